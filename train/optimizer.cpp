#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/core/check.h"

#include "kernels/ops/adamw.h"
#include "kernels/ops/global_norm.h"

namespace zgpt {

AdamW::AdamW(const ParameterTable& table, const OptimConfig& cfg)
    : AdamW(table, cfg, {{0, table.total()}}) {}

AdamW::AdamW(const ParameterTable& table, const OptimConfig& cfg, std::vector<ArenaSlice> ranges)
    : table_(table), cfg_(cfg), ranges_(std::move(ranges)) {
    int64_t n = 0;
    for (const ArenaSlice& r : ranges_) {
        ZG_CHECK(0 <= r.lo && r.lo <= r.hi && r.hi <= table.total(),
                 "AdamW: range outside the arena");
        n += r.hi - r.lo;
    }
    m_.assign(size_t(n), 0.0f);
    v_.assign(size_t(n), 0.0f);
}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale) {
    t_++;
    cpu::AdamWStep s;
    s.lr = lr;
    s.beta1 = cfg_.beta1;
    s.beta2 = cfg_.beta2;
    s.eps = cfg_.eps;
    s.t = t_;
    s.grad_scale = grad_scale;
    int64_t at = 0;  // where the range's moments start
    for (const ArenaSlice& r : ranges_) {
        for (const ParamSpec& p : table_.specs()) {  // each tensor's part inside the range
            const int64_t a = std::max(p.offset, r.lo), b = std::min(p.offset + p.numel, r.hi);
            if (a >= b) continue;
            s.weight_decay = p.decay ? decoupled_weight_decay(cfg_) : 0.0;
            const int64_t k = at + (a - r.lo);
            cpu::adamw_update(params + a, grads + a, m_.data() + k, v_.data() + k, b - a, s);
        }
        at += r.hi - r.lo;
    }
}

double global_grad_norm(const float* grads, int64_t n) {
    return std::sqrt(cpu::sum_of_squares(grads, n));
}

}  // namespace zgpt

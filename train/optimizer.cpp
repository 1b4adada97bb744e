#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/core/check.h"

#include "kernels/ops/adamw.h"
#include "kernels/ops/global_norm.h"

namespace zgpt {

AdamW::AdamW(const ParameterTable& table, const OptimConfig& cfg)
    : AdamW(table, cfg, 0, table.total()) {}

AdamW::AdamW(const ParameterTable& table, const OptimConfig& cfg, int64_t lo, int64_t hi)
    : table_(table), cfg_(cfg), lo_(lo), hi_(hi), m_(hi - lo, 0.0f), v_(hi - lo, 0.0f) {
    ZG_CHECK(0 <= lo && lo <= hi && hi <= table.total(), "AdamW: range outside the arena");
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
    for (const ParamSpec& p : table_.specs()) {  // each tensor's part inside [lo, hi)
        const int64_t a = std::max(p.offset, lo_), b = std::min(p.offset + p.numel, hi_);
        if (a >= b) continue;
        s.weight_decay = p.decay ? decoupled_weight_decay(cfg_) : 0.0;
        cpu::adamw_update(params + a, grads + a, m_.data() + (a - lo_), v_.data() + (a - lo_),
                          b - a, s);
    }
}

double global_grad_norm(const float* grads, int64_t n) {
    return std::sqrt(cpu::sum_of_squares(grads, n));
}

}  // namespace zgpt

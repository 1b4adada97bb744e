#include "train/optimizer.h"

#include <cmath>

#include "kernels/adamw.h"
#include "kernels/global_norm.h"

namespace zgpt {

AdamW::AdamW(const ParameterTable& table, const OptimConfig& cfg)
    : table_(table), cfg_(cfg), m_(table.total(), 0.0f), v_(table.total(), 0.0f) {}

void AdamW::step(float* params, const float* grads, double lr, double grad_scale) {
    t_++;
    cpu::AdamWStep s;
    s.lr = lr;
    s.beta1 = cfg_.beta1;
    s.beta2 = cfg_.beta2;
    s.eps = cfg_.eps;
    s.t = t_;
    s.grad_scale = grad_scale;
    for (const ParamSpec& p : table_.specs()) {
        s.weight_decay = p.decay ? cfg_.weight_decay : 0.0;
        cpu::adamw_update(params + p.offset, grads + p.offset, m_.data() + p.offset,
                          v_.data() + p.offset, p.numel, s);
    }
}

double global_grad_norm(const float* grads, int64_t n) {
    return std::sqrt(cpu::sum_of_squares(grads, n));
}

}  // namespace zgpt

#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zgpt {

double learning_rate(const OptimConfig& o, int64_t step, int64_t max_steps) {
    if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
    if (o.decay == "constant") return o.lr;
    const int64_t end = o.decay_steps > 0 ? o.decay_steps : max_steps;
    if (step >= end) return o.min_lr;
    const double progress =
        double(step - o.warmup_steps) / double(std::max<int64_t>(1, end - o.warmup_steps));
    const double shape =
        o.decay == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
    return o.min_lr + shape * (o.lr - o.min_lr);
}

}  // namespace zgpt

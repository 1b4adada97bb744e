// Sum of squares of a gradient buffer (fp64 accumulation), for global-norm clipping.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

template <typename T>
double sum_of_squares(const T* x, int64_t n);

// The factor that clips a gradient of norm `norm` to at most `max_norm` (PyTorch's
// clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1). max_norm <= 0 disables clipping.
double clip_scale(double norm, double max_norm);

}  // namespace zgpt::cpu

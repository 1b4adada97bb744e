// Sum of squares of a gradient buffer (fp64 accumulation), for global-norm clipping.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/core/host_device.h"

namespace zgpt::cpu {

template <typename T>
double sum_of_squares(const T* x, int64_t n);

// The factor that clips a gradient of norm `norm` to at most `max_norm` (PyTorch's
// clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1). max_norm <= 0 disables clipping.
// Host and device code: the AdamW kernel takes it on the GPU (cuda::AdamWClip) with the same bits.
ZG_HOST_DEVICE inline double clip_scale(double norm, double max_norm) {
    if (max_norm <= 0.0) return 1.0;
    const double s = max_norm / (norm + 1e-6);
    return s < 1.0 ? s : 1.0;  // std::min(1.0, s), NaN included: a NaN norm gives 1
}

}  // namespace zgpt::cpu

// CUDA launcher (kernels/ops/global_norm.cu; CUDA builds only): the sum of squares into *out
// (device, fp64), block partials then one block over them, in a fixed order: deterministic.
struct CUstream_st;
namespace zgpt::cuda {

size_t sum_of_squares_scratch_bytes();
void sum_of_squares(double* out, const float* x, int64_t n, void* scratch, CUstream_st* s);
// *out = the n parts added in one fixed order (a sum of squares taken slice by slice).
void sum_of_parts(double* out, const double* parts, int n, CUstream_st* s);

}  // namespace zgpt::cuda

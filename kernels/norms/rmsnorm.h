// RMSNorm over the last dimension (Llama's norm: no mean, no bias). CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps); rstd (N) is saved for backward.
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     double eps);

// Adds into dinp and dweight.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C);

}  // namespace zgpt::cpu

// The CUDA launchers run in the LayerNorm's kernels: kernels/norms/layernorm.h.

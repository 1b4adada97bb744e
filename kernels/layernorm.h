// LayerNorm over the last dimension. CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// out = (inp - mean) * rstd * weight + bias; bias may be null (bias-free LayerNorm).
// mean and rstd (N each) are saved for the backward pass.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, double eps = 1e-5);

// Adds into dinp, dweight and dbias (dbias may be null).
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C);

}  // namespace zgpt::cpu

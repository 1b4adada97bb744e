// GELU, tanh approximation (GPT-2's form). CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);

// Adds into dinp.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/ops/gelu.cu; CUDA builds only).
#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

void gelu_forward(void* out, const void* inp, int64_t n, DType t, CUstream_st* s);
// dinp = dout * gelu'(inp) (written, not added); dinp may alias dout.
void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n, DType t,
                   CUstream_st* s);

}  // namespace zgpt::cuda

// SwiGLU, the gate of Llama's MLP: silu(gate) * up. CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// inp [N, 2H]: each row is gate (H) then up (H), the output of one matmul with gate_proj and
// up_proj stacked; out [N, H] = silu(gate) * up, silu(g) = g / (1 + e^-g).
template <typename T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t H);

// Adds into dinp [N, 2H].
template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, int64_t N, int64_t H);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/ops/swiglu.cu; CUDA builds only), fp32 math on values of type t.
#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

void swiglu_forward(void* out, const void* inp, int64_t N, int64_t H, DType t, CUstream_st* s);

// dinp [N, 2H] written (not added); it must not alias inp or dout.
void swiglu_backward(void* dinp, const void* inp, const void* dout, int64_t N, int64_t H, DType t,
                     CUstream_st* s);

}  // namespace zgpt::cuda

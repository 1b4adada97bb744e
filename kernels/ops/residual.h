// Residual add: out = a + b. CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);

// Adds dout into both da and db.
template <typename T>
void residual_backward(T* da, T* db, const T* dout, int64_t n);

}  // namespace zgpt::cpu

// CUDA launchers (defined in residual.cu; CUDA builds only). stream is a cudaStream_t.
#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

// out = a + b on device pointers, n elements (64-bit indexing).
void residual_forward(float* out, const float* a, const float* b, int64_t n, CUstream_st* stream);
// The same in storage type t (fp32 arithmetic, one rounding).
void residual_forward(void* out, const void* a, const void* b, int64_t n, DType t,
                      CUstream_st* stream);
// A residual stream in res_t (out, a) plus a branch in t (b): fp32 + bf16, or one type.
void residual_forward(void* out, const void* a, const void* b, int64_t n, DType t, DType res_t,
                      CUstream_st* stream);

// out[i] = in[i] rounded once to type t (a sum made in fp32, such as a vocab-parallel head's
// reduce-scattered hidden-state gradient, handed back to bf16 activations).
void cast_from_f32(void* out, const float* in, int64_t n, DType t, CUstream_st* stream);

}  // namespace zgpt::cuda

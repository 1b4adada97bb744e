// Causal attention on tensor cores (kernels/attention_mma.cu): the fast path of the `flash`
// variant for bf16 with head size 64. Same contract as flash: lse [B, NH, T] (natural log) saved
// by forward; backward writes dqkv and uses dsum [B, NH, T] as scratch.
#pragma once
#include "kernels/attention.h"
#include "kernels/dtype.h"

struct CUstream_st;
namespace zgpt::cuda::attention_mma {

bool usable(const AttentionShape& s, DType t);
void forward(void* out, float* lse, const void* qkv, const AttentionShape& s, CUstream_st* st);
void backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
              float* dsum, const AttentionShape& s, CUstream_st* st);

}  // namespace zgpt::cuda::attention_mma

// Causal attention on tensor cores (kernels/attention/mma.cu): the fast path of the `flash`
// variant for bf16 with head size 64. Same contract as flash: lse [B, NH, T] (natural log) saved
// by forward; backward writes dqkv and uses dsum [B, NH, T] as scratch.
#pragma once
#include "kernels/attention/attention.h"
#include "kernels/core/dtype.h"

struct CUstream_st;
namespace zgpt::cuda::attention_mma {

bool usable(const AttentionShape& s, DType t);
// out_residual (optional, bf16 [B, T, C]): O - bf16(O), for tuning.unrounded_dsum.
void forward(void* out, float* lse, void* out_residual, const void* qkv, const AttentionShape& s,
             CUstream_st* st);
// dqkv_colsums (optional): [colsum_rows(s), C + 2 KVC] partial column sums of dqkv, one row per
// batch element and block of 128 rows; summed over the rows they are its column sums.
int64_t colsum_rows(const AttentionShape& s);
// out_residual (optional): forward's, added to out in D = rowsum(dO O).
void backward(void* dqkv, const void* dout, const void* qkv, const void* out,
              const void* out_residual, const float* lse, float* dsum, float* dqkv_colsums,
              const AttentionShape& s, CUstream_st* st);

}  // namespace zgpt::cuda::attention_mma

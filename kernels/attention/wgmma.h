// Causal attention on Hopper's warpgroup tensor-core instructions (kernels/attention/wgmma.cu,
// compiled for sm_90a only): the fast path of the `flash` variant on H100/H200 for bf16 with head
// size 64. Same contract and column-sum layout as attention/mma.h, which stays the path on other
// GPUs and is the `flash_mma` variant everywhere.
#pragma once
#include "kernels/attention/attention.h"
#include "kernels/core/dtype.h"

struct CUstream_st;
namespace zgpt::cuda::attention_wgmma {

// bf16, head size 64, and the current device is compute capability 9.0. s.tuning's wgmma_fwd /
// wgmma_bwd false keeps that direction off these kernels (for measuring the difference).
bool usable_forward(const AttentionShape& s, DType t);
bool usable_backward(const AttentionShape& s, DType t);
// out_residual (optional, bf16 [B, T, C]): O - bf16(O), for tuning.unrounded_dsum.
void forward(void* out, float* lse, void* out_residual, const void* qkv, const AttentionShape& s,
             CUstream_st* st);
// dqkv_colsums (optional): [colsum_rows(s), C + 2 KVC], as attention_mma::backward writes them.
int64_t colsum_rows(const AttentionShape& s);
// Whether backward's dK/dV runs the warp-specialised kernel with 128-query tiles (tuning
// wgmma_dkdv_tile 128, or 0 with its TMA ring, two warpgroups, T % 4 == 0), whose sums differ in
// order from the 64-query kernels'.
bool dkdv_warp_specialised(const AttentionShape& s);
// out_residual (optional): forward's, added to out in D = rowsum(dO O).
void backward(void* dqkv, const void* dout, const void* qkv, const void* out,
              const void* out_residual, const float* lse, float* dsum, float* dqkv_colsums,
              const AttentionShape& s, CUstream_st* st);

}  // namespace zgpt::cuda::attention_wgmma

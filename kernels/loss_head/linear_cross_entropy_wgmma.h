// The Hopper kernels of fused_linear_wgmma (kernels/loss_head/linear_cross_entropy_wgmma.cu):
// logits tiles of h W^T on wgmma with the cross-entropy in the epilogue.
// kernels/loss_head/linear_cross_entropy.cu runs its schedule with these in place of "cuBLASLt
// GEMM, then a CE pass over the tile".
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/core/cuda_common.cuh"
#include "kernels/loss_head/cross_entropy.h"

namespace zgpt::cuda::linear_ce_wgmma {

// An sm_90 device, C a multiple of 8 and 16-byte aligned h and W (what TMA needs).
bool usable(const LinearCrossEntropyArgs& a);

// RowStatsF entries of the statistics pass's per-group partials for `rows` rows.
size_t partials_count(int64_t rows, int64_t V_local);

// The shard's statistics of rows [r0, r0 + nr) into stats[r0, r0 + nr); partials:
// partials_count(nr, V_local) entries of scratch.
void shard_stats(RowStatsF* stats, RowStatsF* partials, const LinearCrossEntropyArgs& a,
                 const CrossEntropyOptions& o, int64_t r0, int64_t nr, CUstream_st* s);

// The dlogits of rows [r0, r0 + nr) x shard columns [c0, c0 + nc) as bf16 into out [nr, nc].
void dlogits_tile(bf16* out, const RowGradParams* params, const LinearCrossEntropyArgs& a,
                  const CrossEntropyOptions& o, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                  CUstream_st* s);

}  // namespace zgpt::cuda::linear_ce_wgmma

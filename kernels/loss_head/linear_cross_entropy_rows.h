// fused_linear_rows (kernels/loss_head/linear_cross_entropy_rows.cu): the linear + cross-entropy
// head in blocks of whole rows, 3 GEMMs; registered in linear_cross_entropy_variants().
// run_filtered is fused_linear_rows_filtered: dh and dW skip the dlogits below tuning.filter_eps
// (not exact).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/loss_head/cross_entropy.h"

namespace zgpt::cuda::linear_ce_rows {

size_t workspace_bytes(int64_t N, int64_t C, int64_t V, const LinearCrossEntropyTuning& tuning);
size_t workspace_bytes_filtered(int64_t N, int64_t C, int64_t V,
                                const LinearCrossEntropyTuning& tuning);
void run(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
         CUstream_st* stream);
void run_filtered(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
                  CUstream_st* stream);

}  // namespace zgpt::cuda::linear_ce_rows

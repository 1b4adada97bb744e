// The forward GEMM of the `wgmma` matmul variant (kernels/gemm/matmul_wgmma.cu): out = inp W^T with
// the bias and GELU epilogues, on Hopper's tensor cores (the persistent core of
// kernels/gemm/hopper_gemm.cuh) instead of cuBLASLt. Deterministic: each output is one tile's one
// accumulation.
#pragma once
#include "kernels/gemm/matmul.h"

namespace zgpt::cuda {

// The forward products the kernel takes: bf16 A [M, K] and B [N, K] (trans_b), bf16 D, alpha 1,
// beta 0, epilogue none / bias / gelu_aux_bias / gelu_aux, K and N multiples of 8 and 16-byte
// aligned matrices, on an sm_90 device.
bool gemm_wgmma_usable(const Gemm& g);
// How the kernel's two consumer warpgroups share the work (kernels.matmul_wgmma_schedule):
// cooperative, both on each 128 x 256 tile beside an epilogue warpgroup
// (kernels/gemm/hopper_gemm.cuh), or ping-pong, alternate 128 x 128 tiles, each warpgroup taking
// its own epilogue while the other multiplies (kernels/gemm/matmul_wgmma_pingpong.cu). The same
// bits either way.
enum class WgmmaSchedule { cooperative, pingpong };

// Runs g when gemm_wgmma_usable(g); false (nothing launched) otherwise. With GELU, D is the GELU of
// the pre-activation as stored to aux (rounded to bf16 first), as the `separate` variant computes
// it.
bool try_gemm_wgmma(const Gemm& g, CUstream_st* stream,
                    WgmmaSchedule schedule = WgmmaSchedule::cooperative);

}  // namespace zgpt::cuda

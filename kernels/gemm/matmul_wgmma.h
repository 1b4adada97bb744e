// The forward GEMM of the `wgmma` matmul variant (kernels/gemm/matmul_wgmma.cu): out = inp W^T with
// the bias, GELU, SwiGLU and RoPE epilogues, on Hopper's tensor cores (the persistent core of
// kernels/gemm/hopper_gemm.cuh) instead of cuBLASLt. Deterministic: each output is one tile's one
// accumulation.
#pragma once
#include "kernels/gemm/matmul.h"

namespace zgpt::cuda {

// The forward products the kernel takes: bf16 A [M, K] and B [N, K] (trans_b), bf16 D, alpha 1,
// beta 0, epilogue none / bias / gelu_aux_bias / gelu_aux / swiglu_aux / swiglu_aux_bias, K and N
// multiples of 8 and 16-byte aligned matrices, on an sm_90 device. SwiGLU: N = 2H with H a multiple
// of 128. RoPE (Gemm::rope_table): heads of rope_hs = 64, rope_cols a multiple of 64 and at most N,
// beside the none and bias epilogues only.
bool gemm_wgmma_usable(const Gemm& g);
// How the kernel's two consumer warpgroups share the work (kernels.matmul_wgmma_schedule):
// cooperative, both on each 128 x 256 tile beside an epilogue warpgroup
// (kernels/gemm/hopper_gemm.cuh), or ping-pong, alternate 128 x 128 tiles, each warpgroup taking
// its own epilogue while the other multiplies (kernels/gemm/matmul_wgmma_pingpong.cu). The same
// bits either way.
enum class WgmmaSchedule { cooperative, pingpong };

// Runs g when gemm_wgmma_usable(g); false (nothing launched) otherwise, and the caller runs its
// separate passes. With GELU or SwiGLU, D is the activation of the pre-activation as stored to aux
// (rounded to bf16 first), the bits of the separate GELU or SwiGLU pass. RoPE rotates the fp32
// values before their rounding, so it may differ from the separate RoPE pass by a rounding. SwiGLU
// runs on the cooperative schedule under either.
bool try_gemm_wgmma(const Gemm& g, CUstream_st* stream,
                    WgmmaSchedule schedule = WgmmaSchedule::cooperative);

}  // namespace zgpt::cuda

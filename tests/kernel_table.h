// The kernel table of test_kernels: the shapes of its rows, and the GPU check of each op family
// (tests/kernel_checks_gpu.cpp, built with CUDA only). Plain C++, so that a CPU-only build lists
// the same rows; it runs the CPU ones and reports the GPU ones as skipped.
//
// Each GPU check runs one variant on fresh random inputs (rounded to the device type first, so the
// CPU reference in double reads the same values), forward and backward where the op has one, and
// holds every output to the bounds argued in kernel_checks_gpu.cpp (fp32, bf16) and in ce_gpu.h
// (the loss head).
#pragma once
#include <cstdint>
#include <string>

#include "kernels/core/dtype.h"
#include "kernels/loss_head/cross_entropy.h"

namespace zgpt::test {

struct AttentionDims {
    int64_t B, T, C, NH;
    int64_t NKV = 0;              // key/value heads (grouped-query attention); 0: NH
    int dkdv_wgs = 0;             // kernels.attention_tuning.wgmma_dkdv_wgs (0: the default)
    int dkdv_tile = 0;            // kernels.attention_tuning.wgmma_dkdv_tile (0: the default)
    int dq_tile = 0;              // kernels.attention_tuning.wgmma_dq_tile (0: the default)
    bool fwd_pipeline = false;    // kernels.attention_tuning.wgmma_fwd_pipeline
    bool dkdv_tma = true;         // kernels.attention_tuning.wgmma_dkdv_tma
    bool dq_tma = true;           // kernels.attention_tuning.wgmma_dq_tma
    bool fwd_tma = true;          // kernels.attention_tuning.wgmma_fwd_tma
    int fwd_keys = 0;             // kernels.attention_tuning.wgmma_fwd_keys (0: the default)
    bool rope = false;            // rotary positions: backward returns the unrotated q's and k's
    bool unrounded_dsum = false;  // kernels.attention_tuning.unrounded_dsum
};
struct LayernormDims {
    int64_t N, C;
};
// LayerNorm over head-sized rows inside qkv [BT, 3C] (qk_norm): BT x NH rows of hs.
struct HeadsDims {
    int64_t BT, NH, hs;
};
// RMSNorm rows: N rows of C; with NH > 1 the heads of q inside qkv rows of ld (qk_norm).
struct RmsnormDims {
    int64_t N, C, NH = 1, ld = 0;
};
// Rotary embedding on `heads` heads of hs inside rows of ld, B x T tokens.
struct RopeDims {
    int64_t B, T, heads, hs, ld;
};
struct MatmulDims {
    int64_t N, C, OC;
};
struct EncoderDims {
    int64_t B, T, C, V;
};
// A loss-head problem (ce_gpu.h's make_case): N rows of V logits with hard rows mixed in, z-loss
// 1e-4, `ignored` targets set to ignore_index, dlogits in place or to their own buffer.
struct CeDims {
    int64_t N, V;
    Reduction reduction;
    double label_smoothing;
    int ignored;
    bool in_place;
    uint64_t seed;
};

namespace gpu {

// variant: a name of kernels/core/registry.h's family of the same name
void attention(const std::string& variant, const AttentionDims& s, DType t);
// bf16 with peaked rows (scores of standard deviation about 32), multi-head, default tuning:
// attention_tuning.unrounded_dsum leaves the output alone and at least halves the error of dq and
// dk together (Frobenius norm) against the double reference.
void attention_unrounded_dsum_gain(const std::string& variant, const AttentionDims& s);
void cross_entropy(const std::string& variant, const CeDims& s, DType t);
// The activations in t, the residual stream (a, res, dinp), weight and bias in res_t.
void layernorm(const std::string& variant, const LayernormDims& s, DType t, DType res_t);
void matmul(const std::string& variant, const MatmulDims& s, DType t);
// The wgmma matmul's two schedules (kernels.matmul_wgmma_schedule) on random bf16 inputs, each
// epilogue: the same bits, sampled rows against the double reference, repeated runs equal
void matmul_wgmma_schedules(int64_t M, int64_t K, int64_t N);
// The wgmma matmul's SwiGLU epilogue, without and with a bias, on both schedules: aux [M, 2H] =
// x [M, K] W^T (W [2H, K]: gate rows, then up) and D [M, H] = silu(gate) * up, against the double
// reference and the separate SwiGLU pass's bits; an H that is no multiple of 128 is refused
void matmul_wgmma_swiglu(int64_t M, int64_t K, int64_t H);
// The wgmma matmul's RoPE epilogue, without and with a bias, on both schedules: qkv [B T, N] = x
// [B T, K] W^T with heads of 64 in columns [0, rope_cols) rotated at position t of each row,
// against the double reference; the columns after them as the plain GEMM's; other head sizes and
// widths refused
void matmul_wgmma_rope(int64_t B, int64_t T, int64_t K, int64_t N, int64_t rope_cols);
// fc's bias gradient from the GELU' epilogue: d[M, K] = (dout[M, N] w[N, K]) GELU'(pre)
void dgelu_bias_grad(int64_t M, int64_t K, int64_t N);
// The vocab-parallel head's three products over a shard of N logits whose rows are ld apart
// (Gemm::lda / ldd): logits [M, N] = h [M, K] w[N, K]^T, dw [N, K] += g^T h, dh [M, K] = g w
void matmul_strided(int64_t M, int64_t K, int64_t N, int64_t ld, DType t);
// Partial column sums [rows, cols] added into a row (the reduction behind the bias gradients and
// the LayerNorm weight gradients)
void column_sums(int64_t rows, int64_t cols);
// Ops with one CUDA implementation.
void qk_layernorm(const HeadsDims& s, DType t);
void encoder(const EncoderDims& s, DType t);
void gelu(int64_t n, DType t);
void rmsnorm(const RmsnormDims& s, DType t, DType res_t);
void rope(const RopeDims& s, DType t);
void swiglu(int64_t N, int64_t H, DType t);
void residual(int64_t n, DType t, DType res_t);
void adamw(int64_t n, int64_t base, int nspans);
void global_norm(int64_t n);

}  // namespace gpu
}  // namespace zgpt::test

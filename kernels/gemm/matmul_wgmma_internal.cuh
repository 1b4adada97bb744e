// What the `wgmma` matmul variant's two schedules share (kernels/gemm/matmul_wgmma.cu, the
// cooperative kernel and the dispatch; kernels/gemm/matmul_wgmma_pingpong.cu): the epilogue's
// parts, the launch parameters and the walk over the output tiles, which differ only in the tile's
// width.
//
// In an anonymous namespace, as kernels/gemm/hopper_gemm.cuh: each translation unit keeps its
// copies.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/core/check.h"
#include "kernels/gemm/matmul.h"

namespace zgpt::cuda {

inline bool wgmma_has_bias(Epilogue e) {
    return e == Epilogue::bias || e == Epilogue::gelu_aux_bias || e == Epilogue::swiglu_aux_bias;
}
// D = GELU(pre), pre stored to aux
inline bool wgmma_has_gelu(Epilogue e) {
    return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias;
}
// D [M, N / 2] = silu(gate) * up, pre [M, N] stored to aux (the cooperative kernel only)
inline bool wgmma_has_swiglu(Epilogue e) {
    return e == Epilogue::swiglu_aux || e == Epilogue::swiglu_aux_bias;
}

// Launches g (gemm_wgmma_usable(g) holds) on the ping-pong kernel.
bool gemm_wgmma_pingpong(const Gemm& g, CUstream_st* stream);

namespace {

struct WgmmaParams {
    int N, K;  // rows past M need no bound: the TMA loads zero-fill them and the stores clip them
    int row_tiles, col_tiles, tiles;
    bool rows_fastest;  // B too large to stay in L2 (the LM head's weight): walk rows fastest
    const __nv_bfloat16* bias;  // [N] or null
    const float* rope_table;    // Gemm::rope_table (head size 64), or null
    int rope_Tn, rope_cols;
};

// g's parameters for output tiles of kRows x kCols.
template <int kRows, int kCols>
WgmmaParams wgmma_params(const Gemm& g) {
    WgmmaParams p{};
    p.N = int(g.N);
    p.K = int(g.K);
    const int64_t row_tiles = (g.M + kRows - 1) / kRows;
    p.row_tiles = int(row_tiles);
    p.col_tiles = int((g.N + kCols - 1) / kCols);
    const int64_t tiles = row_tiles * int64_t(p.col_tiles);
    ZG_CHECK(tiles < INT32_MAX, "gemm_wgmma: too many tiles");
    p.tiles = int(tiles);
    // Columns fastest keeps each row tile of A in L2 while the CTAs take its column tiles; that
    // re-reads B once per row tile, which stays in L2 only while B is small beside the 50 MB L2
    // (the layers' weights: at most 4.7 MB). The LM head's weight (77 MB at V = 50304) is walked
    // the other way, as fused_linear_wgmma walks it.
    p.rows_fastest = g.N * g.K * 2 > (int64_t(16) << 20);
    p.bias = wgmma_has_bias(g.epilogue) ? static_cast<const __nv_bfloat16*>(g.bias) : nullptr;
    p.rope_table = g.rope_table;
    p.rope_Tn = int(g.rope_Tn);
    p.rope_cols = int(g.rope_cols);
    return p;
}

// RoPE on a consumer's fp32 accumulator (Gemm::rope_table, heads of 64), after the bias and before
// the rounding to bf16: so its bits may differ from the separate pass (kernels/ops/rope.cu), which
// rotates the stored bf16 values. The thread's element 4 i + 2 h + e (i < kN / 4) is row row0 + 8
// h, column col + 8 i + 2 tq + e (tq = lane % 4), col a multiple of 64: head `col / 64 + i / 8`,
// its channel 8 (i % 8) + 2 tq + e, and channel ch < 32 (i % 8 < 4) pairs with ch + 32 (i + 4),
// held by the same thread. Heads from rope_cols on are left alone. The products are rounded
// explicitly, so that both schedules compute the same bits whatever the compiler contracts.
template <int kN>
__device__ __forceinline__ void rope_columns(float (&acc)[kN], const WgmmaParams& p, int col,
                                             int row0) {
    constexpr int kPairs = 32;  // of a head of 64
    const int tq = threadIdx.x % 4;
    const float* cs[2];  // the cos rows of the thread's two rows' positions; sin Tn rows further
#pragma unroll
    for (int h = 0; h < 2; h++) cs[h] = p.rope_table + ((row0 + 8 * h) % p.rope_Tn) * kPairs;
    const int sin_at = p.rope_Tn * kPairs;
#pragma unroll
    for (int q = 0; q < 4; q++) {  // channels 8 q + 2 tq + e of each head
        const int ch = 8 * q + 2 * tq;
        float2 c[2], s[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            c[h] = __ldg(reinterpret_cast<const float2*>(cs[h] + ch));
            s[h] = __ldg(reinterpret_cast<const float2*>(cs[h] + sin_at + ch));
        }
#pragma unroll
        for (int head = 0; head < kN / 32; head++) {
            if (col + 64 * head >= p.rope_cols) continue;
            const int i = 8 * head + q;
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float cv = e ? c[h].y : c[h].x, sv = e ? s[h].y : s[h].x;
                    const float x1 = acc[4 * i + 2 * h + e], x2 = acc[4 * (i + 4) + 2 * h + e];
                    acc[4 * i + 2 * h + e] = fmaf(x1, cv, -__fmul_rn(x2, sv));
                    acc[4 * (i + 4) + 2 * h + e] = fmaf(x2, cv, __fmul_rn(x1, sv));
                }
        }
    }
}

// The CTA's tiles of kRows x kCols (hopper_gemm::consume's walk): blockIdx.x, + gridDim.x, ...,
// columns fastest (tile t: row tile t / col_tiles, column tile t % col_tiles), or rows with
// WgmmaParams::rows_fastest.
template <int kRows, int kCols>
struct WgmmaTiles {
    const WgmmaParams* p;
    int t, row = 0, col = 0;
    __device__ explicit WgmmaTiles(const WgmmaParams& q) : p(&q), t(int(blockIdx.x)) { place(); }
    __device__ bool done() const { return t >= p->tiles; }
    __device__ void place() {
        const bool rf = p->rows_fastest;
        row = (rf ? t % p->row_tiles : t / p->col_tiles) * kRows;
        col = (rf ? t / p->row_tiles : t % p->col_tiles) * kCols;
    }
    __device__ void next() {
        t += gridDim.x;
        place();
    }
};

}  // namespace
}  // namespace zgpt::cuda

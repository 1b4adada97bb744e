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
    return e == Epilogue::bias || e == Epilogue::gelu_aux_bias;
}
// D = GELU(pre), pre stored to aux
inline bool wgmma_has_gelu(Epilogue e) {
    return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias;
}

// Launches g (gemm_wgmma_usable(g) holds) on the ping-pong kernel.
bool gemm_wgmma_pingpong(const Gemm& g, CUstream_st* stream);

namespace {

struct WgmmaParams {
    int N, K;  // rows past M need no bound: the TMA loads zero-fill them and the stores clip them
    int row_tiles, col_tiles, tiles;
    bool rows_fastest;  // B too large to stay in L2 (the LM head's weight): walk rows fastest
    const __nv_bfloat16* bias;  // [N] or null
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
    return p;
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

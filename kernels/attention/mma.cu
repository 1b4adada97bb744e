// Causal attention on tensor cores: bf16, head size 64, fp32 accumulation.
//
// FlashAttention-2's schedule with mma.sync m16n8k16: 4 warps per block, key (or query) tiles of
// 64 rows (forward) or 32 (backward) staged in shared memory with cp.async in a ring of three
// (rows padded by 8 elements against bank conflicts), fragments read with ldmatrix. The S
// accumulator's register layout is exactly the A operand layout of the next product, so P (and dS)
// never leave registers. Backward: a kernel over key blocks for dK/dV and one over query blocks for
// dQ, so every output has one writer (deterministic, no atomics); each warp there owns two m-tiles
// of 16 rows. Grouped-query attention: the dK/dV blocks own a key/value head's keys and walk its
// group's query heads in turn (dkdv_kernel<true>); multi-head attention runs the <false> kernels,
// whose group of one is known at compile time.
//
// What keeps the instruction count down (these kernels are issue-bound, not tensor-bound):
// - only tiles that straddle the diagonal are masked; the others take a compare-free path;
// - exponentials are ex2 of one FFMA: scores are scaled into log2 units (scale * log2 e) and the
//   row statistics are kept in those units;
// - each ldmatrix.x4 fetches the B fragments of two n-tiles;
// - the forward gives each warp MT m-tiles (16 rows each), so every K/V fragment read from shared
//   memory feeds MT products.
#include "kernels/attention/mma.h"

#include <string>

#include "kernels/attention/geo.cuh"
#include "kernels/attention/tc.cuh"
#include "kernels/core/cuda_common.cuh"
#include "kernels/gemm/mma_sync.cuh"

namespace zgpt::cuda::attention_mma {

namespace {

using namespace attention_tc;
using namespace mma_sync;
using Geo = AttentionGeo;
constexpr int kD = 64, kLD = kD + 8;  // head size; padded shared-memory row
constexpr int kTile = 64, kWarps = 4, kThreads = 32 * kWarps;

// A fragment (16 x 16) of a row-major matrix at (r0, k0), row stride kLD.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* m, int r0, int k0) {
    const int l = threadIdx.x % 32;
    ldmatrix_x4(a, m + (r0 + l % 8 + (l / 8) % 2 * 8) * kLD + k0 + l / 16 * 8);
}
// B fragments (16 x 8) of the n-tiles n0 and n0 + 8 at k0, from a matrix stored [n][k]:
// b[0], b[1] for n0 and b[2], b[3] for n0 + 8.
__device__ __forceinline__ void load_b2(uint32_t (&b)[4], const bf16* m, int n0, int k0) {
    const int l = threadIdx.x % 32;
    ldmatrix_x4(b, m + (n0 + l % 8 + l / 16 * 8) * kLD + k0 + (l / 8) % 2 * 8);
}
// The same from a matrix stored [k][n] (ldmatrix.trans), so V, Q, dO and K serve as right
// operands without a transposed copy.
__device__ __forceinline__ void load_bt2(uint32_t (&b)[4], const bf16* m, int k0, int n0) {
    const int l = threadIdx.x % 32;
    ldmatrix_x4_trans(b, m + (k0 + l % 16) * kLD + n0 + l / 16 * 8);
}
// An accumulator pair of n-tiles (2kk, 2kk+1) as the A fragment of the next product.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
    a[0] = pack(lo[0], lo[1]);
    a[1] = pack(lo[2], lo[3]);
    a[2] = pack(hi[0], hi[1]);
    a[3] = pack(hi[2], hi[3]);
}

// Row gq + 8 r of a warp's 16 x kD accumulator, times `scale`, as bf16 at `dst` (this lane's two
// columns of each n-tile).
// kResidual: what that rounding loses instead (pack_residual), for tuning.unrounded_dsum.
template <bool kResidual = false>
__device__ __forceinline__ void store_acc_row(bf16* dst, const float (&acc)[kD / 8][4], int r,
                                              float scale) {
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < kD / 8; n++) {
        const float lo = acc[n][2 * r] * scale, hi = acc[n][2 * r + 1] * scale;
        *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * tq) =
            kResidual ? pack_residual(lo, hi) : pack(lo, hi);
    }
}

// Column sums of a block's kWarps x 32 rows of a 16 x kD accumulator pair: lane_column_sums
// below, then block_column_sums<kD, kWarps> (attention/tc.cuh).
// This lane's sums, over its rows of a warp's two m-tiles, of the columns of acc; rows at or past
// Tn (first row r0) are left out.
__device__ __forceinline__ void lane_column_sums(float (&cs)[kD / 8][2],
                                                 const float (&acc)[2][kD / 8][4], int64_t r0,
                                                 int64_t Tn) {
    const int gq = threadIdx.x % 32 / 4;
#pragma unroll
    for (int n = 0; n < kD / 8; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float v = 0;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    if (r0 + mt * 16 + gq + r * 8 < Tn) v += acc[mt][n][2 * r + c];
            cs[n][c] = v;
        }
}

// Rows [r0, r0 + 64) of one head's slice (rows of `stride` elements from base) into shared memory
// with cp.async, 16 bytes per copy; rows past Tn are zero-filled. Call commit() after a tile's
// copies and wait_prev() before using the tile issued one commit earlier.
template <int ROWS = kTile>
__device__ void stage_async(bf16* rows, const bf16* base, int64_t stride, int64_t r0, int64_t Tn) {
    constexpr int CH = kD / 8;
    for (int c = threadIdx.x; c < ROWS * CH; c += kThreads) {
        const int r = c / CH, col = c % CH * 8;
        const bool in = r0 + r < Tn;
        cp_async16(rows + r * kLD + col, in ? base + (r0 + r) * stride + col : base, in);
    }
}
// qkv's row width and k's width in it, C + 2 KVC and KVC. Multi-head attention (kGroup false)
// spells them 3C and C: ptxas then shares the address arithmetic with dout's rows of C, which
// keeps the backward kernels (at the register limit) from spilling.
template <bool kGroup>
__device__ __forceinline__ int64_t qkv_stride(const Geo& g) {
    return kGroup ? g.ld : 3 * g.C;
}
template <bool kGroup>
__device__ __forceinline__ int64_t kv_width(const Geo& g) {
    return kGroup ? g.KVC : g.C;
}
// The K and V tiles of keys [k0, k0 + ROWS) of key/value head kvh, whose k columns start C after
// `head` = qkv + row 0 of the batch + kvh hs (for multi-head attention, the head's q), and its v
// columns C + KVC after. (Written as 2C without groups: that form spills nothing.)
template <int ROWS = kTile, bool kGroup = true>
__device__ void stage_kv_async(bf16* Ks, bf16* Vs, const bf16* head, int64_t k0, const Geo& g) {
    const int64_t stride = qkv_stride<kGroup>(g);
    stage_async<ROWS>(Ks, head + g.C, stride, k0, g.Tn);
    stage_async<ROWS>(Vs, head + (kGroup ? g.C + g.KVC : 2 * g.C), stride, k0, g.Tn);
}

// ---------------------------------------------------------------- forward
// A block covers 64 * MT query rows (16 * MT per warp) and walks the key tiles up to its last row.
constexpr int kForwardSmemBytes = kStages * 2 * kTile * kLD * int(sizeof(bf16));
template <int MT>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(bf16* out, float* lse, bf16* ores, const bf16* qkv, Geo g) {
    constexpr int WR = 16 * MT, BQ = kWarps * WR;
    static_assert(BQ <= 2 * kTile, "Q is staged in one ring slot");
    // The ring of K and V tiles. Q is staged in slot 2 first and moved to registers before
    // key tile 2 is issued there.
    extern __shared__ __align__(16) unsigned char fwd_smem[];
    auto buf = reinterpret_cast<bf16(*)[2][kTile * kLD]>(fwd_smem);
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * BQ;  // heaviest blocks first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const bf16* qbase = qkv + b * g.Tn * g.ld + h * g.hs;
    const bf16* kvhead = qkv + b * g.Tn * g.ld + h / g.group * g.hs;
    const int64_t key_tiles = (g.Tn + kTile - 1) / kTile;
    const int64_t tiles = (q0 + BQ) / kTile < key_tiles ? (q0 + BQ) / kTile : key_tiles;

    auto stage_tile = [&](int64_t t, int slot) {
        stage_kv_async(buf[slot][0], buf[slot][1], kvhead, t * kTile, g);
    };
    stage_tile(0, 0);
    commit();
    for (int r = 0; r < BQ; r += kTile) stage_async(buf[2][0] + r * kLD, qbase, g.ld, q0 + r, g.Tn);
    commit();
    if (tiles > 1) stage_tile(1, 1);
    commit();
    wait_prev();  // key tile 0 and Q
    __syncthreads();
    uint32_t qa[MT][kD / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kk = 0; kk < kD / 16; kk++)
            load_a(qa[mt][kk], buf[2][0], warp * WR + mt * 16, kk * 16);
    __syncthreads();  // slot 2 now takes key tile 2

    const float sl2 = g.scale * kLog2e;
    float o[MT][kD / 8][4] = {};
    float m[MT][2], l[MT][2];  // running max and sum per row, in log2 units of the scaled scores
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        for (int r = 0; r < 2; r++) m[mt][r] = -INFINITY, l[mt][r] = 0;

    int slot = 0;  // the ring slot of tile t
    for (int64_t t = 0; t < tiles; t++, slot = ring_next(slot)) {
        wait_prev();
        __syncthreads();
        if (t + 2 < tiles) stage_tile(t + 2, ring_after_next(slot));
        commit();
        const bf16* Kt = buf[slot][0];
        const bf16* Vt = buf[slot][1];
        // The tile's first key relative to this warp's first row. Keys run rel..rel+63 and rows
        // 0..WR-1: the warp skips a tile whose keys all follow its rows and masks one that
        // straddles.
        const int rel = int(t * kTile - q0) - warp * WR;
        if (rel < WR) {
            float s[MT][kTile / 8][4] = {};
#pragma unroll
            for (int kk = 0; kk < kD / 16; kk++)
#pragma unroll
                for (int n = 0; n < kTile / 8; n += 2) {
                    uint32_t kb[4];
                    load_b2(kb, Kt, n * 8, kk * 16);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma(s[mt][n], qa[mt][kk], kb[0], kb[1]);
                        mma(s[mt][n + 1], qa[mt][kk], kb[2], kb[3]);
                    }
                }
            if (rel + kTile - 1 > 0) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < kTile / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (rel + n * 8 + 2 * tq + (e & 1) > mt * 16 + gq + (e >> 1) * 8)
                                s[mt][n][e] = -INFINITY;
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int n = 0; n < kTile / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
                float corr[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                    // Key 0 is in tile 0 and precedes every row, so m is finite from then on.
                    const float mn = fmaxf(m[mt][r], scaled_score(mx[r], sl2));
                    corr[r] = ex2(m[mt][r] - mn);
                    m[mt][r] = mn;
                    l[mt][r] *= corr[r];
                }
#pragma unroll
                for (int n = 0; n < kTile / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float p = ex2(scaled_score(s[mt][n][e], sl2) - m[mt][e >> 1]);
                        s[mt][n][e] = p;
                        l[mt][e >> 1] += p;
                    }
#pragma unroll
                for (int n = 0; n < kD / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[mt][n][e] *= corr[e >> 1];
            }
#pragma unroll
            for (int kk = 0; kk < kTile / 16; kk++) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
                for (int n = 0; n < kD / 8; n += 2) {
                    uint32_t vb[4];
                    load_bt2(vb, Vt, kk * 16, n * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma(o[mt][n], pa[mt], vb[0], vb[1]);
                        mma(o[mt][n + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = l[mt][r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int64_t row = q0 + warp * WR + mt * 16 + gq + r * 8;
            if (row >= g.Tn) continue;
            const int64_t at = (b * g.Tn + row) * g.C + h * g.hs;
            store_acc_row(out + at, o[mt], r, 1.0f / sum);
            if (ores) store_acc_row<true>(ores + at, o[mt], r, 1.0f / sum);
            if (tq == 0) lse[bh * g.Tn + row] = (m[mt][r] + __log2f(sum)) * kLn2;
        }
}

// ---------------------------------------------------------------- backward
// The backward kernels own kBwdRows rows per block (keys for dK/dV, queries for dQ), kWarpRows
// (two m-tiles) per warp, and walk the other side in tiles of kBwdTile rows.
constexpr int kWarpRows = 32, kBwdRows = kWarps * kWarpRows, kBwdTile = 32;

// S and dP of a tile, as both backward kernels compute them, for a warp's two m-tiles (rows
// r0.. and r0 + 16..): s[mt] (16 x kBwdTile) += As Bs^T and dp[mt] += Ad Bd^T, the A rows in
// shared memory, each B a kBwdTile x 64 tile stored [n][k]. Each B fragment read feeds both
// m-tiles; the two products are interleaved, which is the order the register allocation of
// dkdv_kernel (247 registers, no spills) was measured with.
__device__ __forceinline__ void scores_tiles2(float (&s)[2][kBwdTile / 8][4], const bf16* As,
                                              const bf16* Bs, float (&dp)[2][kBwdTile / 8][4],
                                              const bf16* Ad, const bf16* Bd, int r0) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; kk++) {
        uint32_t as[2][4], ad[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            load_a(as[mt], As, r0 + mt * 16, kk * 16);
            load_a(ad[mt], Ad, r0 + mt * 16, kk * 16);
        }
#pragma unroll
        for (int n = 0; n < kBwdTile / 8; n += 2) {
            uint32_t bs[4], bd[4];
            load_b2(bs, Bs, n * 8, kk * 16);
            load_b2(bd, Bd, n * 8, kk * 16);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                mma(s[mt][n], as[mt], bs[0], bs[1]);
                mma(s[mt][n + 1], as[mt], bs[2], bs[3]);
                mma(dp[mt][n], ad[mt], bd[0], bd[1]);
                mma(dp[mt][n + 1], ad[mt], bd[2], bd[3]);
            }
        }
    }
}

// One block per 128 keys: dK and dV summed over the query tiles in order. Each warp owns 32 keys
// (two m-tiles), so every Q / dO fragment read from shared memory feeds two products: half the
// shared-memory reads per mma of 16-key warps (measured: the step 126.8-127.3 against 128.5-129.0
// ms). Query tiles have 32 rows so that S and dP of 32 keys fit in registers beside the dK and dV
// accumulators; K and V fragments are read from shared memory.
constexpr int kDkdvSmemBytes = (2 * kBwdRows + 2 * kStages * kBwdTile) * kLD * int(sizeof(bf16)) +
                               2 * kStages * kBwdTile * int(sizeof(float));

// A block owns 128 keys of one key/value head. With kGroup (grouped-query attention) it walks
// the query tiles of each of the head's group of query heads in turn, K and V staged once and dK
// and dV summed in registers in head order; without, the group is the one head, known at compile
// time, so multi-head attention runs the same code as before.
// colsum (optional): this block's column sums of dK and dV (fp32, as stored but before rounding)
// into row b * gridDim.x + blockIdx.x of [B * blocks][C + 2 KVC], the head's k and v columns.
template <bool kGroup>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dsum,
                float* colsum, Geo g) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* Ks = reinterpret_cast<bf16*>(smem);  // [kBwdRows][kLD]
    bf16* Vs = Ks + kBwdRows * kLD;
    bf16* Qs = Vs + kBwdRows * kLD;  // [kStages][kBwdTile][kLD]
    bf16* dOs = Qs + kStages * kBwdTile * kLD;
    float* Ls = reinterpret_cast<float*>(dOs + kStages * kBwdTile * kLD);  // [kStages][kBwdTile]
    float* Ds = Ls + kStages * kBwdTile;
    const int64_t b = blockIdx.y / g.NKV, kvh = blockIdx.y % g.NKV;
    const int64_t k0 = int64_t(blockIdx.x) * kBwdRows;  // early keys see the most queries: first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int64_t stride = qkv_stride<kGroup>(g), kvc = kv_width<kGroup>(g);
    const float sl2 = g.scale * kLog2e;
    const int64_t wk0 = k0 + warp * kWarpRows;  // this warp's first key
    float dk[2][kD / 8][4] = {}, dv[2][kD / 8][4] = {};
    const int group = kGroup ? g.group : 1;
    for (int hq = 0; hq < group; hq++) {
        const int64_t h = kvh * group + hq, bh = b * g.NH + h;
        const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
        const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
        auto issue = [&](int64_t i0, int buf) {
            stage_async<kBwdTile>(Qs + buf * kBwdTile * kLD, qbase, stride, i0, g.Tn);
            stage_async<kBwdTile>(dOs + buf * kBwdTile * kLD, obase, g.C, i0, g.Tn);
            // Plain loads here stalled warp 0, and with it the block's next barrier, on every tile.
            // Queries past Tn get L = D = 0: their Q and dO rows are zero, so P dO and dS Q vanish.
            const int valid = int(std::min<int64_t>(kBwdTile, g.Tn - i0));
            stage_floats(uint32_t(__cvta_generic_to_shared(Ls + buf * kBwdTile)),
                         lse + bh * g.Tn + i0, kBwdTile, valid);
            stage_floats(uint32_t(__cvta_generic_to_shared(Ds + buf * kBwdTile)),
                         dsum + bh * g.Tn + i0, kBwdTile, valid);
            commit();
        };
        if (hq == 0)  // K and V once, committed with the first tile
            stage_kv_async<kBwdRows, kGroup>(Ks, Vs, qkv + b * g.Tn * stride + kvh * g.hs, k0, g);
        else
            __syncthreads();  // every warp is done with the last head's tiles: the ring restarts
        issue(k0, 0);
        if (k0 + kBwdTile < g.Tn)
            issue(k0 + kBwdTile, 1);
        else
            commit();  // an empty group keeps wait_prev() counting right
        int slot = 0;  // the ring slot of the tile at i0
        for (int64_t i0 = k0; i0 < g.Tn; i0 += kBwdTile, slot = ring_next(slot)) {
            wait_prev();
            __syncthreads();
            if (i0 + 2 * kBwdTile < g.Tn)
                issue(i0 + 2 * kBwdTile, ring_after_next(slot));
            else
                commit();
            // The tile's first query relative to this warp's first key; query q sees key k if q >=
            // k.
            const int rel = int(i0 - wk0);
            if (rel > -kBwdTile) {  // the tile's last query sees at least this warp's first key
                const bf16* Qt = Qs + slot * kBwdTile * kLD;
                const bf16* dOt = dOs + slot * kBwdTile * kLD;
                const float* Lt = Ls + slot * kBwdTile;
                const float* Dt = Ds + slot * kBwdTile;
                // S^T and dP^T: keys x queries
                float p[2][kBwdTile / 8][4] = {}, dp[2][kBwdTile / 8][4] = {};
                scores_tiles2(p, Ks, Qt, dp, Vs, dOt, warp * kWarpRows);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int n = 0; n < kBwdTile / 8; n++) {
                        const float2 L = *reinterpret_cast<const float2*>(Lt + n * 8 + 2 * tq);
                        const float l2[2] = {__fmul_rn(L.x, kLog2e), __fmul_rn(L.y, kLog2e)};
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            p[mt][n][e] = ex2(scaled_score(p[mt][n][e], sl2) - l2[e & 1]);
                    }
                if (rel < kWarpRows) {  // the tile straddles this warp's diagonal
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int n = 0; n < kBwdTile / 8; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                if (rel + n * 8 + 2 * tq + (e & 1) < mt * 16 + gq + (e >> 1) * 8)
                                    p[mt][n][e] = 0;
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int n = 0; n < kBwdTile / 8; n++) {
                        const float2 Dv = *reinterpret_cast<const float2*>(Dt + n * 8 + 2 * tq);
#pragma unroll
                        for (int e = 0; e < 4; e++)  // dS^T (unscaled)
                            dp[mt][n][e] = p[mt][n][e] * (dp[mt][n][e] - (e & 1 ? Dv.y : Dv.x));
                    }
#pragma unroll
                for (int kk = 0; kk < kBwdTile / 16; kk++) {
                    uint32_t pa[2][4], sa[2][4];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        acc_to_a(pa[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
                        acc_to_a(sa[mt], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
                    }
                    // dV and dK interleaved: as two separate loops the kernel needs 254 registers
                    // instead of 247 and the step was slower (H100, same call)
#pragma unroll
                    for (int n = 0; n < kD / 8; n += 2) {
                        uint32_t ob[4], qb[4];
                        load_bt2(ob, dOt, kk * 16, n * 8);
                        load_bt2(qb, Qt, kk * 16, n * 8);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            mma(dv[mt][n], pa[mt], ob[0], ob[1]);
                            mma(dv[mt][n + 1], pa[mt], ob[2], ob[3]);
                            mma(dk[mt][n], sa[mt], qb[0], qb[1]);
                            mma(dk[mt][n + 1], sa[mt], qb[2], qb[3]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t key = wk0 + mt * 16 + gq + r * 8;
            if (key >= g.Tn) continue;
            bf16* dkr = dqkv + (b * g.Tn + key) * stride + g.C + kvh * g.hs;
            store_acc_row(dkr, dk[mt], r, g.scale);
            store_acc_row(dkr + kvc, dv[mt], r, 1.0f);
        }
    if (colsum) {  // the qkv bias gradient's share, so that no pass over dqkv is needed for it
        __shared__ float red[2][kWarps][kD];
        float* dst = colsum + (b * gridDim.x + blockIdx.x) * stride + g.C + kvh * g.hs;
        float cs[kD / 8][2];
        lane_column_sums(cs, dk, wk0, g.Tn);
        block_column_sums<kD, kWarps>(dst, cs, g.scale, red[0]);
        lane_column_sums(cs, dv, wk0, g.Tn);
        block_column_sums<kD, kWarps>(dst + kvc, cs, 1.0f, red[1]);
    }
}

// One block per 128 query rows: dQ summed over the key tiles (32 rows each) in order. Each warp
// owns 32 rows (two m-tiles), so every K / V fragment read from shared memory feeds two products.
// Q and dO stay in shared memory, which keeps the kernel at 168 registers: three blocks per SM.
// It runs before the dK/dV kernel and also writes Dsum = rowsum(dO * O) of its rows, which both
// need: dO is already in shared memory here, so a separate pass would read it twice.
constexpr int kDqSmemBytes = (2 * kBwdRows + 2 * kStages * kBwdTile) * kLD * int(sizeof(bf16)) +
                             kBwdRows * int(sizeof(float));
static_assert(kThreads == kBwdRows, "one thread per query row computes its Dsum");

// colsum (optional): as in dkdv_kernel, for dQ (columns h hs), row b * gridDim.x + the query block.
// Query head h reads key/value head h / group; kGroup false: the group is 1 (multi-head).
template <bool kGroup>
__global__ void __launch_bounds__(kThreads, 3)
    dq_kernel(bf16* dqkv, float* dsum, const bf16* dout, const bf16* out, const bf16* ores,
              const bf16* qkv, const float* lse, float* colsum, Geo g) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* Qs = reinterpret_cast<bf16*>(smem);  // [kBwdRows][kLD]
    bf16* dOs = Qs + kBwdRows * kLD;
    bf16* Ks = dOs + kBwdRows * kLD;  // [kStages][kBwdTile][kLD]
    bf16* Vs = Ks + kStages * kBwdTile * kLD;
    float* Dsm = reinterpret_cast<float*>(Vs + kStages * kBwdTile * kLD);  // [kBwdRows]
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBwdRows;  // heaviest blocks first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int64_t stride = qkv_stride<kGroup>(g);
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* kvhead = kGroup ? qkv + b * g.Tn * stride + h / g.group * g.hs : qbase;
    const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
    const float sl2 = g.scale * kLog2e;
    const int64_t wq0 = q0 + warp * kWarpRows;  // this warp's first row
    float dq[2][kD / 8][4] = {};
    const int64_t last = std::min<int64_t>(q0 + kBwdRows, g.Tn);  // keys [0, last) are seen
    const int64_t tiles = (last + kBwdTile - 1) / kBwdTile;
    auto stage_kv = [&](int64_t t, int slot) {
        stage_kv_async<kBwdTile, kGroup>(Ks + slot * kBwdTile * kLD, Vs + slot * kBwdTile * kLD,
                                         kvhead, t * kBwdTile, g);
    };
    stage_async<kBwdRows>(Qs, qbase, stride, q0, g.Tn);  // committed with the first tile
    stage_async<kBwdRows>(dOs, obase, g.C, q0, g.Tn);
    stage_kv(0, 0);
    commit();
    if (tiles > 1) stage_kv(1, 1);
    commit();
    {  // Dsum of row q0 + threadIdx.x; its O row is loaded while the tiles land
        const int64_t row = q0 + threadIdx.x;
        uint4 o[kD / 8] = {};
        if (row < g.Tn) {
            const bf16* orow = out + (b * g.Tn + row) * g.C + h * g.hs;
#pragma unroll
            for (int j = 0; j < kD / 8; j++) o[j] = *reinterpret_cast<const uint4*>(orow + 8 * j);
        }
        wait_prev();  // Q, dO and key tile 0
        __syncthreads();
        float acc = 0;
#pragma unroll
        for (int j = 0; j < kD / 8; j++) {
            acc = dot8(*reinterpret_cast<const uint4*>(dOs + threadIdx.x * kLD + 8 * j), o[j], acc);
        }
        if (ores && row < g.Tn) {  // O's rounding residual (tuning.unrounded_dsum)
            const bf16* rrow = ores + (b * g.Tn + row) * g.C + h * g.hs;
#pragma unroll
            for (int j = 0; j < kD / 8; j++)
                acc = dot8(*reinterpret_cast<const uint4*>(dOs + threadIdx.x * kLD + 8 * j),
                           *reinterpret_cast<const uint4*>(rrow + 8 * j), acc);
        }
        Dsm[threadIdx.x] = acc;  // rows past Tn: dO and O are zero, so 0
        if (row < g.Tn) dsum[bh * g.Tn + row] = acc;
        __syncthreads();
    }
    float L[2][2], Dr[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t row = wq0 + mt * 16 + gq + r * 8;
            L[mt][r] = row < g.Tn ? __fmul_rn(lse[bh * g.Tn + row], kLog2e) : INFINITY;
            Dr[mt][r] = Dsm[warp * kWarpRows + mt * 16 + gq + r * 8];
        }
    int slot = 0;  // the ring slot of tile t
    for (int64_t t = 0; t < tiles; t++, slot = ring_next(slot)) {
        wait_prev();
        __syncthreads();
        if (t + 2 < tiles) stage_kv(t + 2, ring_after_next(slot));
        commit();
        // The tile's first key relative to this warp's first row; row r sees key c if c <= r.
        const int rel = int(t * kBwdTile - wq0);
        if (rel < kWarpRows) {  // some key of the tile is seen by some row of this warp
            const bf16* Kt = Ks + slot * kBwdTile * kLD;
            const bf16* Vt = Vs + slot * kBwdTile * kLD;
            float sc[2][kBwdTile / 8][4] = {}, dp[2][kBwdTile / 8][4] = {};
            scores_tiles2(sc, Qs, Kt, dp, dOs, Vt, warp * kWarpRows);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int n = 0; n < kBwdTile / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sc[mt][n][e] = ex2(scaled_score(sc[mt][n][e], sl2) - L[mt][e >> 1]);
            if (rel > -kBwdTile) {  // the diagonal tile: key c is seen by row r only if c <= r
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int n = 0; n < kBwdTile / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (rel + n * 8 + 2 * tq + (e & 1) > mt * 16 + gq + (e >> 1) * 8)
                                sc[mt][n][e] = 0;
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int n = 0; n < kBwdTile / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)  // dS (unscaled)
                        sc[mt][n][e] = sc[mt][n][e] * (dp[mt][n][e] - Dr[mt][e >> 1]);
#pragma unroll
            for (int kk = 0; kk < kBwdTile / 16; kk++) {
                uint32_t sa[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) acc_to_a(sa[mt], sc[mt][2 * kk], sc[mt][2 * kk + 1]);
#pragma unroll
                for (int n = 0; n < kD / 8; n += 2) {
                    uint32_t kb[4];
                    load_bt2(kb, Kt, kk * 16, n * 8);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma(dq[mt][n], sa[mt], kb[0], kb[1]);
                        mma(dq[mt][n + 1], sa[mt], kb[2], kb[3]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t row = wq0 + mt * 16 + gq + r * 8;
            if (row >= g.Tn) continue;
            store_acc_row(dqkv + (b * g.Tn + row) * stride + h * g.hs, dq[mt], r, g.scale);
        }
    if (colsum) {
        __shared__ float red[kWarps][kD];
        float cs[kD / 8][2];
        lane_column_sums(cs, dq, wq0, g.Tn);
        block_column_sums<kD, kWarps>(colsum + (b * gridDim.x + q0 / kBwdRows) * stride + h * g.hs,
                                      cs, g.scale, red);
    }
}

// Query rows per warp in the forward (in m-tiles of 16): 2 by default; 1
// (AttentionTuning::fwd_m_tiles) exists for measuring the difference.
int forward_m_tiles(const AttentionShape& s) {
    return s.tuning.fwd_m_tiles == 1 ? 1 : 2;
}

}  // namespace

bool usable(const AttentionShape& s, DType t) {
    return t == DType::bf16 && s.C / s.NH == kD && s.C % 8 == 0;
}

void forward(void* out, float* lse, void* out_residual, const void* qkv, const AttentionShape& s,
             CUstream_st* st) {
    const Geo g = attention_geometry(s);
    auto* y = static_cast<bf16*>(out);
    auto* yr = static_cast<bf16*>(out_residual);
    const auto* x = static_cast<const bf16*>(qkv);
    const int mt = forward_m_tiles(s);
    const int64_t rows = kWarps * 16 * mt;
    const dim3 grid(unsigned((s.Tn + rows - 1) / rows), unsigned(s.B * s.NH));
    static const bool smem_set = [] {  // more than the default 48 KB
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            forward_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kForwardSmemBytes));
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            forward_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kForwardSmemBytes));
        return true;
    }();
    (void)smem_set;
    if (mt == 1)
        forward_kernel<1><<<grid, kThreads, kForwardSmemBytes, st>>>(y, lse, yr, x, g);
    else
        forward_kernel<2><<<grid, kThreads, kForwardSmemBytes, st>>>(y, lse, yr, x, g);
    ZG_LAUNCH_CHECK();
}

int64_t colsum_rows(const AttentionShape& s) {
    return s.B * ((s.Tn + kBwdRows - 1) / kBwdRows);
}

void backward(void* dqkv, const void* dout, const void* qkv, const void* out,
              const void* out_residual, const float* lse, float* dsum, float* dqkv_colsums,
              const AttentionShape& s, CUstream_st* st) {
    const Geo g = attention_geometry(s);
    const auto* dy = static_cast<const bf16*>(dout);
    const auto* x = static_cast<const bf16*>(qkv);
    auto* dx = static_cast<bf16*>(dqkv);
    static const bool smem_set = [] {  // both take more than the default 48 KB
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            dkdv_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDkdvSmemBytes));
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            dkdv_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDkdvSmemBytes));
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            dq_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmemBytes));
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            dq_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmemBytes));
        return true;
    }();
    (void)smem_set;
    const dim3 grid(unsigned((s.Tn + kBwdRows - 1) / kBwdRows), unsigned(s.B * s.NH));
    // dQ first: it writes the Dsum that the dK/dV kernel reads
    const auto* o = static_cast<const bf16*>(out);
    const auto* orr = static_cast<const bf16*>(out_residual);
    if (g.group == 1)
        dq_kernel<false>
            <<<grid, kThreads, kDqSmemBytes, st>>>(dx, dsum, dy, o, orr, x, lse, dqkv_colsums, g);
    else
        dq_kernel<true>
            <<<grid, kThreads, kDqSmemBytes, st>>>(dx, dsum, dy, o, orr, x, lse, dqkv_colsums, g);
    // dK/dV: one block row per key/value head
    const dim3 kv_grid(grid.x, unsigned(s.B * g.NKV));
    if (g.group == 1)
        dkdv_kernel<false>
            <<<kv_grid, kThreads, kDkdvSmemBytes, st>>>(dx, dy, x, lse, dsum, dqkv_colsums, g);
    else
        dkdv_kernel<true>
            <<<kv_grid, kThreads, kDkdvSmemBytes, st>>>(dx, dy, x, lse, dsum, dqkv_colsums, g);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda::attention_mma

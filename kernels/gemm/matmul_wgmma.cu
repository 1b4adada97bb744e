// The forward GEMM of the `wgmma` matmul variant: D = epilogue(A B^T) on the persistent Hopper
// core of kernels/gemm/hopper_gemm.cuh. Why: at the trainer's shapes cuBLASLt's GELU-epilogue GEMM
// ran well above its FLOP floor, and the plain and bias GEMMs less so, while this core ran the
// fused head's logits close to cuBLASLt's 8192^3 rate.
//
// - Tiles walk columns fastest (tile t: row tile t / col_tiles, column tile t % col_tiles), so the
//   CTAs running together share A's rows in L2 and the layers' weights (at most 3072 x 768) stay
//   in L2 whole; a B of more than 16 MB (the LM head's) is walked rows fastest instead.
// - The consumers add the bias to the fp32 accumulator (as cuBLASLt's epilogue does) and, with
//   RoPE (Gemm::rope_table), rotate q's and k's heads there, before rounding it to bf16 into the
//   tile buffer.
// - The epilogue warpgroup stores the buffer with TMA (three warps; the fourth's lane 0 issues the
//   loads); with GELU it first stores it as the pre-activation (aux), then takes GELU of the stored
//   bf16 values in place (kernels/ops/gelu.cuh: the bits of the `separate` variant's GELU pass) and
//   stores that (all four warps; a consumer thread loads).
// - SwiGLU (Llama's MLP, gate and up stacked in B): a tile is 128 hidden units j .. j + 127, B's
//   gate rows j .. and up rows H + j .. loaded as the two halves of the stage's B tile (Loads'
//   `up`), so the tile's columns 0-127 are the units' gates and 128-255 their ups. The epilogue
//   stores the halves to aux at columns j and H + j, takes silu(gate) * up of the stored bf16
//   values into the first half (kernels/ops/swiglu.cuh: the bits of the separate SwiGLU pass,
//   which the backward's recompute runs) and stores that to D at column j. As GELU: the whole tile
//   in the buffer, all four warps, a consumer thread loads.
#include "kernels/gemm/matmul_wgmma.h"

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "kernels/core/cuda_common.cuh"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/hopper_gemm.cuh"
#include "kernels/gemm/matmul_wgmma_internal.cuh"
#include "kernels/ops/gelu.cuh"
#include "kernels/ops/swiglu.cuh"

namespace zgpt::cuda {

namespace {

using namespace hopper_gemm;

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZG_NO_WGMMA 1  // device pass for another architecture: the kernel compiles to a trap
#endif

using Params = WgmmaParams;
using GridTiles = WgmmaTiles<kBM, kBN>;  // the cooperative kernel's 128 x 256 tiles
// SwiGLU's tiles of 128 hidden units (each 256 columns of the product): wgmma_params' N / 256 =
// H / 128 column tiles, at hidden unit (column of D) t.col
using UnitTiles = WgmmaTiles<kBM, kBN / 2>;

// What the kernel does to the product besides the bias: nothing, RoPE in the consumers, or GELU or
// SwiGLU in the epilogue warpgroup.
enum class Epi { plain, rope, gelu, swiglu };
constexpr bool whole_tile(Epi e) {
    return e == Epi::gelu || e == Epi::swiglu;
}

// acc += bias of the tile's columns (from `col`); columns past N get 0 (their outputs are not
// stored). The thread's element 4 i + 2 h + e is column 8 i + 2 tq + e.
__device__ __forceinline__ void add_bias_columns(float (&acc)[128], const bf16* bias, int col,
                                                 int N) {
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int c = col + 8 * i + 2 * tq;  // even, and N % 8 == 0: c + 1 < N when c < N
        float2 b = make_float2(0.f, 0.f);
        if (c < N) b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(bias + c));
        acc[4 * i] += b.x;
        acc[4 * i + 1] += b.y;
        acc[4 * i + 2] += b.x;
        acc[4 * i + 3] += b.y;
    }
}

// acc += the bias of a SwiGLU tile at hidden unit j: its columns c < 128 are gate columns j + c,
// the others up columns H + j + c - 128 (all inside N: H % 128 == 0).
__device__ __forceinline__ void add_bias_units(float (&acc)[128], const bf16* bias, int j, int H) {
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int c = (i < 16 ? j : H + j - kBN / 2) + 8 * i + 2 * tq;
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(bias + c));
        acc[4 * i] += b.x;
        acc[4 * i + 1] += b.y;
        acc[4 * i + 2] += b.x;
        acc[4 * i + 3] += b.y;
    }
}

// Warpgroup 0 of the plain and RoPE kernels: warps 0-2 store, lane 0 of warp 3 issues the loads
// (produce()), so that a consumer never waits for the other to free a stage before its own next
// products (faster under ncu on the H100). With GELU (and SwiGLU) all four warps take the
// activation and a consumer thread loads, as in the fused cross-entropy: on three warps the GELU
// became the bottleneck.
template <Epi E>
constexpr int kStoreThreads = whole_tile(E) ? 128 : 96;

// Without GELU: four stages beside half a tile buffer. The epilogue only stores, so filling the
// buffer twice per tile costs the consumers one short wait (the first half's store reading it), and
// the ring covers half as much load latency again as three stages. With GELU the epilogue's work
// on the first half would hold the consumers back: three stages and the whole tile.
template <Epi E>
using CfgOf = std::conditional_t<whole_tile(E), WholeTile, HalfTile>;
template <Epi E>
using TilesOf = std::conditional_t<E == Epi::swiglu, UnitTiles, GridTiles>;

// The buffer's first kBoxes boxes of 64 columns to `map` at (column x(b), row y) for box b, once
// every epilogue thread is done writing it; when this returns the stores have read the buffer.
template <int kThreadsStoring, int kBoxes, class X>
__device__ __forceinline__ void store_boxes(const CUtensorMap* map, uint32_t buf, int y, X&& x) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    epilogue_sync<kThreadsStoring>();
    if (threadIdx.x == 0) store_boxes_at<kBoxes>(map, buf, y, x);
    epilogue_sync<kThreadsStoring>();
}
// The buffer to `map` at the tile, once every epilogue thread is done writing it.
template <class Cfg, int kThreadsStoring>
__device__ __forceinline__ void store_tile(const CUtensorMap* map, uint32_t buf, const GridTiles& t,
                                           int part) {
    const int x0 = t.col + part * Cfg::kBufCols;
    store_boxes<kThreadsStoring, Cfg::kBufCols / 64>(map, buf, t.row,
                                                     [&](int b) { return x0 + 64 * b; });
}

// f(v) on every 16-byte chunk of columns [0, kCols) of the buffer's rows, in place, by the
// kThreadsWorking epilogue threads; f also gets the chunk's row and index in the row.
template <int kCols, int kThreadsWorking, class F>
__device__ __forceinline__ void for_chunks(uint32_t buf, F&& f) {
    constexpr int kChunks = kCols / 8;  // chunk i: row i / kChunks, chunk i % kChunks
    for (int i = threadIdx.x; i < kBM * kChunks; i += kThreadsWorking) {
        const int r = i / kChunks, c = i % kChunks;
        float v[8];
        const uint32_t a = buf_chunk(buf, r, c);
        lds_chunk(a, v);
        f(v, r, c);
        sts_chunk(a, v);
    }
}

template <Epi E>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                const __grid_constant__ CUtensorMap map_b,
                const __grid_constant__ CUtensorMap map_d,
                const __grid_constant__ CUtensorMap map_aux, const Params p) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    extern __shared__ __align__(16) unsigned char smem_raw[];
    using Cfg = CfgOf<E>;
    using Tiles = TilesOf<E>;
    constexpr int kStore = kStoreThreads<E>;
    const Smem<Cfg> sm = setup_smem<Cfg>(smem_raw, kStore / 32);
    const int tid = threadIdx.x, lane = tid % 32;
    const int ksteps = (p.K + kBK - 1) / kBK;
    const int H = E == Epi::swiglu ? p.N / 2 : 0;  // SwiGLU: B's up rows from H (Loads' `up`)
    if (!whole_tile(E) && tid == kStore) produce(sm, &map_a, &map_b, Tiles(p), ksteps);
    if (tid >= kStore && tid < kEpilogueThreads) return;
    if (tid < kStore) {  // the epilogue
        uint32_t n = 0;  // buffer fills so far
        for (Tiles t(p); !t.done(); t.next())
            for (int part = 0; part < Cfg::kParts; part++, n++) {
                bar_wait(sm.buf_full(), n & 1);
                if constexpr (E == Epi::swiglu) {
                    // the gates to aux at column j, the ups at H + j; then silu(gate) * up of the
                    // stored values into the gates' boxes (chunk c + 16 of a row is the up of
                    // chunk c's units), to D at column j
                    store_boxes<kStore, 4>(&map_aux, sm.buf, t.row, [&](int b) {
                        return (b < 2 ? t.col : H + t.col - kBN / 2) + 64 * b;
                    });
                    for_chunks<kBN / 2, kStore>(sm.buf, [&](float(&v)[8], int r, int c) {
                        float u[8];
                        lds_chunk(buf_chunk(sm.buf, r, c + kBN / 16), u);
#pragma unroll
                        for (int k = 0; k < 8; k++) v[k] = swiglu_f(v[k], u[k]);
                    });
                    store_boxes<kStore, 2>(&map_d, sm.buf, t.row,
                                           [&](int b) { return t.col + 64 * b; });
                } else {
                    if constexpr (E == Epi::gelu) {
                        store_tile<Cfg, kStore>(&map_aux, sm.buf, t, part);
                        for_chunks<Cfg::kBufCols, kStore>(sm.buf, [](float(&v)[8], int, int) {
#pragma unroll
                            for (int k = 0; k < 8; k++) v[k] = gelu_bf16(v[k]);
                        });
                    }
                    store_tile<Cfg, kStore>(&map_d, sm.buf, t, part);
                }
                __syncwarp();
                if (lane == 0) bar_arrive(sm.buf_empty());
            }
        if (tid == 0) tma_store_wait();  // the buffer must outlive the stores
        return;
    }
    // the thread's first accumulator row in the tile: consumer warpgroup, warp, lane / 4
    const int row0 = (tid / 128 - 1) * 64 + tid % 128 / 32 * 16 + lane / 4;
    consume<Cfg, whole_tile(E)>(
        sm, &map_a, &map_b, Tiles(p), ksteps,
        [&](float(&acc)[128], const Tiles& t) {
            if constexpr (E == Epi::swiglu) {
                if (p.bias) add_bias_units(acc, p.bias, t.col, H);
            } else {
                if (p.bias) add_bias_columns(acc, p.bias, t.col, p.N);
            }
            if constexpr (E == Epi::rope) rope_columns(acc, p, t.col, t.row + row0);
        },
        Pair{}, H);
#endif
}

}  // namespace

bool gemm_wgmma_usable(const Gemm& g) {
    const bool bias = wgmma_has_bias(g.epilogue), gelu = wgmma_has_gelu(g.epilogue),
               swiglu = wgmma_has_swiglu(g.epilogue), rope = g.rope_table != nullptr;
    const bool epilogue_ok = g.epilogue == Epilogue::none || bias || gelu || swiglu;
    // rows stored back to back only (no Gemm::lda, ldb, ldd): the kernel's TMA maps assume them
    const bool packed = g.lda == 0 && g.ldb == 0 && g.ldd == 0;
    // SwiGLU: whole tiles of 128 hidden units (N = 2H, H % 128 == 0)
    const bool swiglu_ok = !swiglu || g.N % kBN == 0;
    // RoPE: heads of 64 (whole ones in a tile: tiles start at multiples of 128 columns), on the
    // plain or bias epilogue; the table's float2 reads
    const bool rope_ok = !rope || (!gelu && !swiglu && g.rope_hs == 64 && g.rope_cols > 0 &&
                                   g.rope_cols % 64 == 0 && g.rope_cols <= g.N && g.rope_Tn > 0 &&
                                   g.rope_Tn <= INT32_MAX / 64 && is_aligned(g.rope_table, 8));
    return epilogue_ok && swiglu_ok && rope_ok && packed && g.ab_type == DType::bf16 &&
           g.d_type == DType::bf16 && !g.trans_a && g.trans_b && g.alpha == 1.0f &&
           g.beta == 0.0f && !g.C && g.M > 0 && g.N > 0 && g.K > 0 && g.K % 8 == 0 &&
           g.N % 8 == 0 && g.M < INT32_MAX - kBM && g.N < INT32_MAX - kBN && g.K < INT32_MAX &&
           is_aligned({g.A, g.B, g.D}) && (!bias || (g.bias && is_aligned(g.bias, 4))) &&
           (!(gelu || swiglu) || (g.aux && is_aligned(g.aux))) && current_device_is_sm90();
}

namespace {

template <Epi E>
void launch(const Gemm& g, CUstream_st* stream) {
    static std::once_flag once;
    std::call_once(once, [] {
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            gemm_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, CfgOf<E>::kSmemBytes));
    });
    // SwiGLU: N / 256 = H / 128 column tiles (of 128 hidden units: UnitTiles)
    const Params p = wgmma_params<kBM, kBN>(g);
    using hopper_gemm::tensor_map;
    const bool swiglu = E == Epi::swiglu;
    const CUtensorMap ma = tensor_map(g.A, g.M, g.K, kBM, kBK);
    // SwiGLU: the gate rows and the up rows as two boxes of 128 rows (Loads' `up`)
    const CUtensorMap mb = tensor_map(g.B, g.N, g.K, swiglu ? kBN / 2 : kBN, kBK);
    const CUtensorMap md = tensor_map(g.D, g.M, swiglu ? g.N / 2 : g.N, kBM, 64);
    const CUtensorMap mx = whole_tile(E) ? tensor_map(g.aux, g.M, g.N, kBM, 64) : md;
    const int grid = std::min(p.tiles, compute_sm_count());
    gemm_kernel<E><<<grid, kThreads, CfgOf<E>::kSmemBytes, stream>>>(ma, mb, md, mx, p);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool try_gemm_wgmma(const Gemm& g, CUstream_st* stream, WgmmaSchedule schedule) {
    if (!gemm_wgmma_usable(g)) return false;
    // SwiGLU runs on the cooperative kernel under either schedule: the ping-pong kernel's 128 x 128
    // tiles would hold 64 hidden units, and its epilogue works in registers, not on a buffer
    const bool swiglu = wgmma_has_swiglu(g.epilogue);
    if (schedule == WgmmaSchedule::pingpong && !swiglu) return gemm_wgmma_pingpong(g, stream);
    if (swiglu)
        launch<Epi::swiglu>(g, stream);
    else if (wgmma_has_gelu(g.epilogue))
        launch<Epi::gelu>(g, stream);
    else if (g.rope_table)
        launch<Epi::rope>(g, stream);
    else
        launch<Epi::plain>(g, stream);
    return true;
}

}  // namespace zgpt::cuda

// The forward GEMM of the `wgmma` matmul variant: D = epilogue(A B^T) on the persistent Hopper
// core of kernels/gemm/hopper_gemm.cuh. Why: at the trainer's shapes cuBLASLt's GELU-epilogue GEMM
// ran well above its FLOP floor, and the plain and bias GEMMs less so, while this core ran the
// fused head's logits close to cuBLASLt's 8192^3 rate.
//
// - Tiles walk columns fastest (tile t: row tile t / col_tiles, column tile t % col_tiles), so the
//   CTAs running together share A's rows in L2 and the layers' weights (at most 3072 x 768) stay
//   in L2 whole; a B of more than 16 MB (the LM head's) is walked rows fastest instead.
// - The consumers add the bias to the fp32 accumulator (as cuBLASLt's epilogue does) before
//   rounding it to bf16 into the tile buffer.
// - The epilogue warpgroup stores the buffer with TMA (three warps; the fourth's lane 0 issues the
//   loads); with GELU it first stores it as the pre-activation (aux), then takes GELU of the stored
//   bf16 values in place (kernels/ops/gelu.cuh: the bits of the `separate` variant's GELU pass) and
//   stores that (all four warps; a consumer thread loads).
#include "kernels/gemm/matmul_wgmma.h"

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "kernels/core/cuda_common.cuh"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/hopper_gemm.cuh"
#include "kernels/gemm/matmul_wgmma_internal.cuh"
#include "kernels/ops/gelu.cuh"

namespace zgpt::cuda {

namespace {

using namespace hopper_gemm;

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZG_NO_WGMMA 1  // device pass for another architecture: the kernel compiles to a trap
#endif

using Params = WgmmaParams;
using GridTiles = WgmmaTiles<kBM, kBN>;  // the cooperative kernel's 128 x 256 tiles

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

// Warpgroup 0 without GELU: warps 0-2 store, lane 0 of warp 3 issues the loads (produce()), so
// that a consumer never waits for the other to free a stage before its own next products (faster
// under ncu on the H100). With GELU all four warps take the GELU and a consumer thread loads, as
// in the fused cross-entropy: on three warps the GELU became the bottleneck.
template <bool kGelu>
constexpr int kStoreThreads = kGelu ? 128 : 96;

// Without GELU: four stages beside half a tile buffer. The epilogue only stores, so filling the
// buffer twice per tile costs the consumers one short wait (the first half's store reading it), and
// the ring covers half as much load latency again as three stages. With GELU the epilogue's work
// on the first half would hold the consumers back: three stages and the whole tile.
template <bool kGelu>
using CfgOf = std::conditional_t<kGelu, WholeTile, HalfTile>;

// The buffer to `map` at the tile, once every epilogue thread is done writing it.
template <class Cfg, int kThreadsStoring>
__device__ __forceinline__ void store_tile(const CUtensorMap* map, uint32_t buf, const GridTiles& t,
                                           int part) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    epilogue_sync<kThreadsStoring>();
    if (threadIdx.x == 0)
        store_buffer<Cfg::kBufCols>(map, buf, t.col + part * Cfg::kBufCols, t.row);
    epilogue_sync<kThreadsStoring>();
}

template <bool kGelu>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                const __grid_constant__ CUtensorMap map_b,
                const __grid_constant__ CUtensorMap map_d,
                const __grid_constant__ CUtensorMap map_aux, const Params p) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    extern __shared__ __align__(16) unsigned char smem_raw[];
    using Cfg = CfgOf<kGelu>;
    constexpr int kStore = kStoreThreads<kGelu>;
    const Smem<Cfg> sm = setup_smem<Cfg>(smem_raw, kStore / 32);
    const int tid = threadIdx.x, lane = tid % 32;
    const int ksteps = (p.K + kBK - 1) / kBK;
    if (!kGelu && tid == kStore) produce(sm, &map_a, &map_b, GridTiles(p), ksteps);
    if (tid >= kStore && tid < kEpilogueThreads) return;
    if (tid < kStore) {  // the epilogue
        uint32_t n = 0;  // buffer fills so far
        for (GridTiles t(p); !t.done(); t.next())
            for (int part = 0; part < Cfg::kParts; part++, n++) {
                bar_wait(sm.buf_full(), n & 1);
                if constexpr (kGelu) {
                    store_tile<Cfg, kStore>(&map_aux, sm.buf, t, part);
                    // 16-byte chunk i of the buffer: row i / kChunks, chunk i % kChunks
                    constexpr int kChunks = Cfg::kBufCols / 8;
                    for (int i = tid; i < kBM * kChunks; i += kStore) {
                        float v[8];
                        const uint32_t a = buf_chunk(sm.buf, i / kChunks, i % kChunks);
                        lds_chunk(a, v);
#pragma unroll
                        for (int k = 0; k < 8; k++) v[k] = gelu_bf16(v[k]);
                        sts_chunk(a, v);
                    }
                }
                store_tile<Cfg, kStore>(&map_d, sm.buf, t, part);
                __syncwarp();
                if (lane == 0) bar_arrive(sm.buf_empty());
            }
        if (tid == 0) tma_store_wait();  // the buffer must outlive the stores
        return;
    }
    consume<Cfg, kGelu>(sm, &map_a, &map_b, GridTiles(p), ksteps,
                        [&](float(&acc)[128], const GridTiles& t) {
                            if (p.bias) add_bias_columns(acc, p.bias, t.col, p.N);
                        });
#endif
}

}  // namespace

bool gemm_wgmma_usable(const Gemm& g) {
    const bool bias = wgmma_has_bias(g.epilogue), gelu = wgmma_has_gelu(g.epilogue);
    const bool epilogue_ok = g.epilogue == Epilogue::none || bias || gelu;
    // rows stored back to back only (no Gemm::lda, ldb, ldd): the kernel's TMA maps assume them
    const bool packed = g.lda == 0 && g.ldb == 0 && g.ldd == 0;
    return epilogue_ok && packed && g.ab_type == DType::bf16 && g.d_type == DType::bf16 &&
           !g.trans_a && g.trans_b && g.alpha == 1.0f && g.beta == 0.0f && !g.C && g.M > 0 &&
           g.N > 0 && g.K > 0 && g.K % 8 == 0 && g.N % 8 == 0 && g.M < INT32_MAX - kBM &&
           g.N < INT32_MAX - kBN && g.K < INT32_MAX && is_aligned({g.A, g.B, g.D}) &&
           (!bias || (g.bias && is_aligned(g.bias, 4))) &&
           (!gelu || (g.aux && is_aligned(g.aux))) && current_device_is_sm90();
}

bool try_gemm_wgmma(const Gemm& g, CUstream_st* stream, WgmmaSchedule schedule) {
    if (!gemm_wgmma_usable(g)) return false;
    if (schedule == WgmmaSchedule::pingpong) return gemm_wgmma_pingpong(g, stream);
    static std::once_flag once;
    std::call_once(once, [] {
        ZG_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<false>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           CfgOf<false>::kSmemBytes));
        ZG_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           CfgOf<true>::kSmemBytes));
    });
    const Params p = wgmma_params<kBM, kBN>(g);
    const bool gelu = wgmma_has_gelu(g.epilogue);
    using hopper_gemm::tensor_map;
    const CUtensorMap ma = tensor_map(g.A, g.M, g.K, kBM, kBK);
    const CUtensorMap mb = tensor_map(g.B, g.N, g.K, kBN, kBK);
    const CUtensorMap md = tensor_map(g.D, g.M, g.N, kBM, 64);
    const CUtensorMap mx = gelu ? tensor_map(g.aux, g.M, g.N, kBM, 64) : md;
    const int grid = std::min(p.tiles, current_device_sm_count());
    if (gelu)
        gemm_kernel<true><<<grid, kThreads, CfgOf<true>::kSmemBytes, stream>>>(ma, mb, md, mx, p);
    else
        gemm_kernel<false><<<grid, kThreads, CfgOf<false>::kSmemBytes, stream>>>(ma, mb, md, mx, p);
    ZG_CUDA_CHECK(cudaGetLastError());
    return true;
}

}  // namespace zgpt::cuda

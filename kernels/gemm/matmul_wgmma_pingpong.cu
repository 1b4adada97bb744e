// The `wgmma` matmul variant's ping-pong schedule (kernels.matmul_wgmma_schedule = pingpong):
// D = epilogue(A B^T) with A [M, K] and B [N, K] bf16, K-major, on Hopper's warpgroup MMA, where
// each consumer warpgroup owns whole tiles and takes its own epilogue.
//
// Why: the cooperative core (kernels/gemm/hopper_gemm.cuh) splits each 128 x 256 tile between two
// consumer warpgroups, so both finish a tile together: the tensor cores idle while they drain their
// last products and stage the accumulator, once per tile. At the trainer's K = 768 a tile is only
// 12 steps of 64, and that bubble is where the core's plain GEMM loses to cuBLASLt, and its GELU
// epilogue more (docs/results/matmul_pingpong_h100_1643fc2.json). Here the two warpgroups
// take alternate tiles of 128 x 128: the producer fills the ring in tile order, so one
// warpgroup's products run while the other drains, adds the bias, rounds, takes GELU in registers
// and stores (CUTLASS's "ping-pong" warp specialisation; written from the idea, not its code).
//
// - Per CTA (one per SM): 384 threads. Thread 0 is the producer (TMA loads into a ring of kStages
//   stages, each a 128 x 64 tile of A and one of B in the 128-byte swizzle); warpgroups 1 and 2 are
//   the consumers, each with a 128 x 128 fp32 accumulator (two m64n128k16 products per k16 step)
//   and its own 32 KB tile buffer in shared memory.
// - A stage is refilled once the four warps of the warpgroup that read it have released it. A
//   warpgroup starts a tile's products once the other has waited for all of its previous tile's
//   stages (an mbarrier per warpgroup, `turn`), so the main loops take turns.
// - The epilogue: bias in fp32 (then RoPE with Gemm::rope_table, as the cooperative kernel),
//   rounded to bf16 into the buffer (stmatrix), stored by TMA (one thread of the warpgroup); with
//   GELU that store is the pre-activation (aux), and the warpgroup takes GELU of the rounded values
//   in registers (kernels/ops/gelu.cuh: the bits of the separate GELU pass, as the cooperative
//   kernel) while the TMA reads the buffer, then stages and stores D. SwiGLU runs on the
//   cooperative kernel under this schedule too (try_gemm_wgmma).
// - Deterministic: each output is one tile's one accumulation, in a fixed order.
#include <algorithm>
#include <mutex>

#include "kernels/core/cuda_common.cuh"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/hopper_gemm.cuh"
#include "kernels/gemm/matmul_wgmma_internal.cuh"
#include "kernels/ops/gelu.cuh"

namespace zgpt::cuda {

namespace {

using hopper_gemm::bar_arrive;
using hopper_gemm::bar_expect;
using hopper_gemm::bar_init;
using hopper_gemm::bar_wait;
using hopper_gemm::buf_chunk;
using hopper_gemm::pack_bf16;
using hopper_gemm::smem_u32;
using hopper_gemm::tma_load;
using hopper_gemm::tma_store;
using hopper_gemm::tma_store_commit;
using hopper_gemm::tma_store_wait;
using hopper_gemm::tma_store_wait_read;

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZG_NO_WGMMA 1  // device pass for another architecture: the kernel compiles to a trap
#endif

constexpr int kBM = 128;  // rows of A per tile (buf_chunk's box height)
constexpr int kBN = 128;  // rows of B (columns of D) per tile
constexpr int kBK = 64;   // K per stage: one 128-byte swizzled row
constexpr int kStages = 5;
constexpr int kThreads = 3 * 128;
constexpr int kTileBytes = kBM * kBK * 2;  // an A or a B tile of a stage: 16 KB
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kBufBytes = kBM * kBN * 2;  // one consumer's tile buffer: 32 KB
constexpr int kSmemBytes =
    kStages * kStageBytes + 2 * kBufBytes + 1024 /* alignment */ + 256 /* barriers */;
static_assert(kSmemBytes <= 227 * 1024, "more than a CTA's shared memory");
static_assert(kBM == hopper_gemm::kBM, "buf_chunk's boxes are 128 rows");

using Params = WgmmaParams;
// The CTA's 128 x 128 tiles; consumer warpgroup w takes its tiles w, w + 2, ...
using Tiles = WgmmaTiles<kBM, kBN>;

// D (+)= A B^T over one k16 step: A 64 x 16, B 128 x 16, both K-major in shared memory; D a 64 x
// 128 fp32 accumulator (64 floats a thread: element j is row gq + 8 ((j / 2) % 2), column 8 (j /
// 4) + 2 tq + j % 2 of the warp's 16 rows, gq = lane / 4, tq = lane % 4).
__device__ __forceinline__ void wgmma_128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
        "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
        "%56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
}

// The warp's 16 rows r0 .. r0 + 15 of a 64 x 128 accumulator into the buffer as bf16, four 8 x 8
// blocks per stmatrix (hopper_gemm::stage_tile's fragment order).
__device__ __forceinline__ void stage_rows(uint32_t buf, const float (&acc)[64], int r0, int lane) {
    const int m = lane / 8, row = r0 + lane % 8 + 8 * (m % 2);
#pragma unroll
    for (int i = 0; i < kBN / 8; i += 2) {
        const uint32_t addr = buf_chunk(buf, row, i + m / 2);
        asm volatile(
            "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
            "r"(pack_bf16(acc[4 * i], acc[4 * i + 1])),
            "r"(pack_bf16(acc[4 * i + 2], acc[4 * i + 3])),
            "r"(pack_bf16(acc[4 * i + 4], acc[4 * i + 5])),
            "r"(pack_bf16(acc[4 * i + 6], acc[4 * i + 7]))
            : "memory");
    }
}

// acc += the bias of the tile's columns (from `col`; past N: 0, their outputs are not stored).
__device__ __forceinline__ void add_bias(float (&lo)[64], float (&hi)[64], const bf16* bias,
                                         int col, int N) {
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < kBN / 8; i++) {
        const int c = col + 8 * i + 2 * tq;  // even, and N % 8 == 0: c + 1 < N when c < N
        float2 b = make_float2(0.f, 0.f);
        if (c < N) b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(bias + c));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            lo[4 * i + 2 * h] += b.x;
            lo[4 * i + 2 * h + 1] += b.y;
            hi[4 * i + 2 * h] += b.x;
            hi[4 * i + 2 * h + 1] += b.y;
        }
    }
}

// GELU of each value as bf16 would store it (the pre-activation the aux output holds).
__device__ __forceinline__ void gelu_of_rounded(float (&v)[64]) {
#pragma unroll
    for (int j = 0; j < 64; j++) v[j] = gelu_bf16(__bfloat162float(__float2bfloat16_rn(v[j])));
}

// The buffer's two 64-column boxes to `map` at (col, row), committed as one bulk group.
__device__ __forceinline__ void store_tile(const CUtensorMap* map, uint32_t buf, int col, int row) {
#pragma unroll
    for (int b = 0; b < kBN / 64; b++) tma_store(map, buf + b * (kBM * 128), col + 64 * b, row);
    tma_store_commit();
}

template <bool kGelu, bool kRope>
__global__ void __launch_bounds__(kThreads, 1)
    pingpong_kernel(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b,
                    const __grid_constant__ CUtensorMap map_d,
                    const __grid_constant__ CUtensorMap map_aux, const Params p) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t bufs = base + kStages * kStageBytes, bars = bufs + 2 * kBufBytes;
    auto a_tile = [&](int s) { return base + s * kStageBytes; };
    auto b_tile = [&](int s) { return base + s * kStageBytes + kTileBytes; };
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (kStages + s); };
    // turn(w): the other warpgroup has waited for every stage of its tile before w's next one
    auto turn = [&](int w) { return bars + 8 * (2 * kStages + w); };
    const int tid = threadIdx.x, lane = tid % 32;
    if (tid == 0) {
        for (int s = 0; s < kStages; s++) {
            bar_init(full(s), 1);
            bar_init(empty(s), 4);  // lane 0 of each warp of the consuming warpgroup
        }
        bar_init(turn(0), 4);  // lane 0 of each warp of the other warpgroup
        bar_init(turn(1), 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int ksteps = (p.K + kBK - 1) / kBK;
    constexpr uint32_t S = kStages;

    if (tid < 128) {  // warpgroup 0: thread 0 loads every iteration (tile, k step) in order
        if (tid == 0) {
            uint32_t j = 0;
            for (Tiles t(p); !t.done(); t.next())
                for (int k = 0; k < ksteps; k++, j++) {
                    const int s = int(j % S);
                    if (j >= S) bar_wait(empty(s), (j / S - 1) & 1);
                    bar_expect(full(s), kStageBytes);
                    tma_load(a_tile(s), &map_a, full(s), k * kBK, t.row);
                    tma_load(b_tile(s), &map_b, full(s), k * kBK, t.col);
                }
        }
        return;
    }

    const int cw = tid / 128 - 1, warp = tid % 128 / 32;
    const bool leader = tid % 128 == 0;  // issues and waits for the warpgroup's TMA stores
    const uint32_t buf = bufs + cw * kBufBytes;
    auto wg_sync = [&] { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory"); };
    // the buffer to `map`, once every thread of the warpgroup has staged its rows
    auto stage_and_store = [&](const float(&lo)[64], const float(&hi)[64], const CUtensorMap* map,
                               const Tiles& t) {
        if (leader) tma_store_wait_read();  // the buffer's previous store has read it
        wg_sync();
        stage_rows(buf, lo, warp * 16, lane);
        stage_rows(buf, hi, 64 + warp * 16, lane);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        wg_sync();
        if (leader) store_tile(map, buf, t.col, t.row);
    };
    Tiles t(p);
    if (cw == 1) t.next();
    for (uint32_t i = cw, m = 0; !t.done(); t.next(), t.next(), i += 2, m++) {
        float lo[64], hi[64];  // rows 0-63 and 64-127 of the tile
        const uint32_t j0 = i * uint32_t(ksteps);
        // Tile i starts once the other warpgroup has waited for every stage of tile i - 1. Then
        // iteration j - S of each stage this tile waits for has landed, so its `full` barrier is
        // at most one phase behind (a parity wait cannot tell phase u from u - 2, and the
        // producer runs up to S iterations ahead of the slower warpgroup); it also keeps the two
        // warpgroups' main loops in turn, one's products beside the other's epilogue.
        if (i > 0) bar_wait(turn(cw), (cw == 1 ? m : m - 1) & 1);
        for (int k = 0; k < ksteps; k++) {
            const uint32_t j = j0 + k;
            const int s = int(j % S);
            bar_wait(full(s), (j / S) & 1);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < kBK / 16; kk++) {
                const int acc = k > 0 || kk > 0;
                wgmma_128(lo, desc(a_tile(s) + 32 * kk), desc(b_tile(s) + 32 * kk), acc);
                wgmma_128(hi, desc(a_tile(s) + kTileBytes / 2 + 32 * kk), desc(b_tile(s) + 32 * kk),
                          acc);
            }
            wg_commit();
            if (k == ksteps - 1 && lane == 0) bar_arrive(turn(1 - cw));  // the other's turn
            if (k > 0) {
                wg_wait<1>();  // the previous stage's products are done: free it
                if (lane == 0) bar_arrive(empty(int((j - 1) % S)));
            }
        }
        wg_wait<0>();
        if (lane == 0) bar_arrive(empty(int((j0 + ksteps - 1) % S)));
        if (p.bias) add_bias(lo, hi, p.bias, t.col, p.N);
        // rows 0-63 and 64-127, the warp's 16 of each (ptxas spills about 100 bytes in this
        // kernel, none in the others: the two accumulators leave few registers)
        if constexpr (kRope) {
            rope_columns(lo, p, t.col, t.row + warp * 16 + lane / 4);
            rope_columns(hi, p, t.col, t.row + 64 + warp * 16 + lane / 4);
        }
        if constexpr (kGelu) {
            stage_and_store(lo, hi, &map_aux, t);
            gelu_of_rounded(lo);  // beside the TMA's read of the pre-activation
            gelu_of_rounded(hi);
        }
        stage_and_store(lo, hi, &map_d, t);
    }
    if (leader) tma_store_wait();  // the buffer must outlive the stores
#endif
}

template <bool kGelu, bool kRope>
void launch(const Gemm& g, CUstream_st* stream) {
    static std::once_flag once;
    std::call_once(once, [] {
        ZG_CUDA_CHECK(cudaFuncSetAttribute(pingpong_kernel<kGelu, kRope>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kSmemBytes));
    });
    const Params p = wgmma_params<kBM, kBN>(g);
    using hopper_gemm::tensor_map;
    const CUtensorMap ma = tensor_map(g.A, g.M, g.K, kBM, kBK);
    const CUtensorMap mb = tensor_map(g.B, g.N, g.K, kBN, kBK);
    const CUtensorMap md = tensor_map(g.D, g.M, g.N, kBM, 64);
    const CUtensorMap mx = kGelu ? tensor_map(g.aux, g.M, g.N, kBM, 64) : md;
    const int grid = std::min(p.tiles, compute_sm_count());
    pingpong_kernel<kGelu, kRope><<<grid, kThreads, kSmemBytes, stream>>>(ma, mb, md, mx, p);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool gemm_wgmma_pingpong(const Gemm& g, CUstream_st* stream) {
    ZG_CHECK(!wgmma_has_swiglu(g.epilogue), "gemm_wgmma_pingpong: SwiGLU is the cooperative's");
    if (wgmma_has_gelu(g.epilogue))
        launch<true, false>(g, stream);  // (gemm_wgmma_usable: no RoPE beside GELU)
    else if (g.rope_table)
        launch<false, true>(g, stream);
    else
        launch<false, false>(g, stream);
    return true;
}

}  // namespace zgpt::cuda

// The persistent Hopper GEMM core shared by the kernels that put their own epilogue behind h W^T
// (kernels/loss_head/linear_cross_entropy_wgmma.cu: the cross-entropy;
// kernels/gemm/matmul_wgmma.cu: bias, RoPE, GELU and SwiGLU). C = A B^T with A [M, K] and B [N, K]
// bf16, both K-major (row-major, K contiguous).
//
// Per CTA (one per SM, 384 threads): warpgroup 0 is the kernel's epilogue; warpgroups 1 and 2 are
// the consumers, 64 rows of each 128 x 256 tile each, on wgmma.m64n256k16 from a ring of stages (a
// 128 x 64 tile of A and a 256 x 64 tile of B each, loaded by the tensor memory accelerator in the
// 128-byte swizzle; rows and columns past the end arrive as zeros, so odd sizes need no masking).
// One consumer thread refills a stage once both warpgroups have freed it. At the end of a tile the
// consumers round the fp32 accumulator to bf16 into one tile buffer in shared memory (stmatrix, the
// swizzle the TMA store reads; Shape: the whole tile, or two halves one after the other) and go on
// to the next tile while the epilogue warpgroup works on the buffer: two mbarriers hand it back and
// forth (buf_full: the consumers wrote a tile; buf_empty: the epilogue is done with it). A fourth
// warpgroup (a producer) does not fit: a kernel of 512 threads gets 128 registers a thread, and
// ptxas needs 154 for the m64n256 accumulator.
//
// Pairs (a 2-CTA cluster, Pair): the two CTAs of a cluster take row tiles 2q and 2q + 1 with the
// same column tiles, so each loads its own A tile and half of the shared B tile, which the TMA
// multicasts into both CTAs' stages: a CTA reads 32 KB a stage from L2 instead of 48. A stage is
// then refilled once the consumers of both CTAs have freed it (each consumer warp arrives on its
// own CTA's `empty` barrier and on the peer's), and the thread that loads waits for the last
// stages' releases before its CTA may exit (the peer's arrivals land in its shared memory).
// fused_linear_wgmma runs pairs on request only (kernels.linear_ce_wgmma_cluster = 2): there they
// are as fast as single CTAs (kernels/loss_head/linear_cross_entropy_wgmma.cu).
//
// In an anonymous namespace, as kernels/gemm/wgmma.cuh: each translation unit keeps its copies.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/core/check.h"
#include "kernels/core/cuda_check.h"
#include "kernels/gemm/wgmma.cuh"

namespace zgpt::cuda::hopper_gemm {
namespace {

constexpr int kBM = 128;  // rows of A per tile (two warpgroups of 64)
constexpr int kBN = 256;  // rows of B (columns of C) per tile: the N of m64n256k16
constexpr int kBK = 64;   // K per stage: one 128-byte swizzled row
constexpr int kThreads = 3 * 128;
constexpr int kEpilogueThreads = 128;
constexpr int kATileBytes = kBM * kBK * 2;  // 16 KB
constexpr int kBTileBytes = kBN * kBK * 2;  // 32 KB
constexpr int kStageBytes = kATileBytes + kBTileBytes;
// The ring's stages and the tile buffer's columns: the whole 128 x 256 tile beside three stages
// (the fused cross-entropy, whose epilogue works on whole rows), or half of it, which the
// consumers fill twice per tile, beside four (the GEMM, whose epilogue only stores).
template <int kStages_, int kBufCols_>
struct Shape {
    static constexpr int kStages = kStages_, kBufCols = kBufCols_;
    static constexpr int kParts = kBN / kBufCols;  // buffer fills per tile
    static constexpr int kBufBytes = kBM * kBufCols * 2;
    static constexpr int kSmemBytes =
        kStages * kStageBytes + kBufBytes + 1024 /* alignment */ + 256 /* barriers */;
    static_assert(kSmemBytes <= 227 * 1024, "more than a CTA's shared memory");
    static_assert(kBN % kBufCols == 0 && kBufCols % 64 == 0, "whole 64-column boxes");
};
using WholeTile = Shape<3, 256>;
using HalfTile = Shape<4, 128>;

// ---------------------------------------------------------------- mbarriers, TMA
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint32_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_expect(uint32_t bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// A box of the 2-D tensor `map` at (x = column, y = row) into shared memory at `dst`, completing
// on the mbarrier `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int x,
                                         int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%3, %4}], [%2];\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(x), "r"(y)
        : "memory");
}
// The same box into the shared memory of every CTA of the cluster in `mask`, at the same offset,
// each completing its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map,
                                                   uint32_t bar, int x, int y, uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
        "cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(x), "r"(y), "h"(mask)
        : "memory");
}
// The CTA's rank in its cluster, the address of the same shared-memory word in CTA `rank`, an
// arrival on an mbarrier there, and a barrier of every thread of the cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t peer_smem(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// The arrival keeps the default semantics (release at CTA scope), as CUTLASS's cluster barriers
// do: with .release.cluster the pairs ran 18-26% slower than single CTAs, with the default as
// fast (bench_ce, H100; docs/cross_entropy.md). The stage it frees was read by
// wgmma, whose reads are complete once the warpgroup has waited for the products.
__device__ __forceinline__ void bar_arrive_cluster(uint32_t remote_bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;\n" ::
            : "memory");
}

// One box of `map` (128 rows x 64 columns here) from shared memory at `src` to the tensor at
// (x, y); the parts outside the tensor are not written. Completes in the thread's bulk group.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
        "r"(src), "r"(x), "r"(y)
        : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until the thread's bulk stores have read their shared memory.
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_wait() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// The epilogue threads' own barrier (named barrier 1; 0 is __syncthreads'): the first N threads.
template <int N = kEpilogueThreads>
__device__ __forceinline__ void epilogue_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- wgmma
// D (+)= A B^T over one k16 step: A 64 x 16, B 256 x 16, both K-major in shared memory; D the
// warpgroup's 64 x 256 fp32 accumulator (128 floats a thread: element j is row gq + 8 ((j / 2)
// % 2), column 8 (j / 4) + 2 tq + j % 2, with gq = lane / 4, tq = lane % 4 of its warp's 16 rows).
__device__ __forceinline__ void wgmma_256(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
        "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
        "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
        "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
        "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
        "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
        "%123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b), "r"(accumulate));
}

// ---------------------------------------------------------------- the tile buffer
// 128 rows x 256 (or 128) columns of bf16 as boxes of 64 columns (16 KB each) in the 128-byte
// swizzle the TMA store reads: column 8 c + e of row r is at box c / 8, 16-byte chunk (c % 8) ^ (r
// % 8) of the box's 128-byte row r. The consumers' stores (a warp: 8 rows x 4 pairs of one chunk)
// and the epilogue's 16-byte loads (a warp: 32 rows, one chunk each) are free of bank conflicts.
__device__ __forceinline__ uint32_t buf_chunk(uint32_t buf, int r, int c) {
    return buf + (c / 8) * (kBM * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}
// The consumer warp's 16 accumulator rows (r0 .. r0 + 15), columns [part x kCols, + kCols), into
// the buffer as bf16, four 8 x 8 blocks per stmatrix: the accumulator's pair 4 i + 2 h (+ 1) of a
// thread is row gq + 8 h, columns 8 i + 2 tq (+ 1), the fragment layout stmatrix takes. Lane L
// gives the address of row L % 8 of block L / 8: blocks (i, h = 0), (i, 1), (i + 1, 0), (i + 1, 1).
template <int kCols>
__device__ __forceinline__ void stage_tile(uint32_t buf, const float (&acc)[128], int r0, int lane,
                                           int part) {
    const int m = lane / 8, row = r0 + lane % 8 + 8 * (m % 2);
    const int i0 = part * (kCols / 8);
#pragma unroll
    for (int i = 0; i < kCols / 8; i += 2) {
        const uint32_t addr = buf_chunk(buf, row, i + m / 2);
        asm volatile(
            "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
            "r"(pack_bf16(acc[4 * (i0 + i)], acc[4 * (i0 + i) + 1])),
            "r"(pack_bf16(acc[4 * (i0 + i) + 2], acc[4 * (i0 + i) + 3])),
            "r"(pack_bf16(acc[4 * (i0 + i) + 4], acc[4 * (i0 + i) + 5])),
            "r"(pack_bf16(acc[4 * (i0 + i) + 6], acc[4 * (i0 + i) + 7]))
            : "memory");
    }
}
// 8 bf16 of the buffer as floats, and back.
__device__ __forceinline__ void lds_chunk(uint32_t addr, float (&v)[8]) {
    uint32_t w[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(addr)
                 : "memory");
#pragma unroll
    for (int k = 0; k < 4; k++) {  // a bf16 is the high half of its float
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
__device__ __forceinline__ void sts_chunk(uint32_t addr, const float (&v)[8]) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(pack_bf16(v[0], v[1])), "r"(pack_bf16(v[2], v[3])), "r"(pack_bf16(v[4], v[5])),
                 "r"(pack_bf16(v[6], v[7]))
                 : "memory");
}
// The buffer's first kBoxes boxes of 64 columns to the tensor `map` at (column x(b), row y) for
// box b, then wait until they have been read (the buffer may be rewritten after this). One thread.
template <int kBoxes, class X>
__device__ __forceinline__ void store_boxes_at(const CUtensorMap* map, uint32_t buf, int y, X&& x) {
#pragma unroll
    for (int b = 0; b < kBoxes; b++) tma_store(map, buf + b * (kBM * 128), x(b), y);
    tma_store_commit();
    tma_store_wait_read();
}
// The buffer's kCols / 64 boxes side by side from (column x, row y). One thread.
template <int kCols>
__device__ __forceinline__ void store_buffer(const CUtensorMap* map, uint32_t buf, int x, int y) {
    store_boxes_at<kCols / 64>(map, buf, y, [x](int b) { return x + 64 * b; });
}

// ---------------------------------------------------------------- shared memory
template <class Cfg>
struct Smem {
    static constexpr int kStages = Cfg::kStages;
    uint32_t base, buf, bars;
    __device__ uint32_t a_tile(int s) const { return base + s * kStageBytes; }
    __device__ uint32_t b_tile(int s) const { return base + s * kStageBytes + kATileBytes; }
    __device__ uint32_t full(int s) const { return bars + 8 * s; }
    __device__ uint32_t empty(int s) const { return bars + 8 * (kStages + s); }
    __device__ uint32_t buf_full() const { return bars + 16 * kStages; }
    __device__ uint32_t buf_empty() const { return bars + 16 * kStages + 8; }
};
// Whether the kernel runs in 2-CTA clusters (launched so), and this CTA's rank in its pair.
struct Pair {
    bool on = false;
    uint32_t rank = 0;
    __device__ static Pair of(bool on) { return Pair{on, on ? cluster_rank() : 0u}; }
};

// The ring, the tile buffer and the barriers in the dynamic shared memory (Cfg::kSmemBytes), the
// barriers initialised (buf_empty takes one arrival from each of `epilogue_warps` warps; in a pair,
// `empty` takes the consumer warps of both CTAs) and, in a pair, visible to the peer; every thread
// of the CTA calls it.
template <class Cfg>
__device__ __forceinline__ Smem<Cfg> setup_smem(unsigned char* raw,
                                                int epilogue_warps = kEpilogueThreads / 32,
                                                Pair pair = {}) {
    Smem<Cfg> m;
    m.base = (smem_u32(raw) + 1023u) & ~1023u;
    m.buf = m.base + Cfg::kStages * kStageBytes;
    m.bars = m.buf + Cfg::kBufBytes;
    if (threadIdx.x == 0) {
        for (int s = 0; s < Cfg::kStages; s++) {
            bar_init(m.full(s), 1);
            bar_init(m.empty(s), pair.on ? 16 : 8);  // lane 0 of each consumer warp (of both)
        }
        bar_init(m.buf_full(), 8);  // lane 0 of each consumer warp
        bar_init(m.buf_empty(), unsigned(epilogue_warps));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (pair.on)
        cluster_sync();  // the peer's multicasts and arrivals find the barriers initialised
    else
        __syncthreads();
    return m;
}

// ---------------------------------------------------------------- loads and products
// `Tiles` walks the CTA's tiles in order: done(), row (of A) and col (row of B) of the current
// tile, next().
//
// Where the loads are: the CTA's iterations (tile, k step) in the consumers' order; issue(s) loads
// the next one into stage s, completing its full barrier.
//
// In a pair, map_b's boxes are half a B tile (kBN / 2 rows): this CTA loads half `rank` into both
// CTAs, and its `full` barrier counts the peer's half as well.
//
// With `up` > 0 (SwiGLU, not in a pair), map_b's boxes are half a B tile too: rows col .. col + 127
// into the first half and rows up + col .. into the second, so that consumer columns c and c + 128
// are the gate and up columns of one hidden unit (B's rows [0, up) the gate weights, then the up
// weights).
template <class Cfg, class Tiles>
struct Loads {
    const Smem<Cfg>& sm;
    const CUtensorMap *map_a, *map_b;
    Tiles next;
    int ksteps;
    Pair pair;
    int up = 0;
    int k = 0;
    __device__ bool done() const { return next.done(); }
    __device__ void issue(int s) {
        bar_expect(sm.full(s), kStageBytes);  // B's two boxes (a pair's, SwiGLU's) are its tile
        tma_load(sm.a_tile(s), map_a, sm.full(s), k * kBK, next.row);
        if (pair.on) {
            const int half = int(pair.rank) * (kBN / 2);
            tma_load_multicast(sm.b_tile(s) + half * 128, map_b, sm.full(s), k * kBK,
                               next.col + half, uint16_t(3));
        } else if (up > 0) {
            tma_load(sm.b_tile(s), map_b, sm.full(s), k * kBK, next.col);
            tma_load(sm.b_tile(s) + (kBN / 2) * 128, map_b, sm.full(s), k * kBK, up + next.col);
        } else {
            tma_load(sm.b_tile(s), map_b, sm.full(s), k * kBK, next.col);
        }
        if (++k == ksteps) {
            k = 0;
            next.next();
        }
    }
};

// In a pair: the releases of the last stages of the CTA's `n` iterations, which no refill waited
// for. The peer's consumers arrive on this CTA's barriers, so the CTA must not exit before them.
template <class Cfg>
__device__ __forceinline__ void wait_last_releases(const Smem<Cfg>& sm, Pair pair, uint32_t n) {
    constexpr uint32_t S = Cfg::kStages;
    if (!pair.on) return;
    for (uint32_t j = n > S ? n - S : 0; j < n; j++) bar_wait(sm.empty(int(j % S)), (j / S) & 1);
}

// All the CTA's loads from one thread outside the consumers (a producer): iteration j into stage
// j % S once the consumers have freed iteration j - S.
template <class Cfg, class Tiles>
__device__ __forceinline__ void produce(const Smem<Cfg>& sm, const CUtensorMap* map_a,
                                        const CUtensorMap* map_b, Tiles tiles, int ksteps,
                                        Pair pair = {}, int up = 0) {
    constexpr uint32_t S = Cfg::kStages;
    Loads<Cfg, Tiles> loads{sm, map_a, map_b, tiles, ksteps, pair, up};
    uint32_t j = 0;
    for (; !loads.done(); j++) {
        const int s = int(j % S);
        if (j >= S) bar_wait(sm.empty(s), (j / S - 1) & 1);
        loads.issue(s);
    }
    wait_last_releases<Cfg>(sm, pair, j);
}

// The consumers' loop over the CTA's tiles. For each tile: the products over the ring (`ksteps`
// stages of kBK per tile; with kLoads, thread 128 also issues the loads, refilling each stage once
// both warpgroups have freed it; without, produce() runs elsewhere), then transform(acc, tiles)
// (what the kernel adds in fp32, such as a bias) and the accumulator into the tile buffer once the
// epilogue has freed it. Called by warpgroups 1 and 2. `up`: Loads' split B tile (SwiGLU).
template <class Cfg, bool kLoads, class Tiles, class Transform>
__device__ __forceinline__ void consume(const Smem<Cfg>& sm, const CUtensorMap* map_a,
                                        const CUtensorMap* map_b, Tiles tiles, int ksteps,
                                        Transform&& transform, Pair pair = {}, int up = 0) {
    constexpr int S = Cfg::kStages;
    const int tid = threadIdx.x, cw = tid / 128 - 1, warp = tid % 128 / 32, lane = tid % 32;
    const bool loader = kLoads && tid == 128;
    Loads<Cfg, Tiles> loads{sm, map_a, map_b, tiles, ksteps, pair, up};
    // stage s freed by this warp: in a pair, for the peer's loads into it as well
    const uint32_t peer_empty0 = pair.on ? peer_smem(sm.empty(0), pair.rank ^ 1u) : 0u;
    auto release = [&](int s) {
        if (lane != 0) return;
        bar_arrive(sm.empty(s));
        if (pair.on) bar_arrive_cluster(peer_empty0 + 8 * s);
    };
    auto refill = [&](uint32_t j) {  // stage j % S was freed by this warpgroup after iteration j
        if (!loader || loads.done()) return;
        bar_wait(sm.empty(int(j % S)), (j / S) & 1);
        loads.issue(int(j % S));
    };
    if (loader)
        for (int s = 0; s < S && !loads.done(); s++) loads.issue(s);
    uint32_t it = 0, n = 0;  // n: buffer fills so far
    for (; !tiles.done(); tiles.next()) {
        float acc[128];
        for (int k = 0; k < ksteps; k++, it++) {
            const int s = int(it % S);
            bar_wait(sm.full(s), (it / S) & 1);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < kBK / 16; kk++)
                wgmma_256(acc, desc(sm.a_tile(s) + cw * (kATileBytes / 2) + 32 * kk),
                          desc(sm.b_tile(s) + 32 * kk), k > 0 || kk > 0);
            wg_commit();
            if (k > 0) {
                wg_wait<1>();  // the previous stage's products are done: free it
                release(int((it - 1) % S));
                refill(it - 1);
            }
        }
        wg_wait<0>();
        release(int((it - 1) % S));
        refill(it - 1);
        transform(acc, tiles);
        for (int part = 0; part < Cfg::kParts; part++, n++) {
            if (n > 0)
                bar_wait(sm.buf_empty(), (n - 1) & 1);  // the epilogue is done with fill n - 1
            stage_tile<Cfg::kBufCols>(sm.buf, acc, cw * 64 + warp * 16, lane, part);
            __syncwarp();
            if (lane == 0) bar_arrive(sm.buf_full());
        }
    }
    if (loader) wait_last_releases<Cfg>(sm, pair, it);
}

// ---------------------------------------------------------------- host
using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

inline EncodeTiled encoder() {
    static EncodeTiled fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult q{};
        ZG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                       cudaEnableDefault, &q));
        ZG_CHECK(f && q == cudaDriverEntryPointSuccess,
                 "the driver has no cuTensorMapEncodeTiled (needed by the Hopper GEMM kernels)");
        return reinterpret_cast<EncodeTiled>(f);
    }();
    return fn;
}

// A dense row-major tensor of `dims` (innermost first; rank 2 or 3) as a TMA map of boxes of
// `box`: bf16 tiles in the 128-byte swizzle that wgmma reads, or fp32 rows unswizzled. Outside
// the tensor the boxes read zeros.
inline CUtensorMap tensor_map_nd(const void* base, bool bf16_tile, int rank, const cuuint64_t* dims,
                                 const cuuint32_t* box) {
    const cuuint64_t elem = bf16_tile ? 2 : 4;
    const cuuint64_t strides[2] = {dims[0] * elem, dims[0] * dims[1] * elem};
    const cuuint32_t step[3] = {1, 1, 1};
    CUtensorMap m;
    const CUresult r = encoder()(
        &m, bf16_tile ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        cuuint32_t(rank), const_cast<void*>(base), dims, strides, box, step,
        CU_TENSOR_MAP_INTERLEAVE_NONE,
        bf16_tile ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    ZG_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
    return m;
}

// A [rows, cols] bf16 row-major matrix as a TMA map of boxes of box_rows x box_cols (box_cols x 2
// = 128 bytes) in the 128-byte swizzle.
inline CUtensorMap tensor_map(const void* base, int64_t rows, int64_t cols, int box_rows,
                              int box_cols) {
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    return tensor_map_nd(base, true, 2, dims, box);
}

}  // namespace
}  // namespace zgpt::cuda::hopper_gemm

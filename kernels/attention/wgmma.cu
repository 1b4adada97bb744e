// Causal attention on Hopper's warpgroup MMA (wgmma), bf16, head size 64, fp32 accumulation.
//
// The schedule of attention/mma.cu (FlashAttention-2: online softmax, dK/dV over key blocks and dQ
// over query blocks, one writer per output, no atomics), with each product issued by a warpgroup
// (4 warps, 64 rows) as wgmma.m64nNk16 instead of per-warp mma.sync m16n8k16. Why it pays: the
// tensor core reads its operands straight from shared memory, so the ldmatrix traffic and much
// of the instruction issue of the mma.sync kernels (which are issue-bound, see there) go.
// Measured faster than the mma.sync kernels in both directions and in the step (the ablation's
// flash_mma row, docs/experiments/ablate-124m).
//
// - Tiles live in shared memory in the 128-byte swizzle that wgmma reads: a row of 64 bf16 is
//   128 bytes, and its 16-byte chunk c sits at chunk c ^ (row % 8). Tiles start 1024-aligned.
// - Left operands that stay for the whole kernel (Q in the forward; Q, dO or K, V in backward)
//   are read from shared memory too. P and dS come from registers: converted from the
//   accumulator of the product before (the accumulator layout of m64nNk16 is the A-fragment
//   layout of the next product, as with mma.sync). Q fragments held in registers across the
//   tile loop gave wrong scores from the second tile on (measured on the H100: with Q = 0 the
//   scores of tile 1 came out as the previous tile's P times K), so register A operands are
//   only ever values produced in the same iteration, kept alive (keep()) until their wgmma
//   group has been waited for.
// - The right operand is K-major (rows of the tile are the N index: K in Q K^T) or, with the
//   transpose bit, N-major (V in P V: rows of the tile are the K index).
// - The streamed tiles come from the tensor memory accelerator into a ring of four stages handed
//   over by mbarriers (TmaRing, the default), or (the kernels.attention_tuning.wgmma_*_tma keys
//   false, and the tiles kept for the whole kernel) by cp.async with a proxy fence that makes the
//   copies visible to wgmma, which reads shared memory through the async proxy; the cp.async ring
//   (three stages, one block barrier per tile) is attention/mma.cu's.
// - Grouped-query attention: query head h reads key/value head h / group; a dK/dV block owns one
//   key/value head's keys and walks the query tiles of its group's heads in turn (kGroup), dK and
//   dV summed in registers in head order. Without groups (kGroup false) the group of one is known
//   at compile time, and the kernels are multi-head attention's.
#include "kernels/attention/wgmma.h"

#include <algorithm>
#include <string>

#include "kernels/attention/geo.cuh"
#include "kernels/attention/tc.cuh"
#include "kernels/core/cuda_common.cuh"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/hopper_gemm.cuh"
#include "kernels/gemm/wgmma.cuh"

namespace zgpt::cuda::attention_wgmma {

namespace {

using namespace attention_tc;
using Geo = AttentionGeo;
constexpr int kD = 64;                 // head size: one 128-byte swizzled row
constexpr int kWG = 128;               // threads per warpgroup
constexpr int kRows = 64;              // rows per warpgroup (the M of m64nNk16)
constexpr int kBlockRows = 2 * kRows;  // two warpgroups per block share each streamed tile
constexpr int kThreads = 2 * kWG;
constexpr int kDefaultDkdvWgs = 2;  // warpgroups per dK/dV block (see dkdv_kernel)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZG_NO_WGMMA 1  // device pass for another architecture: the kernels compile to a trap
#endif

// ---------------------------------------------------------------- shared-memory tiles
// Byte offset of chunk c (8 elements) of row r in a swizzled tile.
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
}
// Rows [r0, r0 + ROWS) of one head's slice (rows of `stride` elements from base) into the tile at
// shared address `tile`, 16 bytes per cp.async; rows past Tn are zero-filled. `tid` (< NT) counts
// the NT threads that share the copy. A thread copies chunk tid % 8 of rows tid / 8 + k NT / 8:
// its chunk and the rows' swizzle phase (row % 8) are the same for every k, so one address per
// operand serves all its copies (the general loop cost ~25 integer instructions a copy, a third
// of the forward kernel's tile loop).
template <int ROWS, int NT>
__device__ __forceinline__ void stage_tile(uint32_t tile, const bf16* base, int64_t stride,
                                           int64_t r0, int64_t Tn, int tid) {
    constexpr int kPassRows = NT / 8;  // rows per pass of all NT threads
    static_assert(kPassRows % 8 == 0 && ROWS % kPassRows == 0, "one swizzle phase per thread");
    const int r = tid / 8, c = tid % 8;
    const uint32_t dst = tile + swz(r, c);
    const bf16* src = base + (r0 + r) * stride + c * 8;
    const int64_t left = Tn - r0 - r;  // this thread's rows from r on that exist
#pragma unroll
    for (int k = 0; k < ROWS / kPassRows; k++) {
        const bool in = k * kPassRows < left;
        asm volatile(
            "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + k * kPassRows * 128),
            "l"(in ? src + k * kPassRows * stride : base), "r"(in ? 16 : 0));
    }
}
// Waits for all but the newest copy group, then makes the landed tiles visible to wgmma and to
// every thread of the block.
__device__ __forceinline__ void wait_prev_and_sync() {
    wait_prev();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}
// ---------------------------------------------------------------- wgmma
// desc(), wg_fence(), wg_commit(), wg_wait<N>(): kernels/gemm/wgmma.cuh
__device__ __forceinline__ void wg_wait_all() {
    wg_wait<0>();
}
// Keeps the compiler from touching accumulator registers across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void hold(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// Keeps A-fragment registers alive (unchanged) until here: a wgmma reads them asynchronously.
template <int K>
__device__ __forceinline__ void keep(const uint32_t (&a)[K][4]) {
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" ::"r"(a[k][j]) : "memory");
}

// The accumulator of an m64nN wgmma, N / 2 floats per thread, as asm operands %0 ... ("+f").
#define ZG_WGMMA_ACC16(d)                                                                       \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15])
#define ZG_WGMMA_ACC32(d)                                                                          \
    ZG_WGMMA_ACC16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),            \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define ZG_WGMMA_ACC64(d)                                                                          \
    ZG_WGMMA_ACC32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),            \
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// m64nNk16, bf16 in, fp32 accumulate; TB = 1 reads B N-major (transposed). The kernels use ss
// (both operands in shared memory) at N = 32, 64 and 128, and rs (A in registers) at N = 64.
template <int N, int TB>
struct Wgmma;
template <int TB>
struct Wgmma<64, TB> {
    // D (+)= A B: A 64 x 16 and B 16 x 64 in shared memory (A K-major).
    static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, "
            "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, "
            "%25, %26, %27, %28, %29, %30, %31}, "
            "%32, %33, p, 1, 1, 0, %35;\n}\n"
            : ZG_WGMMA_ACC32(d)
            : "l"(a), "l"(b), "r"(accumulate), "n"(TB));
    }
    // D (+)= A B: A 64 x 16 in registers, B 16 x 64 in shared memory.
    static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, "
            "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, "
            "%25, %26, %27, %28, %29, %30, %31}, "
            "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
            : ZG_WGMMA_ACC32(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TB), "r"(accumulate));
    }
};
template <int TB>
struct Wgmma<32, TB> {
    // D (+)= A B: A 64 x 16 and B 16 x 32 in shared memory (A K-major).
    static __device__ __forceinline__ void ss(float (&d)[16], uint64_t a, uint64_t b,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, "
            "%8, %9, %10, %11, %12, %13, %14, %15}, "
            "%16, %17, p, 1, 1, 0, %19;\n}\n"
            : ZG_WGMMA_ACC16(d)
            : "l"(a), "l"(b), "r"(accumulate), "n"(TB));
    }
};

template <int TB>
struct Wgmma<128, TB> {
    // D (+)= A B: A 64 x 16 and B 16 x 128 in shared memory (A K-major).
    static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b,
                                              int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1, 0, %67;\n}\n"
            : ZG_WGMMA_ACC64(d)
            : "l"(a), "l"(b), "r"(accumulate), "n"(TB));
    }
};

// D += A B over K rows: A the accumulator pairs of a 64 x K product (as bf16 fragments), B a tile
// of K rows x kD (N-major) at `tile`.
template <int K>
__device__ __forceinline__ void product_nmajor(float (&d)[kD / 2], const uint32_t (&a)[K / 16][4],
                                               uint32_t tile) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) Wgmma<kD, 1>::rs(d, a[kk], desc(tile + 2048 * kk), 1);
}
// Accumulator (64 x N, this thread: n-tiles of 4) as N / 16 bf16 A fragments.
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[N / 16][4], const float (&s)[N / 2]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        a[kk][0] = pack(s[8 * kk + 0], s[8 * kk + 1]);
        a[kk][1] = pack(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = pack(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

// D = A B^T over kD: A the warpgroup's 64 rows of a tile at `a`, B a tile of N rows at `b`, both
// K-major in shared memory.
template <int N>
__device__ __forceinline__ void product_smem(float (&d)[N / 2], uint32_t a, uint32_t b) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; kk++)
        Wgmma<N, 0>::ss(d, desc(a + 32 * kk), desc(b + 32 * kk), kk > 0);
}
// The backward's two products of a tile, x = A B^T and y = C D^T (S and dP, or their
// transposes), issued as two groups; returns once x has landed, y still running (so the
// exponentials on x overlap it).
template <int N>
__device__ __forceinline__ void product_pair(float (&x)[N / 2], uint32_t a, uint32_t b,
                                             float (&y)[N / 2], uint32_t c, uint32_t d) {
    wg_fence();
    product_smem<N>(x, a, b);
    wg_commit();
    product_smem<N>(y, c, d);
    wg_commit();
    wg_wait<1>();
    hold(x);
}

// ---------------------------------------------------------------- outputs
// Row gq + 8 r of this warp's 16 x kD accumulator rows, times scale, as bf16 at dst. kResidual:
// what that rounding loses instead (pack_residual), for tuning.unrounded_dsum.
template <bool kResidual = false>
__device__ __forceinline__ void store_row(bf16* dst, const float (&acc)[kD / 2], int r,
                                          float scale) {
    const int tq = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < kD / 8; n++) {
        const float lo = acc[4 * n + 2 * r] * scale, hi = acc[4 * n + 2 * r + 1] * scale;
        *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * tq) =
            kResidual ? pack_residual(lo, hi) : pack(lo, hi);
    }
}
// store_row of a dq or dk row at position `pos` with the inverse rotary rotation (Geo::rope; the
// transpose of the forward's): channel c < 32 pairs with c + 32, and both sit in this thread
// (fragments n and n + 4). Rotated in fp32 before the one rounding to bf16.
__device__ __forceinline__ void store_row_unrotated(bf16* dst, const float (&acc)[kD / 2], int r,
                                                    float scale, const Geo& g, int64_t pos) {
    const int tq = threadIdx.x % 4;
    const float* cs = g.rope + pos * (kD / 2);
    const float* sn = cs + g.Tn * (kD / 2);
#pragma unroll
    for (int n = 0; n < kD / 16; n++) {
        const int c = n * 8 + 2 * tq;
        const float2 co = *reinterpret_cast<const float2*>(cs + c);
        const float2 si = *reinterpret_cast<const float2*>(sn + c);
        const float y1a = acc[4 * n + 2 * r] * scale, y1b = acc[4 * n + 2 * r + 1] * scale;
        const float y2a = acc[4 * (n + 4) + 2 * r] * scale;
        const float y2b = acc[4 * (n + 4) + 2 * r + 1] * scale;
        *reinterpret_cast<uint32_t*>(dst + c) =
            pack(y1a * co.x + y2a * si.x, y1b * co.y + y2b * si.y);
        *reinterpret_cast<uint32_t*>(dst + c + kD / 2) =
            pack(y2a * co.x - y1a * si.x, y2b * co.y - y1b * si.y);
    }
}
// Column sums of the block's accumulators (rows at or past Tn left out; wrow0: this thread's
// warp's first row index), times scale, into dst[0, kD): this lane's partial sums of its two rows,
// then block_column_sums<kD, NT / 32> (attention/tc.cuh). Every thread of the group calls it.
template <int NT, typename Group = WholeBlock>
__device__ __forceinline__ void masked_column_sums(float* dst, const float (&acc)[kD / 2],
                                                   int64_t wrow0, int64_t Tn, float scale,
                                                   float (*red)[kD], Group group = {}) {
    const int gq = threadIdx.x % 32 / 4;
    float cs[kD / 8][2];
#pragma unroll
    for (int n = 0; n < kD / 8; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float v = 0;
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (wrow0 + gq + 8 * r < Tn) v += acc[4 * n + 2 * r + c];
            cs[n][c] = v;
        }
    block_column_sums<kD, NT / 32>(dst, cs, scale, red, group);
    group.sync();  // red is reused by the next call
}

// Where a block writes its partial column sums (the qkv bias gradient): row b * per_batch +
// block * step of the [B * per_batch, C + 2 KVC] buffer. per_batch counts the blocks of the kernel
// with the most (64-row blocks when the dK/dV kernel has one warpgroup); the other kernel's blocks
// are `step` rows apart and the rows between them stay zero (backward clears the buffer then).
struct ColsumRows {
    int64_t per_batch, step;
    __device__ __forceinline__ int64_t row(int64_t b, int64_t block) const {
        return b * per_batch + block * step;
    }
};

__device__ __forceinline__ uint32_t aligned_smem(unsigned char* raw) {
    return (uint32_t(__cvta_generic_to_shared(raw)) + 1023u) & ~1023u;
}

// ---------------------------------------------------------------- TMA tile rings
// The streamed tiles of the kernels (kernels.attention_tuning.wgmma_fwd_tma, wgmma_dq_tma,
// wgmma_dkdv_tma):
// loaded by the tensor memory accelerator into a ring of kTmaStages stages, each handed over by
// mbarriers instead of a block-wide barrier per tile: `full` (the tile landed: one arrival with
// its bytes) and `empty` (every warp is done with it: one arrival from each of the 8 warps that
// compute; the warp-specialised kernels' loader warpgroup does not arrive). Thread 0 issues the
// loads kTmaAhead tiles ahead, so the two warpgroups can drift apart by up to kTmaAhead tiles
// (one's exponentials beside the other's products) while still sharing each tile. Rows past Tn
// arrive as zeros, as the cp.async staging's zero-fill gives them. The maps need Tn % 4 == 0 (lse
// and Dsum rows in 16-byte units, a TMA rule).
constexpr int kTmaStages = 4, kTmaAhead = 2, kTmaRows = 64;
constexpr int kTmaTileBytes = kTmaRows * 128;  // 64 rows of 128 bytes: a Q, dO, K or V tile

// A box of a 3-D tensor map at (x, y, z) into shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int x, int y, int z) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%3, %4, %5}], [%2];\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(x), "r"(y), "r"(z)
        : "memory");
}

// Tile j lives in stage j % S (stage_bytes each, from `ring`); the barriers at `bars`. S is
// kTmaStages but in the forward with 128-key tiles, whose stages are twice the size.
template <int S>
struct TmaRingOf {
    uint32_t ring, bars;
    int stage_bytes;
    __device__ uint32_t stage(int j) const { return ring + (j % S) * stage_bytes; }
    __device__ uint32_t full(int j) const { return bars + 8 * (j % S); }
    __device__ uint32_t empty(int j) const { return bars + 8 * (S + j % S); }
    // thread 0, before any other use (a block barrier makes it visible to the others)
    __device__ void init() const {
        for (int s = 0; s < S; s++) {
            hopper_gemm::bar_init(full(s), 1);
            hopper_gemm::bar_init(empty(s), kThreads / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // the issuing thread: tile j's stage, once every warp has released tile j - S, set to
    // expect `bytes`
    __device__ uint32_t acquire(int j, unsigned bytes) const {
        if (j >= S) hopper_gemm::bar_wait(empty(j), unsigned((j / S + 1) & 1));
        hopper_gemm::bar_expect(full(j), bytes);
        return stage(j);
    }
    __device__ void wait(int j) const { hopper_gemm::bar_wait(full(j), unsigned((j / S) & 1)); }
    // every thread, once its warp is done with tile j (its wgmma groups waited for)
    __device__ void release(int j) const {
        __syncwarp();
        if (threadIdx.x % 32 == 0) hopper_gemm::bar_arrive(empty(j));
    }
};
using TmaRing = TmaRingOf<kTmaStages>;

// The forward and dQ kernels stream key tiles of kKeys rows of one key/value head: its K rows,
// then its V rows right after them (kKeys * 128 bytes each) in one slot of the cp.async ring or
// one stage of the TMA ring. kvbase: the head's k columns of row 0 of its batch in qkv
// [B, T, C + 2 KVC] (its v columns are KVC further).
template <int kKeys>
__device__ __forceinline__ void stage_kv_tile(uint32_t k_dst, const bf16* kvbase, const Geo& g,
                                              int64_t t, int tid) {
    stage_tile<kKeys, kThreads>(k_dst, kvbase, g.ld, t * kKeys, g.Tn, tid);
    stage_tile<kKeys, kThreads>(k_dst + kKeys * 128, kvbase + g.KVC, g.ld, t * kKeys, g.Tn, tid);
}
// TMA: key tile j of batch b, key/value head kvh, from qkv's [B, T, C + 2 KVC] map into ring
// stage j.
// A tile of more than kTmaRows keys arrives as several boxes, stacked (a swizzled tile of 128
// rows is two of 64 rows, one after the other).
template <int kKeys, typename Ring>
__device__ __forceinline__ void issue_kv_tile(const Ring& ring, int j, const CUtensorMap* map,
                                              const Geo& g, int64_t b, int64_t kvh) {
    constexpr int kBytes = kKeys * 128, kBoxes = kKeys > kTmaRows ? kKeys / kTmaRows : 1;
    const uint32_t st = ring.acquire(j, 2 * kBytes);
    const int x = int(g.k_col(kvh)), y = j * kKeys;
#pragma unroll
    for (int p = 0; p < kBoxes; p++) {
        tma_load_3d(st + p * kTmaTileBytes, map, ring.full(j), x, y + p * kTmaRows, int(b));
        tma_load_3d(st + kBytes + p * kTmaTileBytes, map, ring.full(j), int(x + g.KVC),
                    y + p * kTmaRows, int(b));
    }
}

// ---------------------------------------------------------------- forward
// A block: 128 query rows (64 per warpgroup), key tiles of KT streamed through the ring. Q stays
// in shared memory; S = Q K^T reads Q and K from there, O += P V takes P from registers and V
// from shared memory (N-major). KT is 128 with the TMA ring (the default), or 64
// (kernels.attention_tuning.wgmma_fwd_keys; the cp.async ring's only size). 128 keys make half
// the tiles, so half the waits for a product and half the softmax's per-tile work (row maxima
// across the quad, the output's rescaling), for products twice the size and the diagonal tile
// of a block's first warpgroup half masked: faster alone at the shapes of every GPT-2 size and
// in the 1558M step (docs/results/gpt2_sizes_h200.json, attention_fwd_keys).
constexpr int kFwdKeys = 64;
constexpr int kFwdTileBytes = kFwdKeys * 128;  // 64 rows of one swizzled tile
// The TMA ring of the forward: four stages of 64 keys loaded two ahead, or two of 128 loaded one
// ahead (two blocks an SM: three stages of 128 keys would exceed the shared memory by 96 bytes).
template <int KT>
constexpr int kFwdTmaStages = KT == kFwdKeys ? kTmaStages : 2;
template <int KT>
constexpr int kFwdTmaAhead = KT == kFwdKeys ? kTmaAhead : 1;
template <int KT, bool kTma>
constexpr int fwd_smem_bytes() {
    constexpr int stages = kTma ? kFwdTmaStages<KT> : kStages;
    return 1024 + kBlockRows * 128 + stages * 2 * KT * 128 + (kTma ? 2 * stages * 8 : 0);
}

// One key tile of a warpgroup's online softmax (this thread: rows gq and gq + 8 of its warp's
// 16; m and l in log2 units of the scaled scores): the scores s become probabilities in place, m
// and l take the tile in, and corr is the factor the output accumulated so far takes. rel: the
// tile's first key from the warpgroup's first row; a tile with a key past some row's (rel > -KT)
// is masked (key c is seen by row r only if c <= r). Every row sees some key of every tile it
// gets: tile 0 starts at key 0, and a later tile that reaches past a row starts at or before it.
// Both forward kernels run it.
template <int KT>
__device__ __forceinline__ void softmax_tile(float (&s)[KT / 2], int rel, float sl2, int warp,
                                             int gq, int tq, float (&m)[2], float (&l)[2],
                                             float (&corr)[2]) {
    if (rel > -KT) {
#pragma unroll
        for (int n = 0; n < KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (rel + n * 8 + 2 * tq + (e & 1) > warp * 16 + gq + (e >> 1) * 8)
                    s[4 * n + e] = -INFINITY;
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < KT / 2; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], scaled_score(mx[r], sl2));  // key 0 (tile 0) makes it finite
        corr[r] = ex2(m[r] - mn);
        m[r] = mn;
        l[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < KT / 2; i++) {
        const int r = (i >> 1) & 1;
        s[i] = ex2(scaled_score(s[i], sl2) - m[r]);
        l[r] += s[i];
    }
}
// The warpgroup's rows below Tn: O / l as bf16, and the lse (natural log); with ores, O's
// rounding residual too (tuning.unrounded_dsum).
__device__ __forceinline__ void store_forward_rows(bf16* out, float* lse, bf16* ores,
                                                   const float (&o)[kD / 2], const float (&m)[2],
                                                   const float (&l)[2], int64_t row0, int warp,
                                                   int gq, int tq, int64_t b, int64_t h, int64_t bh,
                                                   const Geo& g) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int64_t row = row0 + warp * 16 + gq + r * 8;
        if (row >= g.Tn) continue;
        const int64_t at = (b * g.Tn + row) * g.C + h * g.hs;
        store_row(out + at, o, r, 1.0f / sum);
        if (ores) store_row<true>(ores + at, o, r, 1.0f / sum);
        if (tq == 0) lse[bh * g.Tn + row] = (m[r] + __log2f(sum)) * kLn2;
    }
}

// kTma: the key tiles through a TMA ring (kernels.attention_tuning.wgmma_fwd_tma) instead of the
// cp.async ring and its barrier per tile; kv_map is then qkv's [B, T, C + 2 KVC] map. KT: keys
// per tile (64; 128 with kTma only).
template <int KT, bool kTma>
__global__ void __launch_bounds__(kThreads, 2)
    forward_kernel(bf16* out, float* lse, bf16* ores, const bf16* qkv, Geo g,
                   const __grid_constant__ CUtensorMap kv_map) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    static_assert(KT == kFwdKeys || (KT == 2 * kFwdKeys && kTma), "64 keys, or 128 by TMA");
    constexpr int kRing = kTma ? kFwdTmaStages<KT> : kStages, kAhead = kFwdTmaAhead<KT>;
    constexpr int kTileBytes = KT * 128;
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t q_tile = aligned_smem(smem);
    auto k_tile = [&](int slot) { return q_tile + kBlockRows * 128 + slot * 2 * kTileBytes; };
    auto v_tile = [&](int slot) { return k_tile(slot) + kTileBytes; };
    const TmaRingOf<kRing> ring{k_tile(0), k_tile(kRing), 2 * kTileBytes};
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;  // heaviest first
    const int tid = threadIdx.x, wg = tid / kWG, warp = tid % kWG / 32, lane = tid % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld, kvh = h / g.group;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* kvbase = qkv + b * g.Tn * stride + g.k_col(kvh);
    const int64_t key_tiles = (g.Tn + KT - 1) / KT;
    const int64_t tiles = std::min<int64_t>((q0 + kBlockRows) / KT, key_tiles);
    auto stage_kv = [&](int64_t t, int slot) {
        stage_kv_tile<KT>(k_tile(slot), kvbase, g, t, tid);
    };
    auto issue = [&](int j) { issue_kv_tile<KT>(ring, j, &kv_map, g, b, kvh); };
    if (kTma && tid == 0) {
        ring.init();
        for (int j = 0; j < kAhead && j < tiles; j++) issue(j);
    }
    stage_tile<kBlockRows, kThreads>(q_tile, qbase, stride, q0, g.Tn, tid);
    if (!kTma) stage_kv(0, 0);
    commit();
    if (!kTma && tiles > 1) stage_kv(1, 1);
    commit();
    wait_prev_and_sync();  // Q and (cp.async ring) key tile 0; the barriers initialised
    const uint32_t q_rows = q_tile + wg * kRows * 128;  // this warpgroup's rows of Q

    const float sl2 = g.scale * kLog2e;
    const int64_t row0 = q0 + wg * kRows;  // this warpgroup's first row
    float o[kD / 2] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};  // log2 units of the scaled scores
    int slot = 0;
    for (int64_t t = 0; t < tiles; t++, slot = kTma ? 0 : ring_next(slot)) {
        if (kTma) {
            if (tid == 0 && t + kAhead < tiles) issue(int(t + kAhead));
            ring.wait(int(t));
            slot = int(t % kRing);
        } else {
            if (t > 0) wait_prev_and_sync();
            if (t + 2 < tiles) stage_kv(t + 2, ring_after_next(slot));
            commit();
        }
        const int rel = int(t * KT - row0);  // the tile's first key, from row0
        if (rel >= kRows) {                  // every key follows every row of this warpgroup
            if (kTma) ring.release(int(t));
            continue;
        }
        float s[KT / 2];
        wg_fence();
        product_smem<KT>(s, q_rows, k_tile(slot));
        wg_commit();
        wg_wait_all();
        hold(s);
        float corr[2];
        softmax_tile<KT>(s, rel, sl2, warp, gq, tq, m, l, corr);
#pragma unroll
        for (int i = 0; i < kD / 2; i++) o[i] *= corr[(i >> 1) & 1];
        uint32_t pa[KT / 16][4];
        acc_to_a<KT>(pa, s);
        wg_fence();
        product_nmajor<KT>(o, pa, v_tile(slot));
        wg_commit();
        wg_wait_all();
        keep(pa);
        hold(o);
        if (kTma) ring.release(int(t));
    }
    store_forward_rows(out, lse, ores, o, m, l, row0, warp, gq, tq, b, h, bh, g);
#endif
}

// The same forward with the products of consecutive tiles overlapped inside each warpgroup
// (FlashAttention-3's intra-warpgroup pipelining): while O += P_t V_t runs on the tensor core,
// S_{t+1} = Q K_{t+1}^T has been issued ahead of it and the warpgroup computes the
// exponentials of tile t + 1; O is rescaled once P_t V_t is done. K/V tiles stream through a
// ring of four (tile t + 3 is staged while t + 1 is awaited) since K_{t+1} is needed one tile
// earlier than in forward_kernel. Measured on an H200 (--ops, one call): no faster than
// forward_kernel alone, the steps equal within noise: with two blocks of
// two warpgroups per SM the scheduler already overlaps one warpgroup's exponentials with
// another's products, and this kernel adds a ring slot and more issue work. So it is off by
// default (kernels.attention_tuning.wgmma_fwd_pipeline), kept for ablation.
constexpr int kFwdStages = 4;
constexpr int kFwdPipeSmemBytes = 1024 + kBlockRows * 128 + kFwdStages * 2 * kFwdTileBytes;

__global__ void __launch_bounds__(kThreads, 2)
    forward_pipelined_kernel(bf16* out, float* lse, bf16* ores, const bf16* qkv, Geo g) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t q_tile = aligned_smem(smem);
    auto k_tile = [&](int64_t t) {
        return q_tile + kBlockRows * 128 + int(t % kFwdStages) * 2 * kFwdTileBytes;
    };
    auto v_tile = [&](int64_t t) { return k_tile(t) + kFwdTileBytes; };
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;  // heaviest first
    const int tid = threadIdx.x, wg = tid / kWG, warp = tid % kWG / 32, lane = tid % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* kvbase = qkv + b * g.Tn * stride + g.k_col(h / g.group);
    const int64_t key_tiles = (g.Tn + kFwdKeys - 1) / kFwdKeys;
    const int64_t tiles = std::min<int64_t>((q0 + kBlockRows) / kFwdKeys, key_tiles);
    const int64_t row0 = q0 + wg * kRows;  // this warpgroup's first row
    // tiles [0, mine) hold a key some row of this warpgroup sees
    const int64_t mine = std::min<int64_t>((row0 + kRows) / kFwdKeys, tiles);
    auto stage_kv = [&](int64_t t) {
        if (t < tiles) {
            stage_tile<kFwdKeys, kThreads>(k_tile(t), kvbase, stride, t * kFwdKeys, g.Tn, tid);
            stage_tile<kFwdKeys, kThreads>(v_tile(t), kvbase + g.KVC, stride, t * kFwdKeys, g.Tn,
                                           tid);
        }
        commit();  // one group per tile, empty past the last, so the wait counts hold
    };
    stage_tile<kBlockRows, kThreads>(q_tile, qbase, stride, q0, g.Tn, tid);
    stage_kv(0);
    stage_kv(1);
    stage_kv(2);
    asm volatile("cp.async.wait_group 2;\n" ::);  // Q and tile 0
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint32_t q_rows = q_tile + wg * kRows * 128;

    const float sl2 = g.scale * kLog2e;
    float o[kD / 2] = {}, corr[2] = {1, 1};
    uint32_t pa[kFwdKeys / 16][4];  // P of the tile whose P V is next, as bf16 A fragments
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};  // log2 units of the scaled scores
    if (mine > 0) {
        float p[kFwdKeys / 2];
        wg_fence();
        product_smem<kFwdKeys>(p, q_rows, k_tile(0));
        wg_commit();
        wg_wait_all();
        hold(p);
        softmax_tile<kFwdKeys>(p, int(-row0), sl2, warp, gq, tq, m, l, corr);
        acc_to_a<kFwdKeys>(pa, p);
    }
    // A wgmma under a branch that is not the whole sequence gets serialized by ptxas (C7520),
    // so the loop is peeled: tiles [0, mine - 1) issue S_{t+1} and P_t V_t unconditionally,
    // the last of this warpgroup's tiles only P V (a whole sequence under its branch), and the
    // iterations after it only keep the ring going with the other warpgroup.
    auto next_tile = [&](int64_t t) {
        if (t + 1 < tiles) {  // tile t + 1 landed, and every warp is done with tile t - 1
            asm volatile("cp.async.wait_group 1;\n" ::);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
        }
        stage_kv(t + 3);  // into tile t - 1's buffer
    };
    int64_t t = 0;
    for (; t + 1 < mine; t++) {
        next_tile(t);
        float s[kFwdKeys / 2];
        wg_fence();
        product_smem<kFwdKeys>(s, q_rows, k_tile(t + 1));
        wg_commit();
        product_nmajor<kFwdKeys>(o, pa, v_tile(t));
        wg_commit();
        wg_wait<1>();  // S_{t+1}; P_t V_t may still run
        hold(s);
        softmax_tile<kFwdKeys>(s, int((t + 1) * kFwdKeys - row0), sl2, warp, gq, tq, m, l, corr);
        wg_wait_all();
        keep(pa);
        hold(o);
#pragma unroll
        for (int i = 0; i < kD / 2; i++) o[i] *= corr[(i >> 1) & 1];
        acc_to_a<kFwdKeys>(pa, s);  // P_t V_t is done with the old fragments
    }
    for (; t < tiles; t++) {
        next_tile(t);
        if (t + 1 != mine) continue;
        wg_fence();
        product_nmajor<kFwdKeys>(o, pa, v_tile(t));
        wg_commit();
        wg_wait_all();
        keep(pa);
        hold(o);
    }
    store_forward_rows(out, lse, ores, o, m, l, row0, warp, gq, tq, b, h, bh, g);
#endif
}

// ---------------------------------------------------------------- backward: dQ
// The end of a dQ block: this thread's rows of dQ (times the scale) of query head h into dqkv, and
// with colsum the block's column sums (the qkv bias gradient's q part). Every thread of the group
// (NT of them: the block, or its computing warps) calls it.
template <int NT, typename Group = WholeBlock>
__device__ __forceinline__ void store_dq(bf16* dqkv, float* colsum, const ColsumRows& cr,
                                         const float (&dq)[kD / 2], int64_t wrow0, int64_t q0,
                                         int64_t b, int64_t h, int gq, const Geo& g,
                                         Group group = {}) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = wrow0 + gq + r * 8;
        if (row >= g.Tn) continue;
        bf16* dst = dqkv + (b * g.Tn + row) * g.ld + h * g.hs;
        if (g.rope)
            store_row_unrotated(dst, dq, r, g.scale, g, row);
        else
            store_row(dst, dq, r, g.scale);
    }
    if (colsum) {
        __shared__ float red[NT / 32][kD];
        masked_column_sums<NT>(colsum + cr.row(b, q0 / kBlockRows) * g.ld + h * g.hs, dq, wrow0,
                               g.Tn, g.scale, red, group);
    }
}

// One key tile of a dQ warpgroup (its 64 query rows of Q and dO at q_rows, do_rows; the tile's K
// and V at k_tile, v_tile; L and D of the warp's two rows; rel: the tile's first key from the
// warpgroup's first row): S = Q K^T and dP = dO V^T, the exponentials overlapping dP, then
// dQ += dS K. Returns when every product has completed (the tile's shared memory is free again).
template <int KT>
__device__ __forceinline__ void dq_tile(float (&dq)[kD / 2], uint32_t q_rows, uint32_t do_rows,
                                        uint32_t k_tile, uint32_t v_tile, int rel,
                                        const float (&L)[2], const float (&Dr)[2], float sl2,
                                        int warp, int gq, int tq) {
    float s[KT / 2], dp[KT / 2];
    product_pair<KT>(s, q_rows, k_tile, dp, do_rows, v_tile);  // S; dP = dO V^T still running
#pragma unroll
    for (int i = 0; i < KT / 2; i++) s[i] = ex2(scaled_score(s[i], sl2) - L[(i >> 1) & 1]);
    if (rel > -KT) {  // the tile straddles the diagonal of some row of this warpgroup
#pragma unroll
        for (int n = 0; n < KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (rel + n * 8 + 2 * tq + (e & 1) > warp * 16 + gq + (e >> 1) * 8)
                    s[4 * n + e] = 0;
    }
    wg_wait_all();
    hold(dp);
#pragma unroll
    for (int i = 0; i < KT / 2; i++) s[i] *= dp[i] - Dr[(i >> 1) & 1];  // dS, unscaled
    uint32_t sa[KT / 16][4];
    acc_to_a<KT>(sa, s);
    wg_fence();
    product_nmajor<KT>(dq, sa, k_tile);
    wg_commit();
    wg_wait_all();
    keep(sa);
    hold(dq);
}

// A Dsum thread's half row (32 columns) of O, and of O's rounding residual when ores is given
// (tuning.unrounded_dsum), for query row `row` of head h: loaded before the block waits for Q and
// dO, so that their latency overlaps the wait; rows at or past Tn stay zero.
struct OutHalf {
    uint4 o[4] = {}, res[4] = {};
};
__device__ __forceinline__ OutHalf load_out_half(const bf16* out, const bf16* ores, int64_t row,
                                                 int half, int64_t b, int64_t h, const Geo& g) {
    OutHalf v;
    if (row < g.Tn) {
        const int64_t at = (b * g.Tn + row) * g.C + h * g.hs + half * 32;
#pragma unroll
        for (int j = 0; j < 4; j++) v.o[j] = *reinterpret_cast<const uint4*>(out + at + 8 * j);
        if (ores)
#pragma unroll
            for (int j = 0; j < 4; j++)
                v.res[j] = *reinterpret_cast<const uint4*>(ores + at + 8 * j);
    }
    return v;
}
// That half row's share of D = rowsum(dO (O + residual)): row r of the block's dO tile (dorow,
// swizzled) against it.
__device__ __forceinline__ float dsum_half(const unsigned char* dorow, int r, int half,
                                           const OutHalf& v, bool with_residual) {
    float acc = 0;
#pragma unroll
    for (int j = 0; j < 4; j++)
        acc = dot8(*reinterpret_cast<const uint4*>(dorow + swz(r, half * 4 + j)), v.o[j], acc);
    if (with_residual)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc =
                dot8(*reinterpret_cast<const uint4*>(dorow + swz(r, half * 4 + j)), v.res[j], acc);
    return acc;
}

// A block: 128 query rows (64 per warpgroup); key tiles of KT rows through the ring. Q and dO stay
// in shared memory as the left operands (registers would cost 32 per thread, and two blocks per
// SM need at most 128). Per tile: S = Q K^T and dP = dO V^T, then dQ += dS K. Runs first and
// writes Dsum = rowsum(dO * O), which the dK/dV kernel reads.
// kTma: the key tiles through a TMA ring (kernels.attention_tuning.wgmma_dq_tma; KT = 64) instead
// of the cp.async ring and its barrier per tile; kv_map is then qkv's [B, T, C + 2 KVC] map.
template <int KT, bool kTma>
constexpr int dq_smem_bytes() {
    return 1024 + 2 * kBlockRows * 128 + (kTma ? kTmaStages : kStages) * 2 * KT * 128 +
           kBlockRows * int(sizeof(float)) + (kTma ? 2 * kTmaStages * 8 : 0);
}

template <int KT, bool kTma>
__global__ void __launch_bounds__(kThreads, 2)
    dq_kernel(bf16* dqkv, float* dsum, const bf16* dout, const bf16* out, const bf16* ores,
              const bf16* qkv, const float* lse, float* colsum, ColsumRows cr, Geo g,
              const __grid_constant__ CUtensorMap kv_map) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    static_assert(!kTma || KT == kTmaRows, "the TMA ring holds 64-row tiles");
    constexpr int kTileBytes = KT * 128, kRing = kTma ? kTmaStages : kStages;
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t q_tile = aligned_smem(smem), do_tile = q_tile + kBlockRows * 128;
    auto k_tile = [&](int slot) { return do_tile + kBlockRows * 128 + slot * 2 * kTileBytes; };
    auto v_tile = [&](int slot) { return k_tile(slot) + kTileBytes; };
    const uint32_t smem0 = uint32_t(__cvta_generic_to_shared(smem));
    float* Dsm = reinterpret_cast<float*>(smem + (k_tile(kRing) - smem0));
    const TmaRing ring{k_tile(0), k_tile(kRing) + kBlockRows * 4, 2 * kTileBytes};
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;  // heaviest first
    const int tid = threadIdx.x, wg = tid / kWG, warp = tid % kWG / 32, lane = tid % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld, kvh = h / g.group;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* kvbase = qkv + b * g.Tn * stride + g.k_col(kvh);
    const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
    const float sl2 = g.scale * kLog2e;
    const int64_t last = std::min<int64_t>(q0 + kBlockRows, g.Tn);  // keys [0, last) are seen
    const int64_t tiles = (last + KT - 1) / KT;
    auto stage_kv = [&](int64_t t, int slot) {
        stage_kv_tile<KT>(k_tile(slot), kvbase, g, t, tid);
    };
    auto issue = [&](int j) { issue_kv_tile<KT>(ring, j, &kv_map, g, b, kvh); };
    if (kTma && tid == 0) {
        ring.init();
        for (int j = 0; j < kTmaAhead && j < tiles; j++) issue(j);
    }
    stage_tile<kBlockRows, kThreads>(q_tile, qbase, stride, q0, g.Tn, tid);
    stage_tile<kBlockRows, kThreads>(do_tile, obase, g.C, q0, g.Tn, tid);
    if (!kTma) stage_kv(0, 0);
    commit();
    if (!kTma && tiles > 1) stage_kv(1, 1);
    commit();
    {  // Dsum: two threads per row (32 columns each); the O loads overlap the tiles landing
        const int r = tid / 2, half = tid % 2;
        const int64_t row = q0 + r;
        const OutHalf ov = load_out_half(out, ores, row, half, b, h, g);
        wait_prev_and_sync();  // Q, dO and (cp.async ring) key tile 0; the barriers initialised
        const unsigned char* dorow = smem + (do_tile - smem0);
        float acc = dsum_half(dorow, r, half, ov, ores != nullptr);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (half == 0) {
            Dsm[r] = acc;  // rows past Tn: dO and O are zero, so 0
            if (row < g.Tn) dsum[bh * g.Tn + row] = acc;
        }
        __syncthreads();
    }
    const uint32_t q_rows = q_tile + wg * kRows * 128, do_rows = do_tile + wg * kRows * 128;
    const int64_t row0 = q0 + wg * kRows, wrow0 = row0 + warp * 16;
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = wrow0 + gq + r * 8;
        L[r] = row < g.Tn ? __fmul_rn(lse[bh * g.Tn + row], kLog2e) : INFINITY;
        Dr[r] = Dsm[wg * kRows + warp * 16 + gq + r * 8];
    }
    float dq[kD / 2] = {};
    int slot = 0;
    for (int64_t t = 0; t < tiles; t++, slot = kTma ? 0 : ring_next(slot)) {
        if (kTma) {
            if (tid == 0 && t + kTmaAhead < tiles) issue(int(t + kTmaAhead));
            ring.wait(int(t));
            slot = int(t % kTmaStages);
        } else {
            if (t > 0) wait_prev_and_sync();
            if (t + 2 < tiles) stage_kv(t + 2, ring_after_next(slot));
            commit();
        }
        const int rel = int(t * KT - row0);  // the tile's first key, from row0
        if (rel >= kRows) {
            if (kTma) ring.release(int(t));
            continue;
        }
        dq_tile<KT>(dq, q_rows, do_rows, k_tile(slot), v_tile(slot), rel, L, Dr, sl2, warp, gq, tq);
        if (kTma) ring.release(int(t));
    }
    store_dq<kThreads>(dqkv, colsum, cr, dq, wrow0, q0, b, h, gq, g);
#endif
}

// One query tile of a dK/dV warpgroup (its 64 keys' K and V rows at k_rows, v_rows; the tile's
// Q and dO at q, d_o; its L and D at Lt, Dt; rel: the tile's first query from the warpgroup's
// first key). Four products in three stages, each overlapping the tensor core with the
// exponentials or dS of the stage before: S^T | dP^T with P^T, dV with dS^T, then dK. Returns
// when every product has completed (the tile's shared memory is free again).
template <int QT>
__device__ __forceinline__ void dkdv_tile(float (&dk)[kD / 2], float (&dv)[kD / 2], uint32_t k_rows,
                                          uint32_t v_rows, uint32_t q, uint32_t d_o,
                                          const float* Lt, const float* Dt, int rel, float sl2,
                                          int warp, int gq, int tq) {
    float p[QT / 2], dp[QT / 2];
    product_pair<QT>(p, k_rows, q, dp, v_rows, d_o);  // S^T; dP^T still running
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
        const float2 L = *reinterpret_cast<const float2*>(Lt + n * 8 + 2 * tq);
#pragma unroll
        for (int e = 0; e < 4; e++)
            p[4 * n + e] =
                ex2(scaled_score(p[4 * n + e], sl2) - __fmul_rn(e & 1 ? L.y : L.x, kLog2e));
    }
    if (rel < kRows) {  // the tile straddles the diagonal: query rel + c sees key r if c >= r
#pragma unroll
        for (int n = 0; n < QT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (rel + n * 8 + 2 * tq + (e & 1) < warp * 16 + gq + (e >> 1) * 8)
                    p[4 * n + e] = 0;
    }
    uint32_t pa[QT / 16][4], sa[QT / 16][4];
    acc_to_a<QT>(pa, p);
    wg_fence();
    product_nmajor<QT>(dv, pa, d_o);
    wg_commit();
    wg_wait<1>();  // dP^T
    hold(dp);
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
        const float2 D = *reinterpret_cast<const float2*>(Dt + n * 8 + 2 * tq);
#pragma unroll
        for (int e = 0; e < 4; e++)  // dS^T
            dp[4 * n + e] = p[4 * n + e] * (dp[4 * n + e] - (e & 1 ? D.y : D.x));
    }
    acc_to_a<QT>(sa, dp);
    wg_fence();
    product_nmajor<QT>(dk, sa, q);
    wg_commit();
    wg_wait_all();
    keep(pa);
    keep(sa);
    hold(dv);
    hold(dk);
}

// The end of a dK/dV block: this thread's rows of dK (times the scale) and dV of key/value head
// kvh into dqkv, and with colsum the block's column sums of both (the qkv bias gradient's k and v
// parts). Every thread of the group (NT of them: the block, or its computing warps) calls it.
template <int NT, typename Group = WholeBlock>
__device__ __forceinline__ void store_dkdv(bf16* dqkv, float* colsum, const ColsumRows& cr,
                                           const float (&dk)[kD / 2], const float (&dv)[kD / 2],
                                           int64_t wkey0, int64_t b, int64_t kvh, int gq,
                                           const Geo& g, Group group = {}) {
    const int64_t stride = g.ld;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t key = wkey0 + gq + r * 8;
        if (key >= g.Tn) continue;
        bf16* dkr = dqkv + (b * g.Tn + key) * stride + g.k_col(kvh);
        if (g.rope)
            store_row_unrotated(dkr, dk, r, g.scale, g, key);
        else
            store_row(dkr, dk, r, g.scale);
        store_row(dkr + g.KVC, dv, r, 1.0f);
    }
    if (colsum) {
        __shared__ float red[NT / 32][kD];
        float* dst = colsum + cr.row(b, blockIdx.x) * stride + g.k_col(kvh);
        masked_column_sums<NT>(dst, dk, wkey0, g.Tn, g.scale, red, group);
        masked_column_sums<NT>(dst + g.KVC, dv, wkey0, g.Tn, 1.0f, red, group);
    }
}

// ---------------------------------------------------------------- backward: dK, dV
// A block: WGS x 64 keys (64 per warpgroup); query tiles of QT rows from the block's first key
// on. K and V stay in shared memory as left operands. Per tile: S^T = K Q^T and dP^T = V dO^T
// (keys x queries), then dV += P^T dO and dK += dS^T Q. With WGS = 2 the two warpgroups share
// each streamed tile and meet at every tile's barrier, so their exponentials and their products
// fall at the same time; with WGS = 1 each block (two per SM at ~200 registers) streams its own
// tiles and drifts freely against the other, which lets one's products overlap the other's
// exponentials, for twice the tile loads from L2. Measured on an H200 (one call, alternated):
// the backward alone was faster with one warpgroup (--ops, each op alone), but the steps equal,
// probably because in the step the backward runs beside the side stream's weight-gradient GEMMs
// (not measured). Two stays
// the default (no clearing of the column-sum rows); one is kept for ablation.
// A block owns keys of one key/value head. kGroup (grouped-query attention): it walks the query
// tiles of each query head of the group in turn (the ring restarting per head), K and V staged
// once and dK, dV summed in registers in head order; without, the group is one head at compile
// time and multi-head attention runs the code it ran before.
template <int QT, int WGS>
constexpr int dkdv_smem_bytes() {
    return 1024 + 2 * WGS * kRows * 128 + kStages * 2 * QT * 128 + kStages * 2 * QT * 4;
}

template <int QT, int WGS, bool kGroup>
__global__ void __launch_bounds__(WGS* kWG, (QT == 32 ? 2 : 1) * (2 / WGS))
    dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dsum,
                float* colsum, ColsumRows cr, Geo g) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    constexpr int kBlockRows = WGS * kRows, kThreads = WGS * kWG;
    constexpr int kTileBytes = QT * 128;
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t base = aligned_smem(smem), k_all = base, v_all = base + kBlockRows * 128;
    auto q_tile = [&](int slot) { return v_all + kBlockRows * 128 + slot * 2 * kTileBytes; };
    auto do_tile = [&](int slot) { return q_tile(slot) + kTileBytes; };
    const uint32_t f_base = q_tile(kStages);  // [kStages][2][QT] floats: L, D
    const float* Fs =
        reinterpret_cast<const float*>(smem + (f_base - uint32_t(__cvta_generic_to_shared(smem))));
    const int64_t b = blockIdx.y / g.NKV, kvh = blockIdx.y % g.NKV;
    const int64_t k0 = int64_t(blockIdx.x) * kBlockRows;
    const int tid = threadIdx.x, wg = tid / kWG, warp = tid % kWG / 32, lane = tid % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld;
    const bf16* kvbase = qkv + b * g.Tn * stride + g.k_col(kvh);
    const float sl2 = g.scale * kLog2e;
    stage_tile<kBlockRows, kThreads>(k_all, kvbase, stride, k0, g.Tn, tid);
    stage_tile<kBlockRows, kThreads>(v_all, kvbase + g.KVC, stride, k0, g.Tn, tid);
    const uint32_t k_rows = k_all + wg * kRows * 128, v_rows = v_all + wg * kRows * 128;
    const int64_t key0 = k0 + wg * kRows, wkey0 = key0 + warp * 16;
    float dk[kD / 2] = {}, dv[kD / 2] = {};
    const int group = kGroup ? g.group : 1;
    for (int hq = 0; hq < group; hq++) {
        const int64_t h = kvh * group + hq, bh = b * g.NH + h;
        const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
        const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
        auto issue = [&](int64_t i0, int slot) {
            stage_tile<QT, kThreads>(q_tile(slot), qbase, stride, i0, g.Tn, tid);
            stage_tile<QT, kThreads>(do_tile(slot), obase, g.C, i0, g.Tn, tid);
            // queries past Tn get L = D = 0: their Q and dO rows are zero, so P dO and dS Q vanish
            const int valid = int(std::min<int64_t>(QT, g.Tn - i0));
            const uint32_t f = f_base + slot * 2 * QT * 4;
            stage_floats(f, lse + bh * g.Tn + i0, QT, valid);
            stage_floats(f + QT * 4, dsum + bh * g.Tn + i0, QT, valid);
            commit();
        };
        if (hq > 0)
            __syncthreads();  // every warp is done with the last head's tiles: the ring restarts
        issue(k0, 0);         // K and V are committed with the first tile
        if (k0 + QT < g.Tn)
            issue(k0 + QT, 1);
        else
            commit();  // an empty group keeps the wait count right
        int slot = 0;
        for (int64_t i0 = k0; i0 < g.Tn; i0 += QT, slot = ring_next(slot)) {
            wait_prev_and_sync();
            if (i0 + 2 * QT < g.Tn)
                issue(i0 + 2 * QT, ring_after_next(slot));
            else
                commit();
            const int rel = int(i0 - key0);  // the tile's first query, from key0
            if (rel <= -QT) continue;        // every query of the tile precedes every key here
            const float* Lt = Fs + slot * 2 * QT;
            dkdv_tile<QT>(dk, dv, k_rows, v_rows, q_tile(slot), do_tile(slot), Lt, Lt + QT, rel,
                          sl2, warp, gq, tq);
        }
    }
    store_dkdv<kThreads>(dqkv, colsum, cr, dk, dv, wkey0, b, kvh, gq, g);
#endif
}

// The query tiles a TMA-fed dK/dV block streams: keys [k0, k0 + kBlockRows) of key/value head kvh
// of batch b; with kGroup the ring runs on through the query tiles of each query head of the
// group in turn (tile j: head head_of(j), its tile first_of(j) from k0). issue() loads tile j's
// Q | dO | L | D into its stage as QT / 64 boxes of each: Q and dO as QT-row swizzled tiles (the
// boxes stacked), then L and D, QT floats each.
template <int QT, bool kGroup>
struct QueryTiles {
    int64_t b, kvh, k0;
    int per_head, tiles;  // query tiles of one query head; of the block
    __device__ explicit QueryTiles(const Geo& g)
        : b(blockIdx.y / g.NKV),
          kvh(blockIdx.y % g.NKV),
          k0(int64_t(blockIdx.x) * kBlockRows),
          per_head(int((g.Tn - k0 + QT - 1) / QT)),
          tiles(kGroup ? per_head * g.group : per_head) {}
    __device__ int head_of(int j) const { return kGroup ? j / per_head : 0; }
    __device__ int first_of(int j) const { return kGroup ? j - head_of(j) * per_head : j; }
    __device__ void issue(const TmaRing& ring, int j, unsigned bytes, const CUtensorMap* q_map,
                          const CUtensorMap* do_map, const CUtensorMap* l_map,
                          const CUtensorMap* d_map, const Geo& g) const {
        const uint32_t st = ring.acquire(j, bytes);
        const int64_t h = kvh * (kGroup ? g.group : 1) + head_of(j), bh = b * g.NH + h;
        const int y = int(k0 + int64_t(first_of(j)) * QT);
#pragma unroll
        for (int box = 0; box < QT / kTmaRows; box++) {
            const int yb = y + box * kTmaRows;
            tma_load_3d(st + box * kTmaTileBytes, q_map, ring.full(j), int(h * g.hs), yb, int(b));
            tma_load_3d(st + QT * 128 + box * kTmaTileBytes, do_map, ring.full(j), int(h * g.hs),
                        yb, int(b));
            hopper_gemm::tma_load(st + 2 * QT * 128 + box * kTmaRows * 4, l_map, ring.full(j), yb,
                                  int(bh));
            hopper_gemm::tma_load(st + 2 * QT * 128 + (QT + box * kTmaRows) * 4, d_map,
                                  ring.full(j), yb, int(bh));
        }
    }
};

// dkdv_kernel<64, 2> on a TMA ring (kernels.attention_tuning.wgmma_dkdv_tma): a stage holds a
// query tile's Q, dO, L and D (QueryTiles); with kGroup dK and dV are summed in head order.
constexpr int kDkdvStageBytes = 2 * kTmaTileBytes + 1024;           // + L and D, 1024-aligned
constexpr int kDkdvStageTx = 2 * kTmaTileBytes + 2 * kTmaRows * 4;  // bytes that land per stage
constexpr int kDkdvTmaSmemBytes =
    1024 + 2 * kBlockRows * 128 + kTmaStages * kDkdvStageBytes + 2 * kTmaStages * 8;

template <bool kGroup>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_tma_kernel(bf16* dqkv, const __grid_constant__ CUtensorMap q_map,
                    const __grid_constant__ CUtensorMap do_map,
                    const __grid_constant__ CUtensorMap l_map,
                    const __grid_constant__ CUtensorMap d_map, const bf16* qkv, float* colsum,
                    ColsumRows cr, Geo g) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    constexpr int QT = kTmaRows;
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t base = aligned_smem(smem), k_all = base, v_all = base + kBlockRows * 128;
    const TmaRing ring{v_all + kBlockRows * 128,
                       v_all + kBlockRows * 128 + kTmaStages * kDkdvStageBytes, kDkdvStageBytes};
    const uint32_t smem0 = uint32_t(__cvta_generic_to_shared(smem));
    const QueryTiles<QT, kGroup> qt(g);
    const int64_t b = qt.b, kvh = qt.kvh, k0 = qt.k0;
    const int tiles = qt.tiles;
    const int tid = threadIdx.x, wg = tid / kWG, warp = tid % kWG / 32, lane = tid % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld;
    const bf16* kvbase = qkv + b * g.Tn * stride + g.k_col(kvh);
    const float sl2 = g.scale * kLog2e;
    auto issue = [&](int j) {
        qt.issue(ring, j, kDkdvStageTx, &q_map, &do_map, &l_map, &d_map, g);
    };
    if (tid == 0) {
        ring.init();
        for (int j = 0; j < kTmaAhead && j < tiles; j++) issue(j);
    }
    stage_tile<kBlockRows, kThreads>(k_all, kvbase, stride, k0, g.Tn, tid);
    stage_tile<kBlockRows, kThreads>(v_all, kvbase + g.KVC, stride, k0, g.Tn, tid);
    commit();
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // K and V landed; the barriers are initialised
    const uint32_t k_rows = k_all + wg * kRows * 128, v_rows = v_all + wg * kRows * 128;
    const int64_t key0 = k0 + wg * kRows, wkey0 = key0 + warp * 16;
    float dk[kD / 2] = {}, dv[kD / 2] = {};
    for (int j = 0; j < tiles; j++) {
        if (tid == 0 && j + kTmaAhead < tiles) issue(j + kTmaAhead);
        ring.wait(j);
        const int rel = int(k0 + int64_t(qt.first_of(j)) * QT - key0);  // its first query
        if (rel > -QT) {  // else every query of the tile precedes every key here
            const uint32_t st = ring.stage(j);
            const float* Lt =
                reinterpret_cast<const float*>(smem + (st + 2 * kTmaTileBytes - smem0));
            dkdv_tile<QT>(dk, dv, k_rows, v_rows, st, st + kTmaTileBytes, Lt, Lt + QT, rel, sl2,
                          warp, gq, tq);
        }
        ring.release(j);
    }
    store_dkdv<kThreads>(dqkv, colsum, cr, dk, dv, wkey0, b, kvh, gq, g);
#endif
}

// dkdv_tma_kernel with query tiles of 128 rows (kernels.attention_tuning.wgmma_dkdv_tile: 128),
// warp-specialised as FlashAttention-3's backward is: a third warpgroup only issues the TMA loads
// and gives its registers to the two that compute (setmaxnreg: 24 against 240 a thread). At
// 64 x 128 per warpgroup step the S^T and dP^T products are m64n128k16 and dV and dK run over
// k = 128, so each step waits as often as a 64-query step but does twice its work; the fp32
// partials of a 128-query tile (about 220 registers live) do not fit the 202 of the two-warpgroup
// kernel. The stage: Q and dO as two 64-row TMA boxes each (one 128-row swizzled tile), then L
// and D, two boxes each. The ring runs all kTmaStages ahead: the loader waits on the stage's
// `empty` barrier, not on the tile loop. Column sums and stores as store_dkdv, among the
// computing warpgroups (named barrier 1).
constexpr int kWsQT = 2 * kTmaRows;                          // queries per tile
constexpr int kWsStageBytes = 2 * kWsQT * 128 + 1024;        // Q, dO; L and D (1024-aligned)
constexpr int kWsStageTx = 2 * kWsQT * 128 + 2 * kWsQT * 4;  // bytes that land per stage
constexpr int kWsThreads = kThreads + kWG;                   // the loader warpgroup first
constexpr int kWsSmemBytes =
    1024 + 2 * kBlockRows * 128 + kTmaStages * kWsStageBytes + 2 * kTmaStages * 8;

__device__ __forceinline__ void compute_sync() {  // the two computing warpgroups
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
// The computing warps of a warp-specialised kernel, as the column sums' group: their index past
// the loader warpgroup, and their named barrier.
struct ComputeWarps {
    __device__ __forceinline__ unsigned t() const { return threadIdx.x - kWG; }
    __device__ __forceinline__ void sync() const { compute_sync(); }
};

template <bool kGroup>
__global__ void __launch_bounds__(kWsThreads, 1)
    dkdv_ws_kernel(bf16* dqkv, const __grid_constant__ CUtensorMap q_map,
                   const __grid_constant__ CUtensorMap do_map,
                   const __grid_constant__ CUtensorMap l_map,
                   const __grid_constant__ CUtensorMap d_map, const bf16* qkv, float* colsum,
                   ColsumRows cr, Geo g) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    constexpr int QT = kWsQT;
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t base = aligned_smem(smem), k_all = base, v_all = base + kBlockRows * 128;
    const TmaRing ring{v_all + kBlockRows * 128,
                       v_all + kBlockRows * 128 + kTmaStages * kWsStageBytes, kWsStageBytes};
    const uint32_t smem0 = uint32_t(__cvta_generic_to_shared(smem));
    const QueryTiles<QT, kGroup> qt(g);
    const int64_t b = qt.b, kvh = qt.kvh, k0 = qt.k0;
    const int tiles = qt.tiles;
    if (threadIdx.x == 0) ring.init();
    __syncthreads();          // the barriers are initialised
    if (threadIdx.x < kWG) {  // the loader: tile j's Q | dO | L | D, two boxes each
        setmaxnreg_dec<24>();
        if (threadIdx.x == 0)
            for (int j = 0; j < tiles; j++)
                qt.issue(ring, j, kWsStageTx, &q_map, &do_map, &l_map, &d_map, g);
        return;
    }
    setmaxnreg_inc<240>();
    const int t = threadIdx.x - kWG, wg = t / kWG, warp = t % kWG / 32, lane = t % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld;
    const bf16* kvbase = qkv + b * g.Tn * stride + g.k_col(kvh);
    const float sl2 = g.scale * kLog2e;
    stage_tile<kBlockRows, kThreads>(k_all, kvbase, stride, k0, g.Tn, t);
    stage_tile<kBlockRows, kThreads>(v_all, kvbase + g.KVC, stride, k0, g.Tn, t);
    commit();
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    compute_sync();  // K and V landed
    const uint32_t k_rows = k_all + wg * kRows * 128, v_rows = v_all + wg * kRows * 128;
    const int64_t key0 = k0 + wg * kRows, wkey0 = key0 + warp * 16;
    float dk[kD / 2] = {}, dv[kD / 2] = {};
    for (int j = 0; j < tiles; j++) {
        ring.wait(j);
        const int rel = int(k0 + int64_t(qt.first_of(j)) * QT - key0);  // its first query
        if (rel > -QT) {  // else every query of the tile precedes every key here
            const uint32_t st = ring.stage(j);
            const float* Lt = reinterpret_cast<const float*>(smem + (st + 2 * QT * 128 - smem0));
            dkdv_tile<QT>(dk, dv, k_rows, v_rows, st, st + QT * 128, Lt, Lt + QT, rel, sl2, warp,
                          gq, tq);
        }
        ring.release(j);
    }
    store_dkdv<kThreads>(dqkv, colsum, cr, dk, dv, wkey0, b, kvh, gq, g, ComputeWarps{});
#endif
}

// dq_kernel<64, true> with key tiles of 128 rows (kernels.attention_tuning.wgmma_dq_tile: 128),
// warp-specialised as dkdv_ws_kernel: a loader warpgroup streams K | V tiles (two 64-row boxes
// each) into the ring; the two computing warpgroups (64 query rows each) take S and dP as
// m64n128k16 and dQ += dS K over k = 128. Dsum as dq_kernel's.
constexpr int kWsKT = 2 * kTmaRows;               // keys per tile
constexpr int kWsDqStageBytes = 2 * kWsKT * 128;  // K | V
constexpr int kWsDqSmemBytes = 1024 + 2 * kBlockRows * 128 + kTmaStages * kWsDqStageBytes +
                               kBlockRows * int(sizeof(float)) + 2 * kTmaStages * 8;

__global__ void __launch_bounds__(kWsThreads, 1)
    dq_ws_kernel(bf16* dqkv, float* dsum, const bf16* dout, const bf16* out, const bf16* ores,
                 const bf16* qkv, const float* lse, float* colsum, ColsumRows cr, Geo g,
                 const __grid_constant__ CUtensorMap kv_map) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    constexpr int KT = kWsKT, kTileBytes = KT * 128;
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t q_tile = aligned_smem(smem), do_tile = q_tile + kBlockRows * 128;
    const uint32_t ring0 = do_tile + kBlockRows * 128, dsm = ring0 + kTmaStages * kWsDqStageBytes;
    const TmaRing ring{ring0, dsm + kBlockRows * 4, kWsDqStageBytes};
    const uint32_t smem0 = uint32_t(__cvta_generic_to_shared(smem));
    float* Dsm = reinterpret_cast<float*>(smem + (dsm - smem0));
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kBlockRows;  // heaviest first
    const int64_t kvh = h / g.group;
    const int64_t last = std::min<int64_t>(q0 + kBlockRows, g.Tn);  // keys [0, last) are seen
    const int tiles = int((last + KT - 1) / KT);
    if (threadIdx.x == 0) ring.init();
    __syncthreads();          // the barriers are initialised
    if (threadIdx.x < kWG) {  // the loader: key tile j's K | V, two boxes each
        setmaxnreg_dec<24>();
        if (threadIdx.x == 0)
            for (int j = 0; j < tiles; j++) {
                const uint32_t st = ring.acquire(j, 2 * kTileBytes);
                const int x = int(g.k_col(kvh));
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int y = j * KT + half * kTmaRows;
                    tma_load_3d(st + half * kTmaTileBytes, &kv_map, ring.full(j), x, y, int(b));
                    tma_load_3d(st + kTileBytes + half * kTmaTileBytes, &kv_map, ring.full(j),
                                int(x + g.KVC), y, int(b));
                }
            }
        return;
    }
    setmaxnreg_inc<240>();
    const int t = threadIdx.x - kWG, wg = t / kWG, warp = t % kWG / 32, lane = t % 32;
    const int gq = lane / 4, tq = lane % 4;
    const int64_t stride = g.ld;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
    const float sl2 = g.scale * kLog2e;
    stage_tile<kBlockRows, kThreads>(q_tile, qbase, stride, q0, g.Tn, t);
    stage_tile<kBlockRows, kThreads>(do_tile, obase, g.C, q0, g.Tn, t);
    commit();
    {  // Dsum: two threads per row (32 columns each); the O loads overlap Q and dO landing
        const int r = t / 2, half = t % 2;
        const int64_t row = q0 + r;
        const OutHalf ov = load_out_half(out, ores, row, half, b, h, g);
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        compute_sync();  // Q and dO landed
        const unsigned char* dorow = smem + (do_tile - smem0);
        float acc = dsum_half(dorow, r, half, ov, ores != nullptr);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (half == 0) {
            Dsm[r] = acc;  // rows past Tn: dO and O are zero, so 0
            if (row < g.Tn) dsum[bh * g.Tn + row] = acc;
        }
        compute_sync();
    }
    const uint32_t q_rows = q_tile + wg * kRows * 128, do_rows = do_tile + wg * kRows * 128;
    const int64_t row0 = q0 + wg * kRows, wrow0 = row0 + warp * 16;
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = wrow0 + gq + r * 8;
        L[r] = row < g.Tn ? __fmul_rn(lse[bh * g.Tn + row], kLog2e) : INFINITY;
        Dr[r] = Dsm[wg * kRows + warp * 16 + gq + r * 8];
    }
    float dq[kD / 2] = {};
    for (int j = 0; j < tiles; j++) {
        ring.wait(j);
        const int rel = int(int64_t(j) * KT - row0);  // the tile's first key, from row0
        if (rel >= kRows) {                           // every key of the tile follows every row
            ring.release(j);
            continue;
        }
        const uint32_t k_tile = ring.stage(j);
        dq_tile<KT>(dq, q_rows, do_rows, k_tile, k_tile + kTileBytes, rel, L, Dr, sl2, warp, gq,
                    tq);
        ring.release(j);
    }
    store_dq<kThreads>(dqkv, colsum, cr, dq, wrow0, q0, b, h, gq, g, ComputeWarps{});
#endif
}

bool shape_ok(const AttentionShape& s, DType t) {
    return t == DType::bf16 && s.C / s.NH == kD && s.C % 8 == 0 && current_device_is_sm90();
}

template <typename Kernel>
void allow_smem(Kernel k, int bytes) {
    ZG_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// qkv [B, T, C + 2 KVC] as a map of 64-row tiles of one head (the TMA rings' Q, K and V tiles).
CUtensorMap qkv_map(const bf16* x, const AttentionShape& s) {
    const cuuint32_t tile[3] = {kD, kTmaRows, 1};
    const cuuint64_t dims[3] = {cuuint64_t(attention_geometry(s).ld), cuuint64_t(s.Tn),
                                cuuint64_t(s.B)};
    return hopper_gemm::tensor_map_nd(x, true, 3, dims, tile);
}

}  // namespace

bool usable_forward(const AttentionShape& s, DType t) {
    return s.tuning.wgmma_fwd && shape_ok(s, t);
}
bool usable_backward(const AttentionShape& s, DType t) {
    return s.tuning.wgmma_bwd && shape_ok(s, t);
}

void forward(void* out, float* lse, void* out_residual, const void* qkv, const AttentionShape& s,
             CUstream_st* st) {
    static const bool smem_set =
        (allow_smem(forward_kernel<kFwdKeys, false>, fwd_smem_bytes<kFwdKeys, false>()),
         allow_smem(forward_kernel<kFwdKeys, true>, fwd_smem_bytes<kFwdKeys, true>()),
         allow_smem(forward_kernel<2 * kFwdKeys, true>, fwd_smem_bytes<2 * kFwdKeys, true>()),
         allow_smem(forward_pipelined_kernel, kFwdPipeSmemBytes), true);
    (void)smem_set;
    const Geo g = attention_geometry(s);
    const dim3 grid(unsigned((s.Tn + kBlockRows - 1) / kBlockRows), unsigned(s.B * s.NH));
    auto* y = static_cast<bf16*>(out);
    auto* yr = static_cast<bf16*>(out_residual);
    const auto* x = static_cast<const bf16*>(qkv);
    constexpr int k2 = 2 * kFwdKeys;
    if (s.tuning.wgmma_fwd_pipeline)
        forward_pipelined_kernel<<<grid, kThreads, kFwdPipeSmemBytes, st>>>(y, lse, yr, x, g);
    else if (s.tuning.wgmma_fwd_tma && s.tuning.wgmma_fwd_keys != kFwdKeys)
        forward_kernel<k2, true>
            <<<grid, kThreads, fwd_smem_bytes<k2, true>(), st>>>(y, lse, yr, x, g, qkv_map(x, s));
    else if (s.tuning.wgmma_fwd_tma)
        forward_kernel<kFwdKeys, true><<<grid, kThreads, fwd_smem_bytes<kFwdKeys, true>(), st>>>(
            y, lse, yr, x, g, qkv_map(x, s));
    else
        forward_kernel<kFwdKeys, false>
            <<<grid, kThreads, fwd_smem_bytes<kFwdKeys, false>(), st>>>(y, lse, yr, x, g, {});
    ZG_LAUNCH_CHECK();
}

namespace {
// Warpgroups per dK/dV block: AttentionTuning::wgmma_dkdv_wgs, 1 or 2 (0: the default).
int dkdv_wgs(const AttentionShape& s) {
    return s.tuning.wgmma_dkdv_wgs == 0 ? kDefaultDkdvWgs : s.tuning.wgmma_dkdv_wgs;
}
ColsumRows colsum_layout(const AttentionShape& s, int wgs) {
    const int64_t fine = (s.Tn + wgs * kRows - 1) / (wgs * kRows);  // the dK/dV kernel's blocks
    return {fine, wgs == 2 ? 1 : 2};                                // dQ's blocks: 128 rows
}
}  // namespace

int64_t colsum_rows(const AttentionShape& s) {
    return s.B * colsum_layout(s, dkdv_wgs(s)).per_batch;
}

bool dkdv_warp_specialised(const AttentionShape& s) {
    const int tile = s.tuning.wgmma_dkdv_tile;
    return (tile == kWsQT || (tile == 0 && s.tuning.wgmma_dkdv_tma)) && dkdv_wgs(s) == 2 &&
           s.Tn % 4 == 0;
}

// The dK/dV kernels fed by TMA: dkdv_tma_kernel (AttentionTuning::wgmma_dkdv_tma, in place of
// dkdv_kernel<64, 2>) and, with kWs, the warp-specialised dkdv_ws_kernel (wgmma_dkdv_tile 128),
// which loads the same maps' 64-row boxes two at a time. dO, L and D as maps beside qkv's (qm).
template <bool kWs>
void dkdv_tma(bf16* dx, const bf16* dy, const bf16* x, const CUtensorMap& qm, const float* lse,
              const float* dsum, float* colsums, ColsumRows cr, const Geo& g,
              const AttentionShape& s, CUstream_st* st) {
    constexpr auto kernel = [](bool group) {
        if constexpr (kWs)
            return group ? dkdv_ws_kernel<true> : dkdv_ws_kernel<false>;
        else
            return group ? dkdv_tma_kernel<true> : dkdv_tma_kernel<false>;
    };
    constexpr int threads = kWs ? kWsThreads : kThreads;
    constexpr int smem = kWs ? kWsSmemBytes : kDkdvTmaSmemBytes;
    static const bool smem_set =
        (allow_smem(kernel(false), smem), allow_smem(kernel(true), smem), true);
    (void)smem_set;
    const cuuint64_t T = cuuint64_t(s.Tn), C = cuuint64_t(s.C), B = cuuint64_t(s.B);
    const cuuint32_t tile[3] = {kD, kTmaRows, 1}, row[2] = {kTmaRows, 1};
    const cuuint64_t do_dims[3] = {C, T, B};
    const cuuint64_t f_dims[2] = {T, cuuint64_t(s.B * s.NH)};
    const CUtensorMap dm = hopper_gemm::tensor_map_nd(dy, true, 3, do_dims, tile);
    const CUtensorMap lm = hopper_gemm::tensor_map_nd(lse, false, 2, f_dims, row);
    const CUtensorMap sm = hopper_gemm::tensor_map_nd(dsum, false, 2, f_dims, row);
    const dim3 grid(unsigned((s.Tn + kBlockRows - 1) / kBlockRows), unsigned(s.B * g.NKV));
    kernel(g.group != 1)<<<grid, threads, smem, st>>>(dx, qm, dm, lm, sm, x, colsums, cr, g);
}

// The backward with tiles of KT keys per dQ tile and QT queries per dK/dV tile (32 or 64, from
// AttentionTuning::wgmma_dq_tile and wgmma_dkdv_tile; tiles of 128 are the warp-specialised
// kernels, dq_ws_kernel and, where T % 4 == 0, dkdv_ws_kernel) and WGS warpgroups per dK/dV block
// (wgmma_dkdv_wgs), for measuring. The defaults are the fastest measured: dQ tiles of 64 keys,
// and dK/dV tiles of 128 queries where the warp-specialised kernel runs (two warpgroups, the TMA
// ring, T % 4 == 0; faster at every GPT-2 size, docs/results/gpt2_sizes_h200.json,
// dkdv_tile_default), else 64.
template <int KT, int QT, int WGS>
void backward_tiles(bf16* dx, float* dsum, const bf16* dy, const bf16* out, const bf16* ores,
                    const bf16* x, const float* lse, float* colsums, const Geo& g,
                    const AttentionShape& s, CUstream_st* st) {
    static const bool smem_set =
        (allow_smem(dq_kernel<KT, false>, dq_smem_bytes<KT, false>()),
         allow_smem(dq_kernel<KT, KT == kTmaRows>, dq_smem_bytes<KT, KT == kTmaRows>()),
         allow_smem(dkdv_kernel<QT, WGS, false>, dkdv_smem_bytes<QT, WGS>()),
         allow_smem(dkdv_kernel<QT, WGS, true>, dkdv_smem_bytes<QT, WGS>()), true);
    (void)smem_set;
    const bool dq_tma = KT == kTmaRows && s.tuning.wgmma_dq_tma;
    const bool dq_ws_on = KT == kTmaRows && s.tuning.wgmma_dq_tile == kWsKT;
    const bool dkdv_ws_on = QT == kTmaRows && WGS == 2 && dkdv_warp_specialised(s);
    const bool dkdv_tma_on = QT == kTmaRows && WGS == 2 && s.tuning.wgmma_dkdv_tma && s.Tn % 4 == 0;
    CUtensorMap qm{};  // the TMA kernels' map of qkv
    if (dq_tma || dq_ws_on || dkdv_tma_on || dkdv_ws_on) qm = qkv_map(x, s);
    const ColsumRows cr = colsum_layout(s, WGS);
    if (colsums && cr.step > 1)  // dQ leaves every other row of its columns unwritten
        ZG_CUDA_CHECK(cudaMemsetAsync(colsums, 0, size_t(s.B * cr.per_batch) * g.ld * 4, st));
    const unsigned bh = unsigned(s.B * s.NH);
    // dQ first: it writes the Dsum that the dK/dV kernel reads
    const dim3 dq_grid(unsigned((s.Tn + kBlockRows - 1) / kBlockRows), bh);
    if (dq_ws_on) {
        static const bool ws_smem_set = (allow_smem(dq_ws_kernel, kWsDqSmemBytes), true);
        (void)ws_smem_set;
        dq_ws_kernel<<<dq_grid, kWsThreads, kWsDqSmemBytes, st>>>(dx, dsum, dy, out, ores, x, lse,
                                                                  colsums, cr, g, qm);
    } else if (dq_tma)
        dq_kernel<KT, KT == kTmaRows>
            <<<dq_grid, kThreads, dq_smem_bytes<KT, KT == kTmaRows>(), st>>>(
                dx, dsum, dy, out, ores, x, lse, colsums, cr, g, qm);
    else
        dq_kernel<KT, false><<<dq_grid, kThreads, dq_smem_bytes<KT, false>(), st>>>(
            dx, dsum, dy, out, ores, x, lse, colsums, cr, g, qm);
    const ColsumRows dkdv_rows{cr.per_batch, 1};
    if (dkdv_ws_on) {
        dkdv_tma<true>(dx, dy, x, qm, lse, dsum, colsums, dkdv_rows, g, s, st);
        return;
    }
    if (dkdv_tma_on) {
        dkdv_tma<false>(dx, dy, x, qm, lse, dsum, colsums, dkdv_rows, g, s, st);
        return;
    }
    // dK/dV: one block row per key/value head
    const dim3 kv_grid(unsigned((s.Tn + WGS * kRows - 1) / (WGS * kRows)), unsigned(s.B * g.NKV));
    if (g.group == 1)
        dkdv_kernel<QT, WGS, false><<<kv_grid, WGS * kWG, dkdv_smem_bytes<QT, WGS>(), st>>>(
            dx, dy, x, lse, dsum, colsums, dkdv_rows, g);
    else
        dkdv_kernel<QT, WGS, true><<<kv_grid, WGS * kWG, dkdv_smem_bytes<QT, WGS>(), st>>>(
            dx, dy, x, lse, dsum, colsums, dkdv_rows, g);
}

void backward(void* dqkv, const void* dout, const void* qkv, const void* out,
              const void* out_residual, const float* lse, float* dsum, float* dqkv_colsums,
              const AttentionShape& s, CUstream_st* st) {
    const bool dq32 = s.tuning.wgmma_dq_tile == 32, dkdv32 = s.tuning.wgmma_dkdv_tile == 32;
    const bool one = dkdv_wgs(s) == 1;
    const Geo g = attention_geometry(s);
    const auto* dy = static_cast<const bf16*>(dout);
    const auto* x = static_cast<const bf16*>(qkv);
    const auto* o = static_cast<const bf16*>(out);
    auto* dx = static_cast<bf16*>(dqkv);
    const auto* orr = static_cast<const bf16*>(out_residual);
    auto run = [&](auto kernels) { kernels(dx, dsum, dy, o, orr, x, lse, dqkv_colsums, g, s, st); };
    if (one) {
        if (!dq32 && !dkdv32)
            run(backward_tiles<64, 64, 1>);
        else if (!dq32)
            run(backward_tiles<64, 32, 1>);
        else if (!dkdv32)
            run(backward_tiles<32, 64, 1>);
        else
            run(backward_tiles<32, 32, 1>);
    } else {
        if (!dq32 && !dkdv32)
            run(backward_tiles<64, 64, 2>);
        else if (!dq32)
            run(backward_tiles<64, 32, 2>);
        else if (!dkdv32)
            run(backward_tiles<32, 64, 2>);
        else
            run(backward_tiles<32, 32, 2>);
    }
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda::attention_wgmma

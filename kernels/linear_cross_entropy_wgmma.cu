// fused_linear_wgmma's kernels: logits = h W^T on Hopper's tensor cores with the cross-entropy in
// the GEMM's epilogue, so that a logit never reaches memory in the statistics pass and only its
// dlogit does in the gradient pass.
//
// One kernel, two epilogues (kGrad):
//   statistics: each 128 x 256 tile of logits is folded into its rows' online-softmax statistics
//           (max, sum of exp without the target, target logit, sum of logits); after a group of
//           kTilesPerGroup column tiles a row's statistics go to partials[group][row], and a small
//           kernel merges the groups in order (deterministic, as fused_linear's shards are).
//   gradient: the tile's dlogits, (softmax (1 + 2 z lse) - target distribution) times the row's
//           grad scale (RowGradParams, from ce_finalize), rounded to bf16 and stored with TMA into
//           the caller's tile buffer, which cuBLASLt then multiplies into dh and dW as
//           fused_linear does.
//
// The GEMM: a persistent grid (one CTA per SM) walks the work items (row tile, column tiles) in
// order, rows fastest, so the CTAs running at one time share the same W columns in L2. Per CTA:
//   - two consumer warpgroups (64 rows each) multiply with wgmma.m64n256k16 from shared memory
//     and free each stage of a ring of kStages once the product that read it is done; one thread
//     of the first refills a stage once both have freed it: 128 x 64 tiles of h and 256 x 64 tiles
//     of W with the tensor memory accelerator (TMA, 128-byte swizzle, rows and columns past the
//     end zero-filled), completing the stage's mbarrier. At the end of a tile they write the fp32
//     accumulator as bf16 (the rounding cuBLASLt's tiles give fused_linear) into one tile buffer
//     in shared memory and go on to the next tile;
//   - the epilogue warpgroup (one row of the tile per thread) runs the cross-entropy on the tile
//     buffer while the consumers multiply the next tile, so that the exponentials overlap the
//     tensor cores instead of following them. With the epilogue inside the consumers the tensor
//     pipe was 61% busy in the statistics pass and 44% in the gradient pass (ncu, H100), and a
//     producer warpgroup beside an epilogue warpgroup does not fit: 512 threads get 128 registers
//     each, and the m64n256 accumulator needs more (ptxas: 154).
// The buffer has two mbarriers: full (the consumers wrote a tile) and empty (the epilogue is done
// with it, and in the gradient pass its TMA stores have read it).
#include "kernels/linear_cross_entropy_wgmma.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "kernels/cross_entropy/common.cuh"
#include "kernels/cuda_check.h"
#include "kernels/cuda_device.h"
#include "kernels/wgmma.cuh"

namespace zgpt::cuda::linear_ce_wgmma {

namespace {

constexpr int kBM = 128;           // rows of h per tile (two warpgroups of 64)
constexpr int kBN = 256;           // vocabulary columns per tile (the N of m64n256k16)
constexpr int kBK = 64;            // C per stage: one 128-byte swizzled row
constexpr int kTilesPerGroup = 8;  // column tiles per statistics group (2048 columns)
// warpgroups: the epilogue's, then two consumers. (A fourth for a producer does not fit: a kernel
// of 512 threads gets 128 registers a thread, and ptxas needs 154 for the m64n256 accumulator.)
constexpr int kThreads = 3 * 128;
constexpr int kATileBytes = kBM * kBK * 2;  // 16 KB
constexpr int kBTileBytes = kBN * kBK * 2;  // 32 KB
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kStages = 3;  // 3 x 48 KB, beside the 64 KB tile buffer
constexpr int kSmemBytes = kStages * kStageBytes + kBM * kBN * 2 /* tile buffer */ +
                           1024 /* alignment */ + 256 /* barriers */;
constexpr int kEpilogueThreads = 128;  // warpgroup 0: one row of the tile each

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZG_NO_WGMMA 1  // device pass for another architecture: the kernel compiles to a trap
#endif

struct Params {
    int64_t r0, nr;  // this launch's rows [r0, r0 + nr)
    int64_t c0, nc;  // and shard-local columns [c0, c0 + nc)
    int64_t v0;      // the shard's first global column (targets are global)
    int C;           // hidden size (the K of the GEMM)
    int row_tiles, col_tiles, tiles_per_item, items;
    const int32_t* targets;
    int64_t ignore_index;
    bool smooth;                  // statistics: sum the logits (label smoothing)
    RowStatsF* partials;          // statistics: [groups][nr]
    const RowGradParams* params;  // gradient: [N] (indexed by global row)
    bf16* dlogits;                // gradient: [nr, ld], columns from c0
    int64_t ld;
    bool tma_store;  // gradient: through map_out (ld * 2 % 16 == 0, 16-byte aligned dlogits)
};

// ---------------------------------------------------------------- mbarriers, TMA, wgmma
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

// desc(), wg_fence(), wg_commit(), wg_wait<N>(): kernels/wgmma.cuh (K-major tiles here: a k16
// step adds 32 bytes to the descriptor's start).

// D (+)= A B^T over one k16 step: A 64 x 16 (rows of h), B 256 x 16 (rows of W), both K-major
// in shared memory; D the warpgroup's 64 x 256 fp32 accumulator (128 floats a thread).
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
// 128 rows x 256 columns of bf16 as four boxes of 64 columns (16 KB each) in the 128-byte swizzle
// the TMA store reads: column 8 c + e of row r is at box c / 8, 16-byte chunk (c % 8) ^ (r % 8)
// of the box's 128-byte row r. The consumers' stores (a warp: 8 rows x 4 pairs of one chunk) and
// the epilogue's 16-byte loads (a warp: 32 rows, one chunk each) are free of bank conflicts.
constexpr int kBufBytes = kBM * kBN * 2;  // 64 KB
__device__ __forceinline__ uint32_t buf_chunk(uint32_t buf, int r, int c) {
    return buf + (c / 8) * (kBM * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

// The consumer warp's 16 accumulator rows (r0 .. r0 + 15) into the buffer as bf16, four 8 x 8
// blocks per stmatrix: the accumulator's pair 4 i + 2 h (+ 1) of a thread is row gq + 8 h,
// columns 8 i + 2 tq (+ 1), the fragment layout stmatrix takes. Lane L gives the address of row
// L % 8 of block L / 8: blocks (i, h = 0), (i, 1), (i + 1, 0), (i + 1, 1).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void stage_tile(uint32_t buf, const float (&acc)[128], int r0,
                                           int lane) {
    const int m = lane / 8, row = r0 + lane % 8 + 8 * (m % 2);
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
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
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&b);
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
}

// One buffered row (its tile starts at shard-local column `col`, `limit` is the first column past
// the launch) into the row's statistics; y_local: the target's shard-local column or -1.
__device__ __forceinline__ void fold_row(RowStatsF& st, uint32_t buf, int r, int64_t col,
                                         int64_t limit, int64_t y_local, bool smooth) {
    const bool full = col + kBN <= limit;
#pragma unroll 4
    for (int c = 0; c < kBN / 8; c++) {
        float v[8];
        lds_chunk(buf_chunk(buf, r, c), v);
        const int64_t j0 = col + 8 * c;
        if (full || j0 + 8 <= limit) {
            stats_chunk_fast(st, v, j0, y_local, smooth);
        } else {
            for (int k = 0; k < 8 && j0 + k < limit; k++) stats_add(st, v[k], j0 + k == y_local);
        }
    }
}

// One buffered row's dlogits, in place (bf16), or straight to global memory at `out` (the row's
// first column of this tile; `cols` of them inside the launch) when the TMA store cannot be used.
__device__ __forceinline__ void grad_row(uint32_t buf, int r, int64_t col, int64_t y_local,
                                         bool valid, const RowGradParams& p, bf16* out, int cols) {
#pragma unroll 4
    for (int c = 0; c < kBN / 8; c++) {
        float v[8];
        const uint32_t a = buf_chunk(buf, r, c);
        lds_chunk(a, v);
        const int64_t t = y_local - (col + 8 * c);
        grad_chunk_fast(v, t >= 0 && t < 8 ? int(t) : -1, valid, p);
        if (!out) {
            sts_chunk(a, v);
        } else {
            for (int k = 0; k < 8 && 8 * c + k < cols; k++)
                out[8 * c + k] = __float2bfloat16_rn(v[k]);
        }
    }
}

// ---------------------------------------------------------------- the kernel
// Where the loads are: the CTA's iterations (work item, column tile, k step) in order, as the
// consumers walk them.
struct LoadCursor {
    const Params& p;
    int w, ksteps;
    int t = 0, t1 = 0, k = 0, row = 0, col = 0;
    __device__ LoadCursor(const Params& q, int w0, int ks) : p(q), w(w0), ksteps(ks) { start(); }
    __device__ bool done() const { return w >= p.items; }
    __device__ void start() {  // the first tile of item w
        if (done()) return;
        row = int(p.r0) + (w % p.row_tiles) * kBM;
        t = (w / p.row_tiles) * p.tiles_per_item;
        t1 = min(t + p.tiles_per_item, p.col_tiles);
        k = 0;
        col = int(p.c0) + t * kBN;
    }
    __device__ void advance() {
        if (++k < ksteps) return;
        k = 0;
        if (++t < t1) {
            col = int(p.c0) + t * kBN;
            return;
        }
        w += gridDim.x;
        start();
    }
};

template <bool kGrad>
__global__ void __launch_bounds__(kThreads, 1)
    logits_ce_kernel(const __grid_constant__ CUtensorMap map_h,
                     const __grid_constant__ CUtensorMap map_w,
                     const __grid_constant__ CUtensorMap map_out, const Params p) {
#ifdef ZG_NO_WGMMA
    __trap();
#else
    constexpr int S = kStages;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t buf = base + S * kStageBytes;  // the tile buffer
    const uint32_t bars = buf + kBufBytes;        // full[S], empty[S], buf_full, buf_empty
    auto a_tile = [&](int s) { return base + s * kStageBytes; };
    auto b_tile = [&](int s) { return base + s * kStageBytes + kATileBytes; };
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (S + s); };
    const uint32_t buf_full = bars + 16 * S, buf_empty = buf_full + 8;
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
    const int ksteps = (p.C + kBK - 1) / kBK;

    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            bar_init(full(s), 1);
            bar_init(empty(s), 8);  // lane 0 of each consumer warp
        }
        bar_init(buf_full, 8);  // lane 0 of each consumer warp
        bar_init(buf_empty, kEpilogueThreads / 32);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // the epilogue: thread e handles row e of each tile
        const int e = tid;
        uint32_t n = 0;  // tiles so far
        for (int w = blockIdx.x; w < p.items; w += gridDim.x) {
            const int rt = w % p.row_tiles, grp = w / p.row_tiles;
            const int t0 = grp * p.tiles_per_item, t1 = min(t0 + p.tiles_per_item, p.col_tiles);
            // the row's target (a launch-local column, -1 when ignored or outside the launch's
            // columns, which must not match a column past its end) and gradient parameters
            const int64_t row = int64_t(rt) * kBM + e;  // launch-relative
            const bool in = row < p.nr;
            const int64_t y = in ? p.targets[p.r0 + row] : p.ignore_index;
            const bool valid = y != p.ignore_index;
            const int64_t yl = y - p.v0;
            const int64_t ylocal = valid && yl >= p.c0 && yl < p.c0 + p.nc ? yl : -1;
            RowGradParams gp{};
            if constexpr (kGrad)
                if (in) gp = p.params[p.r0 + row];
            RowStatsF st = empty_stats();
            for (int t = t0; t < t1; t++, n++) {
                const int64_t col = p.c0 + int64_t(t) * kBN;  // shard-local column of the tile
                bar_wait(buf_full, n & 1);
                if (in) {
                    if constexpr (kGrad) {
                        bf16* out = p.tma_store ? nullptr : p.dlogits + row * p.ld + (col - p.c0);
                        const int cols = int(min(int64_t(kBN), p.c0 + p.nc - col));
                        grad_row(buf, e, col, ylocal, valid, gp, out, cols);
                    } else {
                        fold_row(st, buf, e, col, p.c0 + p.nc, ylocal, p.smooth);
                    }
                }
                if (kGrad && p.tma_store) {  // the whole tile, once every row is written
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
                    if (e == 0) {
#pragma unroll
                        for (int b = 0; b < kBN / 64; b++)
                            tma_store(&map_out, buf + b * (kBM * 128), int(col - p.c0) + 64 * b,
                                      rt * kBM);
                        tma_store_commit();
                        tma_store_wait_read();  // the buffer may be rewritten after this
                    }
                    asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
                }
                __syncwarp();
                if (lane == 0) bar_arrive(buf_empty);
            }
            if constexpr (!kGrad)
                if (in) p.partials[int64_t(grp) * p.nr + row] = st;
        }
        if (kGrad && e == 0) tma_store_wait();  // the buffer must outlive the stores
        return;
    }

    // the consumers; the first one's thread 0 also issues the loads: the ring's first S
    // iterations, then iteration j + S into stage j % S once both warpgroups have freed it
    const int cw = wg - 1, warp = tid % 128 / 32;
    const bool loader = tid == 128;
    LoadCursor next{p, int(blockIdx.x), ksteps};
    auto load = [&](int s) {
        bar_expect(full(s), kStageBytes);
        tma_load(a_tile(s), &map_h, full(s), next.k * kBK, next.row);
        tma_load(b_tile(s), &map_w, full(s), next.k * kBK, next.col);
        next.advance();
    };
    auto refill = [&](uint32_t j) {  // stage j % S was freed by this warpgroup after iteration j
        if (!loader || next.done()) return;
        bar_wait(empty(int(j % S)), (j / S) & 1);
        load(int(j % S));
    };
    if (loader)
        for (int s = 0; s < S && !next.done(); s++) load(s);
    uint32_t it = 0, n = 0;
    for (int w = blockIdx.x; w < p.items; w += gridDim.x) {
        const int grp = w / p.row_tiles;
        const int t0 = grp * p.tiles_per_item, t1 = min(t0 + p.tiles_per_item, p.col_tiles);
        for (int t = t0; t < t1; t++, n++) {
            float acc[128];
            for (int k = 0; k < ksteps; k++, it++) {
                const int s = int(it % S);
                bar_wait(full(s), (it / S) & 1);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < kBK / 16; kk++)
                    wgmma_256(acc, desc(a_tile(s) + cw * (kATileBytes / 2) + 32 * kk),
                              desc(b_tile(s) + 32 * kk), k > 0 || kk > 0);
                wg_commit();
                if (k > 0) {
                    wg_wait<1>();  // the previous stage's products are done: free it
                    if (lane == 0) bar_arrive(empty(int((it - 1) % S)));
                    refill(it - 1);
                }
            }
            wg_wait<0>();
            if (lane == 0) bar_arrive(empty(int((it - 1) % S)));
            refill(it - 1);
            if (n > 0) bar_wait(buf_empty, (n - 1) & 1);  // the epilogue is done with tile n - 1
            stage_tile(buf, acc, cw * 64 + warp * 16, lane);
            __syncwarp();
            if (lane == 0) bar_arrive(buf_full);
        }
    }
#endif
}

// stats[i] = the groups' partials [groups][nr], merged in group order (deterministic)
__global__ void merge_groups_kernel(RowStatsF* stats, const RowStatsF* partials, int64_t nr,
                                    int groups) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= nr) return;
    RowStatsF s = partials[i];
    for (int g = 1; g < groups; g++) s = merge_stats(s, partials[g * nr + i]);
    stats[i] = s;
}

// ---------------------------------------------------------------- host
using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

EncodeTiled encoder() {
    static EncodeTiled fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult q{};
        ZG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                       cudaEnableDefault, &q));
        ZG_CHECK(f && q == cudaDriverEntryPointSuccess,
                 "fused_linear_wgmma: the driver has no cuTensorMapEncodeTiled");
        return reinterpret_cast<EncodeTiled>(f);
    }();
    return fn;
}

// A [rows, cols] bf16 row-major matrix as a TMA map of boxes of box_rows x box_cols (box_cols x 2
// = 128 bytes) in the 128-byte swizzle.
CUtensorMap tensor_map(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols) {
    CUtensorMap m;
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r =
        encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                  box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    ZG_CHECK(r == CUDA_SUCCESS,
             "fused_linear_wgmma: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
    return m;
}

int column_groups(int64_t nc) {
    const int64_t tiles = (nc + kBN - 1) / kBN;
    return int((tiles + kTilesPerGroup - 1) / kTilesPerGroup);
}

Params launch_params(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, int64_t r0,
                     int64_t nr, int64_t c0, int64_t nc, int tiles_per_item) {
    Params p{};
    p.r0 = r0;
    p.nr = nr;
    p.c0 = c0;
    p.nc = nc;
    p.v0 = a.v0;
    p.C = int(a.C);
    p.row_tiles = int((nr + kBM - 1) / kBM);
    p.col_tiles = int((nc + kBN - 1) / kBN);
    p.tiles_per_item = tiles_per_item;
    p.items = p.row_tiles * ((p.col_tiles + tiles_per_item - 1) / tiles_per_item);
    p.targets = a.targets;
    p.ignore_index = o.ignore_index;
    p.smooth = o.label_smoothing != 0.0;
    return p;
}

template <bool kGrad>
void launch(const LinearCrossEntropyArgs& a, const Params& p, CUstream_st* s) {
    static std::once_flag once;
    std::call_once(once, [] {
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            logits_ce_kernel<kGrad>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    });
    const CUtensorMap mh = tensor_map(a.hidden, a.N, a.C, kBM, kBK);
    const CUtensorMap mw = tensor_map(a.weight, a.local_vocab(), a.C, kBN, kBK);
    // the dlogits [nr, ld] in boxes of 128 x 64 (a placeholder where the stores are direct)
    const CUtensorMap mo = p.tma_store ? tensor_map(p.dlogits, p.nr, p.ld, kBM, 64) : mh;
    const int grid = std::min(p.items, current_device_sm_count());
    logits_ce_kernel<kGrad><<<grid, kThreads, kSmemBytes, s>>>(mh, mw, mo, p);
    ZG_CUDA_CHECK(cudaGetLastError());
}

// Column tiles per work item of the gradient pass: the most (up to 4, so that each item's row
// loads are spread over several tiles) whose items fill the persistent grid's last round to at
// least 90%.
int gradient_tiles_per_item(int row_tiles, int col_tiles) {
    const int64_t ctas = current_device_sm_count();
    for (int k = 4; k > 1; k--) {
        const int64_t items = int64_t(row_tiles) * ((col_tiles + k - 1) / k);
        const int64_t rounds = (items + ctas - 1) / ctas;
        if (double(items) / double(rounds * ctas) >= 0.9) return k;
    }
    return 1;
}

}  // namespace

bool usable(const LinearCrossEntropyArgs& a) {
    const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    return current_device_is_sm90() && a.C % 8 == 0 && a.C <= INT32_MAX && aligned(a.hidden) &&
           aligned(a.weight) && a.N < INT32_MAX - kBM && a.local_vocab() < INT32_MAX - kBN;
}

size_t partials_count(int64_t rows, int64_t V_local) {
    return size_t(rows) * size_t(column_groups(V_local));
}

void shard_stats(RowStatsF* stats, RowStatsF* partials, const LinearCrossEntropyArgs& a,
                 const CrossEntropyOptions& o, int64_t r0, int64_t nr, CUstream_st* s) {
    Params p = launch_params(a, o, r0, nr, 0, a.local_vocab(), kTilesPerGroup);
    p.partials = partials;
    launch<false>(a, p, s);
    const int groups = column_groups(a.local_vocab());
    merge_groups_kernel<<<unsigned((nr + 255) / 256), 256, 0, s>>>(stats + r0, partials, nr,
                                                                   groups);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void dlogits_tile(bf16* out, const RowGradParams* params, const LinearCrossEntropyArgs& a,
                  const CrossEntropyOptions& o, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                  CUstream_st* s) {
    const int row_tiles = int((nr + kBM - 1) / kBM), col_tiles = int((nc + kBN - 1) / kBN);
    Params p = launch_params(a, o, r0, nr, c0, nc, gradient_tiles_per_item(row_tiles, col_tiles));
    p.params = params;
    p.dlogits = out;
    p.ld = nc;
    p.tma_store = nc % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    launch<true>(a, p, s);
}

}  // namespace zgpt::cuda::linear_ce_wgmma

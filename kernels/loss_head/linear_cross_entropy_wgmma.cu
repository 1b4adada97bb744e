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
// The GEMM is the persistent core of kernels/gemm/hopper_gemm.cuh (WholeTile: three stages beside
// the whole 128 x 256 tile buffer, loads issued by a consumer thread, since every thread of the
// epilogue warpgroup owns a row). The work items (a row tile and a run of column tiles) are walked
// rows fastest, so the CTAs running at one time share the same W columns in L2. The epilogue
// warpgroup (one row of the tile per thread) runs the cross-entropy on the tile buffer while the
// consumers multiply the next tile, so that the exponentials overlap the tensor cores instead of
// following them: with the epilogue inside the consumers the tensor pipe was 61% busy in the
// statistics pass and 44% in the gradient pass (ncu, H100).
#include "kernels/loss_head/linear_cross_entropy_wgmma.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/hopper_gemm.cuh"
#include "kernels/loss_head/cross_entropy/common.cuh"

namespace zgpt::cuda::linear_ce_wgmma {

namespace {

using namespace hopper_gemm;
constexpr int kTilesPerGroup = 8;  // column tiles per statistics group (2048 columns)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ZG_NO_WGMMA 1  // device pass for another architecture: the kernel compiles to a trap
#endif

struct Params {
    bool pair;       // 2-CTA clusters: the CTAs of a pair take row tiles 2q and 2q + 1 of an item
    int64_t r0, nr;  // this launch's rows [r0, r0 + nr)
    int64_t c0, nc;  // and shard-local columns [c0, c0 + nc)
    int64_t v0;      // the shard's first global column (targets are global)
    int C;           // hidden size (the K of the GEMM)
    // items: (row tile, group of tiles_per_item column tiles), rows fastest; in pairs, (pair of
    // row tiles, group), pair_rows of them a group (the second of the last pair may lie past the
    // launch's rows: its rows are all outside)
    int row_tiles, col_tiles, tiles_per_item, items, pair_rows;
    const int32_t* targets;
    int64_t ignore_index;
    bool smooth;                  // statistics: sum the logits (label smoothing)
    RowStatsF* partials;          // statistics: [groups][nr]
    const RowGradParams* params;  // gradient: [N] (indexed by global row)
    bf16* dlogits;                // gradient: [nr, ld], columns from c0
    int64_t ld;
    bool tma_store;  // gradient: through map_out (ld * 2 % 16 == 0, 16-byte aligned dlogits)
};

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
// The CTA's work items: blockIdx.x, + gridDim.x, ... (in pairs: the cluster's, + the clusters),
// each a row tile (launch-relative) and a group of column tiles.
struct Items {
    const Params* p;
    int rank, first, stride;
    __device__ explicit Items(const Params& q, Pair pr)
        : p(&q),
          rank(int(pr.rank)),
          first(int(q.pair ? blockIdx.x / 2 : blockIdx.x)),
          stride(int(q.pair ? gridDim.x / 2 : gridDim.x)) {}
    __device__ int row_tile(int w) const {
        return p->pair ? 2 * (w % p->pair_rows) + rank : w % p->row_tiles;
    }
    __device__ int group(int w) const { return w / (p->pair ? p->pair_rows : p->row_tiles); }
};

// The CTA's tiles in order (hopper_gemm::consume's walk): its items, each a row tile and its run
// of column tiles.
struct ItemTiles {
    Items items;
    int w, t = 0, t1 = 0, row = 0, col = 0;
    __device__ explicit ItemTiles(const Items& it) : items(it), w(it.first) { start(); }
    __device__ bool done() const { return w >= items.p->items; }
    __device__ void start() {  // the first tile of item w
        if (done()) return;
        const Params& p = *items.p;
        row = int(p.r0) + items.row_tile(w) * kBM;
        t = items.group(w) * p.tiles_per_item;
        t1 = min(t + p.tiles_per_item, p.col_tiles);
        col = int(p.c0) + t * kBN;
    }
    __device__ void next() {
        if (++t < t1) {
            col = int(items.p->c0) + t * kBN;
            return;
        }
        w += items.stride;
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
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const Pair pair = Pair::of(p.pair);
    const Smem<WholeTile> sm = setup_smem<WholeTile>(smem_raw, kEpilogueThreads / 32, pair);
    const uint32_t buf = sm.buf;
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
    const Items items(p, pair);

    if (wg == 0) {  // the epilogue: thread e handles row e of each tile
        const int e = tid;
        uint32_t n = 0;  // tiles so far
        for (int w = items.first; w < p.items; w += items.stride) {
            const int rt = items.row_tile(w), grp = items.group(w);
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
                bar_wait(sm.buf_full(), n & 1);
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
                    epilogue_sync();
                    if (e == 0) store_buffer<kBN>(&map_out, buf, int(col - p.c0), rt * kBM);
                    epilogue_sync();
                }
                __syncwarp();
                if (lane == 0) bar_arrive(sm.buf_empty());
            }
            if constexpr (!kGrad)
                if (in) p.partials[int64_t(grp) * p.nr + row] = st;
        }
        if (kGrad && e == 0) tma_store_wait();  // the buffer must outlive the stores
        return;
    }

    consume<WholeTile, true>(
        sm, &map_h, &map_w, ItemTiles(items), (p.C + kBK - 1) / kBK,
        [](float(&)[128], const ItemTiles&) {}, pair);
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
int column_groups(int64_t nc) {
    const int64_t tiles = (nc + kBN - 1) / kBN;
    return int((tiles + kTilesPerGroup - 1) / kTilesPerGroup);
}

// Pairs where the tuning asks for them (kernels.linear_ce_wgmma_cluster = 2) and there are two row
// tiles or more. Not the default: on an H100 they load a third less from L2 but run as fast as
// single CTAs (bench_ce within 1%, the step within its noise; docs/cross_entropy.md), so this
// kernel is not limited by L2.
Params launch_params(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, int64_t r0,
                     int64_t nr, int64_t c0, int64_t nc, int tiles_per_item) {
    Params p{};
    p.pair = a.tuning.wgmma_cluster == 2 && nr > kBM;
    p.r0 = r0;
    p.nr = nr;
    p.c0 = c0;
    p.nc = nc;
    p.v0 = a.v0;
    p.C = int(a.C);
    p.row_tiles = int((nr + kBM - 1) / kBM);
    p.col_tiles = int((nc + kBN - 1) / kBN);
    p.tiles_per_item = tiles_per_item;
    p.pair_rows = (p.row_tiles + 1) / 2;
    p.items = (p.pair ? p.pair_rows : p.row_tiles) *
              ((p.col_tiles + tiles_per_item - 1) / tiles_per_item);
    p.targets = a.targets;
    p.ignore_index = o.ignore_index;
    p.smooth = o.label_smoothing != 0.0;
    return p;
}

// The kernel's launch over `grid` CTAs, in 2-CTA clusters when `pair` (at: storage for the
// cluster attribute, which the config points to).
cudaLaunchConfig_t launch_config(unsigned grid, bool pair, cudaLaunchAttribute& at,
                                 CUstream_st* s = nullptr) {
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(grid);
    c.blockDim = dim3(kThreads);
    c.dynamicSmemBytes = WholeTile::kSmemBytes;
    c.stream = s;
    at = cudaLaunchAttribute{};
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = 2;
    at.val.clusterDim.y = at.val.clusterDim.z = 1;
    c.attrs = &at;
    c.numAttrs = pair ? 1 : 0;
    return c;
}

template <bool kGrad>
void launch(const LinearCrossEntropyArgs& a, const Params& p, CUstream_st* s) {
    static std::once_flag once;
    std::call_once(once, [] {
        ZG_CUDA_CHECK(cudaFuncSetAttribute(logits_ce_kernel<kGrad>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           WholeTile::kSmemBytes));
    });
    int grid = std::min(p.items, compute_sm_count());
    if (p.pair) {  // as many pairs as fit on the device at once (asked the first time only)
        static const int pair_clusters = [] {
            cudaLaunchAttribute cluster;
            const cudaLaunchConfig_t c =
                launch_config(unsigned(2 * current_device_sm_count()), true, cluster);
            int n = 0;
            ZG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, logits_ce_kernel<kGrad>, &c));
            return n;
        }();
        ZG_CHECK(pair_clusters > 0, "fused_linear_wgmma: no 2-CTA cluster fits on this device");
        // the pairs of SMs left to collectives, if any
        const int pairs = std::max(1, pair_clusters - (collective_sms() + 1) / 2);
        grid = 2 * std::min(p.items, pairs);
    }
    const CUtensorMap mh = tensor_map(a.hidden, a.N, a.C, kBM, kBK);
    // in pairs, each CTA loads half of a weight tile into both
    const CUtensorMap mw = tensor_map(a.weight, a.local_vocab(), a.C, p.pair ? kBN / 2 : kBN, kBK);
    // the dlogits [nr, ld] in boxes of 128 x 64 (a placeholder where the stores are direct)
    const CUtensorMap mo = p.tma_store ? tensor_map(p.dlogits, p.nr, p.ld, kBM, 64) : mh;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t c = launch_config(unsigned(grid), p.pair, at, s);
    ZG_CUDA_CHECK(cudaLaunchKernelEx(&c, logits_ce_kernel<kGrad>, mh, mw, mo, p));
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
    return current_device_is_sm90() && a.C % 8 == 0 && a.C <= INT32_MAX && is_aligned(a.hidden) &&
           is_aligned(a.weight) && a.N < INT32_MAX - kBM && a.local_vocab() < INT32_MAX - kBN;
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
    p.tma_store = nc % 8 == 0 && is_aligned(out);
    launch<true>(a, p, s);
}

}  // namespace zgpt::cuda::linear_ce_wgmma

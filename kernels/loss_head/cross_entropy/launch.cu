// CUDA loss head: cross-entropy + z-loss + label smoothing, vocab-shard aware.
// The math is kernels/loss_head/cross_entropy.h's; docs/loss_head.md explains the variants.
//
//   naive  textbook: row max, row sum, fp32 softmax materialised, loss, gradient (5 kernels)
//   online two passes over each row in one kernel (Liger's structure): stats, then re-read the
//          row and write its dlogits
//   fast   one read and one write: persistent thread-block clusters hold each row in shared
//          memory (split across the cluster's CTAs); two or three warp groups per CTA take turns
//          over the rows (fast_pingpong_kernel), exchanging the cluster's statistics through DSMEM
//          and mbarriers; where the clusters leave SMs idle, a helper grid takes the last rows
//          there: 2-CTA clusters of the same kernel with one group, or online's whole rows
//          (plan_fast_helper)
//   fast_lockstep  the same with all of a CTA's warps on one row at a time and the cluster barrier
//          per row (fast_lockstep_kernel), kept for ablations
//
// This file: the registry, the variants' shared workspace and argument checks, and the public
// building blocks' small kernels (count, merge, finalize, reduce). naive and online (with
// ce_shard_stats / ce_shard_backward) are in naive_online.cu, fast and fast_lockstep in fast.cu;
// kernels/loss_head/cross_entropy/internal.h lists what the files share.
#include <cuda_bf16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_common.cuh"
#include "kernels/core/workspace.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/cross_entropy/common.cuh"
#include "kernels/loss_head/cross_entropy/internal.h"

namespace zgpt::cuda {

using namespace ce;

namespace {

// ---------------------------------------------------------------- small kernels

__global__ void count_valid_kernel(int* n_valid, unsigned* max_key, const int32_t* targets,
                                   int64_t N, int64_t ignore_index) {
    __shared__ int partial[32];
    int c = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) c += targets[i] != ignore_index;
    for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < int(blockDim.x + 31) / 32; w++) t += partial[w];
        *n_valid = t;
        if (max_key) *max_key = 0;
    }
}

__global__ void merge_stats_kernel(RowStatsF* acc, const RowStatsF* shard, int64_t N) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < N) acc[i] = merge_stats(acc[i], shard[i]);
}

__global__ void finalize_kernel(const RowStatsF* stats, RowGradParams* params, int64_t N,
                                RowFinish f) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    params[i] = finish_row(f, i, stats[i], true).p;
}

// One block, fixed order, double accumulation: a deterministic summary. Each row's z-loss and
// loss are recomputed from its ce and lse (as finalize_row rounds them), so only those two rows
// and the row maxima (every max_stride-th float of row_max: RowStatsF's first field, or a plain
// array; or, where max_key is given, the one key raise_max kept) need to exist.
__global__ void reduce_kernel(LossSummaryF* out, const float* ce_rows, const float* lse_rows,
                              const float* row_max, int64_t max_stride, const unsigned* max_key,
                              float zw, const int32_t* targets, int64_t N, int64_t ignore_index,
                              const int* n_valid, Reduction red) {
    __shared__ double part[5][32];  // loss, ce, z, lse, lse^2
    __shared__ float part_max[32];
    double a[5] = {0, 0, 0, 0, 0};
    float mx = kNegInf;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        if (targets[i] != ignore_index) {
            const float z = row_z_loss(zw, lse_rows[i]);
            a[0] += row_loss(ce_rows[i], z);
            a[1] += ce_rows[i];
            a[2] += z;
            a[3] += lse_rows[i];
            a[4] += double(lse_rows[i]) * lse_rows[i];
        }
        if (!max_key) mx = fmaxf(mx, row_max[i * max_stride]);
    }
    for (int off = 16; off > 0; off >>= 1) {
        for (int k = 0; k < 5; k++) a[k] += __shfl_xor_sync(0xffffffffu, a[k], off);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        for (int k = 0; k < 5; k++) part[k][warp] = a[k];
        part_max[warp] = mx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t[5] = {0, 0, 0, 0, 0};
        float m = kNegInf;
        for (int w = 0; w < int(blockDim.x + 31) / 32; w++) {
            for (int k = 0; k < 5; k++) t[k] += part[k][w];
            m = fmaxf(m, part_max[w]);
        }
        if (max_key) m = float_of_max_key(*max_key);
        *out = summary_from_sums(t, m, *n_valid, red);
    }
}

}  // namespace

// ---------------------------------------------------------------- the variants' shared host side

namespace ce {

void check_args(const CrossEntropyArgs& a, const CrossEntropyOptions& o, bool full_row) {
    validate(o);
    ZG_CHECK(a.logits && a.targets && a.grad_output,
             "cross_entropy: logits, targets and grad_output are required");
    ZG_CHECK(a.N > 0 && a.V_local > 0 && a.ld >= a.V_local && a.V >= a.v0 + a.V_local && a.v0 >= 0,
             "cross_entropy: inconsistent sizes");
    ZG_CHECK(a.N <= INT32_MAX, "cross_entropy: N must fit a grid dimension");
    if (full_row)
        ZG_CHECK(a.v0 == 0 && a.V_local == a.V,
                 "this variant needs whole rows (v0 = 0, V_local = V); use the shard API");
}

// The layout of every variant's workspace; on a measuring layout (null base) it gives the size.
// online and fast keep a row's statistics and gradient parameters on the chip: they need only the
// valid count, the largest logit's key (for the summary) and the ce and lse rows the caller did
// not give: 8 bytes a row.
Workspace carve(WorkspaceLayout& l, int64_t N, int64_t V, bool naive) {
    Workspace ws{};
    ws.n_valid = l.take<int>(1);
    ws.max_key = l.take<unsigned>(1);
    ws.ce = l.take<float>(N);
    ws.lse = l.take<float>(N);
    if (naive) {
        ws.row_max = l.take<float>(N);
        ws.stats = l.take<RowStatsF>(N);
        ws.params = l.take<RowGradParams>(N);
        ws.probs = l.take<float>(size_t(N) * V);
    }
    return ws;
}

Workspace carve(void* w, int64_t N, int64_t V, bool naive) {
    WorkspaceLayout l(w);
    return carve(l, N, V, naive);
}

// The args with the ce and lse rows (what the summary reads) in the workspace where the caller
// gave none; loss and z-loss rows are written only where the caller asked for them.
CrossEntropyArgs with_rows(CrossEntropyArgs a, const Workspace& ws) {
    if (!a.ce_rows) a.ce_rows = ws.ce;
    if (!a.lse_rows) a.lse_rows = ws.lse;
    if (!a.dlogits) a.dlogits = const_cast<void*>(a.logits);
    return a;
}

void reduce_rows(const CrossEntropyArgs& a, const float* row_max, int64_t max_stride,
                 const int* n_valid, const CrossEntropyOptions& o, CUstream_st* s) {
    ZG_CHECK(a.summary && a.ce_rows && a.lse_rows,
             "the loss summary needs the ce and lse rows and a summary");
    reduce_kernel<<<1, 1024, 0, s>>>(a.summary, a.ce_rows, a.lse_rows, row_max, max_stride, nullptr,
                                     float(o.z_loss_weight), a.targets, a.N, o.ignore_index,
                                     n_valid, o.reduction);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void reduce_rows(const CrossEntropyArgs& a, const unsigned* max_key, const int* n_valid,
                 const CrossEntropyOptions& o, CUstream_st* s) {
    ZG_CHECK(a.summary && a.ce_rows && a.lse_rows && max_key,
             "the loss summary needs the ce and lse rows, the max key and a summary");
    reduce_kernel<<<1, 1024, 0, s>>>(a.summary, a.ce_rows, a.lse_rows, nullptr, 0, max_key,
                                     float(o.z_loss_weight), a.targets, a.N, o.ignore_index,
                                     n_valid, o.reduction);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void count_valid_and_reset_max(int* n_valid, unsigned* max_key, const int32_t* targets, int64_t N,
                               int64_t ignore_index, CUstream_st* s) {
    count_valid_kernel<<<1, 1024, 0, s>>>(n_valid, max_key, targets, N, ignore_index);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ce

namespace {

size_t workspace_size(int64_t N, int64_t V, bool naive) {
    WorkspaceLayout l(nullptr);
    carve(l, N, V, naive);
    return l.bytes();
}
size_t ws_online(int64_t N, int64_t V, LogitsType) {
    return workspace_size(N, V, false);
}
size_t ws_naive(int64_t N, int64_t V, LogitsType) {
    return workspace_size(N, V, true);
}

}  // namespace

// ---------------------------------------------------------------- public building blocks

void ce_count_valid(int* n_valid, const int32_t* targets, int64_t N, int64_t ignore_index,
                    CUstream_st* s) {
    count_valid_kernel<<<1, 1024, 0, s>>>(n_valid, nullptr, targets, N, ignore_index);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_merge_stats(RowStatsF* acc, const RowStatsF* shard, int64_t N, CUstream_st* s) {
    merge_stats_kernel<<<unsigned((N + 255) / 256), 256, 0, s>>>(acc, shard, N);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_finalize(RowGradParams* params, const RowStatsF* stats, const int* n_valid,
                 const CrossEntropyArgs& a, const CrossEntropyOptions& o, CUstream_st* s) {
    validate(o);
    finalize_kernel<<<unsigned((a.N + 255) / 256), 256, 0, s>>>(stats, params, a.N,
                                                                row_finish(a, o, n_valid));
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_reduce(const CrossEntropyArgs& a, const RowStatsF* stats, const int* n_valid,
               const CrossEntropyOptions& o, CUstream_st* s) {
    static_assert(sizeof(RowStatsF) == 4 * sizeof(float) && offsetof(RowStatsF, max) == 0,
                  "the summary reads RowStatsF::max as every fourth float");
    reduce_rows(a, reinterpret_cast<const float*>(stats), 4, n_valid, o, s);
}

const std::vector<CrossEntropyVariant>& cross_entropy_variants() {
    static const std::vector<CrossEntropyVariant> v = {
        {"naive", "textbook: row max, fp32 softmax materialised, loss, gradient (5 kernels)",
         ws_naive, run_naive},
        {"online", "one kernel per row: online-softmax stats, then re-read and write dlogits",
         ws_online, run_online},
        {"fast",
         "one read, one write: persistent clusters hold rows in shared memory; warp groups per "
         "CTA take turns over the rows, so one's waits overlap the others' passes; a helper grid "
         "takes the last rows on the SMs the clusters leave idle",
         ws_online, run_fast},
        {"fast_lockstep",
         "fast with all of a CTA's warps on one row at a time (the cluster barrier per row)",
         ws_online, run_fast_lockstep},
    };
    return v;
}

const CrossEntropyVariant& find_cross_entropy_variant(const std::string& name) {
    std::string known;
    for (const CrossEntropyVariant& v : cross_entropy_variants()) {
        if (name == v.name) return v;
        known += (known.empty() ? "" : ", ") + std::string(v.name);
    }
    throw Error("unknown cross_entropy variant '" + name + "' (known: " + known + ")");
}

}  // namespace zgpt::cuda

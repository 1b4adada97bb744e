// The CUDA loss head's host-side planners: plain arithmetic on the shapes, the alignment, the
// device's shared memory and SM count, deciding the grids, clusters and helper layout of the
// `fast` variants and the block sizes of the others. No CUDA here: the CPU library builds it too,
// and tests/test_ce_plan.cpp checks its decisions without a GPU. The launchers that follow the
// plans are in kernels/loss_head/cross_entropy/*.cu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/loss_head/cross_entropy.h"

namespace zgpt::cuda::ce {

constexpr int kFastThreads = 512;
constexpr int kMaxCluster = 8;
constexpr int kMaxStages = 8;
// The cluster sizes `fast` (the pingpong kernels) takes, when no size is fixed
// (CrossEntropyTuning::cluster). Odd sizes above 1 are left out: on an H200 (bf16, N = 16384,
// fast_cluster_sizes in docs/results/ce_vocab_sweep_h200.json), with three stages, clusters of 3
// and 5 ran at 2.2-2.4x the copy floor where 2, 4, 6 and 8 ran at 1.3-1.5x; at V = 256000, 7 ran
// at 1.50x against 8's 1.41x. The planner took them for rows of 150-225 KB (3), 300-375 KB (5)
// and 450-525 KB (7). fast_lockstep, not measured so, keeps every size.
constexpr int kFastClusterSizes[] = {1, 2, 4, 6, 8};

// The helper's rows per SM against the main grid's, in percent. Swept on the H100 at V = 128256
// (docs/results/ce_fast_helper_h100_99dcc22.json): the time falls up to about 75 and jumps from
// 90, where the helper's rows become the tail. 70 leaves a margin before that cliff.
constexpr int kHelperWeight = 70;
// The shapes `fast` and `fast_lockstep` take by the length of a row, as data: each table is
// searched for the first band whose max_row_bytes holds the row (the last band holds every
// length). The knobs of CrossEntropyTuning override a field each; `measured` says where each
// choice was measured (files in docs/results).
//
// fast (the pingpong kernels): one CTA per SM, its warp groups taking turns at `stages` buffers
// (a stage each, or fewer), in the smallest cluster (of kFastClusterSizes) whose slices fit
// `min_stages` stages; each buffer in `parts` copies, so a group refills one while its dlogits
// pass is on another (four copies measured no better). With fewer stages than groups a group
// waits for the buffer the group before it frees: fewer rows in flight an SM, but every SM busy
// (the 4-CTA clusters a longer row needs leave 12 of an H200's 132 idle). Rows of up to
// max_row_bytes of the online band go to the two-pass online kernels, where a short row's time in
// the cluster kernels is latency.
struct FastBand {
    size_t max_row_bytes;
    bool online;     // the online kernels take these rows (not with a fixed cluster size)
    int groups;      // warp groups per CTA: 3 of 256 threads, or 2 of kTwoGroupThreads
    int min_stages;  // the stages the cluster size is chosen for
    int parts;       // bulk copies per buffer
    const char* measured;
};
constexpr int kTwoGroupThreads = 512;
inline constexpr FastBand kFastBands[] = {
    {size_t(48) << 10, true, 3, 2, 2,
     "H200, bf16, N = 16384: online ahead up to V = 24576 (48 KB rows: 0.502 against 0.512 ms "
     "for three groups of 256 in one CTA), behind from 32768 (0.703 against 0.601 ms); "
     "fast_min_stages in ce_vocab_sweep_h200.json"},
    {size_t(256) << 10, false, 3, 2, 2,
     "H200, bf16, N = 16384: three groups of 256 with two stages in one CTA at V = 50304 (1.19x "
     "the copy floor against 1.29x with three stages in 2-CTA clusters, and 1.33x for two groups "
     "of 512) and in 2-CTA clusters at 100352 (1.14x against 4-CTA clusters with three, 1.40x); "
     "fast_min_stages in ce_vocab_sweep_h200.json"},
    {SIZE_MAX, false, 3, 3, 2,
     "three groups of 256 with three stages in clusters of 6 and 8 (fast_cluster_sizes and "
     "fast_stats_sweeps in ce_vocab_sweep_h200.json)"},
};
// fast's statistics sweeps over a slice (CrossEntropyTuning::stats_sweeps) by the threads of its
// warp groups and its cluster size (0: any), the first entry that matches. One sweep leaves less
// of a row's work after its last part lands: on an H200 it paid in three groups of 256 in
// clusters of 2, 6 and 8 CTAs and lost in clusters of 4 and in groups of 512, at the same work
// per thread (fast_stats_sweeps in docs/results/ce_vocab_sweep_h200.json).
struct SweepsBand {
    int group_threads;
    int cluster;
    int sweeps;
};
inline constexpr SweepsBand kStatsSweeps[] = {
    {256, 4, 2},
    {256, 0, 1},
    {512, 0, 2},
};
// The sweeps for groups of group_threads threads in clusters of `cluster` CTAs, unless the tuning
// fixes them; 2 where no entry matches.
int stats_sweeps_for(int group_threads, int cluster, const CrossEntropyTuning& k);

// fast_lockstep (one warp group a CTA): its threads, the stages its cluster size is chosen for,
// and the buffers' budget (0: the device's opt-in shared memory less 2 KB).
struct LockstepBand {
    size_t max_row_bytes;
    int threads;
    int min_stages;
    int smem_kb;
    const char* measured;
};
inline constexpr LockstepBand kLockstepBands[] = {
    {size_t(128) << 10, 256, 2, 110,
     "two 256-thread CTAs per SM with two stages each (H100, docs/cross_entropy.md)"},
    {SIZE_MAX, 512, 3, 0, "one 512-thread CTA per SM holding three stages (H100)"},
};

// The band of `bands` that holds rows of row_bytes bytes.
template <typename Band, size_t N>
constexpr const Band& band_for(const Band (&bands)[N], size_t row_bytes) {
    for (size_t i = 0; i + 1 < N; i++)
        if (row_bytes <= bands[i].max_row_bytes) return bands[i];
    return bands[N - 1];
}

// `fast` leaves rows of at most this many bytes to the online kernels (the first band).
constexpr size_t kFastOnlineMaxRowBytes = kFastBands[0].max_row_bytes;
static_assert(kFastBands[0].online && !kFastBands[1].online, "one online band, the first");

size_t type_size(LogitsType t);

// Whole 16-byte chunks are possible when every row of both buffers starts 16-byte aligned.
bool rows_aligned(const void* a, const void* b, int64_t ld, LogitsType t);

// Threads per block of the block-per-row kernels (naive, online).
int num_threads_for(int64_t V);

// The fast kernel's shape. Each CTA keeps `stages` slices of rows in shared memory; the plan
// takes the fewest CTAs per cluster (of kFastClusterSizes) whose slices fit the wanted number of
// stages in the budget (else 2), so that rows stream in while one is worked on. As many persistent
// clusters are launched as fit on the GPU at once.
struct FastPlan {
    int cluster = 0;  // 0: not possible (unaligned rows or rows too long): use online
    int threads = kFastThreads;
    bool pingpong = false;  // fast_pingpong_kernel (threads: all of its groups)
    int groups = 1;         // warp groups per CTA
    int parts = 1;          // bulk copies per buffer
    int stages = 0;
    int64_t slice = 0;
    size_t smem = 0;
    int stats_sweeps = 2;  // the pingpong kernels' statistics: 1 or 2 sweeps over a slice
};

// max_smem: the device's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
// Follows the knobs of a.tuning (CrossEntropyTuning; its defaults: the choices below).
FastPlan plan_fast(const CrossEntropyArgs& a, bool pingpong, int max_smem);

// The helper of a `fast` launch whose clusters leave SMs idle. Clusters live inside one GPC, and
// on the H100 (132 SMs) at most 30 clusters of 4 one-CTA-per-SM CTAs fit at once: 120 SMs, while
// 66 clusters of 2 take all 132 (measured, docs/cross_entropy.md). The helper is one warp group
// of 512 threads per CTA in 2-CTA clusters, one buffer of half a row each (so rows of up to two
// CTAs' shared memory), launched after the main grid onto the SMs it left idle. Its copies per
// buffer: a.tuning.helper_parts.
FastPlan plan_fast_helper(const CrossEntropyArgs& a, const FastPlan& main, int max_smem);

// The helper grid's share of N rows. The SMs (of sm_count) that the main grid leaves idle, with
// main_clusters clusters of its plan resident at once, take rows [N - rows, N) in `clusters`
// clusters of the helper's shape (at most helper_fit, those that fit at once), in proportion to
// their rate per SM against the main grid's: `weight` percent (kHelperWeight, or
// CrossEntropyTuning::helper_weight).
struct HelperSplit {
    int clusters = 0;
    int64_t rows = 0;
};
HelperSplit split_helper(int64_t N, int sm_count, int main_clusters, const FastPlan& main,
                         const FastPlan& help, int helper_fit, int weight);

}  // namespace zgpt::cuda::ce

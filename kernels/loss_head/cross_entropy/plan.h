// The CUDA loss head's host-side planners: plain arithmetic on the shapes, the alignment, the
// device's shared memory and SM count, deciding the grids, clusters and helper layout of the
// `fast` variants and the block sizes of the others. No CUDA here: the CPU library builds it too,
// and tests/test_ce_plan.cpp checks its decisions without a GPU. The launchers that follow the
// plans are in kernels/loss_head/cross_entropy/*.cu.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "kernels/loss_head/cross_entropy.h"

namespace zgpt::cuda::ce {

constexpr int kFastThreads = 512;
constexpr int kMaxCluster = 8;
constexpr int kMaxStages = 8;
// The cluster sizes `fast` (the pingpong kernels) takes, when no size is fixed
// (CrossEntropyTuning::cluster). 7 is left out: on an H200 (bf16, N = 16384) it ran behind 6 or 8
// at every V it could take (fast_odd_clusters in docs/results/ce_vocab_sweep_h200.json; 3 and 5,
// once slowed by a helper grid that could not run beside them, are ahead where the planner takes
// them). fast_lockstep keeps every size.
constexpr int kFastClusterSizes[] = {1, 2, 3, 4, 5, 6, 8};

// The helper grid behind fast's main grid (plan_fast_helper), by the main grid's cluster size, as
// data: the band of the main grid's cluster size, else the last (cluster 0: any other size).
// `online`: online's whole rows on single idle SMs rather than 2-CTA clusters of the pingpong
// kernel; those need the idle SMs in pairs (an even cluster size) and half a row in a CTA, and
// where they cannot run the last band's online rows are taken. `weight`: the helper's rows per SM
// against the main grid's, in percent (CrossEntropyTuning::helper_weight overrides it).
struct HelperBand {
    int cluster;
    bool online;
    int weight;
    const char* measured;
};
inline constexpr HelperBand kHelperBands[] = {
    {4, false, 70,
     "H100, V = 128256: the time falls up to a weight of about 75 and jumps from 90, where the "
     "helper's rows become the tail (ce_fast_helper_h100_99dcc22.json); H200, V = 150000: 2.91 ms "
     "against 3.13 with online rows (fast_online_helper in ce_vocab_sweep_h200.json)"},
    {8, true, 80,
     "H200, V = 256000 (no pairs: half a row exceeds a CTA): 4.72 ms at 80 against 4.78 at 60, "
     "4.84 at 40 and 5.14 at 100 (fast_online_helper)"},
    {0, true, 60,
     "H200: V = 128256 in clusters of 3, 2.41 ms at 60 against 2.44 at 40 and 2.61 at 80; 163840 "
     "in clusters of 5, 2.99 against 3.05 and 3.10; 200000 in clusters of 6, 3.91 ms against "
     "pairs' 4.19 (fast_online_helper)"},
};
static_assert(kHelperBands[std::size(kHelperBands) - 1].cluster == 0 &&
                  kHelperBands[std::size(kHelperBands) - 1].online,
              "the last band takes every size, with online rows");

// The shapes `fast` and `fast_lockstep` take by the length of a row, as data: each table is
// searched for the first band whose max_row_bytes holds the row (the last band holds every
// length). The knobs of CrossEntropyTuning override a field each; `measured` says where each
// choice was measured (files in docs/results).
//
// fast (the pingpong kernels): one CTA per SM, its warp groups taking turns at `stages` buffers
// (a stage each, or fewer), in the smallest cluster (of kFastClusterSizes) whose slices fit
// `min_stages` stages; each buffer in `parts` copies, so a group refills one while its dlogits
// pass is on another (four copies measured no better). With fewer stages than groups a group
// waits for the buffer the group before it frees: fewer rows in flight an SM, but fewer CTAs a
// row, so fewer SMs left to the helper grid (clusters of 4 leave 12 of an H200's 132 idle, of 3
// leave 15, of 2 none). Rows of up to
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
     "three groups of 256 with three stages in clusters of 4 to 8 (fast_cluster_sizes, "
     "fast_stats_sweeps and fast_odd_clusters in ce_vocab_sweep_h200.json)"},
};
// fast's statistics sweeps over a slice (CrossEntropyTuning::stats_sweeps) by the threads of its
// warp groups and its cluster size (0: any), the first entry that matches. One sweep leaves less
// of a row's work after its last part lands: on an H200 it paid in three groups of 256 in
// clusters of 2, 3, 6 and 8 CTAs and lost in clusters of 4 and in groups of 512, at the same work
// per thread (fast_stats_sweeps and, for 3, fast_odd_clusters in
// docs/results/ce_vocab_sweep_h200.json); clusters of 5 take one sweep, not measured with two.
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
    // The pingpong kernels' statistics through the cluster exchange (DSMEM writes, a remote
    // arrive, a cluster-scope wait, an 8-wide merge). A cluster of one has nothing to exchange
    // and skips it where its warp groups share buffers (fewer stages than groups: faster at
    // V = 40960 and 50304). Where each group has a buffer of its own (V = 32768: three stages)
    // the exchange, though it carries nothing, ran faster and is kept (fast_cluster_of_one in
    // docs/results/ce_vocab_sweep_h200.json). Always true in clusters of more than one.
    bool exchange = true;
    // a helper grid (plan_fast_helper): of online's one-block-a-row kernel, `threads` a block and
    // `smem` bytes of shared memory it only reserves; its rows per SM against the main grid's, in
    // percent
    bool online_rows = false;
    int weight = 0;
};

// max_smem: the device's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
// Follows the knobs of a.tuning (CrossEntropyTuning; its defaults: the choices below).
FastPlan plan_fast(const CrossEntropyArgs& a, bool pingpong, int max_smem);

// The helper of a `fast` launch whose clusters leave SMs idle. Clusters live inside one GPC, and
// on an H100 or H200 (132 SMs) at most 30 clusters of 4 one-CTA-per-SM CTAs fit at once (120
// SMs), 39 of 3 (117), while 66 clusters of 2 take all 132 (tools/dev/probes/cluster_occupancy.cu).
// The helper is launched after the main grid onto the SMs it left idle, in the shape
// kHelperBands gives for the main grid's cluster size:
//  - 2-CTA clusters of one warp group of 512 threads per CTA, one buffer of half a row each;
//    its copies per buffer: a.tuning.helper_parts;
//  - online's one-block-a-row kernel (online_rows), its blocks reserving enough shared memory
//    that none fits beside a main-grid CTA.
FastPlan plan_fast_helper(const CrossEntropyArgs& a, const FastPlan& main, int max_smem);

// The helper grid's share of N rows. The SMs (of sm_count) that the main grid leaves idle, with
// main_clusters clusters of its plan resident at once, take rows [N - rows, N) in `clusters`
// clusters of the helper's shape (at most helper_fit, those that fit at once), in proportion to
// their rate per SM against the main grid's: `weight` percent (FastPlan::weight).
struct HelperSplit {
    int clusters = 0;
    int64_t rows = 0;
};
HelperSplit split_helper(int64_t N, int sm_count, int main_clusters, const FastPlan& main,
                         const FastPlan& help, int helper_fit, int weight);

}  // namespace zgpt::cuda::ce

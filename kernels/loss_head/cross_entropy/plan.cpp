#include "kernels/loss_head/cross_entropy/plan.h"

#include <algorithm>
#include <iterator>

namespace zgpt::cuda::ce {

size_t type_size(LogitsType t) {
    return t == LogitsType::bf16 ? 2 : 4;
}

bool rows_aligned(const void* a, const void* b, int64_t ld, LogitsType t) {
    return reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
           (ld * int64_t(type_size(t))) % 16 == 0;
}

int num_threads_for(int64_t V) {
    return V >= 4096 ? 512 : V >= 512 ? 256 : 64;
}

namespace {

// plan_fast with the warp groups chosen (pingpong; 1 for fast_lockstep): the shape of the row's
// band (plan.h's tables), then the knobs.
FastPlan plan_fast_groups(const CrossEntropyArgs& a, bool pingpong, int max_smem, int groups) {
    const size_t es = type_size(a.type), row_bytes = size_t(a.V) * es;
    const CrossEntropyTuning& k = a.tuning;
    int parts = 1, threads = 0, want = 0;
    size_t budget = size_t(max_smem) - 2048;
    if (pingpong) {
        const FastBand& b = band_for(kFastBands, row_bytes);
        parts = b.parts;
        if (const int p = k.parts; p == 1 || p == 2 || p == 4) parts = p;
        threads = groups * (groups == 2 ? kTwoGroupThreads : 256);
        want = b.min_stages;
    } else {
        const LockstepBand& b = band_for(kLockstepBands, row_bytes);
        threads = b.threads;
        want = b.min_stages;
        if (b.smem_kb > 0) budget = size_t(b.smem_kb) << 10;
    }
    if (const int t = k.threads; t == 256 || t == 512 || t == 1024)
        threads = !pingpong ? t : groups == 2 ? std::max(t, 512) : threads;
    if (pingpong && threads != 512) parts = std::min(parts, 2);  // the kernels instantiated
    if (const int kb = k.smem_kb; kb > 0) budget = size_t(kb) << 10;
    budget = std::min(budget, size_t(max_smem) - 2048);
    if (const int m = k.min_stages; m > 0) want = m;
    const int forced = std::clamp(k.cluster, 0, kMaxCluster);
    const int64_t per = 16 / int64_t(es);
    for (const int min_stages : {want, 2}) {
        for (int c = forced ? forced : 1; c <= (forced ? forced : kMaxCluster); c++) {
            if (!forced && pingpong &&
                std::find(std::begin(kFastClusterSizes), std::end(kFastClusterSizes), c) ==
                    std::end(kFastClusterSizes))
                continue;
            int64_t slice = (a.V + c - 1) / c;
            slice = (slice + per - 1) / per * per;
            const int64_t stages =
                std::min<int64_t>(kMaxStages, int64_t(budget) / (slice * int64_t(es)));
            if (stages >= min_stages) {
                FastPlan p{c,     threads,     pingpong, groups,
                           parts, int(stages), slice,    size_t(stages) * size_t(slice) * es};
                if (pingpong) p.stats_sweeps = stats_sweeps_for(threads / groups, c, k);
                p.exchange = c > 1 || !pingpong || p.stages >= groups;
                return p;
            }
        }
    }
    return {};
}

}  // namespace

FastPlan plan_fast(const CrossEntropyArgs& a, bool pingpong, int max_smem) {
    if (!rows_aligned(a.logits, a.dlogits ? a.dlogits : a.logits, a.ld, a.type)) return {};
    // The bands' shapes (plan.h), unless a knob fixes them: groups (2 | 3 warp groups), parts
    // (1 | 2 | 4 copies per buffer), threads (256 | 512 | 1024; with two groups, 512 or 1024 in
    // all; three groups have 768), smem_kb (the buffers' budget per CTA), min_stages (the stages
    // the cluster size is chosen for), cluster (a fixed cluster size, which also keeps `fast` on
    // the online band's rows). Static shared memory (barriers, statistics, reductions) takes
    // < 2 KB.
    if (!pingpong) return plan_fast_groups(a, false, max_smem, 1);
    const CrossEntropyTuning& k = a.tuning;
    const FastBand& b = band_for(kFastBands, size_t(a.V) * type_size(a.type));
    if (b.online && k.cluster == 0) return {};
    const int groups = k.groups == 2 || k.groups == 3 ? k.groups : b.groups;
    return plan_fast_groups(a, true, max_smem, groups);
}

FastPlan plan_fast_helper(const CrossEntropyArgs& a, const FastPlan& main, int max_smem) {
    constexpr int kCluster = 2;
    // only behind a grid of one CTA per SM in clusters of more than 2 (1 and 2 fill every SM),
    // whose idle SMs are then whole
    if (!main.pingpong || main.cluster <= kCluster || 2 * main.smem <= size_t(max_smem)) return {};
    const HelperBand& last = kHelperBands[std::size(kHelperBands) - 1];
    const HelperBand* band = &last;
    for (const HelperBand& b : kHelperBands)
        if (b.cluster == main.cluster) {
            band = &b;
            break;
        }
    const size_t es = type_size(a.type);
    const int64_t per = 16 / int64_t(es);
    const int64_t slice = ((a.V + kCluster - 1) / kCluster + per - 1) / per * per;
    const size_t budget = size_t(max_smem) - 2048;
    const int64_t stages = std::min<int64_t>(kMaxStages, int64_t(budget) / (slice * int64_t(es)));
    // Pairs need the idle SMs in pairs: an odd cluster size can leave single SMs in a GPC, and
    // 2-CTA clusters that find none wait for the main grid to end, then run their rows after it
    // (H200, clusters of 3 at V = 128256: 4.41 ms with such a helper, 2.51 without;
    // fast_odd_clusters in docs/results/ce_vocab_sweep_h200.json).
    FastPlan p;
    if (!band->online && main.cluster % kCluster == 0 && stages >= 1) {
        // one copy per buffer: with two or four, the main grid slowed more than the helper
        // gained (V = 128256 on the H100, docs/results/ce_fast_helper_h100_99dcc22.json)
        int parts = 1;
        if (const int k = a.tuning.helper_parts; k == 1 || k == 2 || k == 4) parts = k;
        p = FastPlan{kCluster, 512,         true,  1,
                     parts,    int(stages), slice, size_t(stages) * size_t(slice) * es};
        p.stats_sweeps = stats_sweeps_for(512, kCluster, a.tuning);
    } else {
        if (!band->online) band = &last;  // pairs that cannot run: online rows, at their weight
        p.cluster = 1;
        p.online_rows = true;
        p.threads = num_threads_for(a.V);
        // with the main CTA's (and each block's 1 KB reserve) this exceeds an SM's shared memory
        p.smem = size_t(max_smem) - main.smem;
    }
    p.weight = a.tuning.helper_weight >= 0 ? a.tuning.helper_weight : band->weight;
    return p;
}

int stats_sweeps_for(int group_threads, int cluster, const CrossEntropyTuning& k) {
    if (k.stats_sweeps == 1 || k.stats_sweeps == 2) return k.stats_sweeps;
    for (const SweepsBand& b : kStatsSweeps)
        if (b.group_threads == group_threads && (b.cluster == 0 || b.cluster == cluster))
            return b.sweeps;
    return 2;
}

HelperSplit split_helper(int64_t N, int sm_count, int main_clusters, const FastPlan& main,
                         const FastPlan& help, int helper_fit, int weight) {
    HelperSplit r;
    const int idle = sm_count - main_clusters * main.cluster;
    r.clusters = std::clamp(idle / help.cluster, 0, helper_fit);
    const double h = double(r.clusters * help.cluster) * std::max(weight, 0) / 100.0;
    r.rows = int64_t(double(N) * h / (h + double(main_clusters * main.cluster)));
    return r;
}

}  // namespace zgpt::cuda::ce

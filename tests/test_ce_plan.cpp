// The CUDA loss head's planners (kernels/loss_head/cross_entropy/plan.h) on the CPU: the cluster,
// stages, warp groups and helper grid that `fast` and `fast_lockstep` choose for a few shapes and
// devices. Each expected value is worked out here from the rules the planner documents, not
// copied from a run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/cross_entropy/plan.h"

using namespace zgpt;
using namespace zgpt::cuda;
using namespace zgpt::cuda::ce;

namespace {

constexpr int kHopperSmem = 227 * 1024;          // H100 / H200 opt-in shared memory per block
constexpr int64_t kBudget = kHopperSmem - 2048;  // the buffers' budget: 230,400 bytes

// Rows of V values (row stride ld) at 16-byte aligned addresses; the planner only looks at them.
CrossEntropyArgs rows(LogitsType type, int64_t V, int64_t ld = 0, uintptr_t offset = 0) {
    CrossEntropyArgs a;
    a.type = type;
    a.V = a.V_local = V;
    a.ld = ld ? ld : V;
    a.N = 8192;
    a.logits = reinterpret_cast<const void*>((uintptr_t(1) << 20) + offset);
    return a;
}

}  // namespace

TEST_CASE("ce plan: block sizes and alignment") {
    // 512 threads from 4096 columns, 256 from 512, else 64
    CHECK(num_threads_for(50304) == 512);
    CHECK(num_threads_for(4096) == 512);
    CHECK(num_threads_for(4095) == 256);
    CHECK(num_threads_for(512) == 256);
    CHECK(num_threads_for(511) == 64);
    CHECK(type_size(LogitsType::bf16) == 2);
    CHECK(type_size(LogitsType::f32) == 4);
    const void* p = reinterpret_cast<const void*>(uintptr_t(4096));
    const void* q = reinterpret_cast<const void*>(uintptr_t(4096 + 2));
    CHECK(rows_aligned(p, p, 50304, LogitsType::bf16));   // 100,608-byte rows
    CHECK(!rows_aligned(p, p, 50257, LogitsType::bf16));  // 100,514: not a multiple of 16
    CHECK(rows_aligned(p, p, 50257 + 3, LogitsType::f32));
    CHECK(!rows_aligned(q, p, 50304, LogitsType::bf16));
    CHECK(!rows_aligned(p, q, 50304, LogitsType::bf16));
}

TEST_CASE("ce plan: fast on short rows (GPT-2's vocabulary)") {
    // bf16, V = 50304: 100,608-byte rows, up to 256 KB: three warp groups of 256 threads, each
    // buffer in two copies. The smallest cluster whose slices fit two stages in the budget: one
    // CTA (2 x 100,608 <= 230,400), the third group waiting for a buffer.
    const CrossEntropyArgs a = rows(LogitsType::bf16, 50304);
    const FastPlan p = plan_fast(a, true, kHopperSmem);
    CHECK(p.cluster == 1);
    CHECK(p.pingpong);
    CHECK(p.groups == 3);
    CHECK(p.threads == 768);
    CHECK(p.parts == 2);
    CHECK(p.slice == 50304);
    CHECK(p.stages == 2);
    CHECK(p.smem == size_t(2 * 50304 * 2));
    // one CTA, two stages for three groups: no statistics exchange
    CHECK_FALSE(p.exchange);
    // the helper only goes behind clusters of more than 2 CTAs
    CHECK(plan_fast_helper(a, p, kHopperSmem).cluster == 0);

    // V = 50257 (the trainer's): the slice is rounded up to whole 16-byte chunks (8 values)
    const FastPlan t = plan_fast(rows(LogitsType::bf16, 50257, 50264), true, kHopperSmem);
    CHECK(t.cluster == 1);
    CHECK(t.slice == 50264);
    CHECK(t.stages == 2);

    // a fixed cluster size (CrossEntropyTuning::cluster): 2 CTAs of 25,152 values, 50,304 bytes
    // a slice, so min(8, 230,400 / 50,304) = 4 stages
    CrossEntropyArgs forced = a;
    forced.tuning.cluster = 2;
    const FastPlan f = plan_fast(forced, true, kHopperSmem);
    CHECK(f.cluster == 2);
    CHECK(f.slice == 25152);
    CHECK(f.stages == 4);
    CHECK(f.exchange);  // a cluster of two exchanges

    // V = 32768: 65,536-byte rows, min(8, 230,400 / 65,536) = 3 stages in one CTA, a buffer for
    // each of the three groups: the exchange is kept (it measured faster there)
    const FastPlan q = plan_fast(rows(LogitsType::bf16, 32768), true, kHopperSmem);
    CHECK(q.cluster == 1);
    CHECK(q.stages == 3);
    CHECK(q.exchange);
    // ... and dropped when the budget leaves two stages (smem_kb, 130 KB)
    CrossEntropyArgs two = rows(LogitsType::bf16, 32768);
    two.tuning.smem_kb = 130;
    const FastPlan q2 = plan_fast(two, true, kHopperSmem);
    CHECK(q2.stages == 2);
    CHECK_FALSE(q2.exchange);
}

TEST_CASE("ce plan: fast on long rows, and its helper grid") {
    // bf16, V = 128256 (Llama 3): 256,512-byte rows, the longest of the band that wants two
    // stages: three warp groups of 256 threads, two copies per buffer. Clusters of 2 give slices
    // of 128,256 bytes (1 stage), of 3 85,504 bytes (42,752 values: 2 stages).
    const CrossEntropyArgs a = rows(LogitsType::bf16, 128256);
    const FastPlan p = plan_fast(a, true, kHopperSmem);
    CHECK(p.cluster == 3);
    CHECK(p.groups == 3);
    CHECK(p.threads == 768);
    CHECK(p.parts == 2);
    CHECK(p.slice == 42752);
    CHECK(p.stages == 2);
    CHECK(p.smem == size_t(2 * 85504));

    // One CTA per SM (2 x 171,008 bytes do not fit an SM) in clusters of 3, an odd size: the
    // helper is online's whole rows (kHelperBands' last band), 512 threads a block (V >= 4096),
    // each reserving 232,448 - 171,008 = 61,440 bytes so that none fits beside a main-grid CTA,
    // at weight 60.
    const FastPlan h = plan_fast_helper(a, p, kHopperSmem);
    CHECK(h.cluster == 1);
    CHECK(h.online_rows);
    CHECK_FALSE(h.pingpong);
    CHECK(h.threads == 512);
    CHECK(h.smem == size_t(61440));
    // with each block's 1 KB reserve, more than an SM's 228 KB
    CHECK(h.smem + 1024 + p.smem + 1024 > size_t(228 * 1024));
    CHECK(h.weight == 60);
    // On 132 SMs, 39 clusters of 3 fit (117 SMs): the 15 idle SMs count as 15 x 0.6 = 9 against
    // the main grid's 117, so they take floor(16384 x 9 / 126) = floor(1170.29) = 1170 rows.
    HelperSplit s = split_helper(16384, 132, 39, p, h, 132, h.weight);
    CHECK(s.clusters == 15);
    CHECK(s.rows == 1170);
    // the tuning's weight replaces the band's
    CrossEntropyArgs light = a;
    light.tuning.helper_weight = 25;
    CHECK(plan_fast_helper(light, p, kHopperSmem).weight == 25);

    // bf16, V = 140000: 280,000-byte rows want three stages: clusters of 3 hold two (93,344-byte
    // slices), of 4 three (35,000 values, 70,000 bytes). Behind clusters of 4 the helper is 2-CTA
    // clusters of one 512-thread group, one copy per buffer, slices of half a row (70,000 values,
    // 140,000 bytes), as many stages as fit (230,400 / 140,000 = 1), at weight 70.
    const CrossEntropyArgs b = rows(LogitsType::bf16, 140000);
    const FastPlan p4 = plan_fast(b, true, kHopperSmem);
    CHECK(p4.cluster == 4);
    CHECK(p4.slice == 35000);
    CHECK(p4.stages == 3);
    const FastPlan h2 = plan_fast_helper(b, p4, kHopperSmem);
    CHECK(h2.cluster == 2);
    CHECK_FALSE(h2.online_rows);
    CHECK(h2.pingpong);
    CHECK(h2.groups == 1);
    CHECK(h2.threads == 512);
    CHECK(h2.parts == 1);
    CHECK(h2.slice == 70000);
    CHECK(h2.stages == 1);
    CHECK(h2.smem == size_t(140000));
    CHECK(h2.weight == 70);

    // On 132 SMs, 30 clusters of 4 fit (120 SMs): the 12 idle SMs make 6 helper clusters. At
    // weight 70 they count as 12 x 0.7 = 8.4 SMs against the main grid's 120, so they take
    // floor(16384 x 8.4 / 128.4) = floor(1071.85) = 1071 of 16,384 rows.
    s = split_helper(16384, 132, 30, p4, h2, 66, 70);
    CHECK(s.clusters == 6);
    CHECK(s.rows == 1071);
    // only 4 helper clusters fit at once: 8 SMs, 5.6 against 120: floor(16384 x 5.6 / 125.6) = 730
    s = split_helper(16384, 132, 30, p4, h2, 4, 70);
    CHECK(s.clusters == 4);
    CHECK(s.rows == 730);
    // no idle SMs (33 clusters of 4 on 132), or weight 0: no helper rows
    s = split_helper(16384, 132, 33, p4, h2, 66, 70);
    CHECK(s.clusters == 0);
    CHECK(s.rows == 0);
    s = split_helper(16384, 132, 30, p4, h2, 66, 0);
    CHECK(s.rows == 0);
    // an odd idle SM is left out: 115 SMs, 28 clusters of 4 leave 3, one helper cluster of 2;
    // floor(16384 x 1.4 / 113.4) = floor(202.27) = 202
    s = split_helper(16384, 115, 28, p4, h2, 66, 70);
    CHECK(s.clusters == 1);
    CHECK(s.rows == 202);

    // Where half a row exceeds a CTA, online rows even behind clusters of 4 (the last band's
    // weight): V = 256000 in clusters of 4 (fixed, with one stage) has slices of 128,000 bytes (1
    // stage), and half rows of 256,000 bytes do not fit. Behind the planner's clusters of 8 (three
    // stages of 64,000 bytes) the helper is online rows at weight 80.
    CrossEntropyArgs wide = rows(LogitsType::bf16, 256000);
    wide.tuning.cluster = 4;
    wide.tuning.min_stages = 1;
    const FastPlan w4 = plan_fast(wide, true, kHopperSmem);
    CHECK(w4.cluster == 4);
    CHECK(w4.stages == 1);
    const FastPlan hw4 = plan_fast_helper(wide, w4, kHopperSmem);
    CHECK(hw4.online_rows);
    CHECK(hw4.weight == 60);
    const CrossEntropyArgs c = rows(LogitsType::bf16, 256000);
    const FastPlan p8 = plan_fast(c, true, kHopperSmem);
    CHECK(p8.cluster == 8);
    CHECK(p8.stages == 3);
    const FastPlan h8 = plan_fast_helper(c, p8, kHopperSmem);
    CHECK(h8.online_rows);
    CHECK(h8.smem == size_t(kHopperSmem) - p8.smem);
    CHECK(h8.weight == 80);

    // fp32 rows of 50,304 values (201,216 bytes) plan as bf16 rows of the same bytes: three
    // groups, clusters of 2 with 2 stages of 25,152 values (100,608 bytes), and no helper behind
    // 2-CTA clusters (they fill every SM)
    const CrossEntropyArgs f = rows(LogitsType::f32, 50304);
    const FastPlan pf = plan_fast(f, true, kHopperSmem);
    CHECK(pf.cluster == 2);
    CHECK(pf.threads == 768);
    CHECK(pf.slice == 25152);
    CHECK(pf.stages == 2);
    CHECK(plan_fast_helper(f, pf, kHopperSmem).cluster == 0);
}

TEST_CASE("ce plan: fast's rows of up to 256 KB take the fewest CTAs that hold two stages") {
    // Three groups (768 threads) hold two stages of bf16 rows of up to 57,600 values in one CTA
    // (230,400 bytes of budget); longer rows spread over a cluster of 2, which holds three stages
    // up to 76,800 values and two up to 115,200; then clusters of 3 (two stages, to the band's
    // edge at 131,072).
    for (const int64_t V : {32776, 57600}) {
        CAPTURE(V);
        const FastPlan p = plan_fast(rows(LogitsType::bf16, V), true, kHopperSmem);
        CHECK(p.cluster == 1);
        CHECK(p.groups == 3);
        CHECK(p.threads == 768);
        CHECK(p.stages >= 2);
    }
    struct Case {
        int64_t V;
        int cluster, stages;
    };
    for (const Case c : {Case{57608, 2, 3}, Case{76800, 2, 3}, Case{76808, 2, 2},
                         Case{115200, 2, 2}, Case{115208, 3, 2}, Case{131072, 3, 2}}) {
        CAPTURE(c.V);
        const FastPlan p = plan_fast(rows(LogitsType::bf16, c.V), true, kHopperSmem);
        CHECK(p.cluster == c.cluster);
        CHECK(p.groups == 3);
        CHECK(p.stages == c.stages);
        CHECK(p.smem <= size_t(kHopperSmem - 2048));
    }
    // fp32 rows of 30,000 values (120,000 bytes) likewise
    CHECK(plan_fast(rows(LogitsType::f32, 30000), true, kHopperSmem).groups == 3);
    // a fixed group count is kept
    CrossEntropyArgs fixed = rows(LogitsType::bf16, 64128);
    fixed.tuning.groups = 2;
    const FastPlan f = plan_fast(fixed, true, kHopperSmem);
    CHECK(f.groups == 2);
    CHECK(f.cluster == 2);
}

TEST_CASE("ce plan: fast takes clusters of 1 to 6 and 8 CTAs, 7 only when the size is fixed") {
    // bf16 rows in the budget of 227 KB - 2 KB = 230,400 bytes. Rows of up to 256 KB want two
    // stages: clusters of 2 hold them up to 115,200 values, 3 up to 172,800 (the band ends at
    // 131,072). Longer rows want three: clusters of 4 hold them up to 153,600 values, 5 up to
    // 192,000, 6 up to 230,400, 7 (not taken) up to 268,800 and 8 up to 307,200.
    struct Case {
        int64_t V;
        int cluster, stages;
    };
    for (const Case c :
         {Case{100352, 2, 2}, Case{115200, 2, 2}, Case{128256, 3, 2}, Case{131080, 4, 3},
          Case{153600, 4, 3}, Case{153608, 5, 3}, Case{163840, 5, 3}, Case{192000, 5, 3},
          Case{192008, 6, 3}, Case{200000, 6, 3}, Case{230400, 6, 3}, Case{230408, 8, 3},
          Case{256000, 8, 3}, Case{307200, 8, 3}}) {
        CAPTURE(c.V);
        const FastPlan p = plan_fast(rows(LogitsType::bf16, c.V), true, kHopperSmem);
        CHECK(p.cluster == c.cluster);
        CHECK(p.stages >= c.stages);
        CHECK(p.smem <= size_t(kHopperSmem - 2048));
    }
    // past 8 x 3 stages, two stages in 8 CTAs, up to 460,800 values; then online
    const FastPlan two = plan_fast(rows(LogitsType::bf16, 400000), true, kHopperSmem);
    CHECK(two.cluster == 8);
    CHECK(two.stages == 2);
    CHECK(plan_fast(rows(LogitsType::bf16, 500000), true, kHopperSmem).cluster == 0);
    // a fixed size is kept, in the table or not (the ablations measure it)
    CrossEntropyArgs forced = rows(LogitsType::bf16, 256000);
    forced.tuning.cluster = 7;
    CHECK(plan_fast(forced, true, kHopperSmem).cluster == 7);
    // fast_lockstep keeps every size: 3 CTAs of 66,904 bytes hold its 3 stages
    CHECK(plan_fast(rows(LogitsType::bf16, 100352), false, kHopperSmem).cluster == 3);
}

TEST_CASE("ce plan: fast_lockstep") {
    // Rows of up to 128 KB: 256-thread CTAs, two per SM, so a 110 KB budget each and two stages:
    // one CTA holds only one 100,608-byte stage, two CTAs of 50,304 bytes hold 2.
    const CrossEntropyArgs a = rows(LogitsType::bf16, 50304);
    const FastPlan p = plan_fast(a, false, kHopperSmem);
    CHECK(p.cluster == 2);
    CHECK(!p.pingpong);
    CHECK(p.groups == 1);
    CHECK(p.parts == 1);
    CHECK(p.threads == 256);
    CHECK(p.slice == 25152);
    CHECK(p.stages == 2);
    CHECK(plan_fast_helper(a, p, kHopperSmem).cluster == 0);  // no helper behind lockstep
    // longer rows: one 512-thread CTA per SM holding three stages (kLockstepBands)
    const FastPlan l = plan_fast(rows(LogitsType::bf16, 128256), false, kHopperSmem);
    CHECK(l.cluster == 4);
    CHECK(l.threads == 512);
    CHECK(l.stages == 3);
    CHECK(l.smem == size_t(3 * 64128));
}

TEST_CASE("ce plan: rows fast cannot take fall back to online") {
    // unaligned rows: a row stride of 100,514 bytes, or logits 2 bytes off 16
    CHECK(plan_fast(rows(LogitsType::bf16, 50257), true, kHopperSmem).cluster == 0);
    CHECK(plan_fast(rows(LogitsType::bf16, 50304, 0, 2), true, kHopperSmem).cluster == 0);
    CrossEntropyArgs d = rows(LogitsType::bf16, 50304);
    d.dlogits = reinterpret_cast<void*>(uintptr_t(4096 + 8));
    CHECK(plan_fast(d, false, kHopperSmem).cluster == 0);
    // rows longer than 8 CTAs hold two stages of: 10^6 bf16 values, 8 slices of 250,000 bytes
    CHECK(250000 > kBudget);
    CHECK(plan_fast(rows(LogitsType::bf16, 1000000), true, kHopperSmem).cluster == 0);
    CHECK(plan_fast(rows(LogitsType::bf16, 1000000), false, kHopperSmem).cluster == 0);
}

TEST_CASE("ce plan: a smaller shared memory") {
    // 99 KB per block (101,376 bytes; budget 99,328): GPT-2's rows need more than 2 CTAs (2 x
    // 50,304 bytes hold 1 stage), so 3 (slices of 16,768 values, 33,536 bytes, 2 stages); behind
    // clusters of 3 the helper is online rows, each block reserving 101,376 - 67,072 = 34,304
    // bytes.
    const int smem = 99 * 1024;
    const CrossEntropyArgs a = rows(LogitsType::bf16, 50304);
    const FastPlan p = plan_fast(a, true, smem);
    CHECK(p.cluster == 3);
    CHECK(p.slice == 16768);
    CHECK(p.stages == 2);
    CHECK(p.groups == 3);  // as every row, with no knob set
    const FastPlan h = plan_fast_helper(a, p, smem);
    CHECK(h.online_rows);
    CHECK(h.smem == size_t(34304));
}

TEST_CASE("ce plan: fast leaves short rows to online") {
    // rows of up to 48 KB (kFastOnlineMaxRowBytes): 24,576 bf16 or 12,288 fp32 values
    CHECK(plan_fast(rows(LogitsType::bf16, 1024), true, kHopperSmem).cluster == 0);
    CHECK(plan_fast(rows(LogitsType::bf16, 24576), true, kHopperSmem).cluster == 0);
    CHECK(plan_fast(rows(LogitsType::f32, 12288), true, kHopperSmem).cluster == 0);
    // one 16-byte chunk more and fast takes them: 24,584 bf16 values, 49,168 bytes
    CHECK(plan_fast(rows(LogitsType::bf16, 24584), true, kHopperSmem).cluster == 1);
    CHECK(plan_fast(rows(LogitsType::f32, 12292), true, kHopperSmem).cluster == 1);
    // a fixed cluster size keeps the cluster kernels, and fast_lockstep always does
    CrossEntropyArgs forced = rows(LogitsType::bf16, 1024);
    forced.tuning.cluster = 2;
    CHECK(plan_fast(forced, true, kHopperSmem).cluster == 2);
    CHECK(plan_fast(rows(LogitsType::bf16, 1024), false, kHopperSmem).cluster == 1);
}

TEST_CASE("ce plan: the bands' tables are what the planners follow") {
    // Each table's bands grow in row length, the last holds every length, and a row at a band's
    // edge belongs to it while a row 16 bytes longer belongs to the next.
    auto check_edges = [](const auto& bands) {
        const size_t n = std::size(bands);
        CHECK(bands[n - 1].max_row_bytes == SIZE_MAX);
        for (size_t i = 0; i + 1 < n; i++) {
            CHECK(bands[i].max_row_bytes < bands[i + 1].max_row_bytes);
            CHECK(&band_for(bands, bands[i].max_row_bytes) == &bands[i]);
            CHECK(&band_for(bands, bands[i].max_row_bytes + 16) == &bands[i + 1]);
        }
    };
    check_edges(kFastBands);
    check_edges(kLockstepBands);
    for (const FastBand& b : kFastBands) {
        // bf16 rows at the band's top edge (the last band: 256000 values), with no knob set
        const int64_t V = b.max_row_bytes == SIZE_MAX ? 256000 : int64_t(b.max_row_bytes / 2);
        CAPTURE(V);
        const FastPlan p = plan_fast(rows(LogitsType::bf16, V), true, kHopperSmem);
        if (b.online) {
            CHECK(p.cluster == 0);  // left to online; 16 bytes more is not
            CHECK(plan_fast(rows(LogitsType::bf16, V + 8), true, kHopperSmem).cluster > 0);
            continue;
        }
        CHECK(p.groups == b.groups);
        CHECK(p.threads == b.groups * (b.groups == 2 ? kTwoGroupThreads : 256));
        CHECK(p.parts == b.parts);
        CHECK(p.stages >= b.min_stages);
        // the smallest cluster size that holds the band's stages: one size smaller does not
        const int* c =
            std::find(std::begin(kFastClusterSizes), std::end(kFastClusterSizes), p.cluster);
        REQUIRE(c != std::end(kFastClusterSizes));
        if (c != std::begin(kFastClusterSizes)) {
            CrossEntropyArgs smaller = rows(LogitsType::bf16, V);
            smaller.tuning.cluster = c[-1];
            const FastPlan q = plan_fast(smaller, true, kHopperSmem);
            CHECK((q.cluster == 0 || q.stages < b.min_stages));
        }
    }
    // fewer stages than groups: rows of 100 KB (V = 50304) in one CTA, with two stages for its
    // three groups; 200 KB (V = 100352) in 2-CTA clusters, likewise
    for (const auto [V, cluster] : {std::pair<int64_t, int>{50304, 1}, {100352, 2}}) {
        CAPTURE(V);
        const FastPlan p = plan_fast(rows(LogitsType::bf16, V), true, kHopperSmem);
        CHECK(p.cluster == cluster);
        CHECK(p.groups == 3);
        CHECK(p.stages == 2);
    }
    // the min_stages knob overrides the band's: three stages of 50304 take 2-CTA clusters (slices
    // of 50,304 bytes: 4 stages)
    CrossEntropyArgs three = rows(LogitsType::bf16, 50304);
    three.tuning.min_stages = 3;
    const FastPlan t = plan_fast(three, true, kHopperSmem);
    CHECK(t.cluster == 2);
    CHECK(t.stages == 4);
    for (const LockstepBand& b : kLockstepBands) {
        const int64_t V = b.max_row_bytes == SIZE_MAX ? 256000 : int64_t(b.max_row_bytes / 2);
        CAPTURE(V);
        const FastPlan p = plan_fast(rows(LogitsType::bf16, V), false, kHopperSmem);
        CHECK(p.threads == b.threads);
        CHECK(p.stages >= b.min_stages);
        if (b.smem_kb > 0) CHECK(p.smem <= size_t(b.smem_kb) << 10);
    }
}

TEST_CASE("ce plan: fast's statistics sweeps follow kStatsSweeps, or the knob") {
    // one sweep for groups of 256 threads except in clusters of 4; two for groups of 512 (and the
    // 2-CTA helper's one group of 512)
    CrossEntropyArgs two = rows(LogitsType::bf16, 50304);
    two.tuning.groups = 2;
    const FastPlan two_groups = plan_fast(two, true, kHopperSmem);
    CHECK(two_groups.threads / two_groups.groups == 512);
    CHECK(two_groups.stats_sweeps == 2);
    struct Want {
        int64_t V;
        int cluster, sweeps;
    };
    for (const Want w :
         {Want{50304, 1, 1}, Want{65536, 2, 1}, Want{100352, 2, 1}, Want{128256, 3, 1},
          Want{140000, 4, 2}, Want{163840, 5, 1}, Want{256000, 8, 1}}) {
        CAPTURE(w.V);
        const CrossEntropyArgs a = rows(LogitsType::bf16, w.V);
        const FastPlan p = plan_fast(a, true, kHopperSmem);
        CHECK(p.groups == 3);
        CHECK(p.cluster == w.cluster);
        CHECK(p.stats_sweeps == w.sweeps);
        const FastPlan h = plan_fast_helper(a, p, kHopperSmem);
        if (h.cluster && !h.online_rows) CHECK(h.stats_sweeps == 2);
    }
    // two groups of 256 (threads 512 in all) in one CTA
    CrossEntropyArgs small = rows(LogitsType::bf16, 50304);
    small.tuning.groups = 2;
    small.tuning.threads = 512;
    CHECK(plan_fast(small, true, kHopperSmem).stats_sweeps == 1);
    // the knob fixes them everywhere, the helper included
    for (const int sweeps : {1, 2}) {
        CAPTURE(sweeps);
        CrossEntropyArgs a = rows(LogitsType::bf16, 140000);  // clusters of 4, a 2-CTA helper
        a.tuning.stats_sweeps = sweeps;
        const FastPlan p = plan_fast(a, true, kHopperSmem);
        CHECK(p.stats_sweeps == sweeps);
        CHECK(plan_fast_helper(a, p, kHopperSmem).stats_sweeps == sweeps);
        a.V = a.V_local = a.ld = 50304;
        CHECK(plan_fast(a, true, kHopperSmem).stats_sweeps == sweeps);
    }
    CHECK(stats_sweeps_for(384, 1, CrossEntropyTuning{}) == 2);  // no entry: two sweeps
}

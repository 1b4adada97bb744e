// The CUDA loss head's special cases: the fast variants' schedules, ignore_index and option edge
// cases, p -> 1 in bf16, vocabulary shards, more than 2^31 elements, the PyTorch float64 oracle,
// fused_linear's own paths (schedules, shards, exact inputs) and CUDA graphs. Every variant on
// the common sizes, types and options is a row of test_kernels. Skipped, with the reason, where no
// GPU is usable. The bounds are argued in tests/ce_gpu.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "data/safetensors.h"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/filtered_gemm.h"
#include "kernels/gemm/matmul.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/shard_one_read.h"
#include "tests/ce_gpu.h"
#include "tests/gpu_helpers.h"
#include "tests/gpu_only.h"
#include "tests/helpers.h"

using namespace zgpt;
using namespace zgpt::test;
using cuda::LogitsType;

namespace {
// ce_cases.safetensors and its cases' metadata, or nothing (saying where it was looked for).
struct OracleCases {
    SafeTensors st;
    nlohmann::json cases;
};
std::optional<OracleCases> load_ce_cases() {
    const std::string path = oracle_dir() + "/ce_cases.safetensors";
    if (!std::filesystem::exists(path)) {
        MESSAGE("oracle not found at " << path << " (set ZGPT_ORACLES)");
        return std::nullopt;
    }
    SafeTensors st = SafeTensors::load(path);
    nlohmann::json cases = nlohmann::json::parse(st.metadata().at("cases").get<std::string>());
    return OracleCases{std::move(st), std::move(cases)};
}

// Case `name` of ce_cases.safetensors (m: its metadata), its logits seen as type t.
Case oracle_case(const SafeTensors& st, const std::string& name, const nlohmann::json& m,
                 LogitsType t) {
    Case c;
    c.N = m.at("N");
    c.V = m.at("V");
    c.type = t;
    c.opts.z_loss_weight = m.at("z_loss_weight");
    c.opts.label_smoothing = m.at("label_smoothing");
    c.opts.ignore_index = m.at("ignore_index");
    c.opts.reduction = parse_reduction(m.at("reduction"));
    const auto x = st.as_double(name + ".logits");
    c.logits.assign(x.begin(), x.end());
    const auto y = st.as_double(name + ".targets");
    c.targets.assign(y.begin(), y.end());
    const auto g = st.as_double(name + ".grad_output");
    c.grad_output.assign(g.begin(), g.end());
    return c;
}

}  // namespace

TEST_CASE(
    "fast and fast_lockstep: many rows per cluster through the buffer ring, padded rows with a "
    "tail, every cluster size, odd rings, 2 or 3 warp groups, buffers copied in parts, the "
    "traced kernel, the helper grid on the SMs that clusters leave idle") {
    // CrossEntropyTuning: cluster forces the cluster size (0: the planner's choice), and
    // smem_kb a ring of 3 or 4 stages where it fits: in fast, a buffer is then
    // refilled by one warp group for another (the copy_started handshake). groups
    // and parts pick fast's other kernels; with parts, the slices' last part may be
    // short or empty and holds the tail. trace runs the kernel that records its
    // phases (bf16 only; the f32 shape runs the plain kernel). With clusters of more than 2 CTAs,
    // a helper grid takes the last rows on the SMs the clusters leave idle: 2-CTA clusters behind
    // clusters of 4, online's whole rows behind the other sizes; helper_weight sets its share
    // (0: none, 400: several times its default) and helper_parts the 2-CTA clusters' copies per
    // buffer. Rows per cluster
    // exceed the ring's stages, so buffers are refilled; ld > V leaves the last CTA a tail of
    // fewer than 8 columns, which the bulk copy brings in with NaN padding that must be neither
    // used nor written.
    struct Shape {
        int64_t N, V, ld;
        LogitsType t;
    };
    const std::vector<Shape> shapes = {{600, 50257, 50264, LogitsType::bf16},
                                       {300, 4099, 4100, LogitsType::f32},
                                       {2000, 1000, 1000, LogitsType::bf16}};
    struct Mode {
        const char* variant;
        int stages;  // 0: as many as fit
        int groups = 2, parts = 1;
        bool trace = false;
        int helper_weight = -1, helper_parts = 1;  // -1: the default share
        int stats_sweeps = 0;                      // 0: the plan's
        bool l2_evict_last = true;  // false: the rows' copies under L2's normal policy
    };
    const std::vector<Mode> modes = {{"fast", 0},
                                     {"fast", 3},
                                     {"fast", 0, 3, 1},
                                     {"fast", 4, 3, 1},
                                     {"fast", 0, 2, 2},
                                     {"fast", 3, 2, 4},
                                     {"fast", 3, 3, 2},
                                     {"fast", 0, 2, 4},
                                     {"fast_lockstep", 0},
                                     {"fast", 0, 2, 1, true},
                                     {"fast", 0, 3, 2, true},
                                     {"fast", 0, 3, 2, false, 0},
                                     {"fast", 0, 3, 2, false, 400, 2},
                                     {"fast", 0, 2, 2, false, 400, 4},
                                     {"fast", 0, 3, 2, true, 400, 1},
                                     {"fast", 0, 2, 2, false, -1, 1, 1},
                                     {"fast", 3, 3, 2, false, -1, 1, 1},
                                     {"fast", 0, 3, 2, false, 400, 2, 2},
                                     {"fast", 0, 3, 2, false, -1, 1, 0, false}};
    // Four cases a shape (label smoothing on and off, dlogits in place and in their own buffer,
    // 0-2 ignored rows), each with its reference computed once, taken in turn by the modes and
    // cluster sizes below: making the cases and their double-precision references, not the GPU,
    // took most of this test's time when every run drew its own.
    struct Prepared {
        Case c;
        Reference want;
    };
    std::vector<std::vector<Prepared>> prepared(shapes.size());
    uint64_t seed = 900;
    for (size_t si = 0; si < shapes.size(); si++) {
        const Shape& sh = shapes[si];
        for (int k = 0; k < 4; k++) {
            const uint64_t s = seed++;
            Case c = make_case(s, sh.N, sh.V, sh.t, 1e-4, k % 2 ? 0.1 : 0.0, Reduction::mean,
                               int(s % 3));
            c.ld = sh.ld;
            c.in_place = k < 2;
            Reference want = reference(c);
            prepared[si].push_back({std::move(c), std::move(want)});
        }
    }
    size_t turn = 0;
    for (const Mode& m : modes) {
        const std::string variant = m.variant;
        CAPTURE(variant);
        CAPTURE(m.stages);
        CAPTURE(m.groups);
        CAPTURE(m.parts);
        CAPTURE(m.trace);
        CAPTURE(m.helper_weight);
        CAPTURE(m.helper_parts);
        CAPTURE(m.stats_sweeps);
        CAPTURE(m.l2_evict_last);
        cuda::CrossEntropyTuning tuning;
        tuning.stats_sweeps = m.stats_sweeps;
        tuning.l2_evict_last = m.l2_evict_last;
        tuning.helper_weight = m.helper_weight;
        tuning.helper_parts = m.helper_parts;
        tuning.groups = m.groups;
        tuning.parts = m.parts;
        tuning.trace = m.trace;
        for (int cluster : {0, 1, 2, 3, 4, 5, 6, 7, 8}) {
            if (m.stages && !cluster) continue;  // the slice size needs a known cluster size
            CAPTURE(cluster);
            tuning.cluster = cluster;
            for (size_t si = 0; si < shapes.size(); si++) {
                const Shape& sh = shapes[si];
                CAPTURE(sh.V);
                const int64_t per = sh.t == LogitsType::bf16 ? 8 : 4, es = 16 / per;
                const int64_t slice =
                    ((sh.V + cluster - 1) / std::max(cluster, 1) + per - 1) / per * per;
                tuning.smem_kb = m.stages ? int((m.stages * slice * es + 1023) / 1024) : 0;
                const Prepared& p = prepared[si][turn++ % 4];
                CAPTURE(p.c.in_place);
                const Result got =
                    run_variant(cuda::find_cross_entropy_variant(variant), p.c, tuning);
                check_result(got, p.want, p.c);
                CHECK_FALSE(got.padding_written);
            }
        }
    }
}

TEST_CASE("fast at long rows, in the clusters its planner picks there (2, 3, 4, 5, 6 and 8 CTAs)") {
    // bf16 rows of 125 KB (64120: clusters of 2, three stages), 196 KB (100344: clusters of 2, two
    // stages for three warp groups), 250 KB (128248: clusters of 3, two stages), 273 KB (140000:
    // clusters of 4, three stages), 320 KB (163840: 5), 391 KB (200000: 6) and 500 KB (255992: 8)
    // (kFastClusterSizes; tests/test_ce_plan.cpp checks the plans), each CTA taking several rows
    // through its ring. Behind clusters of 4 a helper grid of 2-CTA clusters takes the last rows
    // on the SMs they leave idle; behind 3, 5, 6 and 8 a helper grid of online's whole rows does.
    // 64120 (two slices of 32,064 and 32,056), 100344, 128248, 200000 (slices of 33,336, the last
    // 33,320) and 255992 leave the last CTA a short slice.
    uint64_t seed = 1700;
    for (const int64_t V : {64120, 100344, 128248, 140000, 163840, 200000, 255992}) {
        CAPTURE(V);
        Case c = make_case(seed++, 300, V, LogitsType::bf16, 1e-4, 0.0, Reduction::mean, 2);
        c.in_place = seed % 2 == 0;
        const Result got = run_variant(cuda::find_cross_entropy_variant("fast"), c);
        check_result(got, reference(c), c);
    }
}

TEST_CASE("fast's statistics in one sweep: rows its reference chunk does not fit") {
    // In one sweep a thread sums its exponentials against the max of a chunk of the first part,
    // and sums again against its own max where that lies over 64 above the reference or 40 below
    // it. Rows here put a spike far above the first chunks, -inf in the first chunks, a first
    // chunk far above the rest, and the target inside such chunks or in the tail; in one sweep and
    // two, whole rows and copies in four parts (where threads past part 0's chunks borrow one of
    // them as the reference), clusters of 1 and 4 CTAs.
    uint64_t seed = 2300;
    const int64_t N = 8, V = 20003;
    for (LogitsType t : {LogitsType::bf16, LogitsType::f32}) {
        Case c = make_case(seed++, N, V, t, 1e-4, 0.0, Reduction::mean, 0);
        c.ld = t == LogitsType::bf16 ? 20008 : 20004;
        auto row = [&](int64_t i) { return &c.logits[i * V]; };
        row(0)[V - 9] = 150.0f;                                  // spike near the end
        for (int64_t j = 0; j < 64; j++) row(1)[j] = -INFINITY;  // -inf first chunks
        // a first chunk far above the rest: threads that borrow it as their reference must sum
        // again (e^(200 - max) would overflow the final factor)
        for (int64_t j = 0; j < 8; j++) row(2)[j] = 200.0f;
        c.targets[2] = 3;
        for (int64_t j = 0; j < V; j++) row(3)[j] = j == 4321 ? 0.0f : -1e4f;  // one live column
        row(4)[V - 1] = 120.0f;  // the spike in the tail
        c.targets[4] = int32_t(V - 1);
        for (int64_t j = 0; j < 2000; j++) row(5)[j] = -300.0f;  // the first part far below
        c.targets[5] = 7;
        row(6)[12345] = 70.0f;
        c.targets[6] = 12345;
        for (int64_t j = 0; j < V; j++) row(7)[j] = -INFINITY;  // a row of -inf but its target
        row(7)[c.targets[7]] = 1.0f;
        const Reference want = reference(c);
        for (int sweeps : {1, 2})
            for (int parts : {1, 4})
                for (int cluster : {1, 4}) {
                    const std::string type = type_name(t);
                    CAPTURE(type);
                    CAPTURE(sweeps);
                    CAPTURE(parts);
                    CAPTURE(cluster);
                    cuda::CrossEntropyTuning tuning;
                    tuning.stats_sweeps = sweeps;
                    tuning.parts = parts;
                    tuning.groups = 2;
                    tuning.threads = 512;  // two groups of 256: four parts are instantiated
                    tuning.cluster = cluster;
                    const Result got =
                        run_variant(cuda::find_cross_entropy_variant("fast"), c, tuning);
                    check_result(got, want, c);
                    CHECK_FALSE(got.padding_written);
                }
    }
}

TEST_CASE("fast in one sweep at logits near 2^30, where ref + 64 rounds to ref + 128") {
    // fp32 steps are 128 apart at 2^30: the slices' first halves hold 2^30 + 128 (an odd last
    // mantissa bit, so ref + 64 rounds to ref + 128), their second halves 2^30 + 256. A thread's
    // reference then lies 128 below its max, where e^128 overflows: it must sum again. z = 0.
    Case c = make_case(2400, 2, 50304, LogitsType::f32, 0.0, 0.0, Reduction::mean, 0);
    for (int64_t i = 0; i < c.N; i++)
        for (int64_t j = 0; j < c.V; j++)
            c.logits[i * c.V + j] = (j % 12576) < 6288 ? 1073741952.0f : 1073742080.0f;
    const Reference want = reference(c);
    for (int cluster : {2, 4}) {  // one CTA cannot hold these 201 KB rows
        CAPTURE(cluster);
        cuda::CrossEntropyTuning tuning;
        tuning.stats_sweeps = 1;
        tuning.cluster = cluster;
        const Result got = run_variant(cuda::find_cross_entropy_variant("fast"), c, tuning);
        for (int64_t i = 0; i < c.N; i++) {
            CAPTURE(i);
            CHECK(close(got.loss[i], want.loss[i], 2e-5, 1e-6));
            CHECK(close(got.lse[i], want.lse[i], 1e-6, 1e-5));
        }
    }
}

TEST_CASE("fast and fast_lockstep at rows of logits near +-1.6e7 to +-2e9") {
    // The hard rows elsewhere reach |x| ~ 100 and -1e4 masks; here whole rows sit far from 0, where
    // an exponent taken as x log2 e - max log2 e (one FFMA, without the subtraction first) would
    // lose the row: an ulp of max log2 e is 2 at 1.6e7 and 256 at 2e9. Logits spread over a few
    // ulps of the row's magnitude, so several columns share each row's probability; in clusters of
    // 1 and 4 CTAs (each CTA's slice max is its own). Not beyond 2e9: the fp64 reference's lse then
    // drops the log of that count (an ulp of 1e30 is 1.4e14). z = 0: lse^2 would overflow float.
    uint64_t seed = 2100;
    const double scales[] = {6.7e7, -6.7e7, 2e9, -2e9, 1.6e7, -3e5};
    for (LogitsType t : {LogitsType::bf16, LogitsType::f32}) {
        for (const auto& [name, cluster] : {std::pair<const char*, int>{"fast", 0},
                                            {"fast", 1},
                                            {"fast", 4},
                                            {"fast_lockstep", 0}}) {
            const std::string type = type_name(t), variant = name;
            CAPTURE(type);
            CAPTURE(variant);
            CAPTURE(cluster);
            Case c = make_case(seed++, 6, 50304, t, 0.0, 0.0, Reduction::mean, 0);
            Rng rng(seed);
            for (int64_t i = 0; i < c.N; i++)
                for (int64_t j = 0; j < c.V; j++)
                    c.logits[i * c.V + j] =
                        float(scales[i] * (1.0 + 0.02 * double(rng.below(8)) / 8));
            const Reference want = reference(c);
            cuda::CrossEntropyTuning tuning;
            tuning.cluster = cluster;
            const Result got = run_variant(cuda::find_cross_entropy_variant(variant), c, tuning);
            for (int64_t i = 0; i < c.N; i++) {
                CAPTURE(i);
                CHECK(close(got.loss[i], want.loss[i], 2e-5, 1e-6));
                CHECK(close(got.lse[i], want.lse[i], 1e-6, 1e-5));
            }
            const MaxError e = compare(got.dlogits.data(), want.dlogits.data(),
                                       int64_t(want.dlogits.size()), 1.0 / 256 + 1e-5, 1e-12);
            INFO("dlogits: max abs err " << e.abs << ", max rel err " << e.rel);
            CHECK(e.ok);
        }
    }
}

TEST_CASE(
    "ignore_index none / some / all, z = 0 and label smoothing with z-loss, every reduction") {
    uint64_t seed = 500;
    for (const auto& v : cuda::cross_entropy_variants())
        for (int ignored : {0, 3, 1000})
            for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none})
                for (double z : {0.0, 1e-3})
                    for (double eps : {0.0, 0.2}) {
                        Case c = make_case(seed++, 9, 1031, LogitsType::f32, z, eps, r, ignored);
                        const std::string variant = v.name;
                        CAPTURE(variant);
                        CAPTURE(ignored);
                        const std::string reduction = reduction_name(r);
                        CAPTURE(reduction);
                        CAPTURE(z);
                        CAPTURE(eps);
                        const Result got = run_variant(v, c);
                        check_result(got, reference(c), c);
                        if (ignored >= 9) {
                            CHECK(got.summary.loss == 0.0f);
                            for (float d : got.dlogits) CHECK(d == 0.0f);
                        }
                        if (z == 0.0)
                            for (float zr : got.z) CHECK(zr == 0.0f);
                    }
}

TEST_CASE("bf16 dlogits at p -> 1 are within bf16 rounding of the fp64 answer") {
    for (const auto& v : cuda::cross_entropy_variants()) {
        const std::string variant = v.name;
        CAPTURE(variant);
        // z = 0 so that the target's gradient is exactly p - 1 (the z term would add 2 z lse p)
        Case c = make_case(900, 4, 50304, LogitsType::bf16, 0.0, 0.0, Reduction::mean, 0);
        for (int64_t i = 0; i < c.N; i++) {
            for (int64_t j = 0; j < c.V; j++) c.logits[i * c.V + j] = -8.0f + 0.001f * float(j % 7);
            c.logits[i * c.V + c.targets[i]] = 10.0f + 2.0f * float(i);  // 1 - p: 7.7e-4 .. 1.9e-6
        }
        const Reference want = reference(c);
        const Result got = run_variant(v, c);
        for (int64_t i = 0; i < c.N; i++) {
            const int64_t k = i * c.V + c.targets[i];
            CAPTURE(i);
            CHECK(want.dlogits[k] < 0);
            CHECK(close(got.dlogits[k], want.dlogits[k], 1.0 / 256, 0));
        }
    }
}

TEST_CASE("shards on one GPU, merged, equal the whole row (loss and dlogits)") {
    const int64_t N = 7, V = 50257;
    for (LogitsType t : {LogitsType::f32, LogitsType::bf16}) {
        const std::string type = type_name(t);
        CAPTURE(type);
        Case c = make_case(77, N, V, t, 1e-4, 0.1, Reduction::mean, 2);
        const Reference want = reference(c);
        const size_t es = t == LogitsType::f32 ? 4 : 2;
        Dev logits(N * V * es), targets(N * 4), go(4), rows(4 * N * 4),
            summary(sizeof(cuda::LossSummaryF));
        Dev acc(N * sizeof(cuda::RowStatsF)), acc2(N * sizeof(cuda::RowStatsF)),
            part(N * sizeof(cuda::RowStatsF)), params(N * sizeof(cuda::RowGradParams)), nvalid(4);
        upload(logits.p, c.logits, t);
        CUDA_OK(cudaMemcpy(targets.p, c.targets.data(), N * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(go.p, c.grad_output.data(), 4, cudaMemcpyHostToDevice));
        const std::vector<int64_t> cuts = {0,     1,     4000, 4001,
                                           25000, 50000, 50257};  // 6 uneven shards
        // the whole rows' arguments; each shard narrows them to its columns
        const cuda::CrossEntropyArgs a =
            ce_args(logits.p, logits.p, t, V, N, V, targets, go, rows, summary);
        auto shard = [&](size_t k) {
            cuda::CrossEntropyArgs s = a;
            s.logits = static_cast<const char*>(logits.p) + cuts[k] * es;
            s.dlogits = const_cast<void*>(s.logits);
            s.v0 = cuts[k];
            s.V_local = cuts[k + 1] - cuts[k];
            return s;
        };
        cuda::ce_count_valid(nvalid.as<int>(), a.targets, N, c.opts.ignore_index, nullptr);
        for (size_t k = 0; k + 1 < cuts.size(); k++) {
            cuda::ce_shard_stats(k == 0 ? acc.as<cuda::RowStatsF>() : part.as<cuda::RowStatsF>(),
                                 shard(k), c.opts, nullptr);
            if (k > 0)
                cuda::ce_merge_stats(acc.as<cuda::RowStatsF>(), part.as<cuda::RowStatsF>(), N,
                                     nullptr);
            // the same merge inside the stats kernels (both the warp- and the block-per-row one)
            cuda::ce_shard_stats(acc2.as<cuda::RowStatsF>(), shard(k), c.opts, nullptr, k > 0);
        }
        {
            std::vector<cuda::RowStatsF> s1(N), s2(N);
            CUDA_OK(cudaMemcpy(s1.data(), acc.p, acc.bytes, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(s2.data(), acc2.p, acc2.bytes, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < N; i++) {
                CHECK(s2[i].max == s1[i].max);
                CHECK(close(s2[i].sum_excl, s1[i].sum_excl, 1e-6, 0.0));
                CHECK(s2[i].target_logit == s1[i].target_logit);
                CHECK(close(s2[i].sum_logits, s1[i].sum_logits, 1e-6, 1e-6));
            }
        }
        cuda::ce_finalize(params.as<cuda::RowGradParams>(), acc.as<cuda::RowStatsF>(),
                          nvalid.as<int>(), a, c.opts, nullptr);
        for (size_t k = 0; k + 1 < cuts.size(); k++)
            cuda::ce_shard_backward(shard(k), params.as<cuda::RowGradParams>(), c.opts, nullptr);
        cuda::ce_reduce(a, acc.as<cuda::RowStatsF>(), nvalid.as<int>(), c.opts, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        Result got;
        got.dlogits = download(logits.p, N * V, t);
        read_rows(got, rows, summary, N);
        check_result(got, want, c);
    }
}

TEST_CASE(
    "the one-read shard pass: the whole-row variants over uneven shards give the row's "
    "loss and dlogits") {
    // Each shard (its own buffer, rows 8-aligned, NaN padding) runs a variant once with local
    // targets (absent_targets); its stat and ce rows give the shard's statistics, which are merged
    // and finalised as in the two-read path; then a q (+ c at the target) must be the whole row's
    // dlogits, with q what the pass left in place. Hard rows (peaked, |x| ~ 100, -inf entries),
    // an ignored row, z-loss, mean and sum; without label smoothing (the one-read path's domain).
    // The two long shards (80 KB rows in bf16) run fast's own cluster kernels, not online's, and
    // every logit is moved down by 10, so that the plain and masked rows' maxima sit near 0: a
    // target column counted in a shard that does not hold it would add about exp(-max) to such a
    // row's sum, a large error here. naive is not used by the model's one-read path (its
    // workspace), but its pass must hold too.
    const int64_t N = 11, V = 80011;
    const std::vector<int64_t> cuts = {0, 1, 40000, 40001, 80011};  // 4 uneven shards
    const int64_t S = int64_t(cuts.size()) - 1;
    for (LogitsType t : {LogitsType::f32, LogitsType::bf16}) {
        for (const char* name : {"online", "fast", "fast_lockstep", "naive"}) {
            for (Reduction red : {Reduction::mean, Reduction::sum}) {
                const std::string type = type_name(t), variant = name;
                CAPTURE(type);
                CAPTURE(variant);
                CAPTURE(int(red));
                const cuda::CrossEntropyVariant& v = cuda::find_cross_entropy_variant(name);
                Case c = make_case(131, N, V, t, 1e-4, 0.0, red, 1);
                for (float& x : c.logits) x -= 10.0f;  // (-inf stays)
                const Reference want = reference(c);
                const DType dt = t == LogitsType::f32 ? DType::f32 : DType::bf16;
                const size_t es = dtype_bytes(dt);
                Dev targets(N * 4), go(4), one(4), rows(4 * N * 4),
                    summary(sizeof(cuda::LossSummaryF));
                Dev all_stats(S * N * sizeof(cuda::RowStatsF)), merged(N * sizeof(cuda::RowStatsF)),
                    params(N * sizeof(cuda::RowGradParams)), nvalid(4);
                CUDA_OK(cudaMemcpy(targets.p, c.targets.data(), N * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(go.p, c.grad_output.data(), 4, cudaMemcpyHostToDevice));
                const float h_one = 1.0f;
                CUDA_OK(cudaMemcpy(one.p, &h_one, 4, cudaMemcpyHostToDevice));
                struct Shard {
                    int64_t v0, Vl, ld;
                    std::unique_ptr<Dev> logits, local, rows;  // rows: cuda::one_read_rows
                };
                std::vector<Shard> sh(S);
                auto* stats = all_stats.as<cuda::RowStatsF>();
                for (int64_t k = 0; k < S; k++) {
                    Shard& z = sh[k];
                    z.v0 = cuts[k];
                    z.Vl = cuts[k + 1] - cuts[k];
                    z.ld = (z.Vl + 7) / 8 * 8;
                    std::vector<float> part(N * z.Vl);
                    for (int64_t i = 0; i < N; i++)
                        for (int64_t j = 0; j < z.Vl; j++)
                            part[i * z.Vl + j] = c.logits[i * V + z.v0 + j];
                    const std::vector<float> padded = pad_rows(part, N, z.Vl, z.ld, NAN);
                    z.logits = std::make_unique<Dev>(padded.size() * es);
                    upload(z.logits->p, padded, t);
                    z.local = std::make_unique<Dev>(N * 4);
                    z.rows = std::make_unique<Dev>(cuda::one_read_rows(nullptr, N).bytes);
                    const cuda::OneReadRows r = cuda::one_read_rows(z.rows->p, N);
                    cuda::ce_local_targets(z.local->as<int32_t>(), r.target_logit,
                                           targets.as<int32_t>(), z.logits->p, dt, z.ld, N, z.v0,
                                           z.Vl, c.opts.ignore_index, nullptr);
                    cuda::CrossEntropyArgs pa;
                    pa.type = t;
                    pa.ld = z.ld;
                    pa.N = N;
                    pa.V_local = pa.V = z.Vl;
                    pa.logits = pa.dlogits = z.logits->p;
                    pa.targets = z.local->as<int32_t>();
                    pa.grad_output = one.as<float>();
                    pa.ce_rows = r.ce;
                    pa.stat_rows = r.stat;
                    pa.summary = summary.as<cuda::LossSummaryF>();
                    pa.absent_targets = true;
                    CrossEntropyOptions po;
                    po.reduction = Reduction::sum;
                    po.ignore_index = c.opts.ignore_index;
                    Dev ws(v.workspace_bytes(N, z.Vl, t));
                    v.run(pa, po, ws.p, nullptr);
                    cuda::ce_local_shard_stats(stats + k * N, r.stat, r.ce, r.target_logit,
                                               z.local->as<int32_t>(), N, z.Vl, nullptr);
                }
                // the exchange, as loss_sharded does it: shard 0's, then the others merged in order
                CUDA_OK(cudaMemcpy(merged.p, stats, N * sizeof(cuda::RowStatsF),
                                   cudaMemcpyDeviceToDevice));
                for (int64_t k = 1; k < S; k++)
                    cuda::ce_merge_stats(merged.as<cuda::RowStatsF>(), stats + k * N, N, nullptr);
                const cuda::CrossEntropyArgs a =
                    ce_args(nullptr, nullptr, t, V, N, V, targets, go, rows, summary);
                cuda::ce_count_valid(nvalid.as<int>(), a.targets, N, c.opts.ignore_index, nullptr);
                cuda::ce_finalize(params.as<cuda::RowGradParams>(), merged.as<cuda::RowStatsF>(),
                                  nvalid.as<int>(), a, c.opts, nullptr);
                cuda::ce_reduce(a, merged.as<cuda::RowStatsF>(), nvalid.as<int>(), c.opts, nullptr);
                Result got;
                got.dlogits.assign(size_t(N) * V, 0.0f);
                for (int64_t k = 0; k < S; k++) {
                    Shard& z = sh[k];
                    const cuda::OneReadRows r = cuda::one_read_rows(z.rows->p, N);
                    cuda::ce_local_factors(r.a, r.c, params.as<cuda::RowGradParams>(), r.stat, r.ce,
                                           z.local->as<int32_t>(), N, z.Vl, nullptr);
                    CUDA_OK(cudaDeviceSynchronize());
                    CUDA_OK(cudaGetLastError());
                    const std::vector<float> q = download(z.logits->p, size_t(N) * z.ld, t);
                    std::vector<float> ha(N), hc(N);
                    std::vector<int32_t> loc(N);
                    CUDA_OK(cudaMemcpy(ha.data(), r.a, N * 4, cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(hc.data(), r.c, N * 4, cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(loc.data(), z.local->p, N * 4, cudaMemcpyDeviceToHost));
                    for (int64_t i = 0; i < N; i++) {
                        const double ai = ha[i], ci = hc[i];
                        for (int64_t j = 0; j < z.Vl; j++) {
                            double d = ai * double(q[i * z.ld + j]);
                            if (j == loc[i]) d += ci;
                            got.dlogits[i * V + z.v0 + j] = float(d);
                        }
                        for (int64_t j = z.Vl; j < z.ld; j++)  // the pass left the padding alone
                            if (!std::isnan(q[i * z.ld + j])) got.padding_written = true;
                    }
                }
                read_rows(got, rows, summary, N);
                check_result(got, want, c);
                CHECK_FALSE(got.padding_written);
                double lse_err = 0;
                for (int64_t i = 0; i < N; i++)
                    lse_err = std::max(lse_err, std::fabs(got.lse[i] - want.lse[i]));
                MESSAGE(variant << " " << type << " red " << int(red) << ": largest lse error "
                                << lse_err);
            }
        }
    }
}

TEST_CASE("the one-read shard backward's row kernels: dh rows, scaled h, dW's target rows") {
    // shard_dh_finish, shard_scale_rows and shard_dw_target_rows against double sums on the host:
    // targets repeated (runs of one row up to many), absent and ignored rows; dW's target rows
    // twice, bit for bit (sorted, one writer per element: no atomics). Widths below one pass of
    // the target-row kernel's threads, not a multiple of them, and above its 2048 columns a pass;
    // 770, not a multiple of 4, takes the row kernels' one-value path.
    const int64_t N = 777, Vl = 50;
    for (const int64_t C : {int64_t(96), int64_t(770), int64_t(1600), int64_t(2200)}) {
        CAPTURE(C);
        Rng rng(5);
        std::vector<int32_t> local(N);
        std::vector<double> a(N), c(N), h(N * C), W(Vl * C), dh0(N * C), dW0(Vl * C);
        for (int64_t i = 0; i < N; i++) {
            const double u = rng.uniform();
            local[i] = u < 0.1 ? cuda::ce_absent_target()
                       : u < 0.15
                           ? -100
                           : int32_t(std::pow(rng.uniform(), 3.0) * Vl);  // skewed: long runs
            a[i] = rng.uniform();
            c[i] = local[i] >= 0 && local[i] < Vl ? rng.normal() : 0.0;
        }
        for (auto& x : h) x = rng.normal();
        for (auto& x : W) x = rng.normal();
        for (auto& x : dh0) x = rng.normal();
        for (auto& x : dW0) x = rng.normal();
        for (DType t : {DType::f32, DType::bf16}) {
            CAPTURE(dtype_name(t));
            DevT hd(t, h), Wd(t, W), hs(t, N * C);
            DevT dh(DType::f32, dh0), dW(DType::f32, dW0), dW2(DType::f32, dW0);
            DevT ad(DType::f32, a), cd(DType::f32, c);
            Dev ld(N * 4), scratch(cuda::shard_dw_target_scratch_bytes(N));
            CUDA_OK(cudaMemcpy(ld.p, local.data(), N * 4, cudaMemcpyHostToDevice));
            const auto* loc = ld.as<int32_t>();
            cuda::shard_dh_finish(static_cast<float*>(dh.p), static_cast<const float*>(ad.p),
                                  static_cast<const float*>(cd.p), loc, Wd.p, t, N, C, Vl, nullptr);
            cuda::shard_scale_rows(hs.p, hd.p, static_cast<const float*>(ad.p), t, N, C, nullptr);
            for (DevT* out : {&dW, &dW2})
                cuda::shard_dw_target_rows(static_cast<float*>(out->p),
                                           static_cast<const float*>(cd.p), loc, hd.p, t, N, C, Vl,
                                           scratch.p, scratch.bytes, nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaGetLastError());
            const std::vector<double> hq = hd.get(), Wq = Wd.get();  // as the device holds them
            std::vector<double> want_dh(N * C), want_hs(N * C), want_dW = dW0;
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < C; j++) {
                    const bool own = local[i] >= 0 && local[i] < Vl;
                    want_dh[i * C + j] =
                        a[i] * dh0[i * C + j] + (own ? c[i] * Wq[local[i] * C + j] : 0);
                    want_hs[i * C + j] = as_stored(a[i] * hq[i * C + j], t);
                    if (own) want_dW[local[i] * C + j] += c[i] * hq[i * C + j];
                }
            const std::vector<double> got_dh = dh.get(), got_hs = hs.get(), got_dW = dW.get();
            CHECK(got_dW == dW2.get());
            // fp32 arithmetic: a product and an FMA for dh; dW's target rows sum up to a few
            // hundred products (the longest run) in fp32
            const MaxError e_dh = compare(got_dh.data(), want_dh.data(), N * C, 1e-6, 1e-6);
            const MaxError e_hs = compare(got_hs.data(), want_hs.data(), N * C,
                                          t == DType::f32 ? 1e-6 : 1.0 / 128, 1e-30);
            const MaxError e_dW = compare(got_dW.data(), want_dW.data(), Vl * C, 1e-5, 1e-4);
            CHECK_MESSAGE(e_dh.ok, "dh: max abs " << e_dh.abs << " at " << e_dh.worst);
            CHECK_MESSAGE(e_hs.ok, "scaled h: max abs " << e_hs.abs << " at " << e_hs.worst);
            CHECK_MESSAGE(e_dW.ok, "dW: max abs " << e_dW.abs << " at " << e_dW.worst);
        }
    }
}

namespace {

// Two device buffers of the same bytes, byte for byte equal.
bool same_bytes(const Dev& a, const Dev& b) {
    std::vector<unsigned char> x(a.bytes), y(b.bytes);
    CUDA_OK(cudaMemcpy(x.data(), a.p, a.bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(y.data(), b.p, b.bytes, cudaMemcpyDeviceToHost));
    return x == y;
}
// One run of the head: its logits (padded rows); dlogits unless in place, starting `skew` bytes
// into their buffer (which is zeroed first); poisoned row outputs and the summary.
struct Run {
    Dev logits, dl, rows, summary;
    size_t skew;
    Run(const std::vector<float>& padded, LogitsType t, int64_t N, bool in_place, size_t skew_bytes)
        : logits(padded.size() * (t == LogitsType::f32 ? 4 : 2)),
          dl(in_place ? 0 : logits.bytes + skew_bytes),
          rows(4 * size_t(N) * 4),
          summary(sizeof(cuda::LossSummaryF)),
          skew(skew_bytes) {
        upload(logits.p, padded, t);
        if (!in_place) {
            CUDA_OK(cudaMemset(dl.p, 0, dl.bytes));
            upload(static_cast<char*>(dl.p) + skew, padded, t);
        }
        CUDA_OK(cudaMemset(rows.p, 0xFF, rows.bytes));
    }
    void* dlogits() { return dl.bytes ? static_cast<char*>(dl.p) + skew : logits.p; }
    const Dev& out() const { return dl.bytes ? dl : logits; }
};

bool same_summary(const Dev& a, const Dev& b) {
    cuda::LossSummaryF x, y;
    CUDA_OK(cudaMemcpy(&x, a.p, sizeof x, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&y, b.p, sizeof y, cudaMemcpyDeviceToHost));
    return std::memcmp(&x, &y, sizeof x) == 0;
}

}  // namespace

TEST_CASE(
    "online's one kernel per row gives the building blocks' bits; no row outputs, same summary") {
    // online runs each row's statistics, finalize and dlogits in one kernel (warp per row up to
    // 8192 columns, block per row above) and keeps only the largest logit's key in its workspace;
    // the building blocks (stats, finalize, backward, reduce) are the vocab-parallel path. Aligned
    // and unaligned row strides, dlogits in place, in their own buffer and in one that starts off
    // the 16-byte grid (aligned logits, unaligned dlogits); with and without label smoothing
    // (without it, rows hold -inf), every reduction (none: a grad_output per row), ignored rows.
    struct Shape {
        int64_t N, V, ld;
        bool in_place;
        size_t skew;  // bytes the dlogits start past their buffer's (aligned) start
    };
    const Shape shapes[] = {{37, 1000, 1000, true, 0},  {19, 8192, 8200, false, 0},
                            {23, 8193, 8193, true, 0},  {11, 20001, 20003, false, 0},
                            {9, 50257, 50264, true, 0}, {13, 12000, 12000, false, 4},
                            {5, 3, 3, false, 0}};
    struct Options {
        double z, eps;
        Reduction red;
    };
    const Options options[] = {
        {1e-4, 0.1, Reduction::mean}, {0.0, 0.0, Reduction::sum}, {1e-3, 0.0, Reduction::none}};
    const cuda::CrossEntropyVariant& online = cuda::find_cross_entropy_variant("online");
    const cuda::CrossEntropyVariant& fast = cuda::find_cross_entropy_variant("fast");
    for (LogitsType t : {LogitsType::f32, LogitsType::bf16}) {
        for (const Shape& sh : shapes) {
            for (const Options& op : options) {
                const std::string type = type_name(t);
                CAPTURE(type);
                CAPTURE(sh.V);
                CAPTURE(sh.ld);
                CAPTURE(sh.skew);
                CAPTURE(op.eps);
                const int64_t N = sh.N, V = sh.V, ld = sh.ld;
                Case c = make_case(91 + uint64_t(V), N, V, t, op.z, op.eps, op.red, 2);
                const size_t n = size_t(N) * ld;
                const std::vector<float> padded = pad_rows(c.logits, N, V, ld, NAN);
                Dev targets(N * 4), go(c.grad_output.size() * 4), nvalid(4);
                CUDA_OK(cudaMemcpy(targets.p, c.targets.data(), N * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(go.p, c.grad_output.data(), go.bytes, cudaMemcpyHostToDevice));
                auto args = [&](Run& r) {
                    return ce_args(r.logits.p, r.dlogits(), t, ld, N, V, targets, go, r.rows,
                                   r.summary);
                };
                auto fresh = [&] {
                    return std::make_unique<Run>(padded, t, N, sh.in_place, sh.skew);
                };
                // the building blocks
                auto blocks = fresh();
                {
                    const cuda::CrossEntropyArgs a = args(*blocks);
                    Dev stats(N * sizeof(cuda::RowStatsF)), params(N * sizeof(cuda::RowGradParams));
                    cuda::ce_count_valid(nvalid.as<int>(), a.targets, N, c.opts.ignore_index,
                                         nullptr);
                    cuda::ce_shard_stats(stats.as<cuda::RowStatsF>(), a, c.opts, nullptr);
                    cuda::ce_finalize(params.as<cuda::RowGradParams>(), stats.as<cuda::RowStatsF>(),
                                      nvalid.as<int>(), a, c.opts, nullptr);
                    cuda::ce_shard_backward(a, params.as<cuda::RowGradParams>(), c.opts, nullptr);
                    cuda::ce_reduce(a, stats.as<cuda::RowStatsF>(), nvalid.as<int>(), c.opts,
                                    nullptr);
                    CUDA_OK(cudaDeviceSynchronize());
                }
                // a variant with the row outputs, and again without any
                auto run = [&](const cuda::CrossEntropyVariant& v, Run& r, bool with_rows) {
                    cuda::CrossEntropyArgs a = args(r);
                    if (!with_rows) a.loss_rows = a.ce_rows = a.z_rows = a.lse_rows = nullptr;
                    Dev ws(v.workspace_bytes(N, V, t));
                    v.run(a, c.opts, ws.p, nullptr);
                    CUDA_OK(cudaDeviceSynchronize());
                    CUDA_OK(cudaGetLastError());
                };
                auto fused = fresh(), bare = fresh();
                run(online, *fused, true);
                run(online, *bare, false);
                CHECK(same_bytes(fused->out(), blocks->out()));
                CHECK(same_bytes(fused->rows, blocks->rows));
                CHECK(same_summary(fused->summary, blocks->summary));
                CHECK(same_bytes(bare->out(), fused->out()));
                CHECK(same_summary(bare->summary, fused->summary));
                // fast (its own kernels where its plan takes the shape, else online's)
                auto f1 = fresh(), f2 = fresh();
                run(fast, *f1, true);
                run(fast, *f2, false);
                CHECK(same_bytes(f2->out(), f1->out()));
                CHECK(same_summary(f2->summary, f1->summary));
                Result got;
                got.dlogits.resize(size_t(N) * V);
                const std::vector<float> o = download(f1->dlogits(), n, t);
                for (int64_t i = 0; i < N; i++)
                    std::copy(o.begin() + i * ld, o.begin() + i * ld + V,
                              got.dlogits.begin() + i * V);
                read_rows(got, f1->rows, f1->summary, N);
                c.ld = ld;
                c.in_place = sh.in_place;
                check_result(got, reference(c), c);
            }
        }
    }
}

TEST_CASE("BT x V above 2^31 elements: 64-bit indexing (rows beyond 2^31 checked)") {
    const int64_t V = 128256, N = 16900;  // 2.167e9 elements, 4.3 GB of bf16
    REQUIRE(N * V > (int64_t(1) << 31));
    size_t free_b = 0, total_b = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    if (free_b < size_t(N) * V * 2 * 3) {
        MESSAGE("not enough GPU memory for the 2^31 case: " << free_b << " bytes free");
        return;
    }
    // The logits are made on the host as bf16 and uploaded once; each variant starts from a device
    // copy of them, and only the checked rows come back (host passes over all 2e9 values, not the
    // GPU, took most of this test's time).
    std::vector<__nv_bfloat16> host(size_t(N) * V);
    std::vector<int32_t> targets(N);
    Rng rng(31);
    for (auto& x : host)  // [-4, 4] in steps of 1/500, rounded to bf16
        x = __float2bfloat16_rn(float(int64_t(rng.next_u64() % 4001) - 2000) / 500.0f);
    for (auto& y : targets) y = int32_t(rng.below(V));
    Dev pristine(host.size() * 2), logits(host.size() * 2), tg(size_t(N) * 4), go(4),
        rows(4 * size_t(N) * 4), summary(sizeof(cuda::LossSummaryF));
    CUDA_OK(cudaMemcpy(pristine.p, host.data(), pristine.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(tg.p, targets.data(), tg.bytes, cudaMemcpyHostToDevice));
    const float g = 1.0f;
    CUDA_OK(cudaMemcpy(go.p, &g, 4, cudaMemcpyHostToDevice));
    CrossEntropyOptions opts;
    opts.z_loss_weight = 1e-4;
    for (const std::string name : {"online", "fast", "fast_lockstep"}) {
        CAPTURE(name);
        const cuda::CrossEntropyVariant& v = cuda::find_cross_entropy_variant(name);
        CUDA_OK(cudaMemcpy(logits.p, pristine.p, logits.bytes, cudaMemcpyDeviceToDevice));
        Dev ws(v.workspace_bytes(N, V, LogitsType::bf16));
        const cuda::CrossEntropyArgs a =
            ce_args(logits.p, logits.p, LogitsType::bf16, V, N, V, tg, go, rows, summary);
        v.run(a, opts, ws.p, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaGetLastError());
        Result got;
        read_rows(got, rows, summary, N);
        // the reference on the first rows and on every row that starts past 2^31 elements
        for (int64_t i : std::vector<int64_t>{0, 1, (int64_t(1) << 31) / V + 1, N - 2, N - 1}) {
            CAPTURE(i);
            Case one;
            one.N = 1;
            one.V = V;
            one.type = LogitsType::bf16;
            one.opts = opts;
            one.opts.reduction = Reduction::sum;
            one.logits.resize(V);
            for (int64_t j = 0; j < V; j++) one.logits[j] = __bfloat162float(host[i * V + j]);
            one.targets = {targets[i]};
            one.grad_output = {1.0f / float(N)};  // what mean over N valid rows gives each row
            const Reference want = reference(one);
            CHECK(close(got.loss[i], want.loss[0], 2e-5, 1e-6));
            const std::vector<float> d = download(
                static_cast<const char*>(logits.p) + size_t(i) * V * 2, V, LogitsType::bf16);
            const MaxError e = compare(d.data(), want.dlogits.data(), V, 1.0 / 256 + 1e-5,
                                       1e-6 * max_abs(want.dlogits));
            INFO("row dlogits max abs err " << e.abs);
            CHECK(e.ok);
        }
        CHECK(got.summary.n_valid == N);
    }
}

TEST_CASE("every variant reproduces the PyTorch float64 oracle (ce_cases.safetensors)") {
    const std::optional<OracleCases> oc = load_ce_cases();
    if (!oc) return;
    const SafeTensors& st = oc->st;
    const nlohmann::json& cases = oc->cases;
    for (const auto& v : cuda::cross_entropy_variants())
        for (auto it = cases.begin(); it != cases.end(); ++it) {
            const std::string name = it.key();
            const auto& m = it.value();
            const std::string variant = v.name;
            CAPTURE(variant);
            CAPTURE(name);
            const Case c = oracle_case(st, name, m, LogitsType::f32);
            const Result got = run_variant(v, c);
            const auto want_rows = st.as_double(name + ".loss_rows");
            const auto want_d = st.as_double(name + ".dlogits");
            for (int64_t i = 0; i < c.N; i++) CHECK(close(got.loss[i], want_rows[i], 1e-6, 1e-7));
            if (c.opts.reduction != Reduction::none)
                CHECK(close(got.summary.loss, st.as_double(name + ".loss")[0], 1e-6, 1e-7));
            // fp32 logits: exact in both; the oracle's lse gives each element's bound
            const auto want_lse = st.as_double(name + ".lse");
            std::vector<double> lse(want_lse.begin(), want_lse.end());
            const MaxError e = compare_dlogits(got.dlogits, want_d, c.logits, lse, c.V, 1e-6);
            INFO("dlogits max abs err " << e.abs << " rel " << e.rel << " at " << e.worst);
            CHECK(e.ok);
        }
}

namespace {

double norm_rel_err(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); i++) {
        num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        den += want[i] * want[i];
    }
    return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// fused_linear's dh and dW against the fp64 answer, norm-relative to 1e-2: the GPU rounds the
// logits, the dlogits and its outputs to bf16 (2^-9 each) and accumulates in fp32, so errors of
// a few 2^-9 are expected (METHOD.md's range for bf16 operands).
void check_linear_grads(const std::vector<float>& dh, const std::vector<double>& want_dh,
                        const std::vector<float>& dW, const std::vector<double>& want_dW) {
    const double e_dh = norm_rel_err(dh, want_dh), e_dW = norm_rel_err(dW, want_dW);
    INFO("norm-relative errors: dh " << e_dh << ", dW " << e_dW);
    CHECK(e_dh < 1e-2);
    CHECK(e_dW < 1e-2);
}

// fused_linear's summary and per-row loss (device buffers) against the fp64 answer: n_valid
// exactly, the loss (an average of many rows) to 2e-3 relative, each row's to 2e-3 and 1e-5.
void check_linear_loss(const Dev& summary, const Dev& rows, int64_t N, int n_valid,
                       const CrossEntropySummary& want, const std::vector<double>& want_rows) {
    cuda::LossSummaryF s;
    CUDA_OK(cudaMemcpy(&s, summary.p, sizeof s, cudaMemcpyDeviceToHost));
    std::vector<float> got_rows(N);
    CUDA_OK(cudaMemcpy(got_rows.data(), rows.p, N * 4, cudaMemcpyDeviceToHost));
    CHECK(s.n_valid == n_valid);
    CHECK(close(s.loss, want.loss, 2e-3, 1e-6));
    for (int64_t i = 0; i < N; i++) CHECK(close(got_rows[i], want_rows[i], 2e-3, 1e-5));
}

// A fused_linear problem on random bf16-rounded h [N, C] and W [V, C] (one target ignored, z-loss
// and label smoothing on) and its answer in fp64: logits = h W^T, the CPU head, dh = dlogits W,
// dW = dlogits^T h.
struct LinearProblem {
    std::vector<float> h, W, go;
    std::vector<int32_t> t;
    CrossEntropyOptions o;
    CrossEntropySummary want;
    std::vector<double> rows, dh, dW;
    LinearProblem(int64_t N, int64_t C, int64_t V, Reduction r) : h(N * C), W(V * C), t(N) {
        Rng rng(uint64_t(V) + 3);
        for (auto& x : h) x = bf16_round(float(rng.normal()));
        for (auto& x : W) x = bf16_round(float(0.2 * rng.normal()));
        for (auto& y : t) y = int32_t(rng.below(uint64_t(V)));
        t[5] = -100;
        o.z_loss_weight = 1e-3;
        o.label_smoothing = 0.05;
        o.reduction = r;
        go = r == Reduction::none ? random_vector<float>(rng, N) : std::vector<float>{0.5f};
        std::vector<double> logits(N * V, 0.0);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < V; j++) {
                double s = 0;
                for (int64_t c = 0; c < C; c++) s += double(h[i * C + c]) * W[j * C + c];
                logits[i * V + j] = s;
            }
        std::vector<double> g(go.begin(), go.end());
        rows.assign(N, 0.0);
        want = cpu::cross_entropy(logits.data(), V, t.data(), N, V, o,
                                  {g.data(), r == Reduction::none}, {rows.data()}, true);
        dh.assign(N * C, 0.0);
        dW.assign(V * C, 0.0);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < V; j++) {
                const double d = logits[i * V + j];  // dlogits now
                for (int64_t c = 0; c < C; c++) {
                    dh[i * C + c] += d * W[j * C + c];
                    dW[j * C + c] += d * h[i * C + c];
                }
            }
    }
};

}  // namespace

// fused_linear: against logits = h W^T, the CPU head and dh = dlogits W, dW = dlogits^T h, all in
// fp64 on the same bf16-rounded h and W. The GPU rounds the logits and dlogits to bf16 (2^-9 each)
// and its outputs to bf16, with fp32 accumulation in the GEMMs: norm-relative errors of a few 2^-9
// are expected, so dh and dW are held to 1e-2 (METHOD.md's range for bf16 operands) and the loss,
// an average of many rows, to 2e-3 relative.
TEST_CASE("fused_linear equals h W^T followed by the CPU head (chunks, row blocks, both orders)") {
    for (Reduction r : {Reduction::mean, Reduction::none}) {
        for (int64_t V : {1000, 4099}) {
            const int64_t N = 37, C = 64;
            const std::string reduction = reduction_name(r);
            CAPTURE(reduction);
            CAPTURE(V);
            const LinearProblem p(N, C, V, r);
            const auto &h = p.h, &W = p.W, &go = p.go;
            const auto& t = p.t;
            const CrossEntropyOptions& o = p.o;
            const CrossEntropySummary& want = p.want;
            const auto &rows = p.rows, &dh = p.dh, &dW = p.dW;
            // every head (the fp64 answer once for all), in each schedule: one row block or
            // blocks of 16 rows (37 = 16 + 16 + 5), dW as bf16 or added to an fp32
            // accumulator, the row blocks inside or outside
            for (const auto& v : cuda::linear_cross_entropy_variants())
                for (const Schedule& sc : kSchedules) {
                    const std::string variant = v.name;
                    CAPTURE(variant);
                    CAPTURE(sc.name);
                    Dev dh_d(N * C * 2), dW_d(V * C * 2), dWacc_d(V * C * 4), hd(N * C * 2),
                        Wd(V * C * 2), td(N * 4), god(go.size() * 4), rowsd(N * 4),
                        sd(sizeof(cuda::LossSummaryF));
                    upload(hd.p, h, LogitsType::bf16);
                    upload(Wd.p, W, LogitsType::bf16);
                    CUDA_OK(cudaMemcpy(td.p, t.data(), N * 4, cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemcpy(god.p, go.data(), go.size() * 4, cudaMemcpyHostToDevice));
                    // poison: every weight row must be written
                    CUDA_OK(cudaMemset(dW_d.p, 0xFF, dW_d.bytes));
                    // the accumulator starts at 0.125 everywhere: the head must add, not
                    // overwrite
                    const std::vector<float> acc0(V * C, 0.125f);
                    CUDA_OK(
                        cudaMemcpy(dWacc_d.p, acc0.data(), dWacc_d.bytes, cudaMemcpyHostToDevice));
                    const cuda::LinearCrossEntropyArgs a = linear_ce_args(
                        hd, Wd, td, god, dh_d, dW_d, dWacc_d, rowsd, sd, N, C, V, sc);
                    Dev ws(v.workspace_bytes(N, C, V, a.tuning));
                    v.run(a, o, ws.p, nullptr);
                    CUDA_OK(cudaDeviceSynchronize());
                    check_linear_loss(sd, rowsd, N, int(N - 1), want, rows);
                    std::vector<float> got_dW;
                    if (sc.fp32_dw) {
                        got_dW = download(dWacc_d.p, V * C, LogitsType::f32);
                        for (float& x : got_dW) x -= 0.125f;
                    } else {
                        got_dW = download(dW_d.p, V * C, LogitsType::bf16);
                    }
                    check_linear_grads(download(dh_d.p, N * C, LogitsType::bf16), dh, got_dW, dW);
                }
        }
    }
}

// fused_linear's vocab-parallel building blocks: W split into 3 uneven shards (one of a single row)
// on one GPU. Each shard's statistics are merged, finalised once, and each shard's backward adds
// its dh into one fp32 buffer and writes its own dW rows: together they must equal the fp64 head.
TEST_CASE("fused_linear on vocabulary shards, merged, equals the fp64 head (loss, dh, dW)") {
    const int64_t N = 37, C = 64, V = 1000;
    const std::vector<int64_t> cuts = {0, 1, 301, 1000};
    for (Reduction r : {Reduction::mean, Reduction::none}) {
        const LinearProblem p(N, C, V, r);
        for (const Schedule& sc : {kSchedules[0], kSchedules[3], kSchedules[2]})
            for (bool wgmma : {false, true}) {  // fused_linear's shards, fused_linear_wgmma's
                const std::string reduction = reduction_name(r);
                CAPTURE(reduction);
                CAPTURE(sc.name);
                CAPTURE(wgmma);
                cuda::LinearCrossEntropyTuning tuning{384, sc.row_block};
                tuning.wgmma_epilogue = wgmma;
                Dev hd(N * C * 2), Wd(V * C * 2), td(N * 4), god(p.go.size() * 4), dh(N * C * 2),
                    dW(V * C * 2), dWacc(V * C * 4), dh_acc(N * C * 4), rowsd(4 * N * 4),
                    sd(sizeof(cuda::LossSummaryF)), acc(N * sizeof(cuda::RowStatsF)),
                    part(N * sizeof(cuda::RowStatsF)), params(N * sizeof(cuda::RowGradParams)),
                    nvalid(4);
                upload(hd.p, p.h, LogitsType::bf16);
                upload(Wd.p, p.W, LogitsType::bf16);
                CUDA_OK(cudaMemcpy(td.p, p.t.data(), N * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(god.p, p.go.data(), p.go.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemset(dW.p, 0xFF, dW.bytes));  // every shard must write its rows
                CUDA_OK(cudaMemset(dWacc.p, 0, dWacc.bytes));
                CUDA_OK(cudaMemset(dh_acc.p, 0, dh_acc.bytes));
                // shard k: W's rows [cuts[k], cuts[k + 1]), and the same rows of dW
                auto shard = [&](size_t k) {
                    cuda::LinearCrossEntropyArgs a =
                        linear_ce_args(hd, Wd, td, god, dh, dW, dWacc, rowsd, sd, N, C, V, sc);
                    a.dhidden = nullptr;  // the shards add into dh_acc instead
                    a.v0 = cuts[k];
                    a.V_local = cuts[k + 1] - cuts[k];
                    a.weight = static_cast<const uint16_t*>(Wd.p) + a.v0 * C;
                    a.tuning.wgmma_epilogue = wgmma;
                    if (sc.fp32_dw)
                        a.dweight_acc += a.v0 * C;
                    else
                        a.dweight = static_cast<uint16_t*>(dW.p) + a.v0 * C;
                    return a;
                };
                size_t ws_bytes = 0;
                for (size_t k = 0; k + 1 < cuts.size(); k++)
                    ws_bytes = std::max(ws_bytes, cuda::linear_ce_shard_workspace_bytes(
                                                      N, C, cuts[k + 1] - cuts[k], tuning));
                Dev ws(ws_bytes);
                // the CE view of all rows, for finalise and reduce
                cuda::CrossEntropyArgs ce;
                ce.type = LogitsType::bf16;
                ce.N = N;
                ce.V = V;
                ce.targets = td.as<int32_t>();
                ce.grad_output = god.as<float>();
                ce.loss_rows = rowsd.as<float>();
                ce.ce_rows = ce.loss_rows + N;
                ce.z_rows = ce.loss_rows + 2 * N;
                ce.lse_rows = ce.loss_rows + 3 * N;
                ce.summary = sd.as<cuda::LossSummaryF>();
                auto* stats = acc.as<cuda::RowStatsF>();
                cuda::ce_count_valid(nvalid.as<int>(), ce.targets, N, p.o.ignore_index, nullptr);
                for (size_t k = 0; k + 1 < cuts.size(); k++) {
                    cuda::linear_ce_shard_stats(k == 0 ? stats : part.as<cuda::RowStatsF>(),
                                                shard(k), p.o, ws.p, nullptr);
                    if (k > 0) cuda::ce_merge_stats(stats, part.as<cuda::RowStatsF>(), N, nullptr);
                }
                auto* pr = params.as<cuda::RowGradParams>();
                cuda::ce_finalize(pr, stats, nvalid.as<int>(), ce, p.o, nullptr);
                for (size_t k = 0; k + 1 < cuts.size(); k++)
                    cuda::linear_ce_shard_backward(dh_acc.as<float>(), pr, shard(k), p.o, ws.p,
                                                   nullptr);
                cuda::ce_reduce(ce, stats, nvalid.as<int>(), p.o, nullptr);
                CUDA_OK(cudaDeviceSynchronize());
                check_linear_loss(sd, rowsd, N, int(N - 1), p.want, p.rows);
                const std::vector<float> got_dW = sc.fp32_dw
                                                      ? download(dWacc.p, V * C, LogitsType::f32)
                                                      : download(dW.p, V * C, LogitsType::bf16);
                check_linear_grads(download(dh_acc.p, N * C, LogitsType::f32), p.dh, got_dW, p.dW);
            }
    }
}

// fused_linear through an identity weight (run_linear_identity) on the CE variants' cases: the
// vocabularies below, at and above block and vector sizes up to GPT-2's, peaked rows, |logit| ~
// 100, masked entries (-1e4: hidden states cannot make -inf), every reduction, ignore_index none /
// some / all, z-loss with and without label smoothing, every schedule. Held to what the bf16 CE
// variants are held to.
TEST_CASE("fused_linear through an identity weight equals the CPU head on the same bf16 logits") {
    // (C = V: the wgmma kernels of fused_linear_wgmma run where V % 8 == 0: 64, 128, 2056, 50304)
    const std::vector<int64_t> vocab = {1, 7, 64, 127, 128, 129, 513, 2056, 4097, 50257, 50304};
    uint64_t seed = 3000;
    for (int64_t V : vocab) {
        for (int ignored : {0, 3, 1000}) {
            const uint64_t s = seed++;
            // GPT-2's vocabulary (a 5 GB identity) once, with bf16 dW
            if (V > 5000 && ignored != 3 && V != 50304) continue;
            if (V == 50304 && ignored != 0) continue;
            const int64_t N = V > 5000 ? 5 : 37;
            const uint64_t ri = (s + s / 3) % 3;  // turns with V, so each ignore mode meets each
            const Reduction r = ri == 0   ? Reduction::mean
                                : ri == 1 ? Reduction::sum
                                          : Reduction::none;
            const double eps = V > 1 && s % 2 ? 0.1 : 0.0, z = s % 4 == 3 ? 0.0 : 1e-4;
            Case c = make_case(s, N, V, LogitsType::bf16, z, eps, r, ignored);
            for (float& x : c.logits)
                if (std::isinf(x)) x = -1e4f;
            const std::vector<Schedule> schedules =
                V > 5000 ? std::vector<Schedule>{kSchedules[0]}
                         : std::vector<Schedule>(std::begin(kSchedules), std::end(kSchedules));
            for (const Schedule& sc : schedules) {
                CAPTURE(V);
                CAPTURE(ignored);
                const std::string reduction = reduction_name(r);
                CAPTURE(reduction);
                CAPTURE(z);
                CAPTURE(eps);
                CAPTURE(sc.name);
                for (const auto& v : cuda::linear_cross_entropy_variants()) {
                    const std::string variant = v.name;
                    CAPTURE(variant);
                    const Result got = run_linear_identity(c, sc, variant);
                    check_result(got, reference(c), c);
                    if (ignored >= N) {
                        CHECK(got.summary.loss == 0.0f);
                        for (float d : got.dlogits) CHECK(d == 0.0f);
                    }
                }
            }
        }
    }
}

// fused_linear against the PyTorch float64 oracle, through an identity weight. The head sees the
// oracle's fp32 logits rounded to bf16, so it is held to (a) the CPU head on those bf16 logits,
// as every bf16 variant, and (b) the oracle itself, within what the bf16 rounding of the logits
// moves the fp64 answer (the CPU head on the fp32 and on the bf16 logits) plus (a)'s tolerance
// (2e-5 relative, 1e-6 absolute) and the CPU head's own distance from the oracle (1e-6, shown by
// test_oracles).
TEST_CASE("fused_linear reproduces the PyTorch float64 oracle within bf16 rounding (identity W)") {
    const std::optional<OracleCases> oc = load_ce_cases();
    if (!oc) return;
    const SafeTensors& st = oc->st;
    const nlohmann::json& cases = oc->cases;
    for (auto it = cases.begin(); it != cases.end(); ++it) {
        const std::string name = it.key();
        const auto& m = it.value();
        CAPTURE(name);
        const Case c = oracle_case(st, name, m, LogitsType::bf16);
        const Result got = run_linear_identity(c, kSchedules[0]);
        const Reference on_bf16 = reference(c);
        check_result(got, on_bf16, c);  // (a)
        Case c32 = c;
        c32.type = LogitsType::f32;
        const Reference on_f32 = reference(c32);
        const auto want_rows = st.as_double(name + ".loss_rows");
        for (int64_t i = 0; i < c.N; i++) {  // (b)
            CAPTURE(i);
            const double moved = std::fabs(on_bf16.loss[i] - on_f32.loss[i]);
            CHECK(std::fabs(got.loss[i] - want_rows[i]) <=
                  moved + 3e-5 * std::fabs(want_rows[i]) + 2e-6);
        }
        if (c.opts.reduction != Reduction::none) {
            const double want = st.as_double(name + ".loss")[0];
            const double moved = std::fabs(on_bf16.summary.loss - on_f32.summary.loss);
            CHECK(std::fabs(got.summary.loss - want) <= moved + 3e-5 * std::fabs(want) + 2e-6);
        }
    }
}

// A fused linear head's run (a linear_cross_entropy_variants() name) in schedule `sc` (default: one
// row block, dW written as bf16; with an fp32 dW accumulator it starts at 0.125 and dW is the
// accumulator as it ends), the default tile, grad_output a scalar or one per row (reduction
// none), wgmma_cluster and filter_eps as LinearCrossEntropyTuning's; returns the per-row loss,
// the summary, dh and dW.
struct LinearRun {
    std::vector<float> rows, dh, dW;
    cuda::LossSummaryF summary;
};
LinearRun run_linear(const std::vector<float>& h, const std::vector<float>& W,
                     const std::vector<int32_t>& t, const std::vector<float>& go,
                     const CrossEntropyOptions& o, int64_t N, int64_t C, int64_t V,
                     const std::string& variant, int wgmma_cluster = 0,
                     const Schedule& sc = kSchedules[0], float filter_eps = 0.0f) {
    Dev hd(N * C * 2), Wd(V * C * 2), td(N * 4), god(go.size() * 4), dh(N * C * 2),
        dW(sc.fp32_dw ? 0 : V * C * 2), acc(sc.fp32_dw ? V * C * 4 : 0), rowsd(N * 4),
        sd(sizeof(cuda::LossSummaryF));
    upload(hd.p, h, LogitsType::bf16);
    upload(Wd.p, W, LogitsType::bf16);
    CUDA_OK(cudaMemcpy(td.p, t.data(), N * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(god.p, go.data(), go.size() * 4, cudaMemcpyHostToDevice));
    if (sc.fp32_dw) {
        const std::vector<float> acc0(V * C, 0.125f);
        CUDA_OK(cudaMemcpy(acc.p, acc0.data(), acc.bytes, cudaMemcpyHostToDevice));
    }
    cuda::LinearCrossEntropyArgs a =
        linear_ce_args(hd, Wd, td, god, dh, dW, acc, rowsd, sd, N, C, V, sc);
    a.tuning.vocab_chunk = 0;  // the default tile
    a.tuning.wgmma_cluster = wgmma_cluster;
    a.tuning.filter_eps = filter_eps;
    const auto& v = cuda::find_linear_cross_entropy_variant(variant);
    Dev ws(v.workspace_bytes(N, C, V, a.tuning));
    v.run(a, o, ws.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    LinearRun r;
    CUDA_OK(cudaMemcpy(&r.summary, sd.p, sizeof r.summary, cudaMemcpyDeviceToHost));
    r.rows.resize(N);
    CUDA_OK(cudaMemcpy(r.rows.data(), rowsd.p, N * 4, cudaMemcpyDeviceToHost));
    r.dh = download(dh.p, N * C, LogitsType::bf16);
    r.dW = sc.fp32_dw ? download(acc.p, V * C, LogitsType::f32)
                      : download(dW.p, V * C, LogitsType::bf16);
    return r;
}

// The fp64 head of rows `rows_used` of h against W (targets t, scalar grad_output g): per-row
// loss (of those rows), the summary, dh (all N rows; 0 on the others) and dW. h and W must be
// small integers times powers of two (exact_inputs), so that every logit is exact in fp32 in any
// summation order: the GPU's bf16 logits are then the exact ones rounded once, and so are these.
// Inputs whose every logit is exact in fp32: h integers in [-hmax, hmax], W multiples of 1/32
// in (-1, 1) (5 bits), C <= 64: logits are multiples of 1/32 below 2^15.
void exact_inputs(Rng& rng, std::vector<float>& x, int max_int, float scale) {
    for (auto& v : x) v = scale * float(int(rng.below(uint64_t(2 * max_int + 1))) - max_int);
}

struct LinearAnswer {
    std::vector<double> rows, dh, dW;
    CrossEntropySummary summary;
};
LinearAnswer linear_answer(const std::vector<float>& h, const std::vector<float>& W,
                           const std::vector<int32_t>& t, double g, const CrossEntropyOptions& o,
                           const std::vector<int64_t>& rows_used, int64_t N, int64_t C, int64_t V) {
    const int64_t M = int64_t(rows_used.size());
    std::vector<double> logits(M * V);
    std::vector<int32_t> tm(M);
    for (int64_t m = 0; m < M; m++) {
        tm[m] = t[rows_used[m]];
        for (int64_t j = 0; j < V; j++) {
            double s = 0;
            for (int64_t k = 0; k < C; k++) s += double(h[rows_used[m] * C + k]) * W[j * C + k];
            REQUIRE(double(float(s)) == s);  // exact in fp32
            logits[m * V + j] = bf16_round(float(s));
        }
    }
    LinearAnswer a;
    a.rows.assign(M, 0.0);
    a.summary = cpu::cross_entropy(logits.data(), V, tm.data(), M, V, o, {&g, false},
                                   {a.rows.data()}, true);
    a.dh.assign(N * C, 0.0);
    a.dW.assign(V * C, 0.0);
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < V; j++) {
            const double d = logits[m * V + j];  // dlogits now
            if (d == 0.0) continue;
            for (int64_t k = 0; k < C; k++) {
                a.dh[rows_used[m] * C + k] += d * W[j * C + k];
                a.dW[j * C + k] += d * h[rows_used[m] * C + k];
            }
        }
    return a;
}

// fused_linear at the real vocabularies with random h and W (C = 32) and hard rows: one peaked
// (h along its target's weight row, p -> 1), one with |logit| ~ 100, one ignored.
TEST_CASE("fused_linear at V = 50257, 128256 and 256000 with peaked and large-logit rows") {
    const int64_t N = 6, C = 32;
    for (int64_t V : {50257, 128256, 256000}) {
        CAPTURE(V);
        Rng rng{uint64_t(V)};
        std::vector<float> h(N * C), W(V * C);
        exact_inputs(rng, W, 31, 1.0f / 32);
        exact_inputs(rng, h, 2, 1.0f);
        std::vector<int32_t> t(N);
        for (auto& y : t) y = int32_t(rng.below(uint64_t(V)));
        for (int64_t k = 0; k < C; k++) {
            const float w = W[int64_t(t[1]) * C + k];
            h[1 * C + k] = w > 0 ? 15.0f : w < 0 ? -15.0f : 0.0f;  // peaked on the target
            h[2 * C + k] = 15.0f * float(int(rng.below(3)) - 1);   // |logit| ~ 100
        }
        t[4] = -100;
        CrossEntropyOptions o;
        o.z_loss_weight = 1e-4;
        o.label_smoothing = 0.1;
        const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
        const LinearAnswer want = linear_answer(h, W, t, 0.37, o, all, N, C, V);
        for (const auto& v : cuda::linear_cross_entropy_variants()) {
            const std::string variant = v.name;
            CAPTURE(variant);
            const LinearRun got = run_linear(h, W, t, {0.37f}, o, N, C, V, variant);
            CHECK(got.summary.n_valid == N - 1);
            CHECK(close(got.summary.loss, want.summary.loss, 2e-5, 1e-6));
            for (int64_t i = 0; i < N; i++) CHECK(close(got.rows[i], want.rows[i], 2e-5, 1e-6));
            check_linear_grads(got.dh, want.dh, got.dW, want.dW);
        }
    }
}

// fused_linear_wgmma's kernels in 2-CTA clusters (each CTA loads half of a weight tile into both)
// against single CTAs: the same bits. 257 and 600 rows are 3 and 5 row tiles, so the last pair's
// second tile lies past the rows; at V = 50304 both passes have more work items than clusters.
TEST_CASE("fused_linear_wgmma in 2-CTA clusters gives the single CTAs' bits") {
    const int64_t C = 64;
    for (int64_t N : {257, 600})
        for (int64_t V : {4099, 50304}) {
            CAPTURE(N);
            CAPTURE(V);
            Rng rng{uint64_t(N * V)};
            std::vector<float> h(N * C), W(V * C);
            exact_inputs(rng, W, 31, 1.0f / 32);
            exact_inputs(rng, h, 2, 1.0f);
            std::vector<int32_t> t(N);
            for (auto& y : t) y = rng.below(5) == 0 ? -100 : int32_t(rng.below(uint64_t(V)));
            CrossEntropyOptions o;
            o.z_loss_weight = 1e-4;
            o.label_smoothing = 0.1;
            const LinearRun one = run_linear(h, W, t, {0.37f}, o, N, C, V, "fused_linear_wgmma", 1);
            const LinearRun two = run_linear(h, W, t, {0.37f}, o, N, C, V, "fused_linear_wgmma", 2);
            CHECK(two.summary.loss == one.summary.loss);
            CHECK(two.summary.n_valid == one.summary.n_valid);
            CHECK(two.rows == one.rows);
            CHECK(two.dh == one.dh);
            CHECK(two.dW == one.dW);
            // and the default is single CTAs
            const LinearRun def = run_linear(h, W, t, {0.37f}, o, N, C, V, "fused_linear_wgmma");
            CHECK(def.dW == one.dW);
        }
}

// filter_blocks: each 32 x 32 block of a 70 x 200 matrix (row stride 208) flagged where some
// |x| >= the threshold (0.5) or x is NaN, as the host finds.
TEST_CASE("filter_blocks flags the blocks that hold a value at or above the threshold") {
    const int64_t rows = 70, cols = 200, ld = 208, n_rb = 3, n_cb = 7;
    Rng rng(17);
    std::vector<float> X(rows * ld);
    for (auto& x : X) x = bf16_round(float(0.1 * rng.normal()));  // |x| < 0.5 almost surely
    for (int i = 0; i < 12; i++)
        X[rng.below(uint64_t(rows)) * ld + rng.below(uint64_t(cols))] = -0.5f;
    X[3 * ld + 199] = std::nanf("");
    X[69 * ld + 100] = 0.49f;                                   // just below: not flagged by itself
    for (int64_t r = 0; r < rows; r++) X[r * ld + 205] = 9.0f;  // past cols: never read
    std::vector<unsigned char> want(n_rb * n_cb, 0);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float x = X[r * ld + c];
            if (!(std::fabs(x) < 0.5f)) want[(r / 32) * n_cb + c / 32] = 1;
        }
    Dev xd(X.size() * 2), kd(want.size()), td(4);
    upload(xd.p, X, LogitsType::bf16);
    const float thr = 0.5f;
    CUDA_OK(cudaMemcpy(td.p, &thr, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(kd.p, 7, kd.bytes));
    REQUIRE(cuda::filter_blocks_bytes(rows, cols) == int64_t(want.size()));
    cuda::filter_blocks(kd.as<unsigned char>(), xd.p, ld, rows, cols, td.as<float>(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned char> got(want.size());
    CUDA_OK(cudaMemcpy(got.data(), kd.p, got.size(), cudaMemcpyDeviceToHost));
    CHECK(got == want);
    int flagged = 0;
    for (unsigned char f : want) flagged += f;
    CHECK(flagged > 0);
    CHECK(flagged < int(want.size()));
}

// filtered_gemm on its own: D is the sum over exactly the k steps each CTA lists from hand-made
// flags, in both layouts of A, for sizes that are not multiples of the tiles (M, K; N a multiple
// of 8), lists longer than one ballot round (K = 1100: 35 steps), bf16 and fp32 D, beta 0 and 1,
// no flags (every step), and more k steps than the list holds (K = 262,176: every step). A's
// values in unflagged blocks are x 1000, so a step run by mistake shows; its values past K (or M)
// are finite noise that must not matter.
TEST_CASE("filtered_gemm runs exactly the k steps its flags list") {
    struct Shape {
        int64_t M, N, K;
    };
    for (bool at : {false, true})
        for (const Shape sh :
             {Shape{200, 72, 300}, Shape{130, 8, 1100}, Shape{257, 136, 45}, Shape{16, 8, 262176}})
            for (int mode = 0; mode < 4; mode++) {  // bf16 D; fp32 D; fp32 D += ; no flags
                const int64_t M = sh.M, N = sh.N, K = sh.K;
                const bool huge = K > 262144;
                if (huge && mode != 1) continue;
                CAPTURE(at);
                CAPTURE(M);
                CAPTURE(N);
                CAPTURE(K);
                CAPTURE(mode);
                Rng rng(uint64_t(M * 7 + K + mode + (at ? 100 : 0)));
                const int64_t rows = at ? K : M, cols = at ? M : K;  // A's storage
                const int64_t cols8 = (cols + 7) / 8 * 8, lda = cols8 + 8;
                const int64_t n_rb = (rows + 31) / 32, n_cb = (cols8 + 31) / 32;
                std::vector<unsigned char> keep(n_rb * n_cb);
                for (auto& f : keep) f = (unsigned char)(rng.below(2));
                std::vector<float> A(rows * lda), B(K * N);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < lda; c++) {
                        float v = bf16_round(float(rng.normal()));
                        if (c < cols && !keep[(r / 32) * n_cb + c / 32]) v = bf16_round(1000 * v);
                        A[r * lda + c] = v;
                    }
                for (auto& x : B) x = bf16_round(float(rng.normal()));
                auto kept = [&](int64_t mt, int64_t kt) {
                    if (mode == 3 || huge) return true;
                    for (int64_t b = mt * 4; b < mt * 4 + 4; b++)
                        if (!at ? b < n_rb && keep[b * n_cb + kt] : b < n_cb && keep[kt * n_cb + b])
                            return true;
                    return false;
                };
                const float d0 = mode == 2 ? 0.25f : 0.0f;
                std::vector<double> want(M * N, d0), mag(M * N, 0.0);
                for (int64_t m = 0; m < M; m++)
                    for (int64_t kt = 0; kt * 32 < K; kt++) {
                        if (!kept(m / 128, kt)) continue;
                        for (int64_t k = kt * 32; k < std::min(K, kt * 32 + 32); k++) {
                            const double a = at ? A[k * lda + m] : A[m * lda + k];
                            for (int64_t n = 0; n < N; n++) {
                                want[m * N + n] += a * B[k * N + n];
                                mag[m * N + n] += std::fabs(a * B[k * N + n]);
                            }
                        }
                    }
                const bool fp32 = mode != 0;
                Dev Ad(A.size() * 2), Bd(B.size() * 2), Dd(M * N * 4), kd(keep.size());
                upload(Ad.p, A, LogitsType::bf16);
                upload(Bd.p, B, LogitsType::bf16);
                CUDA_OK(cudaMemcpy(kd.p, keep.data(), keep.size(), cudaMemcpyHostToDevice));
                const std::vector<float> init(M * N, fp32 ? 0.25f : 0.0f);
                if (fp32)
                    CUDA_OK(cudaMemcpy(Dd.p, init.data(), M * N * 4, cudaMemcpyHostToDevice));
                else
                    CUDA_OK(cudaMemset(Dd.p, 0xFF, Dd.bytes));  // poison: every output written
                cuda::FilteredGemm g;
                g.A = Ad.p;
                g.lda = lda;
                g.a_transposed = at;
                g.B = Bd.p;
                g.ldb = N;
                g.D = Dd.p;
                g.ldd = N;
                g.d_fp32 = fp32;
                g.beta = mode == 2 ? 1.0f : 0.0f;
                g.M = M;
                g.N = N;
                g.K = K;
                g.keep = mode == 3 ? nullptr : kd.as<unsigned char>();
                REQUIRE(cuda::filtered_gemm_usable(g));
                cuda::filtered_gemm(g, nullptr);
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaGetLastError());
                const std::vector<float> got =
                    download(Dd.p, M * N, fp32 ? LogitsType::f32 : LogitsType::bf16);
                int64_t bad = 0;
                for (int64_t i = 0; i < M * N; i++) {
                    // fp32 accumulation (the tensor cores' adds) and, for bf16 D, one rounding
                    const double tol =
                        1e-5 * mag[i] + (fp32 ? 0.0 : 0x1p-8 * std::fabs(want[i])) + 1e-6;
                    bad += !(std::fabs(got[i] - want[i]) <= tol);
                }
                CHECK(bad == 0);
            }
    // beta other than 0 or 1 is refused
    cuda::FilteredGemm g;
    Dev d(4096);
    g.A = g.B = g.D = d.p;
    g.lda = g.ldb = g.ldd = g.N = 8;
    g.M = g.K = 8;
    g.d_fp32 = true;
    g.beta = 0.5f;
    CHECK_FALSE(cuda::filtered_gemm_usable(g));
    g.beta = 1.0f;
    CHECK(cuda::filtered_gemm_usable(g));
}

// fused_linear_rows_filtered (Cut Cross-Entropy's gradient filtering; not exact) against its own
// run with filter_eps = 0, which the tests above hold to the fp64 head. The rows are peaked
// (logits of standard deviation ~24: a few entries of a row above 2^-12 of the gradient's
// scale), so that many 128 x 32 pieces of dlogits, what a CTA of the filtered GEMM skips, are
// below it. The forward is not filtered: the loss and per-row loss are the same bits. A
// skipped piece's every |dlogit| is below thr = 2^-12 x the largest |scale|, so each dh entry
// moves by at most thr x sum_v |W[v][c]| (plus one bf16 rounding of dh) and each dW entry by at
// most thr x sum_i |h[i][c]| (plus fp32 rounding). The filter must have skipped something (dW
// differs), and two runs give the same bits.
TEST_CASE("fused_linear_rows_filtered drops no more than its threshold allows") {
    const float eps = 0x1p-12f;
    for (Reduction r : {Reduction::mean, Reduction::none})
        for (int64_t V : {4099, 16384}) {  // a CTA skips a 128 x 32 piece: V >> 128 rows
            const int64_t N = 300, C = 64;
            const std::string reduction = reduction_name(r);
            CAPTURE(reduction);
            CAPTURE(V);
            Rng rng(uint64_t(V) + 11);
            std::vector<float> h(N * C), W(V * C);
            for (auto& x : h) x = bf16_round(float(rng.normal()));
            for (auto& x : W) x = bf16_round(float(3.0 * rng.normal()));
            std::vector<int32_t> t(N);
            for (auto& y : t) y = int32_t(rng.below(uint64_t(V)));
            t[7] = -100;
            CrossEntropyOptions o;
            o.z_loss_weight = 1e-3;
            o.label_smoothing = 0.05;
            o.reduction = r;
            const std::vector<float> go =
                r == Reduction::none ? random_vector<float>(rng, N) : std::vector<float>{0.5f};
            float scale = 0.5f / float(N - 1);  // mean: grad_output over the valid rows
            if (r == Reduction::none) {
                scale = 0;
                for (float g : go) scale = std::max(scale, std::fabs(g));
            }
            const double thr = double(eps) * scale;
            // 128-row blocks (300 = 128 + 128 + 44), dW added to an fp32 accumulator
            const Schedule sc{"128-row blocks, fp32 dW", 128, false, true};
            auto run = [&](float filter_eps) {
                return run_linear(h, W, t, go, o, N, C, V, "fused_linear_rows_filtered", 0, sc,
                                  filter_eps);
            };
            const LinearRun exact = run(0.0f), filtered = run(eps), again = run(eps);
            CHECK(filtered.summary.loss == exact.summary.loss);
            CHECK(filtered.rows == exact.rows);
            CHECK(again.dh == filtered.dh);
            CHECK(again.dW == filtered.dW);
            std::vector<double> w_cols(C, 0.0), h_cols(C, 0.0);
            for (int64_t v = 0; v < V; v++)
                for (int64_t c = 0; c < C; c++) w_cols[c] += std::fabs(W[v * C + c]);
            for (int64_t i = 0; i < N; i++)
                for (int64_t c = 0; c < C; c++) h_cols[c] += std::fabs(h[i * C + c]);
            int64_t dh_over = 0, dW_over = 0, dW_moved = 0;
            for (int64_t i = 0; i < N * C; i++) {
                const double d = std::fabs(double(filtered.dh[i]) - exact.dh[i]);
                dh_over += d > thr * w_cols[i % C] + 0x1p-8 * std::fabs(exact.dh[i]) + 1e-30;
            }
            for (int64_t i = 0; i < V * C; i++) {
                const double d = std::fabs(double(filtered.dW[i]) - exact.dW[i]);
                dW_over += d > thr * h_cols[i % C] + 1e-5 * std::fabs(exact.dW[i] - 0.125) + 1e-7;
                dW_moved += filtered.dW[i] != exact.dW[i];
            }
            MESSAGE("dW entries the filter moved: " << dW_moved << " of " << V * C);
            CHECK(dh_over == 0);
            CHECK(dW_over == 0);
            CHECK(dW_moved > 0);
        }
}

// fused_linear with N x V above 2^31 (16400 x 131072) although no such buffer exists: all but
// 64 rows are ignored, so that the fp64 answer stays cheap; every row still goes through every
// tile. The ignored rows' dh must be exactly 0.
TEST_CASE("fused_linear with BT x V above 2^31 elements (all but 64 rows ignored)") {
    const int64_t N = 16400, C = 16, V = 131072;
    REQUIRE(N * V > (int64_t(1) << 31));
    Rng rng(31);
    std::vector<float> h(N * C), W(V * C);
    exact_inputs(rng, h, 3, 1.0f);
    exact_inputs(rng, W, 31, 1.0f / 32);
    std::vector<int32_t> t(N, -100);
    std::vector<int64_t> valid;
    for (int64_t k = 0; k < 64; k++) valid.push_back(k * (N / 64) + 7);
    valid.back() = N - 1;  // the last row too
    for (int64_t i : valid) t[i] = int32_t(rng.below(uint64_t(V)));
    CrossEntropyOptions o;
    o.z_loss_weight = 1e-4;
    const LinearAnswer want = linear_answer(h, W, t, 1.0, o, valid, N, C, V);
    for (const auto& v : cuda::linear_cross_entropy_variants()) {
        const std::string variant = v.name;
        CAPTURE(variant);
        const LinearRun got = run_linear(h, W, t, {1.0f}, o, N, C, V, variant);
        CHECK(got.summary.n_valid == int(valid.size()));
        CHECK(close(got.summary.loss, want.summary.loss, 2e-5, 1e-6));
        for (size_t m = 0; m < valid.size(); m++)
            CHECK(close(got.rows[valid[m]], want.rows[m], 2e-5, 1e-6));
        int64_t nonzero_ignored = 0;
        for (int64_t i = 0; i < N; i++)
            if (t[i] == -100)
                for (int64_t k = 0; k < C; k++) nonzero_ignored += got.dh[i * C + k] != 0.0f;
        CHECK(nonzero_ignored == 0);
        check_linear_grads(got.dh, want.dh, got.dW, want.dW);
    }
}

// The whole head inside a CUDA graph. Each variant is captured on a stream in global mode, so a
// host synchronization, a host read of device data or a use of the legacy stream inside run()
// fails the capture. The graph is then replayed on the inputs it was captured with and on new
// ones (logits, targets, grad_output, all written on the device between replays): every output
// must equal, bit for bit, a direct run on the same inputs. The direct runs come first, so the
// stream's cuBLASLt workspace exists before the capture, as after a trainer's first step.
namespace {

struct GraphRun {
    cudaStream_t stream = nullptr;
    GraphRun() { CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
    ~GraphRun() {
        zgpt::cuda::release_gemm_workspace(stream);  // its 32 MB go with the stream
        cudaStreamDestroy(stream);
    }
    GraphRun(const GraphRun&) = delete;
    GraphRun& operator=(const GraphRun&) = delete;
    // Captures f(stream) into an executable graph.
    template <typename F>
    cudaGraphExec_t capture(F&& f) {
        cudaGraph_t g = nullptr;
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        f(stream);
        CUDA_OK(cudaStreamEndCapture(stream, &g));
        cudaGraphExec_t exec = nullptr;
        CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
        CUDA_OK(cudaGraphDestroy(g));
        return exec;
    }
    void replay(cudaGraphExec_t exec) {
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
    }
};

std::vector<uint8_t> device_bytes(const Dev& d) {
    std::vector<uint8_t> r(d.bytes);
    CUDA_OK(cudaMemcpy(r.data(), d.p, d.bytes, cudaMemcpyDeviceToHost));
    return r;
}

}  // namespace

TEST_CASE("every variant runs inside a CUDA graph: no host sync, new device inputs per replay") {
    GraphRun gr;
    const int64_t N = 37;
    // `fast` twice more with rows long enough for clusters of 3 (V = 128256: online's rows as the
    // helper grid) and of 4 (140000: 2-CTA clusters), and a large helper share: the helper grid's
    // programmatic dependency on the main grid is captured too
    std::vector<std::pair<cuda::CrossEntropyVariant, int64_t>> runs;
    for (const auto& v : cuda::cross_entropy_variants()) {
        runs.push_back({v, 5003});
        if (std::string(v.name) == "fast")
            for (const int64_t V : {128256, 140000}) runs.push_back({v, V});
    }
    for (const auto& [v, V] : runs) {
        const bool helper = V > 5003;
        for (Reduction r : {Reduction::mean, Reduction::none}) {
            const std::string variant = v.name, reduction = reduction_name(r);
            CAPTURE(variant);
            CAPTURE(helper);
            CAPTURE(reduction);
            Case c[2] = {make_case(7, N, V, LogitsType::bf16, 1e-4, 0.1, r, 1),
                         make_case(8, N, V, LogitsType::bf16, 1e-4, 0.1, r, 3)};
            if (r == Reduction::mean) c[1].grad_output = {0.25f};
            Dev logits(size_t(N) * V * 2), targets(N * 4), go(N * 4), rows(4 * N * 4),
                summary(sizeof(cuda::LossSummaryF)), ws(v.workspace_bytes(N, V, LogitsType::bf16));
            auto set_inputs = [&](const Case& k) {
                upload(logits.p, k.logits, LogitsType::bf16);
                CUDA_OK(cudaMemcpy(targets.p, k.targets.data(), N * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(go.p, k.grad_output.data(), k.grad_output.size() * 4,
                                   cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemset(rows.p, 0xFF, rows.bytes));
                CUDA_OK(cudaMemset(summary.p, 0xFF, summary.bytes));
                // landed before the head runs: these calls return early, on the default stream,
                // which the non-blocking capture stream does not wait for
                CUDA_OK(cudaDeviceSynchronize());
            };
            auto outputs = [&] {
                std::vector<uint8_t> o = device_bytes(logits), x = device_bytes(rows),
                                     y = device_bytes(summary);
                o.insert(o.end(), x.begin(), x.end());
                o.insert(o.end(), y.begin(), y.end());
                return o;
            };
            cuda::CrossEntropyArgs a = ce_args(logits.p, logits.p /* in place */, LogitsType::bf16,
                                               V, N, V, targets, go, rows, summary);
            if (helper) a.tuning.helper_weight = 400;
            auto run = [&](cudaStream_t st) { v.run(a, c[0].opts, ws.p, st); };
            std::vector<uint8_t> want[2];
            for (int i = 0; i < 2; i++) {
                set_inputs(c[i]);
                run(gr.stream);
                CUDA_OK(cudaStreamSynchronize(gr.stream));
                want[i] = outputs();
            }
            CHECK(want[0] != want[1]);  // the second inputs do change the outputs
            set_inputs(c[0]);
            cudaGraphExec_t exec = gr.capture(run);
            for (int i = 0; i < 2; i++) {
                set_inputs(c[i]);
                gr.replay(exec);
                CHECK(outputs() == want[i]);
            }
            CUDA_OK(cudaGraphExecDestroy(exec));
        }
    }
}

TEST_CASE("fused_linear runs inside a CUDA graph: no host sync, new device inputs per replay") {
    GraphRun gr;
    for (const auto& v : cuda::linear_cross_entropy_variants()) {
        const std::string variant = v.name;
        CAPTURE(variant);
        const int64_t N = 37, C = 64, V = 1000;
        CrossEntropyOptions o;
        o.z_loss_weight = 1e-4;
        o.label_smoothing = 0.1;
        for (const Schedule& sc : kSchedules) {
            CAPTURE(sc.name);
            Dev hd(N * C * 2), Wd(V * C * 2), td(N * 4), god(4), dh(N * C * 2), dW(V * C * 2),
                dWacc(V * C * 4), rowsd(N * 4), sd(sizeof(cuda::LossSummaryF));
            const cuda::LinearCrossEntropyArgs a =
                linear_ce_args(hd, Wd, td, god, dh, dW, dWacc, rowsd, sd, N, C, V, sc);
            const Dev& dW_out = sc.fp32_dw ? dWacc : dW;
            Dev ws(v.workspace_bytes(N, C, V, a.tuning));
            auto set_inputs = [&](uint64_t seed) {
                Rng rng(seed);
                std::vector<float> h(N * C), W(V * C);
                for (auto& x : h) x = bf16_round(float(rng.normal()));
                for (auto& x : W) x = bf16_round(float(0.2 * rng.normal()));
                std::vector<int32_t> t(N);
                for (auto& y : t) y = int32_t(rng.below(uint64_t(V)));
                t[seed % N] = -100;
                const float g = float(0.5 + rng.uniform());
                upload(hd.p, h, LogitsType::bf16);
                upload(Wd.p, W, LogitsType::bf16);
                CUDA_OK(cudaMemcpy(td.p, t.data(), N * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(god.p, &g, 4, cudaMemcpyHostToDevice));
                for (const Dev* d : {&dh, &dW, &rowsd, &sd})
                    CUDA_OK(cudaMemset(d->p, 0xFF, d->bytes));
                CUDA_OK(cudaMemset(dWacc.p, 0, dWacc.bytes));  // the accumulator is added into
                CUDA_OK(cudaDeviceSynchronize());  // landed before the head runs (as above)
            };
            auto outputs = [&] {
                std::vector<uint8_t> r;
                for (const Dev* d : std::initializer_list<const Dev*>{&dh, &dW_out, &rowsd, &sd}) {
                    const std::vector<uint8_t> b = device_bytes(*d);
                    r.insert(r.end(), b.begin(), b.end());
                }
                return r;
            };
            auto run = [&](cudaStream_t st) { v.run(a, o, ws.p, st); };
            std::vector<uint8_t> want[2];
            for (int i = 0; i < 2; i++) {
                set_inputs(uint64_t(11 + i));
                run(gr.stream);
                CUDA_OK(cudaStreamSynchronize(gr.stream));
                want[i] = outputs();
            }
            CHECK(want[0] != want[1]);
            set_inputs(11);
            cudaGraphExec_t exec = gr.capture(run);
            for (int i = 0; i < 2; i++) {
                set_inputs(uint64_t(11 + i));
                gr.replay(exec);
                CHECK(outputs() == want[i]);
            }
            CUDA_OK(cudaGraphExecDestroy(exec));
        }
    }
}

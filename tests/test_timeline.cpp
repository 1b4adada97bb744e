// The GPU timeline's summary (kernels/core/gpu_timeline.h) on hand-made intervals: the busy time
// is the union over streams, the idle gaps lie between busy stretches and name their neighbours,
// communication alone is what NCCL ran with nothing beside it, and the kernel names are short.
// CUPTI itself runs only on a GPU machine (bench_train --timeline, train.timeline_step there).
#include <doctest/doctest.h>

#include "kernels/core/gpu_timeline.h"

using namespace zgpt;

namespace {
const std::vector<std::string> kNames = {"gemm", "softmax",         "memset",
                                         "norm", "cudaMemcpyAsync", "cudaLaunchKernel"};
TimelineSummary summarise(const std::vector<TimelineInterval>& v, int gaps = 8, int top = 8,
                          const std::vector<TimelineInterval>& api = {}) {
    TimelineSummary s;
    summarise_intervals(v, api, kNames, gaps, top, s);
    return s;
}
}  // namespace

TEST_CASE("timeline: overlapping streams count once, gaps lie between busy stretches") {
    // ns: gemm [0, 100) and softmax [50, 120) on two streams overlap; a 30 ns gap; memset
    // [150, 160) inside nothing else; a 40 ns gap; norm [200, 300) with gemm [210, 250) inside it
    const std::vector<TimelineInterval> v = {
        {200, 300, 3}, {0, 100, 0}, {150, 160, 2}, {50, 120, 1}, {210, 250, 0}};
    const TimelineSummary s = summarise(v);
    CHECK(s.span_ms == doctest::Approx(300e-6));
    CHECK(s.busy_ms == doctest::Approx((120 + 10 + 100) * 1e-6));
    CHECK(s.idle_ms == doctest::Approx(70e-6));
    REQUIRE(s.largest_gaps.size() == 2);
    CHECK(s.largest_gaps[0].us == doctest::Approx(0.040));  // longest first
    CHECK(s.largest_gaps[0].before == "memset");
    CHECK(s.largest_gaps[0].after == "norm");
    CHECK(s.largest_gaps[0].at_ms == doctest::Approx(160e-6));
    CHECK(s.largest_gaps[1].us == doctest::Approx(0.030));
    CHECK(s.largest_gaps[1].before == "softmax");  // it ends the first stretch, not gemm
    CHECK(s.largest_gaps[1].after == "memset");
    CHECK(s.gaps_over_5us == 0);
    // per name: gemm twice (100 + 40 ns) is the longest
    REQUIRE(s.top_kernels.size() == 4);
    CHECK(s.top_kernels[0].name == "gemm");
    CHECK(s.top_kernels[0].calls == 2);
    CHECK(s.top_kernels[0].total_ms == doctest::Approx(140e-6));
    CHECK(s.top_kernels[1].name == "norm");
}

TEST_CASE("timeline: back-to-back kernels leave no gap; long gaps are counted; lists are cut") {
    // three kernels end to end, then a 10 us hole, then one more
    const std::vector<TimelineInterval> v = {
        {0, 1000, 0}, {1000, 2000, 1}, {2000, 3000, 0}, {13000, 14000, 3}};
    const TimelineSummary s = summarise(v, 1, 2);
    CHECK(s.busy_ms == doctest::Approx(4000e-6));
    CHECK(s.idle_ms == doctest::Approx(10000e-6));
    CHECK(s.gaps_over_5us == 1);
    REQUIRE(s.largest_gaps.size() == 1);
    CHECK(s.largest_gaps[0].before == "gemm");
    CHECK(s.top_kernels.size() == 2);
    const TimelineSummary none = summarise({});
    CHECK(none.busy_ms == 0);
    CHECK(none.largest_gaps.empty());
}

TEST_CASE("timeline: each gap names the host's runtime call that covered most of it") {
    // GPU: [0, 1000) then [9000, 10000): an 8 us gap. Host: a launch [500, 2500) (1.5 us of the
    // gap), a copy call [3000, 8500) (5.5 us of it), a launch after the gap
    const std::vector<TimelineInterval> gpu = {{0, 1000, 0}, {9000, 10000, 3}};
    const std::vector<TimelineInterval> api = {{500, 2500, 5}, {3000, 8500, 4}, {9500, 9600, 5}};
    const TimelineSummary s = summarise(gpu, 8, 8, api);
    REQUIRE(s.largest_gaps.size() == 1);
    CHECK(s.largest_gaps[0].host_call == "cudaMemcpyAsync");
    CHECK(s.largest_gaps[0].host_call_us == doctest::Approx(5.5));
    CHECK(s.api_calls == 3);
    CHECK(s.api_ms == doctest::Approx((2000 + 5500 + 100) * 1e-6));
    // no host call inside a gap: none named
    const TimelineSummary quiet = summarise(gpu, 8, 8, {{9500, 9600, 5}});
    CHECK(quiet.largest_gaps[0].host_call.empty());
    CHECK(quiet.largest_gaps[0].host_call_us == 0);
}

TEST_CASE("timeline: kernel names without templates, parameters or return types") {
    // void zgpt::cuda::(anonymous namespace)::ln_bwd<64, true>(float*, int)
    CHECK(short_kernel_name("_ZN4zgpt4cuda12_GLOBAL__N_16ln_bwdILi64ELb1EEEvPfi") ==
          "zgpt::cuda::{anon}::ln_bwd");
    // a plain C name (cuBLASLt's kernels are mostly these) stays as it is
    CHECK(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") ==
          "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64");
    CHECK(short_kernel_name(nullptr) == "?");
    CHECK(short_kernel_name(std::string(200, 'k').c_str()).size() == 96);
}

TEST_CASE("timeline: communication alone is NCCL's time with nothing else running") {
    const std::vector<std::string> names = {"gemm", "ncclDevKernel_AllGather_RING_LL", "norm",
                                            "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"};
    // gemm [0, 100) beside an all-gather [50, 200): the all-gather runs alone in [100, 200);
    // norm [250, 300); a reduce-scatter [280, 400) alone in [300, 400)
    const std::vector<TimelineInterval> v = {
        {0, 100, 0}, {50, 200, 1}, {250, 300, 2}, {280, 400, 3}};
    TimelineSummary s;
    summarise_intervals(v, {}, names, 8, 8, s);
    CHECK(s.busy_ms == doctest::Approx(350e-6));
    CHECK(s.comm_ms == doctest::Approx(270e-6));       // [50, 200) and [280, 400)
    CHECK(s.comm_only_ms == doctest::Approx(200e-6));  // [100, 200) and [300, 400)
    CHECK(s.idle_ms == doctest::Approx(50e-6));
    // without NCCL kernels both are zero
    TimelineSummary none;
    summarise_intervals({{0, 100, 0}, {150, 200, 2}}, {}, names, 8, 8, none);
    CHECK(none.comm_ms == 0);
    CHECK(none.comm_only_ms == 0);
}

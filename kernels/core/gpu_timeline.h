// Every kernel, copy and memset the GPU ran between start() and stop(), and every CUDA runtime
// call the host made, from CUPTI's activity records, reduced to what a step's schedule needs: how
// long the GPU was busy (the union of all streams' intervals), where it sat idle between its
// first and last activity, next to which kernels and while the host was in which runtime call,
// how long it ran communication alone, and the kernels that took the time. The GPU machines have
// Nsight Compute but no Nsight Systems; this is the timeline part of the latter, for bench_train
// --timeline and train.timeline_step.
//
// CUPTI (libcupti, part of the CUDA toolkit) is opened at run time, as NVML is in
// kernels/core/gpu_power.cpp: without it bench_train still runs and unavailable() says why. Its
// records must have the layout of the headers this was built with, so a CUPTI of another version is
// refused by name. CUPTI's activity buffers are per process: one GpuTimeline at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zgpt {

struct TimelineGap {
    double us = 0;            // idle time between two activities (no stream running anything)
    double at_ms = 0;         // where it starts, from the first activity
    std::string before;       // the activity that ended last before the gap
    std::string after;        // the one that started it again
    std::string host_call;    // the runtime call the host spent most of the gap in ("" if none)
    double host_call_us = 0;  // how much of the gap that call covered
};

struct TimelineKernel {
    std::string name;  // demangled, without template and parameter lists
    int64_t calls = 0;
    double total_ms = 0;  // summed durations (streams overlap, so these can add up to > busy)
};

struct TimelineSummary {
    int64_t kernels = 0, copies = 0, memsets = 0;  // records seen
    int64_t dropped = 0;                           // records CUPTI could not keep
    int64_t api_calls = 0;                         // CUDA runtime calls the host made
    double api_ms = 0;                             // host time inside them
    double span_ms = 0;                            // first activity's start to the last one's end
    double busy_ms = 0;                            // union of all activity intervals
    double idle_ms = 0;                            // span - busy: gaps with nothing running
    // Communication (NCCL's kernels, named "nccl..."): the union of its intervals, and the time
    // it ran with no other activity beside it, where a step waits on its collectives (an NCCL
    // kernel is busy while it waits for a peer, so such waits show here, not as idle time).
    double comm_ms = 0, comm_only_ms = 0;
    int64_t gaps_over_5us = 0;                // how many idle gaps exceed 5 us
    std::vector<TimelineGap> largest_gaps;    // longest first
    std::vector<TimelineKernel> top_kernels;  // by total time, longest first
};

class GpuTimeline {
  public:
    GpuTimeline();  // opens CUPTI; records nothing yet
    ~GpuTimeline();
    GpuTimeline(const GpuTimeline&) = delete;
    GpuTimeline& operator=(const GpuTimeline&) = delete;

    // empty when recording works
    const std::string& unavailable() const { return why_; }
    // clears what was recorded and starts recording kernels, copies, memsets and runtime calls,
    // then runs a synchronised probe so that CUPTI's start-up lies before the first mark()
    void start();
    // a window boundary on the records' clock (a step's start)
    void mark();
    // stops recording (after the caller synchronised the device) and summarises each window:
    // from each mark to the next (to the end for the last; what came before the first mark is
    // left out), or everything since start() without marks. Each has the `gaps` longest idle
    // gaps and the `top` kernels with the most time.
    std::vector<TimelineSummary> stop(int gaps = 8, int top = 15);

  private:
    struct Cupti;
    std::unique_ptr<Cupti> cupti_;
    std::string why_;
    bool on_ = false;
    std::vector<uint64_t> marks_;
};

// A short kernel name: demangled, with template arguments and the parameter list dropped, and
// the namespaces kept ("zgpt::cuda::(anonymous namespace)::ln_bwd", "sm90_xmma_gemm_...").
std::string short_kernel_name(const char* mangled);

// The pure part of stop(), tested on the CPU: [start, end) intervals in ns, each with a label (the
// GPU's activities, and the host's runtime calls in `api`).
struct TimelineInterval {
    uint64_t start = 0, end = 0;
    int label = 0;  // index into the caller's names
};
// Fills span, busy, idle, communication, gaps (with the host call under each), the per-label
// totals and the runtime call count and time of out (its record counts are the caller's).
void summarise_intervals(std::vector<TimelineInterval> v, const std::vector<TimelineInterval>& api,
                         const std::vector<std::string>& names, int gaps, int top,
                         TimelineSummary& out);

}  // namespace zgpt

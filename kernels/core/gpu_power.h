// The GPU's board power and SM clock, sampled in the background while a benchmark runs.
//
// Why a benchmark wants them: at the board's power limit (700 W on H100 and H200 SXM) the GPU
// lowers its clock until it draws no more, so a step's time is its energy over the limit. A kernel
// that does the same work in less time at more power then saves nothing in the step, and overlap
// buys little. These figures say whether a run was at the limit (docs/cuda_trainer.md).
//
// Read through NVML, the driver's libnvidia-ml.so.1, opened at run time: the tools still start
// where there is no driver (CI), and the toolkit need not ship nvml.h. Plain C++ header; the
// definitions are in gpu_power.cpp and exist only in CUDA builds.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace zgpt::cuda {

struct PowerSummary {
    int samples = 0;
    double power_w = 0;       // mean board power over the samples
    double sm_clock_mhz = 0;  // mean SM clock over the samples
    double limit_w = 0;       // the power limit the driver enforces, read when the sampler was made
};

// Samples the current CUDA device every period_ms between start() and stop(), on a thread of its
// own. Without NVML or a device it samples nothing and unavailable() says why.
class PowerSampler {
  public:
    explicit PowerSampler(int period_ms = 50);
    ~PowerSampler();
    PowerSampler(const PowerSampler&) = delete;
    PowerSampler& operator=(const PowerSampler&) = delete;

    // empty when sampling works
    const std::string& unavailable() const { return why_; }
    // clears what was sampled and starts sampling
    void start();
    // stops sampling; the means of what was sampled since start()
    PowerSummary stop();

  private:
    struct Nvml;
    void run();
    std::unique_ptr<Nvml> nvml_;
    std::string why_;
    int period_ms_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool on_ = false, quit_ = false;
    double power_sum_ = 0, clock_sum_ = 0;
    int samples_ = 0;
    std::thread thread_;
};

}  // namespace zgpt::cuda

#include "train/device.h"

#include <algorithm>
#include <cstdio>

#include <unistd.h>

#include "kernels/core/check.h"
#ifdef ZGPT_HAVE_CUDA
#include "kernels/core/cuda_device.h"
#include "kernels/core/gpu_power.h"
#endif

namespace zgpt {

std::string one_thread_draw_note(double parameters, int threads, int cores, int ranks_here) {
    const int spare = cores / std::max(1, ranks_here);
    if (threads > 1 || spare < 2 || parameters < 3e8) return "";
    // about a minute for GPT-2 1558M's 1.6G values on one core (model/gpt.cpp's draw)
    const double seconds = parameters / 1.6e9 * 60.0;
    char line[320];
    std::snprintf(line, sizeof line,
                  "note: OpenMP has one thread here (OMP_NUM_THREADS=1, as torchrun sets it), so "
                  "the %.0fM initial weights are drawn on one core, about %.0f s; this machine "
                  "has %d cores for %d rank(s): OMP_NUM_THREADS=%d (or train.threads: %d) "
                  "draws them on all of them",
                  parameters / 1e6, seconds, cores, std::max(1, ranks_here), spare, spare);
    return line;
}

double host_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? double(pages) * double(size) : 0.0;
}

DeviceChoice choose_device(const std::string& requested) {
    DeviceChoice c;
    c.device = "cpu";
#ifdef ZGPT_HAVE_CUDA
    const cuda::DeviceInfo d = cuda::query_devices();
    c.driver = std::to_string(d.driver_version);
    c.runtime = std::to_string(d.runtime_version);
    c.gpu_name = d.name;
    c.gpus = d.count;
    const bool has_gpu = d.count > 0;
    const std::string gpu = has_gpu ? "CUDA device " + d.name : d.error;
#else
    const bool has_gpu = false;
    const std::string gpu =
        "this build has no CUDA backend (configured without nvcc, or with -DZGPT_CUDA=OFF)";
#endif
    if (requested == "cpu") {
        c.reason = "training on the CPU (train.device=cpu)";
    } else if (has_gpu) {
        c.device = "cuda";
        c.reason = "training on " + gpu;
    } else if (requested == "cuda") {
        throw Error("train.device=cuda but " + gpu + "; use train.device=auto or cpu");
    } else {
        c.reason = gpu + ": training on the CPU";
    }
    return c;
}

#ifdef ZGPT_HAVE_CUDA
struct PowerMeter::Impl {
    cuda::PowerSampler sampler{20};  // every 20 ms: a GPT-2 step (~110 ms) gets about 5 samples
};
PowerMeter::PowerMeter(bool gpu) {
    if (!gpu) return;
    impl_ = std::make_unique<Impl>();
    if (!impl_->sampler.unavailable().empty()) {
        impl_.reset();
        return;
    }
    impl_->sampler.start();
}
PowerMeter::Reading PowerMeter::read() {
    if (!impl_) return {};
    const cuda::PowerSummary s = impl_->sampler.stop();
    impl_->sampler.start();
    return {s.samples, s.power_w, s.sm_clock_mhz};
}
#else
struct PowerMeter::Impl {};
PowerMeter::PowerMeter(bool) {}
PowerMeter::Reading PowerMeter::read() {
    return {};
}
#endif
PowerMeter::~PowerMeter() = default;

double peak_flops(const std::string& name, bool bf16) {
    struct Row {
        const char* match;
        double bf16, fp32;  // dense TFLOP/s from the vendor's data sheets
    };
    // Order matters: the first substring that matches wins (PCIe before the SXM default).
    static const Row rows[] = {
        {"H100 PCIe", 756.0, 51.2}, {"H100 NVL", 835.0, 60.0}, {"H100", 989.4, 66.9},
        {"H200", 989.4, 66.9},      {"H800", 989.4, 66.9},     {"A100", 312.0, 19.5},
        {"L40S", 362.0, 91.6},      {"A10G", 70.0, 31.2},      {"RTX 4090", 165.2, 82.6},
    };
    for (const Row& r : rows)
        if (name.find(r.match) != std::string::npos) return (bf16 ? r.bf16 : r.fp32) * 1e12;
    return 0.0;
}

}  // namespace zgpt

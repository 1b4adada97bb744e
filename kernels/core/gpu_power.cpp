#include "kernels/core/gpu_power.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <type_traits>

namespace zgpt::cuda {

// The few NVML entry points used, declared by hand (their C ABI has been stable since NVML 5):
// nvmlReturn_t is an int, 0 on success; a device is an opaque pointer; power in milliwatts.
struct PowerSampler::Nvml {
    using Device = void*;
    void* lib = nullptr;
    int (*init)() = nullptr;
    int (*shutdown)() = nullptr;
    int (*by_bus_id)(const char*, Device*) = nullptr;
    int (*power_mw)(Device, unsigned*) = nullptr;
    int (*clock_mhz)(Device, int, unsigned*) = nullptr;
    int (*limit_mw)(Device, unsigned*) = nullptr;
    const char* (*error)(int) = nullptr;
    Device dev = nullptr;
    double limit_w = 0;  // read once: the enforced limit does not change while a run samples
    static constexpr int kClockSm = 1;  // NVML_CLOCK_SM

    // empty when the device's handle was found; else why not
    std::string open() {
        lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return std::string("no NVML (") + dlerror() + ")";
        auto sym = [&](auto& f, const char* name) {
            f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
            return f != nullptr;
        };
        if (!sym(init, "nvmlInit_v2") || !sym(shutdown, "nvmlShutdown") ||
            !sym(by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") ||
            !sym(power_mw, "nvmlDeviceGetPowerUsage") ||
            !sym(clock_mhz, "nvmlDeviceGetClockInfo") ||
            !sym(limit_mw, "nvmlDeviceGetEnforcedPowerLimit") || !sym(error, "nvmlErrorString"))
            return "libnvidia-ml.so.1 lacks an NVML function this needs";
        if (const int r = init(); r != 0) {
            init = nullptr;  // nothing to shut down
            return std::string("nvmlInit failed: ") + error(r);
        }
        // NVML numbers devices its own way; the PCI bus id names the one CUDA calls current
        int d = 0;
        char bus[32] = {};
        if (cudaGetDevice(&d) != cudaSuccess ||
            cudaDeviceGetPCIBusId(bus, sizeof bus, d) != cudaSuccess)
            return "no CUDA device";
        if (const int r = by_bus_id(bus, &dev); r != 0)
            return std::string("NVML has no device at ") + bus + ": " + error(r);
        unsigned mw = 0, mhz = 0;
        if (const int r = power_mw(dev, &mw); r != 0)
            return std::string("NVML cannot read the board power: ") + error(r);
        if (const int r = clock_mhz(dev, kClockSm, &mhz); r != 0)
            return std::string("NVML cannot read the SM clock: ") + error(r);
        if (limit_mw(dev, &mw) == 0) limit_w = mw / 1000.0;
        return "";
    }
    ~Nvml() {
        if (init) shutdown();
        if (lib) dlclose(lib);
    }
};

PowerSampler::PowerSampler(int period_ms) : nvml_(new Nvml), period_ms_(period_ms) {
    why_ = nvml_->open();
    if (why_.empty()) thread_ = std::thread([this] { run(); });
}

PowerSampler::~PowerSampler() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void PowerSampler::start() {
    std::lock_guard<std::mutex> lk(mu_);
    power_sum_ = clock_sum_ = 0;
    samples_ = 0;
    on_ = true;
    cv_.notify_all();
}

PowerSummary PowerSampler::stop() {
    std::lock_guard<std::mutex> lk(mu_);
    on_ = false;
    PowerSummary s;
    s.samples = samples_;
    if (samples_ > 0) {
        s.power_w = power_sum_ / samples_;
        s.sm_clock_mhz = clock_sum_ / samples_;
    }
    s.limit_w = nvml_->limit_w;
    return s;
}

void PowerSampler::run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!quit_) {
        if (!on_) {
            cv_.wait(lk, [this] { return on_ || quit_; });
            continue;
        }
        unsigned mw = 0, mhz = 0;
        if (nvml_->power_mw(nvml_->dev, &mw) == 0 &&
            nvml_->clock_mhz(nvml_->dev, Nvml::kClockSm, &mhz) == 0) {
            power_sum_ += mw / 1000.0;
            clock_sum_ += mhz;
            samples_++;
        }
        cv_.wait_for(lk, std::chrono::milliseconds(period_ms_), [this] { return quit_; });
    }
}

}  // namespace zgpt::cuda

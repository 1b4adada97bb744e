#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_device.h"

namespace zgpt::cuda {

DeviceInfo query_devices() {
    DeviceInfo d;
    cudaDriverGetVersion(&d.driver_version);
    cudaRuntimeGetVersion(&d.runtime_version);
    const cudaError_t err = cudaGetDeviceCount(&d.count);
    auto version = [](int v) {
        return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
    };
    if (err != cudaSuccess) {
        d.count = 0;
        // Say what the user can act on: a machine without a driver has no GPU at all.
        if (d.driver_version == 0)
            d.error = "no GPU here (no NVIDIA driver is installed)";
        else if (err == cudaErrorInsufficientDriver)
            d.error = "the NVIDIA driver supports CUDA " + version(d.driver_version) +
                      ", older than this build's CUDA " + version(d.runtime_version);
        else
            d.error = std::string("no usable GPU (") + cudaGetErrorString(err) + ")";
        cudaGetLastError();  // clear the sticky error
        return d;
    }
    if (d.count == 0) {
        d.error = "no GPU here (the NVIDIA driver sees no CUDA device)";
        return d;
    }
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    d.name = p.name;
    d.sm_count = p.multiProcessorCount;
    d.memory_gb = double(p.totalGlobalMem) / (1 << 30);
    return d;
}

bool current_device_is_sm90() {
    static const bool yes = [] {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        return major == 9 && minor == 0;
    }();
    return yes;
}

int current_device_sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        ZG_CUDA_CHECK(cudaGetDevice(&dev));
        ZG_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
        return v;
    }();
    return n;
}

namespace {
thread_local int t_collective_sms = 0;
}

void set_collective_sms(int n) {
    t_collective_sms = n > 0 ? n : 0;
}
int collective_sms() {
    return t_collective_sms;
}
int compute_sm_count() {
    return std::max(1, current_device_sm_count() - t_collective_sms);
}

}  // namespace zgpt::cuda

#include <cuda_runtime.h>

#include "kernels/cuda_device.h"

namespace zgpt::cuda {

DeviceInfo query_devices() {
    DeviceInfo d;
    cudaDriverGetVersion(&d.driver_version);
    cudaRuntimeGetVersion(&d.runtime_version);
    const cudaError_t err = cudaGetDeviceCount(&d.count);
    if (err != cudaSuccess) {
        d.count = 0;
        d.error = cudaGetErrorString(err);
        cudaGetLastError();  // clear the sticky error
        return d;
    }
    if (d.count == 0) {
        d.error = "no CUDA device";
        return d;
    }
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    d.name = p.name;
    d.sm_count = p.multiProcessorCount;
    d.memory_gb = double(p.totalGlobalMem) / (1 << 30);
    return d;
}

}  // namespace zgpt::cuda

// What CUDA device (if any) this process can use. Plain C++ header: callable from CPU code; the
// definitions are in cuda_device.cu and exist only in CUDA builds (ZGPT_HAVE_CUDA).
#pragma once
#include <string>

namespace zgpt::cuda {

struct DeviceInfo {
    int count = 0;      // usable devices
    std::string error;  // why count is 0, when it is
    std::string name;   // device 0
    int sm_count = 0;
    int driver_version = 0, runtime_version = 0;
    double memory_gb = 0;
};

DeviceInfo query_devices();

// Whether the current device is compute capability 9.0 (H100 / H200: the sm_90a kernels run),
// asked once per process; false without a usable device.
bool current_device_is_sm90();
// The current device's multiprocessors, asked once per process (one GPU model per process);
// throws zgpt::Error on a CUDA error.
int current_device_sm_count();

}  // namespace zgpt::cuda

// Picks where to train from train.device (auto | cpu | cuda) and says why.
#pragma once
#include <string>

namespace zgpt {

struct DeviceChoice {
    std::string device;                     // "cpu" | "cuda"
    std::string reason;                     // one line for the log
    std::string gpu_name, driver, runtime;  // provenance; empty when unknown
};

// Physical memory of this machine in bytes (0 when unknown).
double host_memory_bytes();

// auto: the GPU when this build has CUDA and a device is usable, else the CPU with a line that
// says why. cuda: an error when no GPU can be used.
DeviceChoice choose_device(const std::string& requested);

// Dense peak FLOP/s of a GPU (by its name) for bf16 tensor-core or fp32 arithmetic, for MFU;
// 0 when the GPU is not in the table.
double peak_flops(const std::string& gpu_name, bool bf16);

}  // namespace zgpt

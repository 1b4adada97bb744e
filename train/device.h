// Picks where to train from train.device (auto | cpu | cuda) and says why.
#pragma once
#include <string>

namespace zgpt {

struct DeviceChoice {
    std::string device;                     // "cpu" (the CUDA trainer arrives with its own issue)
    std::string reason;                     // one line for the log
    std::string gpu_name, driver, runtime;  // provenance; empty when unknown
};

DeviceChoice choose_device(const std::string& requested);

}  // namespace zgpt

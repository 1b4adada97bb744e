#include "train/device.h"

#include "kernels/check.h"
#ifdef ZGPT_HAVE_CUDA
#include "kernels/cuda_device.h"
#endif

namespace zgpt {

DeviceChoice choose_device(const std::string& requested) {
    DeviceChoice c;
    c.device = "cpu";
#ifdef ZGPT_HAVE_CUDA
    const cuda::DeviceInfo d = cuda::query_devices();
    c.driver = std::to_string(d.driver_version);
    c.runtime = std::to_string(d.runtime_version);
    c.gpu_name = d.name;
    const bool has_gpu = d.count > 0;
    const std::string gpu = has_gpu ? "CUDA device " + d.name : "no CUDA device (" + d.error + ")";
#else
    const bool has_gpu = false;
    const std::string gpu = "built without CUDA";
#endif
    // The CUDA training backend is not built yet: a GPU is detected and reported, never used.
    if (requested == "cuda")
        throw Error("train.device=cuda: the CUDA trainer is not available in this build yet (" +
                    gpu + "); use train.device=cpu or auto");
    if (requested == "cpu")
        c.reason = "training on the CPU (train.device=cpu)";
    else if (has_gpu)
        c.reason = gpu + " found, but the CUDA trainer is not available yet: training on the CPU";
    else
        c.reason = gpu + ": training on the CPU";
    return c;
}

}  // namespace zgpt

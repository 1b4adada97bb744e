// For a test binary that runs only on a GPU (test_gpu, test_gpu_model): where none is usable,
// main() exits 77 (ctest: skipped) with the reason. test_kernels does not include it: it runs its
// CPU rows anyway and reports the GPU rows it skipped.
#pragma once
#include "kernels/core/cuda_device.h"
#include "tests/helpers.h"

namespace zgpt::test {

inline const bool kHaveGpu = [] {
    const cuda::DeviceInfo d = cuda::query_devices();
    if (d.count == 0) skip_binary("no usable CUDA device: " + d.error);
    return d.count > 0;
}();

}  // namespace zgpt::test

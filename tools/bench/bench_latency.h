// The latency floor of a head's launches: the same kernels, grids, blocks and dynamic shared
// memory, each launched as an empty kernel, one after another. At small sizes a head is bound by
// launching and filling the GPU, not by memory or FLOPs, and this is what that alone costs at the
// head's shape.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace zgpt::bench {

struct LaunchShape {
    dim3 grid, block;
    unsigned smem = 0;  // dynamic shared memory, bytes
};

// What fn launches on the stream it is given, recorded by stream capture (kernels in launch
// order; a memset or copy counts as one one-block launch, and a kernel the runtime cannot
// describe, such as cuBLASLt's, as one wave of 128-thread blocks). Empty when fn cannot be
// captured (it synchronises, or throws).
std::vector<LaunchShape> captured_launches(const std::function<void(cudaStream_t)>& fn);

// Median milliseconds of the empty chain (after warm-ups), timed with device events.
double empty_chain_ms(const std::vector<LaunchShape>& chain, int iters);

}  // namespace zgpt::bench

// Host <-> device copies ordered on a (non-blocking) stream and finished on return, for the GPU
// backend's code (CUDA builds only). A plain cudaMemcpy from pageable memory may return before
// its DMA lands, and the legacy stream does not order it before kernels on a non-blocking stream:
// a race.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/core/cuda_check.h"

namespace zgpt {

inline void to_host(void* dst, const void* src, size_t bytes, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    ZG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    ZG_CUDA_CHECK(cudaStreamSynchronize(s));
}
inline void to_device(void* dst, const void* src, size_t bytes, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    ZG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    ZG_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace zgpt

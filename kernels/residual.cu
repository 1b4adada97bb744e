#include "kernels/cuda_check.h"
#include "kernels/residual.h"

namespace zgpt::cuda {

namespace {

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = a[i] + b[i];
}

}  // namespace

void residual_forward(float* out, const float* a, const float* b, int64_t n, CUstream_st* stream) {
    ZG_CHECK(n >= 0, "residual_forward: n must be >= 0");
    if (n == 0) return;
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
    residual_forward_kernel<<<int(blocks), kThreads, 0, stream>>>(out, a, b, n);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zgpt::cuda

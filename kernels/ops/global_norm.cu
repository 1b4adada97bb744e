#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/global_norm.h"

namespace zgpt::cuda {

namespace {

constexpr int kBlocks = 528, kThreads = 256;

// Each block sums a fixed strided subset; the tree in shared memory has a fixed shape.
__device__ double block_sum(double x, double* shm) {
    shm[threadIdx.x] = x;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (int(threadIdx.x) < w) shm[threadIdx.x] += shm[threadIdx.x + w];
        __syncthreads();
    }
    return shm[0];
}

__global__ void partial_kernel(double* part, const float* x, int64_t n) {
    __shared__ double shm[kThreads];
    double acc = 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += double(x[i]) * double(x[i]);
    const double s = block_sum(acc, shm);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void final_kernel(double* out, const double* part, int n) {
    __shared__ double shm[kThreads];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
    const double s = block_sum(acc, shm);
    if (threadIdx.x == 0) *out = s;
}

}  // namespace

size_t sum_of_squares_scratch_bytes() {
    return kBlocks * sizeof(double);
}

void sum_of_squares(double* out, const float* x, int64_t n, void* scratch, CUstream_st* s) {
    ZG_CHECK(n >= 0 && out && scratch, "sum_of_squares: bad arguments");
    auto* part = static_cast<double*>(scratch);
    partial_kernel<<<kBlocks, kThreads, 0, s>>>(part, x, n);
    ZG_LAUNCH_CHECK();
    final_kernel<<<1, kThreads, 0, s>>>(out, part, kBlocks);
    ZG_LAUNCH_CHECK();
}

void sum_of_parts(double* out, const double* parts, int n, CUstream_st* s) {
    ZG_CHECK(n >= 0 && out && parts, "sum_of_parts: bad arguments");
    final_kernel<<<1, kThreads, 0, s>>>(out, parts, n);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

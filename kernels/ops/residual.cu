#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/residual.h"

namespace zgpt::cuda {

namespace {

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = a[i] + b[i];
}

template <typename R, typename T>
__global__ void residual_kernel(R* out, const R* a, const T* b, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f<R>(to_f(a[i]) + to_f(b[i]));
}

template <typename T>
__global__ void cast_kernel(T* out, const float* in, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f<T>(in[i]);
}

}  // namespace

void cast_from_f32(void* out, const float* in, int64_t n, DType t, CUstream_st* stream) {
    ZG_CHECK(n >= 0, "cast_from_f32: n must be >= 0");
    if (n == 0) return;
    ZG_DISPATCH(t, T,
                cast_kernel<T>
                <<<grid_for(n, 256, 1 << 20), 256, 0, stream>>>(static_cast<T*>(out), in, n));
    ZG_LAUNCH_CHECK();
}

void residual_forward(void* out, const void* a, const void* b, int64_t n, DType t,
                      CUstream_st* stream) {
    ZG_CHECK(n >= 0, "residual_forward: n must be >= 0");
    if (n == 0) return;
    ZG_DISPATCH(t, T,
                residual_kernel<T, T><<<grid_for(n, 256, 1 << 20), 256, 0, stream>>>(
                    static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n));
    ZG_LAUNCH_CHECK();
}

void residual_forward(void* out, const void* a, const void* b, int64_t n, DType t, DType res_t,
                      CUstream_st* stream) {
    if (res_t == t) return residual_forward(out, a, b, n, t, stream);
    ZG_CHECK(n >= 0 && res_t == DType::f32 && t == DType::bf16,
             "residual_forward: an fp32 residual stream takes a bf16 branch");
    if (n == 0) return;
    residual_kernel<float, bf16><<<grid_for(n, 256, 1 << 20), 256, 0, stream>>>(
        static_cast<float*>(out), static_cast<const float*>(a), static_cast<const bf16*>(b), n);
    ZG_LAUNCH_CHECK();
}

void residual_forward(float* out, const float* a, const float* b, int64_t n, CUstream_st* stream) {
    ZG_CHECK(n >= 0, "residual_forward: n must be >= 0");
    if (n == 0) return;
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
    residual_forward_kernel<<<int(blocks), kThreads, 0, stream>>>(out, a, b, n);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zgpt::cuda

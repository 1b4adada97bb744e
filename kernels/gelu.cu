#include "kernels/cuda_common.cuh"
#include "kernels/gelu.h"

namespace zgpt::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_f(inp[i]);
        out[i] = from_f<T>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x))));
    }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_f(inp[i]);
        const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
        const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
        const float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] = from_f<T>(to_f(dout[i]) * g);
    }
}

}  // namespace

void gelu_forward(void* out, const void* inp, int64_t n, DType t, CUstream_st* s) {
    ZG_DISPATCH(t, T,
                gelu_forward_kernel<T><<<grid_for(n, 256, 1 << 20), 256, 0, s>>>(
                    static_cast<T*>(out), static_cast<const T*>(inp), n));
    ZG_LAUNCH_CHECK();
}

void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n, DType t,
                   CUstream_st* s) {
    ZG_DISPATCH(
        t, T,
        gelu_backward_kernel<T><<<grid_for(n, 256, 1 << 20), 256, 0, s>>>(
            static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n));
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

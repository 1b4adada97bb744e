#include <type_traits>

#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/gelu.cuh"
#include "kernels/ops/gelu.h"

namespace zgpt::cuda {

namespace {

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_f(inp[i]);
        // bf16 results take the form the GEMM epilogues take (the same bits on either path)
        if constexpr (std::is_same_v<T, bf16>)
            out[i] = from_f<T>(gelu_bf16(x));
        else
            out[i] = from_f<T>(gelu_f(x));
    }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_f(inp[i]);
        dinp[i] = from_f<T>(to_f(dout[i]) * gelu_grad(x));
    }
}

// bf16, 8 elements per thread with 16-byte accesses (n % 8 == 0, 16-byte aligned pointers).
__global__ void gelu_forward_vec(bf16* out, const bf16* inp, int64_t n8) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
        uint4 u = reinterpret_cast<const uint4*>(inp)[i];
        bf16* e = reinterpret_cast<bf16*>(&u);
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = __float2bfloat16_rn(gelu_bf16(__bfloat162float(e[k])));
        reinterpret_cast<uint4*>(out)[i] = u;
    }
}

__global__ void gelu_backward_vec(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n8) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
        const uint4 x = reinterpret_cast<const uint4*>(inp)[i];
        uint4 d = reinterpret_cast<const uint4*>(dout)[i];
        const bf16* xe = reinterpret_cast<const bf16*>(&x);
        bf16* de = reinterpret_cast<bf16*>(&d);
#pragma unroll
        for (int k = 0; k < 8; k++)
            de[k] =
                __float2bfloat16_rn(__bfloat162float(de[k]) * gelu_grad(__bfloat162float(xe[k])));
        reinterpret_cast<uint4*>(dinp)[i] = d;
    }
}

bool vec_ok(int64_t n, const void* a, const void* b, const void* c) {
    return n % 8 == 0 && is_aligned({a, b, c});
}

}  // namespace

void gelu_forward(void* out, const void* inp, int64_t n, DType t, CUstream_st* s) {
    if (t == DType::bf16 && vec_ok(n, out, inp, inp)) {
        gelu_forward_vec<<<grid_for(n / 8, 256, 1 << 20), 256, 0, s>>>(
            static_cast<bf16*>(out), static_cast<const bf16*>(inp), n / 8);
        ZG_LAUNCH_CHECK();
        return;
    }
    ZG_DISPATCH(t, T,
                gelu_forward_kernel<T><<<grid_for(n, 256, 1 << 20), 256, 0, s>>>(
                    static_cast<T*>(out), static_cast<const T*>(inp), n));
    ZG_LAUNCH_CHECK();
}

void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n, DType t,
                   CUstream_st* s) {
    if (t == DType::bf16 && vec_ok(n, dinp, inp, dout)) {
        gelu_backward_vec<<<grid_for(n / 8, 256, 1 << 20), 256, 0, s>>>(
            static_cast<bf16*>(dinp), static_cast<const bf16*>(inp), static_cast<const bf16*>(dout),
            n / 8);
        ZG_LAUNCH_CHECK();
        return;
    }
    ZG_DISPATCH(
        t, T,
        gelu_backward_kernel<T><<<grid_for(n, 256, 1 << 20), 256, 0, s>>>(
            static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n));
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

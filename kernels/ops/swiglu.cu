// SwiGLU on the GPU: elementwise over [N, H] outputs, each reading its gate and up columns of the
// [N, 2H] input. fp32 math; silu'(g) = s (1 + g (1 - s)), s = sigmoid(g), as the CPU reference.
#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/swiglu.cuh"
#include "kernels/ops/swiglu.h"

namespace zgpt::cuda {

namespace {

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int64_t N, int64_t H) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < N * H; k += stride) {
        const int64_t n = k / H, i = k % H;
        const float g = to_f(inp[n * 2 * H + i]), u = to_f(inp[n * 2 * H + H + i]);
        out[k] = from_f<T>(swiglu_f(g, u));
    }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t N, int64_t H) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < N * H; k += stride) {
        const int64_t n = k / H, i = k % H;
        const float g = to_f(inp[n * 2 * H + i]), u = to_f(inp[n * 2 * H + H + i]);
        const float dy = to_f(dout[k]), s = sigmoid(g);
        dinp[n * 2 * H + i] = from_f<T>(dy * u * s * (1.0f + g * (1.0f - s)));
        dinp[n * 2 * H + H + i] = from_f<T>(dy * g * s);
    }
}

// bf16, 8 outputs per thread with 16-byte accesses (H % 8 == 0, 16-byte aligned buffers).
__global__ void swiglu_forward_vec(bf16* out, const bf16* inp, int64_t N, int64_t H) {
    const int64_t H8 = H / 8, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < N * H8; k += stride) {
        const int64_t n = k / H8, i = (k % H8) * 8;
        float g[8], u[8], y[8];
        unpack8(ld16(inp + n * 2 * H + i), g);
        unpack8(ld16(inp + n * 2 * H + H + i), u);
#pragma unroll
        for (int e = 0; e < 8; e++) y[e] = swiglu_f(g[e], u[e]);
        *reinterpret_cast<uint4*>(out + n * H + i) = pack8(y);
    }
}

__global__ void swiglu_backward_vec(bf16* dinp, const bf16* inp, const bf16* dout, int64_t N,
                                    int64_t H) {
    const int64_t H8 = H / 8, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < N * H8; k += stride) {
        const int64_t n = k / H8, i = (k % H8) * 8;
        float g[8], u[8], dy[8], dg[8], du[8];
        unpack8(ld16(inp + n * 2 * H + i), g);
        unpack8(ld16(inp + n * 2 * H + H + i), u);
        unpack8(ld16(dout + n * H + i), dy);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float s = sigmoid(g[e]);
            dg[e] = dy[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
            du[e] = dy[e] * g[e] * s;
        }
        *reinterpret_cast<uint4*>(dinp + n * 2 * H + i) = pack8(dg);
        *reinterpret_cast<uint4*>(dinp + n * 2 * H + H + i) = pack8(du);
    }
}

bool vec_ok(int64_t H, std::initializer_list<const void*> ps) {
    return H % 8 == 0 && is_aligned(ps);
}

}  // namespace

void swiglu_forward(void* out, const void* inp, int64_t N, int64_t H, DType t, CUstream_st* s) {
    ZG_CHECK(N > 0 && H > 0, "swiglu_forward: sizes must be positive");
    if (t == DType::bf16 && vec_ok(H, {out, inp})) {
        swiglu_forward_vec<<<grid_for(N * H / 8, 256, 1 << 20), 256, 0, s>>>(
            static_cast<bf16*>(out), static_cast<const bf16*>(inp), N, H);
    } else {
        ZG_DISPATCH(t, T,
                    swiglu_forward_kernel<T><<<grid_for(N * H, 256, 1 << 20), 256, 0, s>>>(
                        static_cast<T*>(out), static_cast<const T*>(inp), N, H));
    }
    ZG_LAUNCH_CHECK();
}

void swiglu_backward(void* dinp, const void* inp, const void* dout, int64_t N, int64_t H, DType t,
                     CUstream_st* s) {
    ZG_CHECK(N > 0 && H > 0 && dinp != inp && dinp != dout,
             "swiglu_backward: sizes must be positive, dinp its own buffer");
    if (t == DType::bf16 && vec_ok(H, {dinp, inp, dout})) {
        swiglu_backward_vec<<<grid_for(N * H / 8, 256, 1 << 20), 256, 0, s>>>(
            static_cast<bf16*>(dinp), static_cast<const bf16*>(inp), static_cast<const bf16*>(dout),
            N, H);
    } else {
        ZG_DISPATCH(t, T,
                    swiglu_backward_kernel<T><<<grid_for(N * H, 256, 1 << 20), 256, 0, s>>>(
                        static_cast<T*>(dinp), static_cast<const T*>(inp),
                        static_cast<const T*>(dout), N, H));
    }
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

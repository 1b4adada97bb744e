// Rotary position embedding on the GPU: in place, a thread per 16 bytes of pairs of a head (or
// per pair); the angles come from a table made on the host in double (the CPU reference's cos
// and sin).
#include <cmath>

#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/rope.h"

namespace zgpt::cuda {

namespace {

// sign 1: rotate by +angle (forward); -1: by -angle (backward, the transpose of the rotation)
template <typename T>
__global__ void rope_kernel(T* x, const float* table, int64_t BT, int64_t Tn, int64_t heads,
                            int64_t half, int64_t ld, float sign) {
    const int64_t n = BT * heads * half, stride = int64_t(gridDim.x) * blockDim.x;
    const float* cs = table;
    const float* sn = table + Tn * half;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
        const int64_t i = k % half, h = (k / half) % heads, bt = k / (half * heads);
        const int64_t a = (bt % Tn) * half + i;
        const float c = cs[a], s = sign * sn[a];
        T* p = x + bt * ld + h * 2 * half;
        const float x1 = to_f(p[i]), x2 = to_f(p[i + half]);
        p[i] = from_f<T>(x1 * c - x2 * s);
        p[i + half] = from_f<T>(x2 * c + x1 * s);
    }
}

// The same rotation, W = 16 / sizeof(T) pairs a thread with 16-byte loads and stores (half and
// ld multiples of W, x 16-byte aligned): a scalar thread per pair moved 2-byte words and ran at
// about 4x its memory floor.
template <typename T>
__global__ void rope_vec_kernel(T* x, const float* table, int64_t BT, int64_t Tn, int64_t heads,
                                int64_t half, int64_t ld, float sign) {
    constexpr int W = 16 / sizeof(T);
    const int64_t hw = half / W, n = BT * heads * hw, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
        const int64_t i = (k % hw) * W, h = (k / hw) % heads, bt = k / (hw * heads);
        const float* cs = table + (bt % Tn) * half + i;
        const float* sn = cs + Tn * half;
        T* p = x + bt * ld + h * 2 * half + i;
        uint4 u1 = *reinterpret_cast<const uint4*>(p),
              u2 = *reinterpret_cast<const uint4*>(p + half);
        T* e1 = reinterpret_cast<T*>(&u1);
        T* e2 = reinterpret_cast<T*>(&u2);
#pragma unroll
        for (int e = 0; e < W; e++) {
            const float c = cs[e], s = sign * sn[e], x1 = to_f(e1[e]), x2 = to_f(e2[e]);
            e1[e] = from_f<T>(x1 * c - x2 * s);
            e2[e] = from_f<T>(x2 * c + x1 * s);
        }
        *reinterpret_cast<uint4*>(p) = u1;
        *reinterpret_cast<uint4*>(p + half) = u2;
    }
}

void launch(void* x, const float* table, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
            int64_t ld, DType t, CUstream_st* s, float sign) {
    ZG_CHECK(B > 0 && Tn > 0 && heads > 0 && hs > 0 && hs % 2 == 0 && ld >= heads * hs && table,
             "rope: bad shape (the head size must be even)");
    const int64_t half = hs / 2, n = B * Tn * heads * half, W = 16 / int64_t(dtype_bytes(t));
    if (half % W == 0 && ld % W == 0 && is_aligned(x)) {
        ZG_DISPATCH(t, T,
                    rope_vec_kernel<T><<<grid_for(n / W, 256, 1 << 20), 256, 0, s>>>(
                        static_cast<T*>(x), table, B * Tn, Tn, heads, half, ld, sign));
    } else {
        ZG_DISPATCH(t, T,
                    rope_kernel<T><<<grid_for(n, 256, 1 << 20), 256, 0, s>>>(
                        static_cast<T*>(x), table, B * Tn, Tn, heads, half, ld, sign));
    }
    ZG_LAUNCH_CHECK();
}

}  // namespace

std::vector<float> rope_table(int64_t Tn, int64_t hs, double theta) {
    const int64_t half = hs / 2;
    std::vector<float> table(2 * Tn * half);
    for (int64_t t = 0; t < Tn; t++)
        for (int64_t i = 0; i < half; i++) {
            const double a = double(t) * std::pow(theta, -2.0 * double(i) / double(hs));
            table[t * half + i] = float(std::cos(a));
            table[(Tn + t) * half + i] = float(std::sin(a));
        }
    return table;
}

void rope_forward(void* x, const float* table, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
                  int64_t ld, DType t, CUstream_st* s) {
    launch(x, table, B, Tn, heads, hs, ld, t, s, 1.0f);
}

void rope_backward(void* dx, const float* table, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
                   int64_t ld, DType t, CUstream_st* s) {
    launch(dx, table, B, Tn, heads, hs, ld, t, s, -1.0f);
}

}  // namespace zgpt::cuda

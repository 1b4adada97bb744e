// LayerNorm on the GPU: one warp per row, fp32 statistics. The backward pass sums the weight
// gradients per warp in shared memory, per block into a scratch row, then over blocks in a fixed
// order, so results do not depend on scheduling.
#include "kernels/cuda_common.cuh"
#include "kernels/layernorm.h"

namespace zgpt::cuda {

namespace {

constexpr int kWarps = 4;

__device__ __forceinline__ int64_t row_offset(RowMap m, int64_t r, int64_t C) {
    return (r / m.group) * m.ld + (r % m.group) * C;
}

// Mean and rstd of one row (whole warp), two passes over the row for a stable variance.
template <typename T>
__device__ void row_stats(const T* x, int64_t C, float eps, float& mean, float& rstd) {
    float s = 0;
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) s += to_f(x[c]);
    mean = warp_sum(s) / float(C);
    float v = 0;
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) {
        const float d = to_f(x[c]) - mean;
        v += d * d;
    }
    rstd = rsqrtf(warp_sum(v) / float(C) + eps);
}

template <typename T>
__global__ void layernorm_forward_kernel(T* out, RowMap out_map, float* mean, float* rstd,
                                         const T* inp, RowMap in_map, const T* w, const T* b,
                                         int64_t N, int64_t C, float eps) {
    const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= N) return;
    const T* x = inp + row_offset(in_map, r, C);
    T* y = out + row_offset(out_map, r, C);
    float m, rs;
    row_stats(x, C, eps, m, rs);
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) {
        const float n = (to_f(x[c]) - m) * rs;
        y[c] = from_f<T>(n * to_f(w[c]) + (b ? to_f(b[c]) : 0.0f));
    }
    if (threadIdx.x % 32 == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

template <typename T>
__global__ void residual_layernorm_forward_kernel(T* res, T* out, float* mean, float* rstd,
                                                  const T* a, const T* bb, const T* w, const T* b,
                                                  int64_t N, int64_t C, float eps) {
    const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= N) return;
    T* x = res + r * C;
    for (int64_t c = threadIdx.x % 32; c < C; c += 32)
        x[c] = from_f<T>(to_f(a[r * C + c]) + to_f(bb[r * C + c]));
    __syncwarp();
    float m, rs;
    row_stats(x, C, eps, m, rs);
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) {
        const float n = (to_f(x[c]) - m) * rs;
        out[r * C + c] = from_f<T>(n * to_f(w[c]) + (b ? to_f(b[c]) : 0.0f));
    }
    if (threadIdx.x % 32 == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

int backward_blocks(int64_t N) {
    return int(std::min<int64_t>((N + kWarps - 1) / kWarps, 256));
}

// Rows r = warp_global, warp_global + stride, ...: each warp owns a fixed set of rows.
template <typename T>
__global__ void layernorm_backward_kernel(T* dinp, RowMap dinp_map, bool accumulate, float* part_w,
                                          float* part_b, const T* dout, RowMap dout_map,
                                          const T* inp, RowMap in_map, const T* w,
                                          const float* mean, const float* rstd, int64_t N,
                                          int64_t C) {
    extern __shared__ float smem[];  // [kWarps][C] dw, then [kWarps][C] db
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* sw = smem + warp * C;
    float* sb = smem + (kWarps + warp) * C;
    for (int64_t c = lane; c < C; c += 32) sw[c] = sb[c] = 0;
    const int64_t stride = int64_t(gridDim.x) * kWarps;
    for (int64_t r = int64_t(blockIdx.x) * kWarps + warp; r < N; r += stride) {
        const T* dy = dout + row_offset(dout_map, r, C);
        const T* x = inp + row_offset(in_map, r, C);
        T* dx = dinp + row_offset(dinp_map, r, C);
        const float m = mean[r], rs = rstd[r];
        float s1 = 0, s2 = 0;  // mean of dy*w and of dy*w*xhat
        for (int64_t c = lane; c < C; c += 32) {
            const float g = to_f(dy[c]), xh = (to_f(x[c]) - m) * rs, gw = g * to_f(w[c]);
            s1 += gw;
            s2 += gw * xh;
            sw[c] += g * xh;
            sb[c] += g;
        }
        s1 = warp_sum(s1) / float(C);
        s2 = warp_sum(s2) / float(C);
        for (int64_t c = lane; c < C; c += 32) {
            const float xh = (to_f(x[c]) - m) * rs;
            float d = rs * (to_f(dy[c]) * to_f(w[c]) - s1 - xh * s2);
            if (accumulate) d += to_f(dx[c]);
            dx[c] = from_f<T>(d);
        }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float aw = 0, ab = 0;
        for (int k = 0; k < kWarps; k++) {
            aw += smem[k * C + c];
            ab += smem[(kWarps + k) * C + c];
        }
        part_w[blockIdx.x * C + c] = aw;
        part_b[blockIdx.x * C + c] = ab;
    }
}

__global__ void sum_partials_kernel(float* dw, float* db, const float* part_w, const float* part_b,
                                    int blocks, int64_t C) {
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
         c += int64_t(gridDim.x) * blockDim.x) {
        float aw = 0, ab = 0;
        for (int k = 0; k < blocks; k++) {
            aw += part_w[k * C + c];
            ab += part_b[k * C + c];
        }
        dw[c] += aw;
        if (db) db[c] += ab;
    }
}

RowMap plain(RowMap m, int64_t C) {
    if (m.ld == 0) m.ld = m.group * C;
    return m;
}

}  // namespace

void layernorm_forward(void* out, RowMap out_map, float* mean, float* rstd, const void* inp,
                       RowMap in_map, const void* weight, const void* bias, int64_t N, int64_t C,
                       double eps, DType t, CUstream_st* s) {
    ZG_CHECK(N > 0 && C > 0 && weight, "layernorm_forward: sizes must be positive, weight set");
    const int blocks = int((N + kWarps - 1) / kWarps);
    ZG_DISPATCH(t, T,
                layernorm_forward_kernel<T><<<blocks, 32 * kWarps, 0, s>>>(
                    static_cast<T*>(out), plain(out_map, C), mean, rstd, static_cast<const T*>(inp),
                    plain(in_map, C), static_cast<const T*>(weight), static_cast<const T*>(bias), N,
                    C, float(eps)));
    ZG_LAUNCH_CHECK();
}

void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                const void* b, const void* weight, const void* bias, int64_t N,
                                int64_t C, double eps, DType t, CUstream_st* s) {
    ZG_CHECK(N > 0 && C > 0 && weight, "residual_layernorm_forward: bad arguments");
    const int blocks = int((N + kWarps - 1) / kWarps);
    ZG_DISPATCH(t, T,
                residual_layernorm_forward_kernel<T><<<blocks, 32 * kWarps, 0, s>>>(
                    static_cast<T*>(res), static_cast<T*>(out), mean, rstd,
                    static_cast<const T*>(a), static_cast<const T*>(b),
                    static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, float(eps)));
    ZG_LAUNCH_CHECK();
}

size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C) {
    return size_t(2) * backward_blocks(N) * C * sizeof(float);
}

void layernorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight, float* dbias,
                        const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                        const void* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, void* scratch, DType t, CUstream_st* s) {
    ZG_CHECK(N > 0 && C > 0 && weight && dweight && scratch, "layernorm_backward: bad arguments");
    const int blocks = backward_blocks(N);
    const size_t smem = size_t(2) * kWarps * C * sizeof(float);
    ZG_CHECK(smem <= 200 * 1024, "layernorm_backward: C too large for the shared-memory sums");
    float* part_w = static_cast<float*>(scratch);
    float* part_b = part_w + size_t(blocks) * C;
    ZG_DISPATCH(t, T, {
        auto kernel = layernorm_backward_kernel<T>;
        if (smem > 48 * 1024)
            ZG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               int(smem)));
        kernel<<<blocks, 32 * kWarps, smem, s>>>(
            static_cast<T*>(dinp), plain(dinp_map, C), accumulate, part_w, part_b,
            static_cast<const T*>(dout), plain(dout_map, C), static_cast<const T*>(inp),
            plain(in_map, C), static_cast<const T*>(weight), mean, rstd, N, C);
    });
    ZG_LAUNCH_CHECK();
    sum_partials_kernel<<<grid_for(C, 256), 256, 0, s>>>(dweight, dbias, part_w, part_b, blocks, C);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

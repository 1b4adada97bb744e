#include <numeric>

#include "kernels/cuda_common.cuh"
#include "kernels/encoder.h"

namespace zgpt::cuda {

namespace {

template <typename T>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int64_t BT, int64_t Tn, int64_t C) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < BT * C; i += stride) {
        const int64_t bt = i / C, c = i % C;
        out[i] = from_f<T>(to_f(wte[int64_t(tokens[bt]) * C + c]) + to_f(wpe[(bt % Tn) * C + c]));
    }
}

// The same sum, 16 bytes of channels a thread (C a multiple of the width, rows 16-byte aligned):
// one index division per vector instead of per element.
template <typename T>
__global__ void encoder_forward_vec_kernel(T* out, const int32_t* tokens, const T* wte,
                                           const T* wpe, int64_t BT, int64_t Tn, int64_t C) {
    constexpr int W = 16 / sizeof(T);
    const int64_t CW = C / W, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < BT * CW; i += stride) {
        const int64_t bt = i / CW, c = (i % CW) * W;
        const uint4 a = *reinterpret_cast<const uint4*>(wte + int64_t(tokens[bt]) * C + c);
        const uint4 b = *reinterpret_cast<const uint4*>(wpe + (bt % Tn) * C + c);
        uint4 r;
        const T *ea = reinterpret_cast<const T*>(&a), *eb = reinterpret_cast<const T*>(&b);
        T* er = reinterpret_cast<T*>(&r);
#pragma unroll
        for (int k = 0; k < W; k++) er[k] = from_f<T>(to_f(ea[k]) + to_f(eb[k]));
        *reinterpret_cast<uint4*>(out + bt * C + c) = r;
    }
}

template <typename T>
__global__ void add_positions_kernel(T* out, const float* rows, const T* wpe, int64_t BT,
                                     int64_t Tn, int64_t C) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < BT * C; i += stride) {
        const int64_t bt = i / C, c = i % C;
        out[i] = from_f<T>(rows[i] + to_f(wpe[(bt % Tn) * C + c]));
    }
}

template <typename T>
__global__ void lookup_rows_kernel(float* out, const int32_t* tokens, int64_t n, const T* table,
                                   int64_t v0, int64_t rows, int64_t C) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * C; i += stride) {
        const int64_t r = int64_t(tokens[i / C]) - v0;
        out[i] = r >= 0 && r < rows ? to_f(table[r * C + i % C]) : 0.0f;
    }
}

// One thread per (position, channel): sums over the batch in order.
template <typename T>
__global__ void wpe_backward_kernel(float* dwpe, const T* dout, int64_t B, int64_t Tn, int64_t C) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < Tn * C; i += stride) {
        float acc = 0;
        for (int64_t b = 0; b < B; b++) acc += to_f(dout[b * Tn * C + i]);
        dwpe[i] += acc;
    }
}

// One block per distinct token; threads over channels; positions summed in order.
template <typename T>
__global__ void wte_backward_kernel(float* dwte, const T* dout, const int32_t* token,
                                    const int32_t* offset, const int32_t* position, int64_t C) {
    const int64_t i = blockIdx.x;
    const int32_t begin = offset[i], end = offset[i + 1];
    float* row = dwte + int64_t(token[i]) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0;
        for (int32_t p = begin; p < end; p++) acc += to_f(dout[int64_t(position[p]) * C + c]);
        row[c] += acc;
    }
}

}  // namespace

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t B,
                     int64_t Tn, int64_t C, DType t, CUstream_st* s) {
    ZG_CHECK(B > 0 && Tn > 0 && C > 0, "encoder_forward: sizes must be positive");
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = C % (16 / dtype_bytes(t)) == 0 && aligned(out) && aligned(wte) && aligned(wpe);
    ZG_DISPATCH(t, T, {
        if (vec) {
            encoder_forward_vec_kernel<T>
                <<<grid_for(B * Tn * C / (16 / sizeof(T)), 256), 256, 0, s>>>(
                    static_cast<T*>(out), tokens, static_cast<const T*>(wte),
                    static_cast<const T*>(wpe), B * Tn, Tn, C);
        } else {
            encoder_forward_kernel<T><<<grid_for(B * Tn * C, 256), 256, 0, s>>>(
                static_cast<T*>(out), tokens, static_cast<const T*>(wte),
                static_cast<const T*>(wpe), B * Tn, Tn, C);
        }
    });
    ZG_LAUNCH_CHECK();
}

void add_positions(void* out, const float* token_rows, const void* wpe, int64_t B, int64_t Tn,
                   int64_t C, DType t, CUstream_st* s) {
    ZG_CHECK(B > 0 && Tn > 0 && C > 0, "add_positions: sizes must be positive");
    ZG_DISPATCH(t, T,
                add_positions_kernel<T><<<grid_for(B * Tn * C, 256), 256, 0, s>>>(
                    static_cast<T*>(out), token_rows, static_cast<const T*>(wpe), B * Tn, Tn, C));
    ZG_LAUNCH_CHECK();
}

void lookup_rows_in_shard(float* out, const int32_t* tokens, int64_t n, const void* table,
                          int64_t v0, int64_t rows, int64_t C, DType t, CUstream_st* s) {
    if (n <= 0) return;
    ZG_DISPATCH(t, T,
                lookup_rows_kernel<T><<<grid_for(n * C, 256), 256, 0, s>>>(
                    out, tokens, n, static_cast<const T*>(table), v0, rows, C));
    ZG_LAUNCH_CHECK();
}

TokenBuckets bucket_tokens(const int32_t* tokens, int64_t n) {
    ZG_CHECK(n >= 0 && n < INT32_MAX, "bucket_tokens: too many positions");
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
    TokenBuckets r;
    r.position = std::move(order);
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || tokens[r.position[i]] != tokens[r.position[i - 1]]) {
            r.token.push_back(tokens[r.position[i]]);
            r.offset.push_back(int32_t(i));
        }
    }
    r.offset.push_back(int32_t(n));
    return r;
}

void encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* d_token,
                      const int32_t* d_offset, const int32_t* d_position, int64_t n_distinct,
                      int64_t B, int64_t Tn, int64_t C, DType t, CUstream_st* s) {
    ZG_DISPATCH(t, T, {
        if (dwpe)
            wpe_backward_kernel<T>
                <<<grid_for(Tn * C, 256), 256, 0, s>>>(dwpe, static_cast<const T*>(dout), B, Tn, C);
        if (dwte && n_distinct > 0)
            wte_backward_kernel<T><<<int(n_distinct), 256, 0, s>>>(
                dwte, static_cast<const T*>(dout), d_token, d_offset, d_position, C);
    });
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

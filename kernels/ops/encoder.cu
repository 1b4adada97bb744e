#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/encoder.h"

namespace zgpt::cuda {

namespace {

// out[bt,:] = rows[bt,:] + wpe[bt % Tn,:], where rows is wte's row tokens[bt], or row bt itself
// when tokens is null (add_positions: rows already looked up). Summed in fp32, rounded once.
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* rows, const T* wpe,
                                       int64_t BT, int64_t Tn, int64_t C) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < BT * C; i += stride) {
        const int64_t bt = i / C, c = i % C, row = tokens ? int64_t(tokens[bt]) : bt;
        out[i] = from_f<T>(to_f(rows[row * C + c]) + (wpe ? to_f(wpe[(bt % Tn) * C + c]) : 0.0f));
    }
}

// The same sum, 16 bytes of channels a thread (C a multiple of the width, rows 16-byte aligned):
// one index division per vector instead of per element.
template <typename T>
__global__ void encoder_forward_vec_kernel(T* out, const int32_t* tokens, const T* rows,
                                           const T* wpe, int64_t BT, int64_t Tn, int64_t C) {
    constexpr int W = 16 / sizeof(T);
    const int64_t CW = C / W, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < BT * CW; i += stride) {
        const int64_t bt = i / CW, c = (i % CW) * W, row = tokens ? int64_t(tokens[bt]) : bt;
        const uint4 a = *reinterpret_cast<const uint4*>(rows + row * C + c);
        const uint4 b =
            wpe ? *reinterpret_cast<const uint4*>(wpe + (bt % Tn) * C + c) : make_uint4(0, 0, 0, 0);
        uint4 r;
        const T *ea = reinterpret_cast<const T*>(&a), *eb = reinterpret_cast<const T*>(&b);
        T* er = reinterpret_cast<T*>(&r);
#pragma unroll
        for (int k = 0; k < W; k++) er[k] = from_f<T>(to_f(ea[k]) + to_f(eb[k]));
        *reinterpret_cast<uint4*>(out + bt * C + c) = r;
    }
}

// `blocks` blocks of n token rows: block b's tokens at tokens + b * token_stride, its rows at
// out + b * out_stride. A row is the table's row tokens[.] - v0 when that is in [0, rows), else
// zero bits. Vec is T (one element a thread) or uint4 (16 bytes: C a multiple of the width and
// every row start 16-byte aligned).
template <typename T, typename Vec>
__global__ void lookup_rows_kernel(T* out, int64_t out_stride, const int32_t* tokens,
                                   int64_t token_stride, int64_t blocks, int64_t n, const T* table,
                                   int64_t v0, int64_t rows, int64_t C) {
    constexpr int W = sizeof(Vec) / sizeof(T);
    const int64_t CW = C / W, per_block = n * CW, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < blocks * per_block;
         i += stride) {
        const int64_t b = i / per_block, j = i - b * per_block, k = j / CW, c = (j - k * CW) * W;
        const int64_t r = int64_t(tokens[b * token_stride + k]) - v0;
        Vec v;
        if (r >= 0 && r < rows) {
            v = *reinterpret_cast<const Vec*>(table + r * C + c);
        } else if constexpr (W == 1) {
            v = from_f<T>(0.0f);
        } else {
            v = make_uint4(0, 0, 0, 0);
        }
        *reinterpret_cast<Vec*>(out + b * out_stride + k * C + c) = v;
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

// One block per bucket entry; threads over channels; the entry's positions summed in order,
// into the token's gradient row (its only entry) or into the entry's row of partials.
template <typename T>
__global__ void wte_backward_kernel(float* dwte, float* partials, const T* dout,
                                    const int32_t* token, const int32_t* offset,
                                    const int32_t* position, const int32_t* slot, int64_t C) {
    const int64_t i = blockIdx.x;
    const int32_t begin = offset[i], end = offset[i + 1];
    const bool add = slot[i] < 0;  // the token's only entry: added into its gradient row
    float* row = add ? dwte + int64_t(token[i]) * C : partials + int64_t(slot[i]) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0;
#pragma unroll 4
        for (int32_t p = begin; p < end; p++) acc += to_f(dout[int64_t(position[p]) * C + c]);
        row[c] = add ? row[c] + acc : acc;
    }
}

// One block per split token: its entries' partials added into its row, in entry order.
__global__ void wte_merge_kernel(float* dwte, const float* partials, const int32_t* token,
                                 const int32_t* offset, int64_t C) {
    const int64_t j = blockIdx.x;
    float* row = dwte + int64_t(token[j]) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0;
#pragma unroll 4
        for (int32_t k = offset[j]; k < offset[j + 1]; k++) acc += partials[int64_t(k) * C + c];
        row[c] += acc;
    }
}

// encoder_forward's sum, vectorised where C and the pointers allow.
void rows_plus_positions(void* out, const int32_t* tokens, const void* rows, const void* wpe,
                         int64_t BT, int64_t Tn, int64_t C, DType t, CUstream_st* s) {
    const bool vec = C % (16 / dtype_bytes(t)) == 0 && is_aligned({out, rows, wpe});
    ZG_DISPATCH(t, T, {
        if (vec) {
            encoder_forward_vec_kernel<T><<<grid_for(BT * C / (16 / sizeof(T)), 256), 256, 0, s>>>(
                static_cast<T*>(out), tokens, static_cast<const T*>(rows),
                static_cast<const T*>(wpe), BT, Tn, C);
        } else {
            encoder_forward_kernel<T><<<grid_for(BT * C, 256), 256, 0, s>>>(
                static_cast<T*>(out), tokens, static_cast<const T*>(rows),
                static_cast<const T*>(wpe), BT, Tn, C);
        }
    });
    ZG_LAUNCH_CHECK();
}

}  // namespace

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t B,
                     int64_t Tn, int64_t C, DType t, CUstream_st* s) {
    ZG_CHECK(B > 0 && Tn > 0 && C > 0, "encoder_forward: sizes must be positive");
    rows_plus_positions(out, tokens, wte, wpe, B * Tn, Tn, C, t, s);
}

void add_positions(void* out, const void* token_rows, const void* wpe, int64_t B, int64_t Tn,
                   int64_t C, DType t, CUstream_st* s) {
    ZG_CHECK(B > 0 && Tn > 0 && C > 0, "add_positions: sizes must be positive");
    rows_plus_positions(out, nullptr, token_rows, wpe, B * Tn, Tn, C, t, s);
}

void lookup_rows_in_shard(void* out, int64_t out_stride, const int32_t* tokens,
                          int64_t token_stride, int64_t blocks, int64_t n, const void* table,
                          int64_t v0, int64_t rows, int64_t C, DType t, CUstream_st* s) {
    if (n <= 0 || blocks <= 0) return;
    ZG_CHECK(out_stride >= n * C && token_stride >= n, "lookup_rows_in_shard: blocks overlap");
    const int64_t W = 16 / dtype_bytes(t);
    const bool vec = C % W == 0 && out_stride % W == 0 && is_aligned({out, table});
    ZG_DISPATCH(t, T, {
        if (vec) {
            lookup_rows_kernel<T, uint4><<<grid_for(blocks * n * C / W, 256), 256, 0, s>>>(
                static_cast<T*>(out), out_stride, tokens, token_stride, blocks, n,
                static_cast<const T*>(table), v0, rows, C);
        } else {
            lookup_rows_kernel<T, T><<<grid_for(blocks * n * C, 256), 256, 0, s>>>(
                static_cast<T*>(out), out_stride, tokens, token_stride, blocks, n,
                static_cast<const T*>(table), v0, rows, C);
        }
    });
    ZG_LAUNCH_CHECK();
}

void encoder_backward(float* dwte, float* dwpe, const void* dout, const DeviceBuckets& bk,
                      int64_t B, int64_t Tn, int64_t C, DType t, CUstream_st* s) {
    ZG_DISPATCH(t, T, {
        if (dwpe)
            wpe_backward_kernel<T>
                <<<grid_for(Tn * C, 256), 256, 0, s>>>(dwpe, static_cast<const T*>(dout), B, Tn, C);
        if (dwte && bk.entries > 0)
            wte_backward_kernel<T>
                <<<int(bk.entries), 256, 0, s>>>(dwte, bk.partials, static_cast<const T*>(dout),
                                                 bk.token, bk.offset, bk.position, bk.slot, C);
    });
    ZG_LAUNCH_CHECK();
    if (dwte && bk.merged > 0) {
        wte_merge_kernel<<<int(bk.merged), 256, 0, s>>>(dwte, bk.partials, bk.merge_token,
                                                        bk.merge_offset, C);
        ZG_LAUNCH_CHECK();
    }
}

}  // namespace zgpt::cuda

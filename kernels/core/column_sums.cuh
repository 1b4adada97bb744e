// Partial column sums added into their outputs in a fixed order, for kernels that leave one row
// of partial sums per block or row chunk (the bias gradient's column sums, the LayerNorm
// backward's weight gradients): out[c] += sum over k of parts[k * cols + c]. A block covers 32
// columns with 32 thread rows; thread row y sums partials y, y + 32, ... in kUnroll interleaved
// chains, so that each thread has kUnroll independent loads in flight (the partials are a few
// hundred rows; the earlier 8 thread rows with one chain each had one), then thread row 0 adds
// the rows' sums in order. Which partial goes into which chain depends only on `rows`, so the
// result does not depend on scheduling.
#pragma once
#include <cstdint>

#include "kernels/core/cuda_common.cuh"

namespace zgpt::cuda {

namespace column_sums_detail {

constexpr int kCols = 32, kRows = 32, kUnroll = 4;

// out2 / parts2: a second set of the same shape summed in the same launch (nullptr: none). A
// template, so that every file including this header shares one definition.
template <int kCols, int kRows, int kUnroll>
__global__ void __launch_bounds__(kCols* kRows)
    add_kernel(float* out, const float* parts, float* out2, const float* parts2, int rows,
               int64_t cols) {
    __shared__ float s1[kRows][kCols], s2[kRows][kCols];
    const int64_t c = int64_t(blockIdx.x) * kCols + threadIdx.x;
    float a1[kUnroll] = {}, a2[kUnroll] = {};
    if (c < cols) {
        int k = threadIdx.y;
        for (; k + (kUnroll - 1) * kRows < rows; k += kUnroll * kRows)
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                a1[u] += parts[int64_t(k + u * kRows) * cols + c];
                if (out2) a2[u] += parts2[int64_t(k + u * kRows) * cols + c];
            }
#pragma unroll
        for (int u = 0; u < kUnroll; u++)  // the last rows, fewer than kUnroll per thread row
            if (k + u * kRows < rows) {
                a1[u] += parts[int64_t(k + u * kRows) * cols + c];
                if (out2) a2[u] += parts2[int64_t(k + u * kRows) * cols + c];
            }
    }
    float t1 = 0, t2 = 0;
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        t1 += a1[u];
        t2 += a2[u];
    }
    s1[threadIdx.y][threadIdx.x] = t1;
    s2[threadIdx.y][threadIdx.x] = t2;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float r1 = 0, r2 = 0;
        for (int y = 0; y < kRows; y++) {
            r1 += s1[y][threadIdx.x];
            r2 += s2[y][threadIdx.x];
        }
        out[c] += r1;
        if (out2) out2[c] += r2;
    }
}

}  // namespace column_sums_detail

// out[cols] += the column sums of parts [rows, cols]; with out2, out2 += those of parts2 too.
inline void add_partial_column_sums(float* out, const float* parts, float* out2,
                                    const float* parts2, int rows, int64_t cols,
                                    CUstream_st* stream) {
    using namespace column_sums_detail;
    add_kernel<kCols, kRows, kUnroll>
        <<<unsigned((cols + kCols - 1) / kCols), dim3(kCols, kRows), 0, stream>>>(
            out, parts, out2, parts2, rows, cols);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

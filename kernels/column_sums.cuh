// Partial column sums added into their outputs in a fixed order, for kernels that leave one row
// of partial sums per block or row chunk (the bias gradient's column sums, the LayerNorm
// backward's weight gradients): out[c] += sum over k of parts[k * cols + c]. A block covers 32
// columns with 8 thread rows; thread row y sums partials y, y + 8, ..., then thread row 0 adds
// the 8 in order, so the result does not depend on scheduling (8 short chains, not one long one).
#pragma once
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace zgpt::cuda {

namespace column_sums_detail {

constexpr int kCols = 32, kRows = 8;

// out2 / parts2: a second set of the same shape summed in the same launch (nullptr: none). A
// template, so that every file including this header shares one definition.
template <int kCols, int kRows>
__global__ void add_kernel(float* out, const float* parts, float* out2, const float* parts2,
                           int rows, int64_t cols) {
    __shared__ float s1[kRows][kCols], s2[kRows][kCols];
    const int64_t c = int64_t(blockIdx.x) * kCols + threadIdx.x;
    float a1 = 0, a2 = 0;
    if (c < cols)
        for (int k = threadIdx.y; k < rows; k += kRows) {
            a1 += parts[k * cols + c];
            if (out2) a2 += parts2[k * cols + c];
        }
    s1[threadIdx.y][threadIdx.x] = a1;
    s2[threadIdx.y][threadIdx.x] = a2;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t1 = 0, t2 = 0;
        for (int k = 0; k < kRows; k++) {
            t1 += s1[k][threadIdx.x];
            t2 += s2[k][threadIdx.x];
        }
        out[c] += t1;
        if (out2) out2[c] += t2;
    }
}

}  // namespace column_sums_detail

// out[cols] += the column sums of parts [rows, cols]; with out2, out2 += those of parts2 too.
inline void add_partial_column_sums(float* out, const float* parts, float* out2,
                                    const float* parts2, int rows, int64_t cols,
                                    CUstream_st* stream) {
    using namespace column_sums_detail;
    add_kernel<kCols, kRows>
        <<<unsigned((cols + kCols - 1) / kCols), dim3(kCols, kRows), 0, stream>>>(
            out, parts, out2, parts2, rows, cols);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

// A GEMM that skips the products of negligible pieces of its left operand
// (kernels/gemm/filtered_gemm.cu): the dh and dW products of fused_linear_rows_filtered, where A is
// a block of dlogits. Cut Cross-Entropy's gradient filtering: a softmax entry below bf16 resolution
// adds almost nothing to dh or dW. filter_blocks flags the 32 x 32 blocks of A that hold a value at
// or above a threshold, and the GEMM neither loads nor multiplies a k step whose 128 x 32 piece of
// A has no flagged block. Not exact: what it drops is bounded by the threshold times the B rows it
// would have met (tests/test_gpu.cpp checks that bound). A threshold of 0 flags every block.
#pragma once
#include <cstdint>

struct CUstream_st;

namespace zgpt::cuda {

// D [M, N] (=, or += with beta 1) A [M, K] B [K, N], fp32 accumulation, bf16 operands.
struct FilteredGemm {
    // A(m, k) at A[m * lda + k], or at A[k * lda + m] when a_transposed. Reads run in 16-byte
    // pieces, so A's rows are read up to M (a_transposed) or K rounded up to 8: values past M
    // reach only rows of D that are not stored; values past K meet zeros of B and must be finite.
    const void* A = nullptr;
    int64_t lda = 0;
    bool a_transposed = false;
    const void* B = nullptr;  // B(k, n) at B[k * ldb + n]
    int64_t ldb = 0;
    void* D = nullptr;  // D(m, n) at D[m * ldd + n]: bf16 (beta 0), or fp32
    int64_t ldd = 0;
    bool d_fp32 = false;
    float beta = 0.0f;  // 0 or 1 (fp32 D only)
    int64_t M = 0, N = 0, K = 0;
    // filter_blocks' flags of A's storage (the [M][K] or, a_transposed, [K][M] matrix at A with
    // row stride lda, its columns rounded up to 8): a CTA neither loads nor multiplies a k step
    // whose 128 x 32 piece of A has no flagged 32 x 32 block. Null, or K above 262,144: every k
    // step (a plain GEMM).
    const unsigned char* keep = nullptr;
};

// Whether filtered_gemm runs this problem: lda, ldb, ldd and N multiples of 8, 16-byte aligned
// pointers, a device of compute capability 8.0 or more. The caller runs a plain GEMM otherwise.
bool filtered_gemm_usable(const FilteredGemm& g);
void filtered_gemm(const FilteredGemm& g, CUstream_st* stream);

// The 32 x 32 block flags of a row-major bf16 matrix X [rows, cols] (row stride ldx, cols a
// multiple of 8): keep[(r / 32) * ceil(cols / 32) + c / 32] = 1 where the block holds a value
// with |x| >= *threshold (or a NaN), else 0. filter_blocks_bytes is the flags' size.
int64_t filter_blocks_bytes(int64_t rows, int64_t cols);
void filter_blocks(unsigned char* keep, const void* X, int64_t ldx, int64_t rows, int64_t cols,
                   const float* threshold, CUstream_st* stream);

// *threshold = eps * max |g[i]| over i < n (n = 1: a scalar gradient scale), on the device.
void filter_threshold(float* threshold, const float* g, int64_t n, float eps, CUstream_st* stream);

}  // namespace zgpt::cuda

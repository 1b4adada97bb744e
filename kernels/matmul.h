// Matmul with optional bias: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC]. CPU reference.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zgpt::cpu {

// bias may be null.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC);

// Adds into dinp, dweight and dbias; any of them may be null (not needed).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC);

}  // namespace zgpt::cpu

// CUDA matmul through cuBLASLt (kernels/matmul.cu; CUDA builds only). Row-major operands,
// bf16 inputs, fp32 accumulation:
//   D[M, N] = alpha * op(A) @ op(B) + beta * D
// with A stored [M, K] (or [K, M] when trans_a) and B stored [K, N] (or [N, K] when trans_b).
// D is bf16 or fp32. One handle and workspace per thread; heuristics cached per shape.
struct CUstream_st;
namespace zgpt::cuda {

enum class MatType { bf16, f32 };

void gemm_bf16(void* D, MatType d_type, const void* A, bool trans_a, const void* B, bool trans_b,
               int64_t M, int64_t N, int64_t K, float alpha, float beta, CUstream_st* stream);

// Bytes of the persistent cuBLASLt workspace (counted as extra memory by the benchmarks).
size_t gemm_workspace_bytes();

}  // namespace zgpt::cuda

// RMSNorm over the last dimension (Llama's norm: no mean, no bias). CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps); rstd (N) is saved for backward.
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     double eps);

// Adds into dinp and dweight.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/norms/layernorm.cu, which runs both norms with the same kernels;
// CUDA builds only). The same layouts, types and fixed-order sums as the LayerNorm launchers in
// kernels/norms/layernorm.h, without the mean and the bias: rstd alone is saved.
#include "kernels/norms/layernorm.h"
namespace zgpt::cuda {

void rmsnorm_forward(void* out, RowMap out_map, float* rstd, const void* inp, RowMap in_map,
                     const void* weight, int64_t N, int64_t C, double eps, DType t, DType in_t,
                     CUstream_st* s);

// res = a + b (rounded to res_t), out = RMSNorm(res), as residual_layernorm_forward.
void residual_rmsnorm_forward(void* res, void* out, float* rstd, const void* a, const void* b,
                              const void* weight, int64_t N, int64_t C, double eps, DType t,
                              DType res_t, CUstream_st* s, int64_t out_ld = 0);

// As layernorm_backward: scratch of layernorm_backward_scratch_bytes(N, C), dinp_sums likewise.
void rmsnorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight,
                      const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                      const void* weight, const float* rstd, int64_t N, int64_t C, void* scratch,
                      DType t, DType in_t, CUstream_st* s, ColumnSumParts* dinp_sums = nullptr);

}  // namespace zgpt::cuda

// LayerNorm over the last dimension. CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// out = (inp - mean) * rstd * weight + bias; bias may be null (bias-free LayerNorm).
// mean and rstd (N each) are saved for the backward pass.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, double eps = 1e-5);

// Adds into dinp, dweight and dbias (dbias may be null).
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/norms/layernorm.cu; CUDA builds only). Statistics are fp32; the weight
// gradients are fp32 and added into, summed in a fixed order (no atomics).
#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

// Where the rows of a LayerNorm live: row r starts at (r / group) * ld + (r % group) * C. Plain
// rows are {1, C}; the heads of q inside qkv [BT, C + 2 KVC] are {NH, C + 2 KVC} and those of k,
// from column C, {NKV, C + 2 KVC} (qk_norm).
struct RowMap {
    int64_t group = 1, ld = 0;
};

// Types: out (and dout, b below) in t; inp (and res, a, dinp) in in_t, which is t or, under bf16
// activations, an fp32 residual stream (train.fp32_residual). The forward passes take the fp32
// master weight and bias whatever the types, as autocast's norms do (a weight near 1 read as bf16
// would hide updates below 2^-8 from the output); the backward passes take them in in_t.
void layernorm_forward(void* out, RowMap out_map, float* mean, float* rstd, const void* inp,
                       RowMap in_map, const float* weight, const float* bias, int64_t N, int64_t C,
                       double eps, DType t, DType in_t, CUstream_st* s);
inline void layernorm_forward(void* out, RowMap out_map, float* mean, float* rstd, const void* inp,
                              RowMap in_map, const float* weight, const float* bias, int64_t N,
                              int64_t C, double eps, DType t, CUstream_st* s) {
    layernorm_forward(out, out_map, mean, rstd, inp, in_map, weight, bias, N, C, eps, t, t, s);
}

// res = a + b (rounded to res_t), out = LayerNorm(res): the residual add fused into the norm.
// res and a in res_t; b and out in t; weight and bias fp32. out_ld: out's row stride (0: C), as
// layernorm_forward's out_map.ld (the trainer's ln2 with a column of ones beside its rows).
void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                const void* b, const float* weight, const float* bias, int64_t N,
                                int64_t C, double eps, DType t, DType res_t, CUstream_st* s,
                                int64_t out_ld = 0);
inline void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd,
                                       const void* a, const void* b, const float* weight,
                                       const float* bias, int64_t N, int64_t C, double eps, DType t,
                                       CUstream_st* s) {
    residual_layernorm_forward(res, out, mean, rstd, a, b, weight, bias, N, C, eps, t, t, s);
}

size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C);

// Partial column sums [rows, C] that a backward call leaves for a later reduction
// (bias_backward_from_partials in kernels/gemm/matmul.h): `parts` holds
// layernorm_backward_sums_bytes(N, C); the call sets `rows`, to 0 where it could not leave them
// (the generic kernel's shared memory, C above about 4266).
struct ColumnSumParts {
    float* parts = nullptr;
    int rows = 0;
};
size_t layernorm_backward_sums_bytes(int64_t N, int64_t C);

// dinp = (accumulate ? dinp : 0) + dLN/dinp; dweight, dbias (may be null) added into. dinp may
// alias dout (each row is read whole before it is written). dout in t; dinp, inp, weight in in_t.
// dinp_sums (plain dinp rows only): also the column sums of dinp as stored and rounded to t, one
// row of partials per block, in a fixed order. In a pre-LN block dinp is the output gradient of
// the projection before the norm, so they are its bias gradient without a pass of their own.
// split_rows (kernels.layernorm_split_rows): rows above 1280 columns two warps a row, each with its
// half's weight-gradient sums in registers, instead of one warp with them in shared memory.
void layernorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight, float* dbias,
                        const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                        const void* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, void* scratch, DType t, DType in_t, CUstream_st* s,
                        ColumnSumParts* dinp_sums = nullptr, bool split_rows = false);
inline void layernorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight,
                               float* dbias, const void* dout, RowMap dout_map, const void* inp,
                               RowMap in_map, const void* weight, const float* mean,
                               const float* rstd, int64_t N, int64_t C, void* scratch, DType t,
                               CUstream_st* s) {
    layernorm_backward(dinp, dinp_map, accumulate, dweight, dbias, dout, dout_map, inp, in_map,
                       weight, mean, rstd, N, C, scratch, t, t, s);
}

// RMSNorm (model.norm: rmsnorm) through the same kernels without the mean and the bias: the same
// layouts, types and fixed-order sums; rstd alone is saved.
void rmsnorm_forward(void* out, RowMap out_map, float* rstd, const void* inp, RowMap in_map,
                     const float* weight, int64_t N, int64_t C, double eps, DType t, DType in_t,
                     CUstream_st* s);

// res = a + b (rounded to res_t), out = RMSNorm(res), as residual_layernorm_forward.
void residual_rmsnorm_forward(void* res, void* out, float* rstd, const void* a, const void* b,
                              const float* weight, int64_t N, int64_t C, double eps, DType t,
                              DType res_t, CUstream_st* s, int64_t out_ld = 0);

// As layernorm_backward: scratch of layernorm_backward_scratch_bytes(N, C), dinp_sums likewise.
void rmsnorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight,
                      const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                      const void* weight, const float* rstd, int64_t N, int64_t C, void* scratch,
                      DType t, DType in_t, CUstream_st* s, ColumnSumParts* dinp_sums = nullptr,
                      bool split_rows = false);

}  // namespace zgpt::cuda

// AdamW (decoupled weight decay, bias-corrected moments), as PyTorch's torch.optim.AdamW.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

struct AdamWStep {
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double weight_decay = 0.0;  // applied as p -= lr * wd * p (decoupled)
    int64_t t = 1;              // 1-based step count, for bias correction
    double grad_scale = 1.0;    // multiplies the gradient first (global-norm clipping)
};

// One update of n parameters with their moments m and v.
template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, const AdamWStep& s);

}  // namespace zgpt::cpu

// CUDA launcher (kernels/adamw.cu; CUDA builds only): the same update, fused over a contiguous
// range of the fp32 master arena, optionally writing the bf16 working copy of the parameters.
struct CUstream_st;
namespace zgpt::cuda {

void adamw_update(float* params, void* params_bf16, const float* grads, float* m, float* v,
                  int64_t n, const cpu::AdamWStep& s, CUstream_st* stream);

}  // namespace zgpt::cuda

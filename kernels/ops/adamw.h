// AdamW (decoupled weight decay, bias-corrected moments), as PyTorch's torch.optim.AdamW.
#pragma once
#include <cstdint>
#include <vector>

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

// CUDA launchers (kernels/ops/adamw.cu; CUDA builds only): the same update over the fp32 master
// arena, optionally writing the bf16 working copy of the parameters.
struct CUstream_st;
namespace zgpt::cuda {

// A run of arena elements [begin, end) that share one weight-decay flag.
struct AdamWSpan {
    int64_t begin, end;
    bool decay;
};

// Global-norm clipping with the norm left on the device: the gradient's sum of squares (fp64,
// on the GPU, as cuda::sum_of_squares writes it) and the clip threshold. The kernel multiplies
// s.grad_scale by cpu::clip_scale(sqrt(*sum_of_squares), max_norm), the host's bits, so the
// update need not wait for a read of the norm by the host.
struct AdamWClip {
    const double* sum_of_squares = nullptr;  // null: no clipping on the device
    double max_norm = 0.0;
};

// The whole step in one launch (one per 128 spans): params, params_bf16 and grads are indexed by
// arena element, m and v from `base` (the first element of the caller's range, as ZeRO-1 keeps
// only its slice's moments). Spans with `decay` use s.weight_decay, the others none.
void adamw_update(float* params, void* params_bf16, const float* grads, float* m, float* v,
                  int64_t base, const std::vector<AdamWSpan>& spans, const cpu::AdamWStep& s,
                  CUstream_st* stream, AdamWClip clip = {});

// n contiguous elements, all with s.weight_decay.
void adamw_update(float* params, void* params_bf16, const float* grads, float* m, float* v,
                  int64_t n, const cpu::AdamWStep& s, CUstream_st* stream);

}  // namespace zgpt::cuda

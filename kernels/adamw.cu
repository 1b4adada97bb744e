#include "kernels/adamw.h"
#include "kernels/cuda_common.cuh"

namespace zgpt::cuda {

namespace {

struct Coefs {
    double lr, beta1, beta2, eps, decay, bc1, bc2, grad_scale;
};

// Double arithmetic, like the CPU reference, so fp32 runs track it to rounding.
__global__ void adamw_kernel(float* p, bf16* p16, const float* g, float* m, float* v, int64_t n,
                             Coefs c) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double gi = double(g[i]) * c.grad_scale;
        const double mi = c.beta1 * m[i] + (1.0 - c.beta1) * gi;
        const double vi = c.beta2 * v[i] + (1.0 - c.beta2) * gi * gi;
        m[i] = float(mi);
        v[i] = float(vi);
        const double update = (mi / c.bc1) / (sqrt(vi / c.bc2) + c.eps);
        const float np = float(double(p[i]) * c.decay - c.lr * update);
        p[i] = np;
        if (p16) p16[i] = __float2bfloat16_rn(np);
    }
}

}  // namespace

void adamw_update(float* params, void* params_bf16, const float* grads, float* m, float* v,
                  int64_t n, const cpu::AdamWStep& s, CUstream_st* stream) {
    if (n <= 0) return;
    const Coefs c{s.lr,
                  s.beta1,
                  s.beta2,
                  s.eps,
                  1.0 - s.lr * s.weight_decay,
                  1.0 - std::pow(s.beta1, double(s.t)),
                  1.0 - std::pow(s.beta2, double(s.t)),
                  s.grad_scale};
    adamw_kernel<<<grid_for(n, 256, 1 << 16), 256, 0, stream>>>(
        params, static_cast<bf16*>(params_bf16), grads, m, v, n, c);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

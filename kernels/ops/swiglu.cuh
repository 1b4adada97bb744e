// SwiGLU's forward on the device, shared by the SwiGLU kernels (kernels/ops/swiglu.cu) and the
// wgmma GEMM's SwiGLU epilogue (kernels/gemm/matmul_wgmma.cu), so that both compute the same bits
// from the same bf16 pre-activations (the backward's recompute runs the separate kernel).
#pragma once

namespace zgpt::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float g) {
    return 1.0f / (1.0f + expf(-g));
}
// silu(g) * u
__device__ __forceinline__ float swiglu_f(float g, float u) {
    return g * sigmoid(g) * u;
}

}  // namespace
}  // namespace zgpt::cuda

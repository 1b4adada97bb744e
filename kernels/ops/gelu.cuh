// GELU (tanh approximation, GPT-2's form) and its derivative on the device, shared by the GELU
// kernels (kernels/ops/gelu.cu) and the GEMM epilogues of kernels/gemm/matmul_wgmma*.cu, so that
// both compute the same bits: gelu_bf16 for bf16 results, gelu_f for fp32 ones.
#pragma once

namespace zgpt::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// For fp32 results, in its sigmoid form, 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)): one ex2 and one
// reciprocal, within fp32 tests' 1e-5 where tanhf took ~20 instructions an element. For very
// negative x the denominator overflows and the result is a signed 0, as GELU's limit.
__device__ __forceinline__ float gelu_f(float x) {
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    return __fdividef(x, 1.0f + __expf(-2.0f * u));
}
// For a result rounded to bf16: one tanh.approx (a single special-function op, relative error
// about 2^-11, under bf16's 2^-9 rounding) instead of an exponential and a reciprocal. The GEMM
// epilogues' GELU is bound by those units, and the wgmma fc + GELU ran faster than in the sigmoid
// form (H100, bench_gemm).
__device__ __forceinline__ float gelu_bf16(float x) {
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
    const float h = 0.5f * x;
    return fmaf(h, t, h);
}
__device__ __forceinline__ float gelu_grad(float x) {
    const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

}  // namespace
}  // namespace zgpt::cuda

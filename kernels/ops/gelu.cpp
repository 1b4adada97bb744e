#include "kernels/ops/gelu.h"

#include <cmath>

#include "kernels/core/exp_vec.h"

namespace zgpt::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const T x = inp[i];
        out[i] = T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x)));
    }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const T x = inp[i];
        const T u = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
        const T th = std::tanh(u);
        const T sech2 = T(1) - th * th;
        const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
        dinp[i] += dout[i] * (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du);
    }
}

namespace {

// tanh(u) = 1 - 2 / (1 + e^{2u}): within about 1e-7 of tanh absolutely (relatively less near 0,
// where GELU multiplies it by x / 2 anyway).
inline float tanh_vec(float u) {
    return 1.0f - 2.0f / (1.0f + exp_vec(2.0f * u));
}

}  // namespace

// float: the same formula with tanh_vec (double keeps std::tanh: it is the reference).
template <>
void gelu_forward<float>(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const float x = inp[i];
        out[i] =
            0.5f * x * (1.0f + tanh_vec(float(kSqrt2OverPi) * (x + float(kCubic) * x * x * x)));
    }
}

template <>
void gelu_backward<float>(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float th = tanh_vec(float(kSqrt2OverPi) * (x + float(kCubic) * x * x * x));
        const float sech2 = 1.0f - th * th;
        const float du = float(kSqrt2OverPi) * (1.0f + float(3 * kCubic) * x * x);
        dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
    }
}

template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace zgpt::cpu

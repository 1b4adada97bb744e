#include "kernels/gelu.h"

#include <cmath>

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

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace zgpt::cpu

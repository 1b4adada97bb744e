#include "kernels/ops/swiglu.h"

#include <cmath>

namespace zgpt::cpu {

template <typename T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t H) {
#pragma omp parallel for
    for (int64_t n = 0; n < N; n++) {
        const T* g = inp + n * 2 * H;
        const T* u = g + H;
        T* o = out + n * H;
        for (int64_t i = 0; i < H; i++) o[i] = g[i] / (T(1) + std::exp(-g[i])) * u[i];
    }
}

template <typename T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, int64_t N, int64_t H) {
    // d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g)
#pragma omp parallel for
    for (int64_t n = 0; n < N; n++) {
        const T* g = inp + n * 2 * H;
        const T* u = g + H;
        const T* dy = dout + n * H;
        T* dg = dinp + n * 2 * H;
        T* du = dg + H;
        for (int64_t i = 0; i < H; i++) {
            const T s = T(1) / (T(1) + std::exp(-g[i]));
            dg[i] += dy[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
            du[i] += dy[i] * g[i] * s;
        }
    }
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<double>(double*, const double*, const double*, int64_t, int64_t);

}  // namespace zgpt::cpu

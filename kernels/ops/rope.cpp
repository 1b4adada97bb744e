#include "kernels/ops/rope.h"

#include <cmath>
#include <vector>

namespace zgpt::cpu {

namespace {

// Rotates each pair by +angle (sign 1) or -angle (sign -1). cos and sin are taken in double.
template <typename T>
void rotate(T* x, int64_t B, int64_t Tn, int64_t heads, int64_t hs, int64_t ld, double theta,
            double sign) {
    const int64_t half = hs / 2;
    std::vector<double> cs(Tn * half), sn(Tn * half);
    for (int64_t t = 0; t < Tn; t++)
        for (int64_t i = 0; i < half; i++) {
            const double a = double(t) * std::pow(theta, -2.0 * double(i) / double(hs));
            cs[t * half + i] = std::cos(a);
            sn[t * half + i] = sign * std::sin(a);
        }
#pragma omp parallel for
    for (int64_t bt = 0; bt < B * Tn; bt++) {
        const double* c = cs.data() + (bt % Tn) * half;
        const double* s = sn.data() + (bt % Tn) * half;
        for (int64_t h = 0; h < heads; h++) {
            T* p = x + bt * ld + h * hs;
            for (int64_t i = 0; i < half; i++) {
                const double x1 = p[i], x2 = p[i + half];
                p[i] = T(x1 * c[i] - x2 * s[i]);
                p[i + half] = T(x2 * c[i] + x1 * s[i]);
            }
        }
    }
}

}  // namespace

template <typename T>
void rope_forward(T* x, int64_t B, int64_t Tn, int64_t heads, int64_t hs, int64_t ld,
                  double theta) {
    rotate(x, B, Tn, heads, hs, ld, theta, 1.0);
}

template <typename T>
void rope_backward(T* dx, int64_t B, int64_t Tn, int64_t heads, int64_t hs, int64_t ld,
                   double theta) {
    rotate(dx, B, Tn, heads, hs, ld, theta, -1.0);
}

template void rope_forward<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, double);
template void rope_forward<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, double);
template void rope_backward<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, double);
template void rope_backward<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, double);

}  // namespace zgpt::cpu

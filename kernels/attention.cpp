#include "kernels/attention.h"

#include <cmath>
#include <vector>

namespace zgpt::cpu {

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
    const int64_t hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / std::sqrt(double(hs));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            for (int64_t t = 0; t < Tn; t++) {
                const T* q = qkv + (b * Tn + t) * C3 + h * hs;
                T* a = att + ((b * NH + h) * Tn + t) * Tn;
                double maxv = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const T* k = qkv + (b * Tn + t2) * C3 + C + h * hs;
                    T s = 0;
                    for (int64_t i = 0; i < hs; i++) s += q[i] * k[i];
                    a[t2] = T(s * scale);
                    if (a[t2] > maxv) maxv = a[t2];
                }
                double sum = 0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    a[t2] = T(std::exp(a[t2] - maxv));
                    sum += a[t2];
                }
                for (int64_t t2 = 0; t2 <= t; t2++) a[t2] = T(a[t2] / sum);
                for (int64_t t2 = t + 1; t2 < Tn; t2++) a[t2] = 0;
                T* o = out + (b * Tn + t) * C + h * hs;
                for (int64_t i = 0; i < hs; i++) o[i] = 0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const T* v = qkv + (b * Tn + t2) * C3 + 2 * C + h * hs;
                    for (int64_t i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
        }
    }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                        int64_t C, int64_t NH) {
    const int64_t hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / std::sqrt(double(hs));
    // One thread owns one (b, h): it is the only writer of that head's slice of dqkv.
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            std::vector<T> datt(Tn);
            for (int64_t t = 0; t < Tn; t++) {
                const T* a = att + ((b * NH + h) * Tn + t) * Tn;
                const T* dy = dout + (b * Tn + t) * C + h * hs;
                // out = sum_t2 a[t2] v[t2]: gradients for a and v
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const T* v = qkv + (b * Tn + t2) * C3 + 2 * C + h * hs;
                    T* dv = dqkv + (b * Tn + t2) * C3 + 2 * C + h * hs;
                    T s = 0;
                    for (int64_t i = 0; i < hs; i++) {
                        s += v[i] * dy[i];
                        dv[i] += a[t2] * dy[i];
                    }
                    datt[t2] = s;
                }
                // softmax backward: dpre = a * (datt - sum(a * datt))
                T dot = 0;
                for (int64_t t2 = 0; t2 <= t; t2++) dot += a[t2] * datt[t2];
                const T* q = qkv + (b * Tn + t) * C3 + h * hs;
                T* dq = dqkv + (b * Tn + t) * C3 + h * hs;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const T dpre = T(a[t2] * (datt[t2] - dot) * scale);
                    const T* k = qkv + (b * Tn + t2) * C3 + C + h * hs;
                    T* dk = dqkv + (b * Tn + t2) * C3 + C + h * hs;
                    for (int64_t i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
        }
    }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                       int64_t);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t,
                                        int64_t);
template void attention_backward<float>(float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, int64_t);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         int64_t, int64_t, int64_t, int64_t);

}  // namespace zgpt::cpu

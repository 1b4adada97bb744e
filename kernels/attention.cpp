#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/exp_vec.h"

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

// float, the training path: the same sums, laid out so that the compiler vectorises them. K and V
// of the head are transposed into [hs, Tn] first, so a row of scores (and of the probabilities'
// gradient) is built as hs vector updates along t2; each element still sums its hs products in
// order. exp is exp_vec (std::exp on double above, the gradient-check reference).
template <>
void attention_forward<float>(float* out, float* att, const float* qkv, int64_t B, int64_t Tn,
                              int64_t C, int64_t NH) {
    const int64_t hs = C / NH, C3 = 3 * C;
    const float scale = float(1.0 / std::sqrt(double(hs)));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            std::vector<float> kt(hs * Tn);
            for (int64_t t2 = 0; t2 < Tn; t2++) {
                const float* k = qkv + (b * Tn + t2) * C3 + C + h * hs;
                for (int64_t i = 0; i < hs; i++) kt[i * Tn + t2] = k[i];
            }
            for (int64_t t = 0; t < Tn; t++) {
                const float* q = qkv + (b * Tn + t) * C3 + h * hs;
                float* a = att + ((b * NH + h) * Tn + t) * Tn;
                const int64_t n = t + 1;
                std::fill(a, a + Tn, 0.0f);
                for (int64_t i = 0; i < hs; i++) {
                    const float qi = q[i];
                    const float* kr = kt.data() + i * Tn;
#pragma omp simd
                    for (int64_t t2 = 0; t2 < n; t2++) a[t2] += qi * kr[t2];
                }
                float maxv = -INFINITY;
                for (int64_t t2 = 0; t2 < n; t2++) {
                    a[t2] *= scale;
                    maxv = std::max(maxv, a[t2]);
                }
                float sum = 0;
#pragma omp simd reduction(+ : sum)
                for (int64_t t2 = 0; t2 < n; t2++) {
                    a[t2] = exp_vec(a[t2] - maxv);
                    sum += a[t2];
                }
                const float inv = 1.0f / sum;
#pragma omp simd
                for (int64_t t2 = 0; t2 < n; t2++) a[t2] *= inv;
                float* o = out + (b * Tn + t) * C + h * hs;
                std::fill(o, o + hs, 0.0f);
                for (int64_t t2 = 0; t2 < n; t2++) {
                    const float w = a[t2];
                    const float* v = qkv + (b * Tn + t2) * C3 + 2 * C + h * hs;
#pragma omp simd
                    for (int64_t i = 0; i < hs; i++) o[i] += w * v[i];
                }
            }
        }
    }
}

template <>
void attention_backward<float>(float* dqkv, const float* dout, const float* qkv, const float* att,
                               int64_t B, int64_t Tn, int64_t C, int64_t NH) {
    const int64_t hs = C / NH, C3 = 3 * C;
    const float scale = float(1.0 / std::sqrt(double(hs)));
    // One thread owns one (b, h): it is the only writer of that head's slice of dqkv.
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            std::vector<float> vt(hs * Tn), datt(Tn);
            for (int64_t t2 = 0; t2 < Tn; t2++) {
                const float* v = qkv + (b * Tn + t2) * C3 + 2 * C + h * hs;
                for (int64_t i = 0; i < hs; i++) vt[i * Tn + t2] = v[i];
            }
            for (int64_t t = 0; t < Tn; t++) {
                const float* a = att + ((b * NH + h) * Tn + t) * Tn;
                const float* dy = dout + (b * Tn + t) * C + h * hs;
                const int64_t n = t + 1;
                // out = sum_t2 a[t2] v[t2]: datt[t2] = v[t2] . dy, and dv[t2] += a[t2] dy
                std::fill(datt.begin(), datt.begin() + n, 0.0f);
                for (int64_t i = 0; i < hs; i++) {
                    const float di = dy[i];
                    const float* vr = vt.data() + i * Tn;
#pragma omp simd
                    for (int64_t t2 = 0; t2 < n; t2++) datt[t2] += di * vr[t2];
                }
                for (int64_t t2 = 0; t2 < n; t2++) {
                    const float w = a[t2];
                    float* dv = dqkv + (b * Tn + t2) * C3 + 2 * C + h * hs;
#pragma omp simd
                    for (int64_t i = 0; i < hs; i++) dv[i] += w * dy[i];
                }
                // softmax backward: dpre = a * (datt - sum(a * datt))
                float dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int64_t t2 = 0; t2 < n; t2++) dot += a[t2] * datt[t2];
                const float* q = qkv + (b * Tn + t) * C3 + h * hs;
                float* dq = dqkv + (b * Tn + t) * C3 + h * hs;
                for (int64_t t2 = 0; t2 < n; t2++) {
                    const float dpre = a[t2] * (datt[t2] - dot) * scale;
                    const float* k = qkv + (b * Tn + t2) * C3 + C + h * hs;
                    float* dk = dqkv + (b * Tn + t2) * C3 + C + h * hs;
#pragma omp simd
                    for (int64_t i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
        }
    }
}

template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t,
                                        int64_t);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         int64_t, int64_t, int64_t, int64_t);

}  // namespace zgpt::cpu

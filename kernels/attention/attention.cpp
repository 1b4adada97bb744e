#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/core/exp_vec.h"

namespace zgpt::cpu {

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                       int64_t NKV) {
    if (NKV == 0) NKV = NH;
    const int64_t hs = C / NH, KVC = NKV * hs, C3 = C + 2 * KVC, group = NH / NKV;
    const double scale = 1.0 / std::sqrt(double(hs));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            const int64_t kv = (h / group) * hs;  // this head's key and value columns
            for (int64_t t = 0; t < Tn; t++) {
                const T* q = qkv + (b * Tn + t) * C3 + h * hs;
                T* a = att + ((b * NH + h) * Tn + t) * Tn;
                double maxv = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const T* k = qkv + (b * Tn + t2) * C3 + C + kv;
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
                    const T* v = qkv + (b * Tn + t2) * C3 + C + KVC + kv;
                    for (int64_t i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
        }
    }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                        int64_t C, int64_t NH, int64_t NKV) {
    if (NKV == 0) NKV = NH;
    const int64_t hs = C / NH, KVC = NKV * hs, C3 = C + 2 * KVC, group = NH / NKV;
    const double scale = 1.0 / std::sqrt(double(hs));
    // One thread owns one (b, key/value head): it is the only writer of that head's slice of dqkv
    // and of its group's query heads', which it takes in order.
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t g = 0; g < NKV; g++) {
            const int64_t kv = g * hs;
            for (int64_t h = g * group; h < (g + 1) * group; h++) {
                std::vector<T> datt(Tn);
                for (int64_t t = 0; t < Tn; t++) {
                    const T* a = att + ((b * NH + h) * Tn + t) * Tn;
                    const T* dy = dout + (b * Tn + t) * C + h * hs;
                    // out = sum_t2 a[t2] v[t2]: gradients for a and v
                    for (int64_t t2 = 0; t2 <= t; t2++) {
                        const T* v = qkv + (b * Tn + t2) * C3 + C + KVC + kv;
                        T* dv = dqkv + (b * Tn + t2) * C3 + C + KVC + kv;
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
                        const T* k = qkv + (b * Tn + t2) * C3 + C + kv;
                        T* dk = dqkv + (b * Tn + t2) * C3 + C + kv;
                        for (int64_t i = 0; i < hs; i++) {
                            dq[i] += dpre * k[i];
                            dk[i] += dpre * q[i];
                        }
                    }
                }
            }
        }
    }
}

// float, the training path: the same sums, laid out for the vector units. Per head, K (forward) or
// V (backward) is transposed into [hs, Tp] with Tp = Tn rounded up to kLanes and the extra columns
// zero, so rows of scores (and of the probabilities' gradient) are built in whole blocks of kLanes
// columns, kRows queries at a time, each element still summing its hs products in order. The
// softmax runs over whole blocks with the columns past the diagonal masked. exp is exp_vec
// (std::exp on double above, the gradient-check reference).
namespace {

constexpr int64_t kLanes = 16;  // columns of a block: one AVX-512 register of floats
constexpr int64_t kRows = 4;    // queries that share each load of the transposed K or V
// A block of kRows queries ends at or before the end of its first query's last block of columns.
static_assert(kLanes % kRows == 0);

int64_t round_up(int64_t n, int64_t m) {
    return (n + m - 1) / m * m;
}

// s[r * Tp + j] = sum_i x_r[i] xt[i * Tp + j] for r < kRows, j < ncols (a multiple of kLanes);
// x_r = x + r * x_stride.
void rows_times_transposed(float* s, const float* x, int64_t x_stride, const float* xt, int64_t hs,
                           int64_t Tp, int64_t ncols) {
    static_assert(kRows == 4);
    // kLanes floats as one value (one AVX-512 register; two AVX2 ones), so the kRows x kLanes
    // accumulators stay in registers
    typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
    const float *x0 = x, *x1 = x + x_stride, *x2 = x + 2 * x_stride, *x3 = x + 3 * x_stride;
    for (int64_t jb = 0; jb < ncols; jb += kLanes) {
        Lanes a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (int64_t i = 0; i < hs; i++) {
            Lanes col;
            std::memcpy(&col, xt + i * Tp + jb, sizeof col);
            a0 += x0[i] * col;
            a1 += x1[i] * col;
            a2 += x2[i] * col;
            a3 += x3[i] * col;
        }
        std::memcpy(s + jb, &a0, sizeof a0);
        std::memcpy(s + Tp + jb, &a1, sizeof a1);
        std::memcpy(s + 2 * Tp + jb, &a2, sizeof a2);
        std::memcpy(s + 3 * Tp + jb, &a3, sizeof a3);
    }
}

// o[r * hsp + c] = sum_{j < n} p[r * p_rs + j * p_js] y[j * hsp + c] for r < kRows, c < hsp (a
// multiple of kLanes): kRows rows of coefficients times the rows of y, summed in order of j.
void coeffs_times_rows(float* o, const float* p, int64_t p_rs, int64_t p_js, const float* y,
                       int64_t hsp, int64_t n) {
    typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
    for (int64_t c = 0; c < hsp; c += kLanes) {
        Lanes a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (int64_t j = 0; j < n; j++) {
            Lanes row;
            std::memcpy(&row, y + j * hsp + c, sizeof row);
            const float* pj = p + j * p_js;
            a0 += pj[0] * row;
            a1 += pj[p_rs] * row;
            a2 += pj[2 * p_rs] * row;
            a3 += pj[3 * p_rs] * row;
        }
        std::memcpy(o + c, &a0, sizeof a0);
        std::memcpy(o + hsp + c, &a1, sizeof a1);
        std::memcpy(o + 2 * hsp + c, &a2, sizeof a2);
        std::memcpy(o + 3 * hsp + c, &a3, sizeof a3);
    }
}

// The rows t0 .. t0 + kRows - 1 of x (row stride `stride`), the last one repeated past Tn - 1,
// copied into xr [kRows, hs].
void gather_rows(float* xr, const float* x, int64_t stride, int64_t t0, int64_t Tn, int64_t hs) {
    for (int64_t r = 0; r < kRows; r++) {
        const float* src = x + std::min(t0 + r, Tn - 1) * stride;
        std::copy(src, src + hs, xr + r * hs);
    }
}

}  // namespace

template <>
void attention_forward<float>(float* out, float* att, const float* qkv, int64_t B, int64_t Tn,
                              int64_t C, int64_t NH, int64_t NKV) {
    if (NKV == 0) NKV = NH;
    const int64_t hs = C / NH, KVC = NKV * hs, C3 = C + 2 * KVC, group = NH / NKV,
                  Tp = round_up(Tn, kLanes);
    const float scale = float(1.0 / std::sqrt(double(hs)));
#pragma omp parallel
    {
        const int64_t hsp = round_up(hs, kLanes);
        std::vector<float> kt(hs * Tp), s(kRows * Tp), qr(kRows * hs), vh(Tn * hsp),
            orow(kRows * hsp);
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            for (int64_t h = 0; h < NH; h++) {
                const float* head = qkv + b * Tn * C3 + h * hs;  // q of row t at head + t * C3
                const float* kvh = qkv + b * Tn * C3 + C + (h / group) * hs;  // k; v at + KVC
                std::fill(kt.begin(), kt.end(), 0.0f);
                for (int64_t t2 = 0; t2 < Tn; t2++) {
                    const float* k = kvh + t2 * C3;
                    for (int64_t i = 0; i < hs; i++) kt[i * Tp + t2] = k[i];
                    const float* v = kvh + t2 * C3 + KVC;
                    std::copy(v, v + hs, vh.data() + t2 * hsp);
                    std::fill(vh.data() + t2 * hsp + hs, vh.data() + (t2 + 1) * hsp, 0.0f);
                }
                for (int64_t t0 = 0; t0 < Tn; t0 += kRows) {
                    const int64_t rows = std::min(kRows, Tn - t0);
                    gather_rows(qr.data(), head, C3, t0, Tn, hs);
                    rows_times_transposed(s.data(), qr.data(), hs, kt.data(), hs, Tp,
                                          round_up(t0 + rows, kLanes));
                    for (int64_t r = 0; r < rows; r++) {
                        const int64_t t = t0 + r, n = t + 1, nb = round_up(n, kLanes);
                        float* sr = s.data() + r * Tp;
                        float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
                        for (int64_t j = 0; j < nb; j++) {
                            sr[j] = j < n ? sr[j] * scale : -INFINITY;
                            maxv = std::max(maxv, sr[j]);
                        }
                        float sum = 0;
#pragma omp simd reduction(+ : sum)
                        for (int64_t j = 0; j < nb; j++) {
                            sr[j] = j < n ? exp_vec(sr[j] - maxv) : 0.0f;
                            sum += sr[j];
                        }
                        const float inv = 1.0f / sum;
#pragma omp simd
                        for (int64_t j = 0; j < nb; j++) sr[j] *= inv;  // 0 past the diagonal
                        float* a = att + ((b * NH + h) * Tn + t) * Tn;
                        std::copy(sr, sr + n, a);
                        std::fill(a + n, a + Tn, 0.0f);
                    }
                    // out = P V for the block's rows; a row's probabilities are 0 past its
                    // diagonal (rows past Tn - 1 repeat the last one)
                    for (int64_t r = rows; r < kRows; r++)
                        std::copy(s.data() + (rows - 1) * Tp, s.data() + rows * Tp,
                                  s.data() + r * Tp);
                    coeffs_times_rows(orow.data(), s.data(), Tp, 1, vh.data(), hsp, t0 + rows);
                    for (int64_t r = 0; r < rows; r++)
                        std::copy(orow.data() + r * hsp, orow.data() + r * hsp + hs,
                                  out + (b * Tn + t0 + r) * C + h * hs);
                }
            }
        }
    }
}

template <>
void attention_backward<float>(float* dqkv, const float* dout, const float* qkv, const float* att,
                               int64_t B, int64_t Tn, int64_t C, int64_t NH, int64_t NKV) {
    if (NKV == 0) NKV = NH;
    const int64_t hs = C / NH, KVC = NKV * hs, C3 = C + 2 * KVC, group = NH / NKV;
    const int64_t Tp = round_up(Tn, kLanes), hsp = round_up(hs, kLanes);
    const int64_t Tr = round_up(Tn, kRows);  // rows of the per-head buffers: whole blocks
    const float scale = float(1.0 / std::sqrt(double(hs)));
    // One thread owns one (b, key/value head) and its group's query heads, in order: it is the
    // only writer of their slices of dqkv. Per query head:
    // P (att) and dS (the scores' gradient) as [Tr, Tp], Q, K and dY as [Tr, hsp], all
    // zero-padded, then dQ = dS K, dK = dS^T Q and dV = P^T dY by blocks of kRows rows.
#pragma omp parallel
    {
        std::vector<float> vt(hs * Tp), datt(kRows * Tp), ph(Tr * Tp), ds(Tr * Tp), qh(Tr * hsp),
            kh(Tr * hsp), dyh(Tr * hsp), o(kRows * hsp);
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            for (int64_t g = 0; g < NKV; g++) {
                for (int64_t h = g * group; h < (g + 1) * group; h++) {
                    const float* head = qkv + b * Tn * C3 + h * hs;
                    const float* kvh = qkv + b * Tn * C3 + C + g * hs;  // k of row t; v at + KVC
                    std::fill(vt.begin(), vt.end(), 0.0f);
                    std::fill(ph.begin(), ph.end(), 0.0f);
                    std::fill(ds.begin(), ds.end(), 0.0f);
                    std::fill(qh.begin(), qh.end(), 0.0f);
                    std::fill(kh.begin(), kh.end(), 0.0f);
                    std::fill(dyh.begin(), dyh.end(), 0.0f);
                    for (int64_t t = 0; t < Tn; t++) {
                        const float* q = head + t * C3;
                        const float* k = kvh + t * C3;
                        std::copy(q, q + hs, qh.data() + t * hsp);
                        std::copy(k, k + hs, kh.data() + t * hsp);
                        for (int64_t i = 0; i < hs; i++) vt[i * Tp + t] = k[KVC + i];
                        const float* dy = dout + (b * Tn + t) * C + h * hs;
                        std::copy(dy, dy + hs, dyh.data() + t * hsp);
                        const float* a = att + ((b * NH + h) * Tn + t) * Tn;
                        std::copy(a, a + t + 1, ph.data() + t * Tp);
                    }
                    for (int64_t t0 = 0; t0 < Tn; t0 += kRows) {
                        const int64_t rows = std::min(kRows, Tn - t0);
                        // out = sum_t2 a[t2] v[t2]: datt[t2] = v[t2] . dy
                        rows_times_transposed(datt.data(), dyh.data() + t0 * hsp, hsp, vt.data(),
                                              hs, Tp, round_up(t0 + rows, kLanes));
                        for (int64_t r = 0; r < rows; r++) {
                            const int64_t n = t0 + r + 1;
                            const float* a = ph.data() + (t0 + r) * Tp;
                            const float* dr = datt.data() + r * Tp;
                            // softmax backward: dpre = a * (datt - sum(a * datt))
                            float dot = 0;
#pragma omp simd reduction(+ : dot)
                            for (int64_t j = 0; j < n; j++) dot += a[j] * dr[j];
                            float* dsr = ds.data() + (t0 + r) * Tp;
#pragma omp simd
                            for (int64_t j = 0; j < n; j++) dsr[j] = a[j] * (dr[j] - dot) * scale;
                        }
                        // dQ of the block's rows: dS K (dS is 0 past each row's diagonal)
                        coeffs_times_rows(o.data(), ds.data() + t0 * Tp, Tp, 1, kh.data(), hsp,
                                          t0 + rows);
                        for (int64_t r = 0; r < rows; r++) {
                            float* dq = dqkv + (b * Tn + t0 + r) * C3 + h * hs;
#pragma omp simd
                            for (int64_t i = 0; i < hs; i++) dq[i] += o[r * hsp + i];
                        }
                    }
                    for (int64_t t0 = 0; t0 < Tn; t0 += kRows) {
                        const int64_t rows = std::min(kRows, Tn - t0);
                        // keys t0 .. t0 + kRows - 1: only queries t >= t0 see them
                        float* dk = dqkv + (b * Tn + t0) * C3 + C + g * hs;
                        coeffs_times_rows(o.data(), ds.data() + t0 * Tp + t0, 1, Tp,
                                          qh.data() + t0 * hsp, hsp, Tn - t0);
                        for (int64_t r = 0; r < rows; r++)
#pragma omp simd
                            for (int64_t i = 0; i < hs; i++) dk[r * C3 + i] += o[r * hsp + i];
                        coeffs_times_rows(o.data(), ph.data() + t0 * Tp + t0, 1, Tp,
                                          dyh.data() + t0 * hsp, hsp, Tn - t0);
                        for (int64_t r = 0; r < rows; r++)
#pragma omp simd
                            for (int64_t i = 0; i < hs; i++) dk[r * C3 + KVC + i] += o[r * hsp + i];
                    }
                }
            }
        }
    }
}

template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t,
                                        int64_t, int64_t);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace zgpt::cpu

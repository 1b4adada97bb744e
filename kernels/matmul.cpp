#include "kernels/matmul.h"

namespace zgpt::cpu {

// Every output element is owned by one thread and summed in a fixed order, so results do not depend
// on the thread count (repeatable runs). Loops are ordered so the inner one is contiguous.

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC) {
    constexpr int64_t kRows = 4;  // rows of inp per weight-row pass: 4x reuse of each weight load
#pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += kRows) {
        const int64_t rows = n0 + kRows <= N ? kRows : N - n0;
        for (int64_t o = 0; o < OC; o++) {
            const T* w = weight + o * C;
            T acc[kRows] = {};
            for (int64_t r = 0; r < rows; r++) {
                const T* x = inp + (n0 + r) * C;
                T s = 0;
#pragma omp simd reduction(+ : s)
                for (int64_t c = 0; c < C; c++) s += x[c] * w[c];
                acc[r] = s;
            }
            for (int64_t r = 0; r < rows; r++)
                out[(n0 + r) * OC + o] = acc[r] + (bias ? bias[o] : T(0));
        }
    }
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            T* dx = dinp + n * C;
            const T* dy = dout + n * OC;
            for (int64_t o = 0; o < OC; o++) {
                const T g = dy[o];
                const T* w = weight + o * C;
#pragma omp simd
                for (int64_t c = 0; c < C; c++) dx[c] += g * w[c];
            }
        }
    }
    if (dweight || dbias) {
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < OC; o++) {
            T* dw = dweight ? dweight + o * C : nullptr;
            T db = 0;
            for (int64_t n = 0; n < N; n++) {
                const T g = dout[n * OC + o];
                db += g;
                if (dw) {
                    const T* x = inp + n * C;
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) dw[c] += g * x[c];
                }
            }
            if (dbias) dbias[o] += db;
        }
    }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t);
template void matmul_forward<double>(double*, const double*, const double*, const double*, int64_t,
                                     int64_t, int64_t);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t);

}  // namespace zgpt::cpu

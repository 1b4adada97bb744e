#include "kernels/norms/rmsnorm.h"

#include <cmath>

namespace zgpt::cpu {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     double eps) {
#pragma omp parallel for
    for (int64_t n = 0; n < N; n++) {
        const T* x = inp + n * C;
        double ss = 0;
        for (int64_t c = 0; c < C; c++) ss += double(x[c]) * x[c];
        const double r = 1.0 / std::sqrt(ss / double(C) + eps);
        T* o = out + n * C;
        for (int64_t c = 0; c < C; c++) o[c] = T(x[c] * r) * weight[c];
        rstd[n] = T(r);
    }
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C) {
    // y = w x r with r = (mean(x^2) + eps)^-1/2: dx = r (w dy - x r^2 mean(w dy x)).
#pragma omp parallel for
    for (int64_t n = 0; n < N; n++) {
        const T* x = inp + n * C;
        const T* dy = dout + n * C;
        const double r = rstd[n];
        double dot = 0;
        for (int64_t c = 0; c < C; c++) dot += double(weight[c]) * dy[c] * x[c];
        const double k = dot / double(C) * r * r;
        T* dx = dinp + n * C;
        for (int64_t c = 0; c < C; c++)
            dx[c] += T(r * (double(weight[c]) * dy[c] - double(x[c]) * k));
    }
    // One thread per column, rows in order: deterministic.
#pragma omp parallel for
    for (int64_t c = 0; c < C; c++) {
        double dw = 0;
        for (int64_t n = 0; n < N; n++) dw += double(dout[n * C + c]) * inp[n * C + c] * rstd[n];
        dweight[c] += T(dw);
    }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t,
                                     double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int64_t, int64_t);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int64_t, int64_t);

}  // namespace zgpt::cpu

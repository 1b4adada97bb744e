#include "kernels/norms/layernorm.h"

#include <cmath>

namespace zgpt::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, double eps) {
#pragma omp parallel for
    for (int64_t n = 0; n < N; n++) {
        const T* x = inp + n * C;
        double s = 0;
        for (int64_t c = 0; c < C; c++) s += x[c];
        const double m = s / double(C);
        double v = 0;
        for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        const double r = 1.0 / std::sqrt(v / double(C) + eps);
        T* o = out + n * C;
        for (int64_t c = 0; c < C; c++) {
            const T xhat = T((x[c] - m) * r);
            o[c] = xhat * weight[c] + (bias ? bias[c] : T(0));
        }
        mean[n] = T(m);
        rstd[n] = T(r);
    }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for
    for (int64_t n = 0; n < N; n++) {
        const T* x = inp + n * C;
        const T* dy = dout + n * C;
        const T m = mean[n], r = rstd[n];
        double dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int64_t c = 0; c < C; c++) {
            const double dnorm = double(weight[c]) * dy[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * r;
        }
        dnorm_mean /= double(C);
        dnorm_norm_mean /= double(C);
        T* dx = dinp + n * C;
        for (int64_t c = 0; c < C; c++) {
            const double xhat = double(x[c] - m) * r;
            const double dnorm = double(weight[c]) * dy[c];
            dx[c] += T((dnorm - dnorm_mean - xhat * dnorm_norm_mean) * r);
        }
    }
    // Parameter gradients: one thread per column, rows in order, so the sum is deterministic.
#pragma omp parallel for
    for (int64_t c = 0; c < C; c++) {
        double dw = 0, db = 0;
        for (int64_t n = 0; n < N; n++) {
            const double dy = dout[n * C + c];
            dw += dy * double(inp[n * C + c] - mean[n]) * rstd[n];
            db += dy;
        }
        dweight[c] += T(dw);
        if (dbias) dbias[c] += T(db);
    }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int64_t, int64_t, double);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, int64_t, int64_t, double);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int64_t, int64_t);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, int64_t,
                                         int64_t);

}  // namespace zgpt::cpu

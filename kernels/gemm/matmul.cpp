#include "kernels/gemm/matmul.h"

#ifdef ZGPT_HAVE_OPENBLAS
#include <cblas.h>
#include <omp.h>
#endif

namespace zgpt::cpu {

// The plain loops: every output element is owned by one thread and summed in a fixed order, so
// results do not depend on the thread count. Loops are ordered so the inner one is contiguous.
// They serve double (the gradient checks and the CUDA tests' reference) always, and float where
// the build has no OpenBLAS.

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

#ifdef ZGPT_HAVE_OPENBLAS
// float through OpenBLAS's sgemm (3x the plain loops on the CPU recipe's shapes, docs/results/
// cpu_vs_nanogpt.json). It runs on as many threads as OpenMP would (train.threads); its results
// repeat run to run at a fixed thread count.
namespace {

void use_openmp_thread_count() {
    thread_local int set = 0;
    const int want = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (want != set) {
        openblas_set_num_threads(want);
        set = want;
    }
}

}  // namespace

template <>
void matmul_forward<float>(float* out, const float* inp, const float* weight, const float* bias,
                           int64_t N, int64_t C, int64_t OC) {
    use_openmp_thread_count();
    // out[N, OC] = inp[N, C] weight[OC, C]^T (+ bias, added after: the loops' order of sums)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(OC), int(C), 1.0f, inp, int(C),
                weight, int(C), 0.0f, out, int(OC));
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
#pragma omp simd
        for (int64_t o = 0; o < OC; o++) out[n * OC + o] += bias[o];
}

template <>
void matmul_backward<float>(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int64_t N, int64_t C,
                            int64_t OC) {
    use_openmp_thread_count();
    if (dinp)  // dinp[N, C] += dout[N, OC] weight[OC, C]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(C), int(OC), 1.0f, dout,
                    int(OC), weight, int(C), 1.0f, dinp, int(C));
    if (dweight)  // dweight[OC, C] += dout[N, OC]^T inp[N, C]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(C), int(N), 1.0f, dout,
                    int(OC), inp, int(C), 1.0f, dweight, int(C));
    if (dbias) {
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < OC; o++) {
            float db = 0;
            for (int64_t n = 0; n < N; n++) db += dout[n * OC + o];
            dbias[o] += db;
        }
    }
}
#else
template void matmul_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t);
#endif
template void matmul_forward<double>(double*, const double*, const double*, const double*, int64_t,
                                     int64_t, int64_t);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t);

}  // namespace zgpt::cpu

#include "kernels/ops/residual.h"

namespace zgpt::cpu {

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

template <typename T>
void residual_backward(T* da, T* db, const T* dout, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);
template void residual_backward<float>(float*, float*, const float*, int64_t);
template void residual_backward<double>(double*, double*, const double*, int64_t);

}  // namespace zgpt::cpu

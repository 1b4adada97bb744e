#include "kernels/ops/adamw.h"

#include <cmath>

namespace zgpt::cpu {

template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, const AdamWStep& s) {
    const double bc1 = 1.0 - std::pow(s.beta1, double(s.t));
    const double bc2 = 1.0 - std::pow(s.beta2, double(s.t));
    const double decay = 1.0 - s.lr * s.weight_decay;
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const double g = double(grads[i]) * s.grad_scale;
        const double mi = s.beta1 * m[i] + (1.0 - s.beta1) * g;
        const double vi = s.beta2 * v[i] + (1.0 - s.beta2) * g * g;
        m[i] = T(mi);
        v[i] = T(vi);
        const double update = (mi / bc1) / (std::sqrt(vi / bc2) + s.eps);
        params[i] = T(double(params[i]) * decay - s.lr * update);
    }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamWStep&);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamWStep&);

}  // namespace zgpt::cpu

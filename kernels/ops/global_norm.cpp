#include "kernels/ops/global_norm.h"

#include <algorithm>

namespace zgpt::cpu {

template <typename T>
double sum_of_squares(const T* x, int64_t n) {
    // Fixed chunks summed in a fixed order: the result does not depend on the thread count.
    constexpr int64_t kChunks = 64;
    double partial[kChunks] = {};
    const int64_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < kChunks; k++) {
        double s = 0.0;
        for (int64_t i = k * chunk; i < std::min(n, (k + 1) * chunk); i++) s += double(x[i]) * x[i];
        partial[k] = s;
    }
    double s = 0.0;
    for (double p : partial) s += p;
    return s;
}

template double sum_of_squares<float>(const float*, int64_t);
template double sum_of_squares<double>(const double*, int64_t);

}  // namespace zgpt::cpu

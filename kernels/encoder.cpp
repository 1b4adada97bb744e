#include "kernels/encoder.h"

namespace zgpt::cpu {

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                     int64_t Tn, int64_t C) {
#pragma omp parallel for
    for (int64_t bt = 0; bt < B * Tn; bt++) {
        const T* e = wte + int64_t(tokens[bt]) * C;
        const T* p = wpe + (bt % Tn) * C;
        T* o = out + bt * C;
        for (int64_t c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

template <typename T>
void add_positions(T* out, const T* token_rows, const T* wpe, int64_t B, int64_t Tn, int64_t C) {
#pragma omp parallel for
    for (int64_t bt = 0; bt < B * Tn; bt++) {
        const T* e = token_rows + bt * C;
        const T* p = wpe + (bt % Tn) * C;
        T* o = out + bt * C;
        for (int64_t c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn,
                      int64_t C) {
    // Rows that share a token add into the same dwte row, so this runs in a fixed serial order
    // (deterministic); it is a tiny share of a step.
    for (int64_t bt = 0; bt < B * Tn; bt++) {
        const T* d = dout + bt * C;
        if (dwte) {
            T* e = dwte + int64_t(tokens[bt]) * C;
            for (int64_t c = 0; c < C; c++) e[c] += d[c];
        }
        if (dwpe) {
            T* p = dwpe + (bt % Tn) * C;
            for (int64_t c = 0; c < C; c++) p[c] += d[c];
        }
    }
}

template void encoder_forward<float>(float*, const int32_t*, const float*, const float*, int64_t,
                                     int64_t, int64_t);
template void encoder_forward<double>(double*, const int32_t*, const double*, const double*,
                                      int64_t, int64_t, int64_t);
template void add_positions<float>(float*, const float*, const float*, int64_t, int64_t, int64_t);
template void add_positions<double>(double*, const double*, const double*, int64_t, int64_t,
                                    int64_t);
template void encoder_backward<float>(float*, float*, const float*, const int32_t*, int64_t,
                                      int64_t, int64_t);
template void encoder_backward<double>(double*, double*, const double*, const int32_t*, int64_t,
                                       int64_t, int64_t);

}  // namespace zgpt::cpu

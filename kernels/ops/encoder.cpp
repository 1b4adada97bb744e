#include "kernels/ops/encoder.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace zgpt::cpu {

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                     int64_t Tn, int64_t C) {
#pragma omp parallel for
    for (int64_t bt = 0; bt < B * Tn; bt++) {
        const T* e = wte + int64_t(tokens[bt]) * C;
        T* o = out + bt * C;
        if (!wpe) {  // rotary positions: no table
            for (int64_t c = 0; c < C; c++) o[c] = e[c];
            continue;
        }
        const T* p = wpe + (bt % Tn) * C;
        for (int64_t c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

template <typename T>
void add_positions(T* out, const T* token_rows, const T* wpe, int64_t B, int64_t Tn, int64_t C) {
#pragma omp parallel for
    for (int64_t bt = 0; bt < B * Tn; bt++) {
        const T* e = token_rows + bt * C;
        T* o = out + bt * C;
        if (!wpe) {
            for (int64_t c = 0; c < C; c++) o[c] = e[c];
            continue;
        }
        const T* p = wpe + (bt % Tn) * C;
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

namespace zgpt::cuda {

// Host code (the CUDA kernels' plan), in every build so that the CPU tests check it.
TokenBuckets bucket_tokens(const int32_t* tokens, int64_t n) {
    ZG_CHECK(n >= 0 && n < INT32_MAX, "bucket_tokens: too many positions");
    std::vector<int32_t> order;
    order.reserve(n);
    for (int32_t i = 0; i < int32_t(n); i++)
        if (tokens[i] >= 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
    TokenBuckets r;
    r.position = std::move(order);
    const int32_t m = int32_t(r.position.size());
    int32_t slots = 0;
    for (int32_t a = 0; a < m;) {  // the run of one token: [a, b)
        int32_t b = a + 1;
        while (b < m && tokens[r.position[b]] == tokens[r.position[a]]) b++;
        const int32_t tok = tokens[r.position[a]];
        const bool split = b - a > kBucketSegment;
        if (split) {
            r.merge_token.push_back(tok);
            r.merge_offset.push_back(slots);
        }
        for (int32_t e = a; e < b; e += kBucketSegment) {
            r.token.push_back(tok);
            r.offset.push_back(e);
            r.slot.push_back(split ? slots++ : -1);
        }
        a = b;
    }
    r.offset.push_back(m);
    r.merge_offset.push_back(slots);
    ZG_CHECK(slots <= bucket_partial_rows(n), "bucket_tokens: more partials than the bound");
    return r;
}

}  // namespace zgpt::cuda

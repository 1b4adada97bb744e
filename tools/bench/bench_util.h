// Helpers the CUDA benchmarks share (bench_ce, bench_attention, bench_gemm): device-event
// timing, the copy bandwidth and bf16 matmul rate of the GPU they run on (the floors'
// denominators), and cheap deterministic bf16 fills.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/gemm/matmul.h"

namespace zgpt::bench {

#define CK(x)                                                               \
    do {                                                                    \
        cudaError_t e_ = (x);                                               \
        if (e_ != cudaSuccess) {                                            \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
                         cudaGetErrorString(e_));                           \
            std::exit(1);                                                   \
        }                                                                   \
    } while (0)

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Device-to-device copy bandwidth (bytes read + written per second) on a 4 GiB buffer.
inline double copy_bandwidth() {
    const size_t bytes = size_t(4) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> ms;
    for (int i = 0; i < 12; i++) {
        cudaEventRecord(e0);
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 2) ms.push_back(t);
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(bytes) / (median(ms) * 1e-3);
}

// Median milliseconds of fn() over iters runs (after 3 warm-ups), timed with device events;
// before() runs ahead of each, outside the events (e.g. restoring inputs that fn overwrites).
template <typename F, typename B = void (*)()>
inline double time_ms(
    F&& fn, int iters, B before = [] {}) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> ms;
    for (int it = 0; it < iters + 3; it++) {
        before();
        cudaEventRecord(e0);
        fn();
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= 3) ms.push_back(t);
    }
    return median(ms);
}

// Fills bf16 values with a triangular distribution on (-half_width, half_width), std
// half_width / sqrt(6) (sum of two hashed uniforms: cheap, never zero) and uploads them.
inline void fill_logits(__nv_bfloat16* d, size_t n, uint64_t seed, double half_width = 3.4) {
    std::vector<__nv_bfloat16> h(std::min<size_t>(n, size_t(1) << 26));
    for (size_t i = 0; i < h.size(); i++) {
        uint64_t z = (seed + i) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
        const double u1 = double((z >> 11) & ((1ull << 26) - 1)) / double(1ull << 26);
        const double u2 = double(z >> 37) / double(1ull << 27);
        h[i] = __float2bfloat16_rn(float(half_width * (u1 + u2 - 1.0)));
    }
    for (size_t off = 0; off < n; off += h.size())
        CK(cudaMemcpy(d + off, h.data(), std::min(h.size(), n - off) * 2, cudaMemcpyHostToDevice));
}

// The bf16 8192^3 product through the trainer's cuBLASLt wrapper, the one the FLOP floors are
// taken at: A and B filled, C written.
class SquareProduct {
  public:
    static constexpr int64_t kS = 8192;
    static constexpr double kFlop = 2.0 * kS * kS * kS;
    SquareProduct() {
        CK(cudaMalloc(&a_, size_t(kS) * kS * 2 * 3));
        fill_logits(a_, size_t(kS) * kS * 2, 11);
    }
    ~SquareProduct() { cudaFree(a_); }
    SquareProduct(const SquareProduct&) = delete;
    SquareProduct& operator=(const SquareProduct&) = delete;
    void run() const {
        zgpt::cuda::gemm_bf16(a_ + 2 * kS * kS, zgpt::cuda::MatType::bf16, a_, false, a_ + kS * kS,
                              false, kS, kS, kS, 1.0f, 0.0f, nullptr);
    }

  private:
    __nv_bfloat16* a_ = nullptr;
};

// bf16 matmul rate (FLOP/s) of SquareProduct: the rate the FLOP floors are taken at.
inline double matmul_rate(int iters) {
    const SquareProduct p;
    const double ms = time_ms([&] { p.run(); }, iters);
    return SquareProduct::kFlop / (ms * 1e-3);
}

}  // namespace zgpt::bench

// Scaffolding of the GPU tests: device buffers that free themselves, values rounded as the device
// stores them, and element-wise checks with the tolerances argued in each test file. A binary that
// runs only on a GPU also includes tests/gpu_only.h (the whole-binary skip).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/rng.h"
#include "tests/helpers.h"

namespace zgpt::test {

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

// Raw device bytes that free themselves.
struct Dev {
    void* p = nullptr;
    size_t bytes = 0;
    explicit Dev(size_t b) : bytes(b) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(b, 16))); }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    template <typename T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

inline float bf16_round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

// x as a device tensor of type t holds it.
inline double as_stored(double x, DType t) {
    return t == DType::f32 ? double(float(x)) : double(bf16_round(float(x)));
}

// A device tensor of type t, filled from doubles (rounded to t) and read back as doubles.
struct DevT {
    DType t;
    int64_t n;
    void* p = nullptr;
    // The zeros and set()'s values have landed when these return: cudaMemset and a pageable
    // cudaMemcpy may return first, and kernels on a non-blocking stream are not ordered after them.
    DevT(DType type, int64_t count) : t(type), n(count) {
        CUDA_OK(cudaMalloc(&p, std::max<size_t>(size_t(n) * dtype_bytes(t), 16)));
        CUDA_OK(cudaMemset(p, 0, std::max<size_t>(size_t(n) * dtype_bytes(t), 16)));
        CUDA_OK(cudaDeviceSynchronize());
    }
    DevT(DType type, const std::vector<double>& v) : DevT(type, int64_t(v.size())) { set(v); }
    ~DevT() { cudaFree(p); }
    DevT(const DevT&) = delete;
    void set(const std::vector<double>& v) {
        REQUIRE(int64_t(v.size()) == n);
        if (t == DType::f32) {
            std::vector<float> h(v.begin(), v.end());
            CUDA_OK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
        } else {
            std::vector<__nv_bfloat16> h(n);
            for (int64_t i = 0; i < n; i++) h[i] = __float2bfloat16_rn(float(v[i]));
            CUDA_OK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
        }
        CUDA_OK(cudaDeviceSynchronize());
    }
    std::vector<double> get() const {
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<double> r(n);
        if (t == DType::f32) {
            std::vector<float> h(n);
            CUDA_OK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < n; i++) r[i] = h[i];
        } else {
            std::vector<__nv_bfloat16> h(n);
            CUDA_OK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < n; i++) r[i] = __bfloat162float(h[i]);
        }
        return r;
    }
    float* f() const { return static_cast<float*>(p); }
};

// Random normal values, as the device will store them (so the reference reads the same inputs).
inline std::vector<double> rnd(Rng& rng, int64_t n, DType t, double scale = 1.0) {
    std::vector<double> v(n);
    for (double& x : v) x = as_stored(scale * rng.normal(), t);
    return v;
}

inline double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

// One rounding of an output: fp32 1e-5 (sums of thousands of terms); bf16 2^-8 (half an ulp is
// 2^-9).
inline double rtol_of(DType t) {
    return t == DType::f32 ? 1e-5 : 1.0 / 256;
}

// got against want with rtol_of(t), plus an absolute atol_scale (default: rtol) of the largest
// reference magnitude for elements made by cancellation.
inline void check_close(const char* what, const std::vector<double>& got,
                        const std::vector<double>& want, DType t, double atol_scale = -1) {
    REQUIRE(got.size() == want.size());
    const double r = rtol_of(t);
    const double atol = (atol_scale < 0 ? r : atol_scale) * max_abs(want);
    const MaxError e = compare(got.data(), want.data(), int64_t(got.size()), r, atol);
    INFO(std::string(what) << " (" << dtype_name(t) << "): max abs err " << e.abs
                           << ", max rel err " << e.rel << ", worst index " << e.worst << " of "
                           << got.size());
    CHECK(e.ok);
}

}  // namespace zgpt::test

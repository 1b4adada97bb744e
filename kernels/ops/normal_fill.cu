#include "kernels/ops/normal_fill.h"

#include <algorithm>

#include "kernels/core/cuda_check.h"

namespace zgpt::cuda {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // rng.cpp's splitmix64 step

__device__ double uniform_at(uint64_t state) {  // Rng::uniform() with the counter at `state`
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) * 0x1.0p-53;
}

__global__ void normal_fill_kernel(float* out, int64_t n, uint64_t seed, uint64_t first,
                                   double stddev) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        // draw k takes the counter's steps 2k + 1 and 2k + 2 (Rng::normal, Rng::skip_normals)
        const uint64_t base = seed + 2 * (first + uint64_t(i)) * kGolden;
        double u1 = uniform_at(base + kGolden);
        const double u2 = uniform_at(base + 2 * kGolden);
        if (u1 < 1e-300) u1 = 1e-300;
        const double x = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        out[i] = float(stddev * x);
    }
}

}  // namespace

void normal_fill(float* out, int64_t n, uint64_t seed, uint64_t first, double stddev,
                 CUstream_st* s) {
    if (n <= 0) return;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 16);
    normal_fill_kernel<<<unsigned(blocks), threads, 0, s>>>(out, n, seed, first, stddev);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void normal_fill_host(float* host, int64_t n, uint64_t seed, uint64_t first, double stddev) {
    constexpr int64_t kChunk = int64_t(64) << 20;  // floats
    const int64_t chunk = std::min(n, kChunk);
    if (chunk <= 0) return;
    float* dev = nullptr;
    ZG_CUDA_CHECK(cudaMalloc(&dev, size_t(chunk) * sizeof(float)));
    for (int64_t off = 0; off < n; off += chunk) {
        const int64_t len = std::min(chunk, n - off);
        normal_fill(dev, len, seed, first + uint64_t(off), stddev, nullptr);
        ZG_CUDA_CHECK(
            cudaMemcpy(host + off, dev, size_t(len) * sizeof(float), cudaMemcpyDeviceToHost));
    }
    ZG_CUDA_CHECK(cudaFree(dev));
}

}  // namespace zgpt::cuda

// What a plain streaming kernel reaches on this GPU at the loss head's shape: bf16 [16384, V] read
// once and written once, by cudaMemcpy, by a grid-stride kernel of 16-byte loads and stores, and
// by the same kernel with one or two exponentials a value (two: the fused head's arithmetic, a
// sum of exponentials and a scaled exponential). The rate `fast` could reach if its structure
// cost nothing (fast_stats_sweeps in docs/results/ce_vocab_sweep_h200.json).
//   nvcc -O3 -arch=sm_90 -I. tools/dev/probes/stream_rate.cu -o /tmp/stream_rate &&
//   /tmp/stream_rate [V]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "tools/bench/bench_util.h"  // CK, time_ms: the benchmarks' device-event timing

// kExps exponentials a value (0: a copy)
template <int kExps>
__global__ void __launch_bounds__(256)
    stream(const int4* __restrict__ x, int4* __restrict__ y, long long n, float m, float* sink) {
    float acc = 0.0f;
    const long long step = gridDim.x * 256ll;
#pragma unroll 4
    for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += step) {
        int4 r = x[i];
        if constexpr (kExps > 0) {
            const unsigned w[4] = {unsigned(r.x), unsigned(r.y), unsigned(r.z), unsigned(r.w)};
            float v[8];
            for (int k = 0; k < 4; k++) {
                v[2 * k] = __uint_as_float(w[k] << 16);
                v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
            }
            for (int k = 0; k < 8; k++) {
                const float t = v[k] * 1.4426950f - m;
                if constexpr (kExps == 2) acc += exp2f(t + 0.5f);
                v[k] = exp2f(t) * 0.75f;
            }
            __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&r);
            for (int k = 0; k < 4; k++) e[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        }
        y[i] = r;
    }
    if (kExps == 2 && acc == 12345.0f) *sink = acc;  // keeps the sums
}

int main(int argc, char** argv) {
    const long long N = 16384, V = argc > 1 ? std::atoll(argv[1]) : 128256;
    const size_t bytes = size_t(N) * size_t(V) * 2;
    void *x, *y;
    float* sink;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(x, 0, bytes));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const long long chunks = (long long)(bytes / 16);
    const char* names[] = {"cudaMemcpy", "copy kernel", "one exp a value", "two exp a value"};
    for (int blocks_per_sm : {4, 8, 16}) {
        for (int mode = 0; mode < 4; mode++) {
            if (mode == 0 && blocks_per_sm != 4) continue;
            const int grid = sms * blocks_per_sm;
            const double ms = zgpt::bench::time_ms(
                [&] {
                    if (mode == 0)
                        CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice));
                    else if (mode == 1)
                        stream<0><<<grid, 256>>>((int4*)x, (int4*)y, chunks, 1.0f, sink);
                    else if (mode == 2)
                        stream<1><<<grid, 256>>>((int4*)x, (int4*)y, chunks, 1.0f, sink);
                    else
                        stream<2><<<grid, 256>>>((int4*)x, (int4*)y, chunks, 1.0f, sink);
                },
                10);
            std::printf("V=%lld %-16s blocks/SM %2d: %.3f ms, %.3f TB/s (read + write)\n", V,
                        names[mode], mode ? blocks_per_sm : 0, ms,
                        2.0 * double(bytes) / (ms * 1e-3) / 1e12);
        }
    }
    return 0;
}

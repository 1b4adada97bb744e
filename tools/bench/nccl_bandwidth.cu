// All-reduce bandwidth through NCCL across this machine's GPUs, the measure that the data-parallel
// gradient all-reduce is judged against (docs/parallel.md). One process drives every GPU
// (ncclCommInitAll); each size is warmed up, then timed with CUDA events on every GPU, and the
// slowest GPU's time counts. Reported as nccl-tests does: algorithm bandwidth = bytes / time,
// bus bandwidth = algbw x 2 (n - 1) / n, the rate each link must carry (comparable across n).
//
//   nccl_bandwidth [--gpus N] [--iters 20] [--out result.json]
#include <cuda_runtime.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/core/check.h"
#include "kernels/core/cuda_check.h"

namespace {

void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess)
        throw zgpt::Error(std::string("nccl_bandwidth: ") + what + ": " + ncclGetErrorString(r));
}

__global__ void fill(float* x, size_t n, float v) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        x[i] = v;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"NCCL all-reduce bandwidth across this machine's GPUs"};
    int gpus = 0, iters = 20;
    std::string out;
    app.add_option("--gpus", gpus, "GPUs to use (default: all)");
    app.add_option("--iters", iters, "timed all-reduces per size")->check(CLI::Range(1, 10000));
    app.add_option("--out", out, "write the result as JSON here");
    CLI11_PARSE(app, argc, argv);
    try {
        int have = 0;
        ZG_CUDA_CHECK(cudaGetDeviceCount(&have));
        if (gpus == 0) gpus = have;
        ZG_CHECK(gpus >= 1 && gpus <= have, "nccl_bandwidth: --gpus " + std::to_string(gpus) +
                                                " but this machine has " + std::to_string(have));
        std::vector<int> devs(gpus);
        for (int i = 0; i < gpus; i++) devs[i] = i;
        std::vector<ncclComm_t> comms(gpus);
        nccl_check(ncclCommInitAll(comms.data(), gpus, devs.data()), "ncclCommInitAll");
        const std::vector<size_t> sizes_mb = {1, 8, 64, 256, 512, 1024};
        const size_t max_n = sizes_mb.back() << 18;  // floats
        std::vector<float*> buf(gpus);
        std::vector<cudaStream_t> st(gpus);
        std::vector<cudaEvent_t> e0(gpus), e1(gpus);
        for (int g = 0; g < gpus; g++) {
            ZG_CUDA_CHECK(cudaSetDevice(g));
            ZG_CUDA_CHECK(cudaMalloc(&buf[g], max_n * 4));
            ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
            ZG_CUDA_CHECK(cudaEventCreate(&e0[g]));
            ZG_CUDA_CHECK(cudaEventCreate(&e1[g]));
        }
        auto all_reduce = [&](size_t n) {
            nccl_check(ncclGroupStart(), "ncclGroupStart");
            for (int g = 0; g < gpus; g++)
                nccl_check(ncclAllReduce(buf[g], buf[g], n, ncclFloat32, ncclSum, comms[g], st[g]),
                           "ncclAllReduce");
            nccl_check(ncclGroupEnd(), "ncclGroupEnd");
        };
        auto sync_all = [&] {
            for (int g = 0; g < gpus; g++) ZG_CUDA_CHECK(cudaStreamSynchronize(st[g]));
        };
        // Correctness first: GPU g holds g + 1 everywhere; the sum is n (n + 1) / 2.
        for (int g = 0; g < gpus; g++) {
            ZG_CUDA_CHECK(cudaSetDevice(g));
            fill<<<1024, 256, 0, st[g]>>>(buf[g], max_n, float(g + 1));
        }
        all_reduce(max_n);
        sync_all();
        const float expect = float(gpus) * float(gpus + 1) / 2;
        for (int g = 0; g < gpus; g++) {
            float probe[2];
            ZG_CUDA_CHECK(cudaSetDevice(g));
            ZG_CUDA_CHECK(cudaMemcpy(&probe[0], buf[g], 4, cudaMemcpyDeviceToHost));
            ZG_CUDA_CHECK(cudaMemcpy(&probe[1], buf[g] + max_n - 1, 4, cudaMemcpyDeviceToHost));
            ZG_CHECK(probe[0] == expect && probe[1] == expect,
                     "nccl_bandwidth: GPU " + std::to_string(g) + " got a wrong sum");
        }
        nlohmann::json rows = nlohmann::json::array();
        std::printf("%d GPUs, fp32 all-reduce, %d iterations per size\n", gpus, iters);
        std::printf("%10s %10s %12s %12s\n", "MB", "ms", "algbw GB/s", "busbw GB/s");
        for (size_t mb : sizes_mb) {
            const size_t n = mb << 18;
            for (int w = 0; w < 5; w++) all_reduce(n);
            sync_all();
            for (int g = 0; g < gpus; g++) {
                ZG_CUDA_CHECK(cudaSetDevice(g));
                ZG_CUDA_CHECK(cudaEventRecord(e0[g], st[g]));
            }
            for (int i = 0; i < iters; i++) all_reduce(n);
            float worst = 0;
            for (int g = 0; g < gpus; g++) {
                ZG_CUDA_CHECK(cudaSetDevice(g));
                ZG_CUDA_CHECK(cudaEventRecord(e1[g], st[g]));
                ZG_CUDA_CHECK(cudaEventSynchronize(e1[g]));
                float ms = 0;
                ZG_CUDA_CHECK(cudaEventElapsedTime(&ms, e0[g], e1[g]));
                worst = std::max(worst, ms);
            }
            const double ms = worst / iters, bytes = double(n) * 4;
            const double algbw = bytes / (ms * 1e-3) / 1e9;
            const double busbw = algbw * 2.0 * (gpus - 1) / gpus;
            std::printf("%10zu %10.3f %12.1f %12.1f\n", mb, ms, algbw, busbw);
            rows.push_back(
                {{"megabytes", mb}, {"ms", ms}, {"algbw_gb_s", algbw}, {"busbw_gb_s", busbw}});
        }
        for (int g = 0; g < gpus; g++) {
            ncclCommDestroy(comms[g]);
            cudaSetDevice(g);
            cudaFree(buf[g]);
        }
        if (!out.empty()) {
            nlohmann::json j{{"gpus", gpus}, {"dtype", "fp32"}, {"iters", iters}, {"sizes", rows}};
            std::ofstream(out) << j.dump(2) << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

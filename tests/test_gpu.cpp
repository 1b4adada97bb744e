// CUDA kernels against the CPU reference. Skipped, with the reason, where no GPU is usable.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include "kernels/cuda_device.h"
#include "kernels/residual.h"
#include "tests/helpers.h"

using namespace zgpt;
using namespace zgpt::test;

namespace {
const bool kHaveGpu = [] {
    const cuda::DeviceInfo d = cuda::query_devices();
    if (d.count == 0) skip_binary("no usable CUDA device: " + d.error);
    return d.count > 0;
}();
}  // namespace

TEST_CASE("residual_forward (CUDA) equals the CPU reference on odd sizes") {
    for (int64_t n : {1, 255, 257, 1000003}) {
        CAPTURE(n);
        Rng rng{uint64_t(n)};
        const auto a = random_vector<float>(rng, n), b = random_vector<float>(rng, n);
        std::vector<float> want(n), got(n);
        cpu::residual_forward(want.data(), a.data(), b.data(), n);
        float *da, *db, *dout;
        REQUIRE(cudaMalloc(&da, n * 4) == cudaSuccess);
        REQUIRE(cudaMalloc(&db, n * 4) == cudaSuccess);
        REQUIRE(cudaMalloc(&dout, n * 4) == cudaSuccess);
        cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice);
        cuda::residual_forward(dout, da, db, n, nullptr);
        REQUIRE(cudaMemcpy(got.data(), dout, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(got == want);  // one float add: exact
        cudaFree(da);
        cudaFree(db);
        cudaFree(dout);
    }
}

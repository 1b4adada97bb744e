// How many thread-block clusters of each size fit on the GPU at once, and on how many SMs they
// land: cudaOccupancyMaxActiveClusters, then a launch of that many clusters that records each
// CTA's SM. Clusters stay inside one GPC, so sizes that do not divide the GPCs' SM counts leave
// SMs idle (why `fast` runs a helper grid: kernels/loss_head/cross_entropy/plan.cpp,
// plan_fast_helper).
//   nvcc -O2 -arch=sm_90a tools/dev/probes/cluster_occupancy.cu -o /tmp/cluster_occupancy
#include <cuda_runtime.h>

#include <cstdio>
#include <set>

__global__ void record_sm(int* sm) {
    extern __shared__ char smem[];
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0) {
        sm[blockIdx.x] = int(id);
        smem[0] = 1;
    }
    const long long t0 = clock64();
    while (clock64() - t0 < 2000000) {  // stay resident until every CTA has started
    }
}

int main() {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    std::printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10);
    cudaFuncSetAttribute(record_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int* d = nullptr;
    cudaMalloc(&d, 4096 * sizeof(int));
    // 194 KB: one CTA per SM (fast's three 64 KB buffers); 100 KB: two
    for (int kb : {194, 100}) {
        for (int c = 1; c <= 16; c++) {
            cudaLaunchConfig_t cfg{};
            cfg.blockDim = dim3(768);
            cfg.dynamicSmemBytes = size_t(kb) << 10;
            cudaLaunchAttribute a[1];
            a[0].id = cudaLaunchAttributeClusterDimension;
            a[0].val.clusterDim.x = unsigned(c);
            a[0].val.clusterDim.y = 1;
            a[0].val.clusterDim.z = 1;
            cfg.attrs = a;
            cfg.numAttrs = 1;
            cfg.gridDim = dim3(unsigned(c));
            int n = 0;
            if (cudaOccupancyMaxActiveClusters(&n, record_sm, &cfg) != cudaSuccess) {
                std::printf("%d KB, cluster %d: %s\n", kb, c,
                            cudaGetErrorString(cudaGetLastError()));
                continue;
            }
            cfg.gridDim = dim3(unsigned(n * c));
            cudaLaunchKernelEx(&cfg, record_sm, d);
            cudaDeviceSynchronize();
            int h[4096];
            cudaMemcpy(h, d, size_t(n) * c * sizeof(int), cudaMemcpyDeviceToHost);
            const std::set<int> sms(h, h + n * c);
            std::printf("%d KB, cluster %2d: %3d clusters, %3d CTAs on %3zu SMs\n", kb, c, n, n * c,
                        sms.size());
        }
    }
}

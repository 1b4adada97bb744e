// Where and when a grid launched with programmatic dependent launch runs: a "main" grid of 30
// 4-CTA clusters (194 KB of shared memory each, one CTA per SM) triggers its dependents at once
// (griddepcontrol.launch_dependents) and spins ~1 ms; a "helper" grid of 2-CTA clusters (128 KB)
// follows with programmatic stream serialization, spins ~0.1 ms, then waits for the main grid
// (griddepcontrol.wait). Printed: each helper CTA's SM and start / end times against the main
// grid's, on the legacy stream, a created stream, inside a CUDA graph, and with more helper CTAs
// than idle SMs. The shape of fast's main and helper grids
// (kernels/loss_head/cross_entropy/fast.cu).
//   nvcc -O2 -arch=sm_90a tools/dev/probes/pdl_placement.cu -o /tmp/pdl_placement
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <set>

struct Span {
    unsigned long long t0, t1;
    unsigned sm;
};

__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ unsigned sm_id() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
__device__ void spin(long long cycles) {
    const long long c = clock64();
    while (clock64() - c < cycles) {
    }
}

__global__ void main_grid(Span* r, long long cycles) {
    extern __shared__ char smem[];
    const unsigned long long t0 = now_ns();
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    spin(cycles);
    if (threadIdx.x == 0) {
        r[blockIdx.x] = {t0, now_ns(), sm_id()};
        smem[0] = 1;
    }
}

__global__ void helper_grid(Span* r, long long cycles) {
    extern __shared__ char smem[];
    const unsigned long long t0 = now_ns();
    spin(cycles);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) {
        r[blockIdx.x] = {t0, now_ns(), sm_id()};
        smem[0] = 1;
    }
}

void launch(const void* kernel, void** args, int ctas, int threads, int cluster, size_t smem,
            bool programmatic, cudaStream_t s) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(ctas));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute a[2];
    a[0].id = cudaLaunchAttributeClusterDimension;
    a[0].val.clusterDim.x = unsigned(cluster);
    a[0].val.clusterDim.y = 1;
    a[0].val.clusterDim.z = 1;
    a[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = a;
    cfg.numAttrs = programmatic ? 2 : 1;
    if (const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel, args); e != cudaSuccess)
        std::printf("launch: %s\n", cudaGetErrorString(e));
}

int main() {
    constexpr int kMainCtas = 120;
    cudaFuncSetAttribute(main_grid, cudaFuncAttributeMaxDynamicSharedMemorySize, 194 << 10);
    cudaFuncSetAttribute(helper_grid, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 << 10);
    Span *main_spans = nullptr, *helper_spans = nullptr;
    cudaMalloc(&main_spans, kMainCtas * sizeof(Span));
    cudaMalloc(&helper_spans, 64 * sizeof(Span));
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    long long main_cycles = 2000000, helper_cycles = 200000;
    const char* names[] = {"legacy stream", "stream", "graph", "stream, 24 helper CTAs"};
    for (int mode = 0; mode < 4; mode++) {
        const cudaStream_t s = mode == 0 ? cudaStream_t(0) : stream;
        const int helper_ctas = mode == 3 ? 24 : 12;
        void* main_args[] = {&main_spans, &main_cycles};
        void* helper_args[] = {&helper_spans, &helper_cycles};
        cudaGraph_t g;
        cudaGraphExec_t exec;
        if (mode == 2) cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        launch((const void*)main_grid, main_args, kMainCtas, 768, 4, 194 << 10, false, s);
        launch((const void*)helper_grid, helper_args, helper_ctas, 512, 2, 128 << 10, true, s);
        if (mode == 2) {
            cudaStreamEndCapture(s, &g);
            cudaGraphInstantiate(&exec, g, 0);
            cudaGraphLaunch(exec, s);
        }
        cudaDeviceSynchronize();
        std::printf("%s: %s\n", names[mode], cudaGetErrorString(cudaGetLastError()));
        Span m[kMainCtas], h[64];
        cudaMemcpy(m, main_spans, sizeof m, cudaMemcpyDeviceToHost);
        cudaMemcpy(h, helper_spans, helper_ctas * sizeof(Span), cudaMemcpyDeviceToHost);
        unsigned long long base = ~0ull, end = 0;
        std::set<unsigned> main_sms;
        for (const Span& x : m) {
            base = std::min(base, x.t0);
            end = std::max(end, x.t1);
            main_sms.insert(x.sm);
        }
        std::printf("  main grid on %zu SMs, ends at %.3f ms\n", main_sms.size(),
                    (end - base) / 1e6);
        for (int i = 0; i < helper_ctas; i++)
            std::printf("  helper CTA %2d: SM %3u, %.3f to %.3f ms%s\n", i, h[i].sm,
                        (h[i].t0 - base) / 1e6, (h[i].t1 - base) / 1e6,
                        main_sms.count(h[i].sm) ? " (an SM of the main grid)" : "");
    }
}

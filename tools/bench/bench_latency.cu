#include "tools/bench/bench_latency.h"

#include "kernels/gemm/matmul.h"
#include "tools/bench/bench_util.h"

namespace zgpt::bench {

namespace {
__global__ void empty_kernel() {}
}  // namespace

std::vector<LaunchShape> captured_launches(const std::function<void(cudaStream_t)>& fn) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<LaunchShape> out;
    cudaGraph_t g = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        fn(s);
        if (cudaStreamEndCapture(s, &g) != cudaSuccess) g = nullptr;
    }
    cudaGetLastError();  // a head that cannot be captured: no floor, and no sticky error
    if (g) {
        size_t n = 0;
        CK(cudaGraphGetNodes(g, nullptr, &n));
        std::vector<cudaGraphNode_t> nodes(n);
        CK(cudaGraphGetNodes(g, nodes.data(), &n));  // creation order: the launch order
        for (cudaGraphNode_t node : nodes) {
            cudaGraphNodeType t;
            CK(cudaGraphNodeGetType(node, &t));
            if (t == cudaGraphNodeTypeKernel) {
                cudaKernelNodeParams p{};
                if (cudaGraphKernelNodeGetParams(node, &p) == cudaSuccess)
                    out.push_back({p.gridDim, p.blockDim, p.sharedMemBytes});
                else {  // a kernel the runtime cannot describe (a library's): one wave of 128
                    cudaGetLastError();
                    int sms = 0;
                    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
                    out.push_back({dim3(unsigned(sms)), dim3(128), 0});
                }
            } else if (t == cudaGraphNodeTypeMemset || t == cudaGraphNodeTypeMemcpy) {
                out.push_back({dim3(1), dim3(32), 0});
            }
        }
        CK(cudaGraphDestroy(g));
    }
    // a GEMM captured here took a cuBLASLt workspace for this stream (kernels/gemm/matmul.h):
    // give it back, or every capture would keep one more
    zgpt::cuda::release_gemm_workspace(s);
    CK(cudaStreamDestroy(s));
    return out;
}

double empty_chain_ms(const std::vector<LaunchShape>& chain, int iters) {
    int max_smem = 0;
    CK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    return time_ms(
        [&] {
            for (const LaunchShape& l : chain) empty_kernel<<<l.grid, l.block, l.smem>>>();
        },
        iters);
}

}  // namespace zgpt::bench

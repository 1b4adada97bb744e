#include "tools/bench/bench_latency.h"

#include <exception>

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
    // Relaxed: cuBLASLt may allocate its workspace for this stream while it is captured.
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        bool ok = true;
        try {
            fn(s);
        } catch (const std::exception&) {  // a launch refused under capture (a host sync)
            ok = false;
        }
        if (cudaStreamEndCapture(s, &g) != cudaSuccess || !ok) {
            if (g) cudaGraphDestroy(g);
            g = nullptr;
        }
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
                    int dev = 0, sms = 0;
                    CK(cudaGetDevice(&dev));
                    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
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
    int dev = 0, max_smem = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    return time_ms(
        [&] {
            for (const LaunchShape& l : chain) empty_kernel<<<l.grid, l.block, l.smem>>>();
        },
        iters);
}

}  // namespace zgpt::bench

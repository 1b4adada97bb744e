#include <cublasLt.h>

#include <map>
#include <tuple>

#include "kernels/cuda_check.h"
#include "kernels/matmul.h"

namespace zgpt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

#define ZG_CUBLAS_CHECK(expr)                                                              \
    do {                                                                                   \
        const cublasStatus_t st_ = (expr);                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                  \
            ::zgpt::fail_check(#expr, __FILE__, __LINE__,                                  \
                               std::string("cuBLASLt error ") + std::to_string(int(st_))); \
    } while (0)

struct Context {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    // (m, n, k, transa, transb, d_type) -> algorithm
    std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int>, cublasLtMatmulAlgo_t> algos;
    Context() {
        ZG_CUBLAS_CHECK(cublasLtCreate(&handle));
        ZG_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
    }
};

Context& context() {
    static thread_local Context c;  // one per host thread; lives for the process
    return c;
}

}  // namespace

size_t gemm_workspace_bytes() {
    return kWorkspaceBytes;
}

void gemm_bf16(void* D, MatType d_type, const void* A, bool trans_a, const void* B, bool trans_b,
               int64_t M, int64_t N, int64_t K, float alpha, float beta, CUstream_st* stream) {
    ZG_CHECK(M > 0 && N > 0 && K > 0, "gemm_bf16: sizes must be positive");
    Context& ctx = context();
    // Row-major D[M,N] = op(A) op(B) is column-major D^T[N,M] = op(B)^T op(A)^T: cuBLASLt's A is
    // our B and its B is our A, with m = N, n = M.
    const cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint64_t m = uint64_t(N), n = uint64_t(M), k = uint64_t(K);
    cublasLtMatmulDesc_t op;
    ZG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ZG_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    ZG_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, ld;
    // column-major stored shapes: A (m x k or k x m), B (k x n or n x k), D (m x n)
    ZG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k,
                                               ta == CUBLAS_OP_N ? k : m,
                                               ta == CUBLAS_OP_N ? m : k));
    ZG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n,
                                               tb == CUBLAS_OP_N ? n : k,
                                               tb == CUBLAS_OP_N ? k : n));
    const cudaDataType_t dt = d_type == MatType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    ZG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, m));
    const auto key = std::make_tuple(M, N, K, trans_a, trans_b, int(d_type));
    auto it = ctx.algos.find(key);
    if (it == ctx.algos.end()) {
        cublasLtMatmulPreference_t pref;
        ZG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        ZG_CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &kWorkspaceBytes, sizeof kWorkspaceBytes));
        cublasLtMatmulHeuristicResult_t h{};
        int found = 0;
        ZG_CUBLAS_CHECK(
            cublasLtMatmulAlgoGetHeuristic(ctx.handle, op, la, lb, ld, ld, pref, 1, &h, &found));
        cublasLtMatmulPreferenceDestroy(pref);
        ZG_CHECK(found > 0, "cuBLASLt found no algorithm for this matmul");
        it = ctx.algos.emplace(key, h.algo).first;
    }
    ZG_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, op, &alpha, B, la, A, lb, &beta, D, ld, D, ld,
                                   &it->second, ctx.workspace, kWorkspaceBytes, stream));
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}

}  // namespace zgpt::cuda

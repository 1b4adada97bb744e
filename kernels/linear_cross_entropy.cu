// fused_linear: cross-entropy + z-loss from hidden states and the LM-head weight, chunked over the
// vocabulary so that only an N x Vc slice of logits ever exists.
//
//   pass 1, per vocabulary chunk: logits_c = h W_c^T (cuBLASLt, fp32 accumulation, bf16 out);
//           online-softmax statistics of the chunk, merged into the rows' running statistics
//   finalise: lse, per-row loss / ce / z-loss, gradient parameters (kernels/cross_entropy.cu)
//   pass 2, per chunk: logits_c again; dlogits_c in place; dh += dlogits_c W_c (fp32
//           accumulator); dW_c = dlogits_c^T h (each weight row written once, accumulated in fp32
//           inside the GEMM over all N rows)
//
// Chunking over the vocabulary rather than the rows means dW is never re-read and re-written per
// chunk (with row chunks the fp32 V x C accumulator would cross memory twice per chunk); the price
// is computing the logits twice: 4 GEMMs of 2 N C V FLOPs instead of 3.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/cross_entropy.h"
#include "kernels/cuda_check.h"
#include "kernels/matmul.h"
#include "kernels/workspace.h"

namespace zgpt::cuda {

namespace {

constexpr size_t kChunkBudget = size_t(96) << 20;  // bytes of bf16 logits per chunk

int64_t chunk_columns(int64_t N, int64_t V, int64_t requested) {
    if (requested > 0) return std::min(requested, V);
    size_t budget = kChunkBudget;  // ZGPT_CE_LINEAR_CHUNK_MB overrides it (a knob for sweeps)
    if (const char* e = std::getenv("ZGPT_CE_LINEAR_CHUNK_MB"); e && std::atoi(e) > 0)
        budget = size_t(std::atoi(e)) << 20;
    int64_t vc = int64_t(budget / (2 * size_t(N))) / 128 * 128;
    return std::clamp<int64_t>(vc, 128, (V + 127) / 128 * 128);
}

struct Workspace {
    int* n_valid;
    RowStatsF *stats, *part;
    RowGradParams* params;
    float *loss, *ce, *z, *lse;
    float* dh_acc;         // [N, C] fp32
    __nv_bfloat16* chunk;  // [N, Vc]
};

Workspace carve(WorkspaceLayout& l, int64_t N, int64_t C, int64_t vc) {
    Workspace ws;
    ws.n_valid = l.take<int>(1);
    ws.stats = l.take<RowStatsF>(N);
    ws.part = l.take<RowStatsF>(N);
    ws.params = l.take<RowGradParams>(N);
    ws.loss = l.take<float>(N);
    ws.ce = l.take<float>(N);
    ws.z = l.take<float>(N);
    ws.lse = l.take<float>(N);
    ws.dh_acc = l.take<float>(size_t(N) * C);
    ws.chunk = l.take<__nv_bfloat16>(size_t(N) * vc);
    return ws;
}

size_t workspace_bytes(int64_t N, int64_t C, int64_t V, int64_t vocab_chunk) {
    WorkspaceLayout l(nullptr);
    carve(l, N, C, chunk_columns(N, V, vocab_chunk));
    return l.bytes();
}

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __float2bfloat16_rn(in[i]);
}

void run_fused_linear(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* w,
                      CUstream_st* s) {
    validate(o);
    ZG_CHECK(a.hidden && a.weight && a.targets && a.grad_output && a.summary,
             "fused_linear: hidden, weight, targets, grad_output and summary are required");
    const bool grads = a.dhidden || a.dweight || a.dweight_acc;
    ZG_CHECK(!grads || (a.dhidden && (a.dweight || a.dweight_acc)),
             "fused_linear: gradients need dhidden and one of dweight / dweight_acc");
    ZG_CHECK(a.N > 0 && a.C > 0 && a.V > 0 && a.N <= INT32_MAX, "fused_linear: bad sizes");
    const int64_t N = a.N, C = a.C, V = a.V, vc_max = chunk_columns(N, V, a.vocab_chunk);
    WorkspaceLayout layout(w);
    const Workspace ws = carve(layout, N, C, vc_max);
    const auto* h = static_cast<const __nv_bfloat16*>(a.hidden);
    const auto* W = static_cast<const __nv_bfloat16*>(a.weight);
    auto* dW = static_cast<__nv_bfloat16*>(a.dweight);

    // The CE view of one chunk: columns [v, v + vc) of every row, stored contiguously.
    CrossEntropyArgs ce;
    ce.type = LogitsType::bf16;
    ce.N = N;
    ce.V = V;
    ce.targets = a.targets;
    ce.grad_output = a.grad_output;
    ce.loss_rows = a.loss_rows ? a.loss_rows : ws.loss;
    ce.ce_rows = a.ce_rows ? a.ce_rows : ws.ce;
    ce.z_rows = a.z_rows ? a.z_rows : ws.z;
    ce.lse_rows = a.lse_rows ? a.lse_rows : ws.lse;
    ce.summary = a.summary;
    auto chunk_view = [&](int64_t v, int64_t vc) {
        CrossEntropyArgs c = ce;
        c.logits = ws.chunk;
        c.dlogits = ws.chunk;
        c.ld = vc;
        c.V_local = vc;
        c.v0 = v;
        return c;
    };

    ce_count_valid(ws.n_valid, a.targets, N, o.ignore_index, s);
    for (int64_t v = 0; v < V; v += vc_max) {  // pass 1: statistics
        const int64_t vc = std::min(vc_max, V - v);
        gemm_bf16(ws.chunk, MatType::bf16, h, false, W + v * C, true, N, vc, C, 1.0f, 0.0f, s);
        ce_shard_stats(v == 0 ? ws.stats : ws.part, chunk_view(v, vc), o, s);
        if (v > 0) ce_merge_stats(ws.stats, ws.part, N, s);
    }
    ce_finalize(ws.params, ws.stats, ws.n_valid, ce, o, s);
    for (int64_t v = 0; grads && v < V; v += vc_max) {  // pass 2: gradients
        const int64_t vc = std::min(vc_max, V - v);
        const CrossEntropyArgs c = chunk_view(v, vc);
        gemm_bf16(ws.chunk, MatType::bf16, h, false, W + v * C, true, N, vc, C, 1.0f, 0.0f, s);
        ce_shard_backward(c, ws.params, o, s);
        gemm_bf16(ws.dh_acc, MatType::f32, ws.chunk, false, W + v * C, false, N, C, vc, 1.0f,
                  v == 0 ? 0.0f : 1.0f, s);
        if (a.dweight_acc)
            gemm_bf16(a.dweight_acc + v * C, MatType::f32, ws.chunk, true, h, false, vc, C, N, 1.0f,
                      1.0f, s);
        else
            gemm_bf16(dW + v * C, MatType::bf16, ws.chunk, true, h, false, vc, C, N, 1.0f, 0.0f, s);
    }
    if (grads) {
        to_bf16_kernel<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(a.dhidden), ws.dh_acc,
                                            N * C);
        ZG_CUDA_CHECK(cudaGetLastError());
    }
    ce_reduce(ce, ws.stats, ws.n_valid, o, s);
}

}  // namespace

const std::vector<LinearCrossEntropyVariant>& linear_cross_entropy_variants() {
    static const std::vector<LinearCrossEntropyVariant> v = {
        {"fused_linear",
         "vocabulary chunks through cuBLASLt: logits twice, dh accumulated in fp32, dW written "
         "once",
         workspace_bytes, run_fused_linear},
    };
    return v;
}

}  // namespace zgpt::cuda

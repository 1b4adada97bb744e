// fused_linear_rows: the linear + cross-entropy head in blocks of whole rows (the schedule Liger's
// fused linear cross-entropy uses, on our kernels). Per block of R rows:
//
//   logits = h_b W^T over the whole vocabulary (cuBLASLt, bf16 out) into one R x V tile
//   the `fast` cross-entropy on the tile: loss, per-row outputs and dlogits in place, one pass
//   dh_b = dlogits W            (bf16 out, fp32 inside the GEMM)
//   dW  += dlogits^T h_b        (fp32, added by the GEMM: beta = 1)
//
// Why: a block holds whole rows, so each row's lse is known before its dlogits leave the tile,
// and the logits are computed once: 3 GEMMs, where fused_linear's vocabulary chunks need 4. The
// price is the fp32 dW crossing memory once per block (the GEMM's epilogue reads and writes it)
// and the tile's R x V bf16 logits. In a trainer the fp32 dW is the gradient arena it already
// has (dweight_acc; tuning.fp32_dweight_only then leaves the workspace without one), so the tile
// is all the head holds: at GPT-2's vocabulary 8192 rows are 0.82 GB where `fast` keeps all
// B x T rows of logits (6.6 GB at B = 64, T = 1024); the model lends it the backward's scratch
// for it (model/gpt_cuda.cu, head_scratch). With a bf16 dweight over several blocks the
// workspace carries an fp32 [V, C] accumulator, which is why the `bench_ce` memory targets
// (<= 0.2 and 0.5 GB with the gradients) are fused_linear's, not this head's
// (docs/cross_entropy.md).
//
// Contract: fused_linear's (every reduction, ignore_index, smoothing, z-loss, device
// grad_output, no host sync, deterministic), on the whole vocabulary only (no shards). Each
// block's cross-entropy runs with reduction sum; for mean its scalar is grad_output over the
// valid rows of all N, computed on the device. The blocks' summaries are added up in block order.
//
// fused_linear_rows_filtered (the gradient-filtering variant, off by default; not exact):
// the same blocks, with dh and dW on kernels/gemm/filtered_gemm.cu, which skips the pieces of
// dlogits whose |values| are all below tuning.filter_eps times the gradient's scale (Cut
// Cross-Entropy's filter: such softmax entries are below bf16 resolution). Everything else, the
// loss and per-row outputs included, is fused_linear_rows' own.
#include "kernels/loss_head/linear_cross_entropy_rows.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/core/cuda_check.h"
#include "kernels/core/workspace.h"
#include "kernels/gemm/filtered_gemm.h"
#include "kernels/gemm/matmul.h"
#include "kernels/loss_head/cross_entropy/common.cuh"
#include "kernels/ops/residual.h"

namespace zgpt::cuda::linear_ce_rows {

namespace {

// Rows per block when the tuning says nothing: 8192 (0.82 GB of logits at V = 50304, 2.1 GB at
// 128256), the trainer's default: on an H100 its steps were faster than with 4096 rows, and
// 16384 rows gained little more for twice the memory
// (docs/results/linear_ce_rows_h100_acacf1c.json).
constexpr int64_t kBlockRows = 8192;

// The tile's row stride: V rounded up to 8, so that every row starts 16-byte aligned (the fast
// kernel's bulk copies and cuBLASLt's fast kernels need it).
int64_t tile_ld(int64_t V) {
    return (V + 7) / 8 * 8;
}

// Rows per block: tuning.row_block, or as many as tuning.chunk_mb of logits hold (a multiple of
// 16), or kBlockRows; at most N.
int64_t block_rows(int64_t N, int64_t V, const LinearCrossEntropyTuning& t) {
    int64_t r = t.row_block;
    if (r <= 0 && t.chunk_mb > 0)
        r = std::max<int64_t>(
            16, int64_t((size_t(t.chunk_mb) << 20) / (2 * size_t(tile_ld(V)))) / 16 * 16);
    if (r <= 0) r = kBlockRows;
    return std::min(r, N);
}

const CrossEntropyVariant& fast() {
    static const CrossEntropyVariant& v = find_cross_entropy_variant("fast");
    return v;
}

struct Workspace {
    int* n_valid;
    float* scale;         // mean: grad_output / n_valid
    float* threshold;     // the filtered variant's: filter_eps times the largest |scale|
    LossSummaryF* sums;   // one per block
    __nv_bfloat16* tile;  // [R, ld]
    void* ce;             // the fast kernel's workspace
    float* dw_acc;        // [ld, C] fp32, with bf16 dW over several blocks; else null
    unsigned char* keep;  // the filtered variant's 32 x 32 block flags of the tile; else null
};

Workspace carve(WorkspaceLayout& l, int64_t N, int64_t C, int64_t V,
                const LinearCrossEntropyTuning& t, bool filtered) {
    const int64_t R = block_rows(N, V, t), blocks = (N + R - 1) / R, ld = tile_ld(V);
    Workspace w;
    w.n_valid = l.take<int>(1);
    w.scale = l.take<float>(1);
    w.threshold = l.take<float>(1);
    w.sums = l.take<LossSummaryF>(size_t(blocks));
    w.tile = l.take<__nv_bfloat16>(size_t(R) * ld);
    w.ce = l.take<unsigned char>(fast().workspace_bytes(R, V, LogitsType::bf16));
    w.dw_acc = blocks > 1 && !t.fp32_dweight_only ? l.take<float>(size_t(ld) * C) : nullptr;
    w.keep = filtered ? l.take<unsigned char>(size_t(filter_blocks_bytes(R, ld))) : nullptr;
    return w;
}

__global__ void mean_scale_kernel(float* scale, const float* grad_output, const int* n_valid) {
    *scale = grad_scale(*grad_output, Reduction::mean, *n_valid);
}

// The blocks' summaries added up in block order (double), the loss reduced as asked. A block's
// loss is its sum_loss (its reduction is sum or none), so the sums of sum_loss serve both.
__global__ void combine_kernel(LossSummaryF* out, const LossSummaryF* sums, int64_t blocks,
                               Reduction red) {
    double t[5] = {0, 0, 0, 0, 0};
    float mx = kNegInf;
    int n = 0;
    for (int64_t b = 0; b < blocks; b++) {
        const LossSummaryF& s = sums[b];
        t[0] += s.sum_loss;
        t[1] += s.sum_ce;
        t[2] += s.sum_z_loss;
        t[3] += s.sum_lse;
        t[4] += s.sum_lse_sq;
        mx = fmaxf(mx, s.max_logit);
        n += s.n_valid;
    }
    *out = summary_from_sums(t, mx, n, red);
}

}  // namespace

size_t workspace_bytes(int64_t N, int64_t C, int64_t V, const LinearCrossEntropyTuning& t) {
    WorkspaceLayout l(nullptr);
    carve(l, N, C, V, t, false);
    return l.bytes();
}

size_t workspace_bytes_filtered(int64_t N, int64_t C, int64_t V,
                                const LinearCrossEntropyTuning& t) {
    WorkspaceLayout l(nullptr);
    carve(l, N, C, V, t, true);
    return l.bytes();
}

namespace {

void run_blocks(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
                CUstream_st* s, const char* name, bool filtered) {
    const bool grads = check_linear_ce_run(a, o, name);
    const int64_t N = a.N, C = a.C, V = a.V, ld = tile_ld(V);
    const int64_t R = block_rows(N, V, a.tuning), blocks = (N + R - 1) / R;
    ZG_CHECK(!grads || a.dweight_acc || blocks == 1 || !a.tuning.fp32_dweight_only,
             std::string(name) +
                 ": a bf16 dweight over several row blocks needs the workspace's fp32 "
                 "accumulator, which tuning.fp32_dweight_only leaves out: pass dweight_acc");
    ZG_CHECK(!filtered || a.tuning.filter_eps >= 0.0f,
             std::string(name) + ": tuning.filter_eps must be >= 0 (0 skips nothing)");
    // The GEMMs run over ld columns where the weight has that many rows (its rows past V zero):
    // cuBLASLt's kernels for an odd width are far slower (docs/parallel.md, the split head).
    const int64_t Vg = a.weight_rows >= ld ? ld : V;
    WorkspaceLayout layout(workspace);
    const Workspace w = carve(layout, N, C, V, a.tuning, filtered);
    const auto* h = static_cast<const __nv_bfloat16*>(a.hidden);
    const int search = a.tuning.gemm_search;

    ce_count_valid(w.n_valid, a.targets, N, o.ignore_index, s);
    CrossEntropyOptions ob = o;
    const float* go = a.grad_output;
    if (o.reduction == Reduction::mean) {  // every block scaled by all N rows' valid count
        mean_scale_kernel<<<1, 1, 0, s>>>(w.scale, a.grad_output, w.n_valid);
        ZG_CUDA_CHECK(cudaGetLastError());
        go = w.scale;
        ob.reduction = Reduction::sum;
    }
    CrossEntropyArgs all;  // the cross-entropy of all N rows on the tile; each block narrows it
    all.logits = all.dlogits = w.tile;
    all.type = LogitsType::bf16;
    all.ld = ld;
    all.N = N;
    all.V_local = all.V = V;
    all.targets = a.targets;
    all.grad_output = go;
    all.loss_rows = a.loss_rows;
    all.ce_rows = a.ce_rows;
    all.z_rows = a.z_rows;
    all.lse_rows = a.lse_rows;
    // The filter's threshold: filter_eps times the dlogits' scale (per row for reduction none:
    // the largest), so that a piece is skipped where every |softmax - target| < filter_eps.
    if (filtered && grads)
        filter_threshold(w.threshold, go, o.reduction == Reduction::none ? N : 1,
                         a.tuning.filter_eps, s);
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r = b * R, nr = std::min(R, N - r);
        Gemm gl = linear_forward_gemm(w.tile, h + r * C, a.weight, nr, C, Vg, DType::bf16);
        gl.ldd = ld;
        gl.search = search;
        gemm(gl, s);
        CrossEntropyArgs ce = ce_rows_view(all, r, nr, o.reduction);
        ce.summary = w.sums + b;
        fast().run(ce, ob, w.ce, s);
        if (!grads) continue;
        // The GEMMs' extra columns carry no gradient; the filtered GEMM reads A's rows in
        // 16-byte pieces, so it needs the tile's columns up to ld zero too.
        const int64_t zero_to = filtered ? ld : Vg;
        if (zero_to > V)
            ZG_CUDA_CHECK(cudaMemset2DAsync(w.tile + V, ld * 2, 0, (zero_to - V) * 2, nr, s));
        float* acc = a.dweight_acc ? a.dweight_acc : w.dw_acc;
        if (filtered) {
            FilteredGemm fi;  // dh_b = dlogits W
            fi.A = w.tile;
            fi.lda = ld;
            fi.B = a.weight;
            fi.ldb = C;
            fi.D = static_cast<__nv_bfloat16*>(a.dhidden) + r * C;
            fi.ldd = C;
            fi.M = nr;
            fi.N = C;
            fi.K = Vg;
            fi.keep = w.keep;
            FilteredGemm fw;  // dW (+)= dlogits^T h_b: the tile is A transposed
            fw.A = w.tile;
            fw.lda = ld;
            fw.a_transposed = true;
            fw.B = h + r * C;
            fw.ldb = C;
            fw.D = acc ? static_cast<void*>(acc) : a.dweight;
            fw.ldd = C;
            fw.d_fp32 = acc != nullptr;
            fw.beta = acc && (a.dweight_acc || b > 0) ? 1.0f : 0.0f;
            fw.M = Vg;
            fw.N = C;
            fw.K = nr;
            fw.keep = w.keep;
            if (filtered_gemm_usable(fi) && filtered_gemm_usable(fw)) {
                // which 32 x 32 blocks of the tile hold a value above the threshold, over the
                // columns the GEMMs read (Vg rounded up to 8)
                filter_blocks(w.keep, w.tile, ld, nr, (Vg + 7) / 8 * 8, w.threshold, s);
                filtered_gemm(fi, s);
                filtered_gemm(fw, s);
                continue;
            }
            // C % 8 != 0 or an older GPU: the exact products below
        }
        Gemm gi = linear_input_grad_gemm(static_cast<__nv_bfloat16*>(a.dhidden) + r * C, w.tile,
                                         a.weight, nr, C, Vg, DType::bf16);
        gi.lda = ld;
        gi.search = search;
        gemm(gi, s);
        Gemm gw = linear_weight_grad_gemm(acc, w.tile, h + r * C, nr, C, Vg, DType::bf16);
        gw.lda = ld;
        gw.search = search;
        if (!acc) {  // one block, bf16 dW: straight out of the GEMM
            gw.D = a.dweight;
            gw.d_type = DType::bf16;
            gw.beta = 0.0f;
        } else if (!a.dweight_acc) {
            gw.beta = b > 0 ? 1.0f : 0.0f;
        }
        gemm(gw, s);
    }
    if (grads && !a.dweight_acc && w.dw_acc)
        cast_from_f32(a.dweight, w.dw_acc, Vg * C, DType::bf16, s);
    combine_kernel<<<1, 1, 0, s>>>(a.summary, w.sums, blocks, o.reduction);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void run(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
         CUstream_st* s) {
    run_blocks(a, o, workspace, s, "fused_linear_rows", false);
}

void run_filtered(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
                  CUstream_st* s) {
    run_blocks(a, o, workspace, s, "fused_linear_rows_filtered", true);
}

}  // namespace zgpt::cuda::linear_ce_rows

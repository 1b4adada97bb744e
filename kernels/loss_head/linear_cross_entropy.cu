// fused_linear: cross-entropy + z-loss from hidden states and the LM-head weight, in tiles of
// rows x vocabulary columns, so that only one tile of logits ever exists.
//
//   pass 1, per tile: logits = h_b W_c^T (cuBLASLt, fp32 accumulation, bf16 out); the tile's
//           online-softmax statistics merged into its rows' running statistics
//   finalise: lse, per-row loss / ce / z-loss, gradient parameters (cross_entropy/launch.cu)
//   pass 2, per tile: the logits again; dlogits in place; dh_b += dlogits W_c (fp32
//           accumulator); dW_c += dlogits^T h_b (fp32 accumulation)
//
// Two loop orders (the tuning's rows_outer):
//   vocabulary chunks outside (the default): pass 1 over every tile, then pass 2 chunk by chunk,
//           the chunk's row blocks inside. dW_c is complete after its chunk and written once (as
//           bf16, or added to dweight_acc); dh's fp32 accumulator [N, C] crosses memory once per
//           chunk.
//   row blocks outside (with dweight_acc only): each row block's pass 1, finalise and pass 2
//           before the next block. dh needs only the block's accumulator [rows, C]; dW adds up
//           across blocks in the caller's fp32 dweight_acc.
// With one row block both orders are the original vocabulary-chunk schedule. Row blocks make a
// tile small enough for the memory targets (and for the 50 MB L2 between the GEMM that writes it
// and the kernels that read it); the default (kRowBlock, kChunkBudget) is the H100 sweep's.
//
// fused_linear_wgmma runs this schedule with kernels/loss_head/linear_cross_entropy_wgmma.cu's
// kernel in place of "logits GEMM, then a CE pass over the tile": pass 1 in one launch per row
// block with no tile in memory, pass 2 with the tile holding only dlogits.
//
// Chunking over the vocabulary means dW is never re-read and re-written per row (with row chunks
// alone the fp32 V x C accumulator would cross memory twice per chunk); the price is computing the
// logits twice: 4 GEMMs of 2 N C V FLOPs instead of 3. Under the memory targets 3 GEMMs are not
// possible (docs/cross_entropy.md: "The floor of an exact fused linear head").
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/core/cuda_check.h"
#include "kernels/core/workspace.h"
#include "kernels/gemm/matmul.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/linear_cross_entropy_rows.h"
#include "kernels/loss_head/linear_cross_entropy_wgmma.h"

namespace zgpt::cuda {

namespace {

// The default tile, from a sweep on the H100 (docs/results/ce_sweep_h100_87a3ef2.json): 8192 rows
// x 48 MB of bf16 logits: the fastest tile that keeps the head under 0.5 GB at N = 32768,
// V = 128256 and under 0.2 GB at N = 8192, V = 50304.
constexpr size_t kChunkBudget = size_t(48) << 20;  // bytes of bf16 logits per tile
constexpr int64_t kRowBlock = 8192;

// A tile of the schedule: `rows` rows x `cols` vocabulary columns.
struct TileShape {
    int64_t rows, cols;
};

TileShape tile_shape(int64_t N, int64_t V, const LinearCrossEntropyTuning& tuning) {
    // the tuning's 0s: kRowBlock rows, kChunkBudget bytes (when vocab_chunk is 0 too)
    const int64_t rows = std::min(tuning.row_block > 0 ? tuning.row_block : kRowBlock, N);
    if (tuning.vocab_chunk > 0) return {rows, std::min(tuning.vocab_chunk, V)};
    size_t budget = kChunkBudget;
    if (tuning.chunk_mb > 0) budget = size_t(tuning.chunk_mb) << 20;
    const int64_t vc = int64_t(budget / (2 * size_t(rows))) / 128 * 128;
    return {rows, std::clamp<int64_t>(vc, 128, (V + 127) / 128 * 128)};
}

// What every tile needs: the tile of logits (then dlogits), and with bf16 dW over several row
// blocks, one chunk's fp32 dW; with the wgmma epilogues, the statistics pass's per-group partials
// of one row block. The partials share the tile's memory: the wgmma statistics pass writes no
// tile, and the passes run one after the other on the stream.
struct TileBuffers {
    __nv_bfloat16* chunk;  // [rows, cols]
    float* dw_acc;         // [cols, C], or null with one row block
    RowStatsF* partials;   // wgmma epilogues only (in chunk's memory)
};

TileBuffers carve_tiles(WorkspaceLayout& l, int64_t N, int64_t C, int64_t V_local, TileShape t,
                        bool wgmma) {
    TileBuffers b;
    b.dw_acc = t.rows < N ? l.take<float>(size_t(t.cols) * C) : nullptr;
    const size_t chunk_bytes = size_t(t.rows) * t.cols * sizeof(__nv_bfloat16);
    const size_t partial_bytes =
        wgmma ? linear_ce_wgmma::partials_count(t.rows, V_local) * sizeof(RowStatsF) : 0;
    unsigned char* shared = l.take<unsigned char>(std::max(chunk_bytes, partial_bytes));
    b.chunk = reinterpret_cast<__nv_bfloat16*>(shared);
    b.partials = wgmma ? reinterpret_cast<RowStatsF*>(shared) : nullptr;
    return b;
}

struct Workspace {
    int* n_valid;
    RowStatsF* stats;
    RowGradParams* params;
    float *ce, *lse;  // where the caller gave none: the summary reads them (loss and z-loss rows
                      // are written only where asked for)
    float* dh_acc;    // [N, C] fp32 (vocabulary outside) or [rows, C] (rows outside)
    TileBuffers tiles;
};

Workspace carve(WorkspaceLayout& l, int64_t N, int64_t C, int64_t V, TileShape t, bool wgmma) {
    Workspace ws;
    ws.n_valid = l.take<int>(1);
    ws.stats = l.take<RowStatsF>(N);
    ws.params = l.take<RowGradParams>(N);
    ws.ce = l.take<float>(N);
    ws.lse = l.take<float>(N);
    ws.dh_acc = l.take<float>(size_t(N) * C);
    ws.tiles = carve_tiles(l, N, C, V, t, wgmma);
    return ws;
}

size_t workspace_bytes(int64_t N, int64_t C, int64_t V, const LinearCrossEntropyTuning& tuning) {
    WorkspaceLayout l(nullptr);
    carve(l, N, C, V, tile_shape(N, V, tuning), tuning.wgmma_epilogue);
    return l.bytes();
}

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __float2bfloat16_rn(in[i]);
}

void to_bf16(void* out, const float* in, int64_t n, CUstream_st* s) {
    to_bf16_kernel<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(out), in, n);
    ZG_CUDA_CHECK(cudaGetLastError());
}

// The schedule's steps over one shard of the weight: a.weight holds rows [a.v0, a.v0 + V_local)
// of the global vocabulary a.V (the whole of it by default). `ce` is the CE view of all N rows.
struct ShardSteps {
    const LinearCrossEntropyArgs& a;
    const CrossEntropyOptions& o;
    CrossEntropyArgs ce;
    TileShape t;
    TileBuffers b;
    CUstream_st* s;
    const __nv_bfloat16* h = static_cast<const __nv_bfloat16*>(a.hidden);
    const __nv_bfloat16* W = static_cast<const __nv_bfloat16*>(a.weight);
    int64_t C = a.C, V_local = a.local_vocab();
    // the Hopper kernels with the CE in the GEMM's epilogue (fused_linear_wgmma) where they run;
    // cuBLASLt tiles and the CE passes elsewhere
    bool tc = a.tuning.wgmma_epilogue && linear_ce_wgmma::usable(a);

    // the CE view narrowed to rows [r, r + nr)
    CrossEntropyArgs rows_view(int64_t r, int64_t nr) const {
        return ce_rows_view(ce, r, nr, o.reduction);
    }
    // ... and to the shard's columns [v, v + vc), stored contiguously in the tile
    CrossEntropyArgs tile_view(int64_t r, int64_t nr, int64_t v, int64_t vc) const {
        CrossEntropyArgs c = rows_view(r, nr);
        c.logits = b.chunk;
        c.dlogits = b.chunk;
        c.ld = vc;
        c.V_local = vc;
        c.v0 = a.v0 + v;
        return c;
    }
    void logits_tile(int64_t r, int64_t nr, int64_t v, int64_t vc) const {
        gemm_bf16(b.chunk, MatType::bf16, h + r * C, false, W + v * C, true, nr, vc, C, 1.0f, 0.0f,
                  s, a.tuning.gemm_search);
    }
    // pass 1 for rows [r, r + nr): the shard's statistics into stats[r, r + nr)
    void stats_rows(RowStatsF* stats, int64_t r, int64_t nr) const {
        if (tc) {
            linear_ce_wgmma::shard_stats(stats, b.partials, a, o, r, nr, s);
            return;
        }
        for (int64_t v = 0; v < V_local; v += t.cols) {
            const int64_t vc = std::min(t.cols, V_local - v);
            logits_tile(r, nr, v, vc);
            ce_shard_stats(stats + r, tile_view(r, nr, v, vc), o, s, /*accumulate=*/v > 0);
        }
    }
    // pass 2 up to dh for one tile (the tile holds its dlogits afterwards); dh_rows [nr, C] is
    // overwritten by the shard's first chunk unless dh_add
    void grad_tile(const RowGradParams* params, int64_t r, int64_t nr, int64_t v, int64_t vc,
                   float* dh_rows, bool dh_add) const {
        if (tc) {
            linear_ce_wgmma::dlogits_tile(b.chunk, params, a, o, r, nr, v, vc, s);
        } else {
            logits_tile(r, nr, v, vc);
            ce_shard_backward(tile_view(r, nr, v, vc), params + r, o, s);
        }
        gemm_bf16(dh_rows, MatType::f32, b.chunk, false, W + v * C, false, nr, C, vc, 1.0f,
                  dh_add || v > 0 ? 1.0f : 0.0f, s, a.tuning.gemm_search);
    }
    // dW_c (+)= dlogits^T h_b into an fp32 buffer [vc, C]
    void dw_tile(float* out, int64_t r, int64_t nr, int64_t vc, bool add) const {
        gemm_bf16(out, MatType::f32, b.chunk, true, h + r * C, false, vc, C, nr, 1.0f,
                  add ? 1.0f : 0.0f, s, a.tuning.gemm_search);
    }
    // pass 2 with the vocabulary chunks outside: dh_acc [N, C] fp32; the shard's dW rows written
    // (dweight, bf16) or added (dweight_acc)
    void backward(const RowGradParams* params, float* dh_acc, bool dh_add) const {
        const int64_t N = a.N;
        for (int64_t v = 0; v < V_local; v += t.cols) {
            const int64_t vc = std::min(t.cols, V_local - v);
            auto* dW = a.dweight ? static_cast<__nv_bfloat16*>(a.dweight) + v * C : nullptr;
            for (int64_t r = 0; r < N; r += t.rows) {
                const int64_t nr = std::min(t.rows, N - r);
                grad_tile(params, r, nr, v, vc, dh_acc + r * C, dh_add);
                if (a.dweight_acc)
                    dw_tile(a.dweight_acc + v * C, r, nr, vc, true);
                else if (nr == N)  // one row block: dW_c straight out of the GEMM as bf16
                    gemm_bf16(dW, MatType::bf16, b.chunk, true, h, false, vc, C, N, 1.0f, 0.0f, s,
                              a.tuning.gemm_search);
                else
                    dw_tile(b.dw_acc, r, nr, vc, r > 0);
            }
            if (!a.dweight_acc && t.rows < N) to_bf16(dW, b.dw_acc, vc * C, s);
        }
    }
};

// The checks every entry point makes (`who` names it in the messages).
void check_linear_args(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o,
                       const std::string& who = "fused_linear") {
    validate(o);
    ZG_CHECK(a.hidden && a.weight && a.targets && a.grad_output,
             who + ": hidden, weight, targets and grad_output are required");
    ZG_CHECK(a.N > 0 && a.C > 0 && a.V > 0 && a.N <= INT32_MAX, who + ": bad sizes");
    ZG_CHECK(a.v0 >= 0 && a.V_local >= 0 && a.v0 + a.local_vocab() <= a.V,
             who + ": the shard [v0, v0 + V_local) must lie in [0, V)");
}

CrossEntropyArgs ce_view(const LinearCrossEntropyArgs& a, const Workspace* ws) {
    CrossEntropyArgs ce;
    ce.type = LogitsType::bf16;
    ce.N = a.N;
    ce.V = a.V;
    ce.targets = a.targets;
    ce.grad_output = a.grad_output;
    ce.loss_rows = a.loss_rows;
    ce.ce_rows = a.ce_rows ? a.ce_rows : ws ? ws->ce : nullptr;
    ce.z_rows = a.z_rows;
    ce.lse_rows = a.lse_rows ? a.lse_rows : ws ? ws->lse : nullptr;
    ce.summary = a.summary;
    return ce;
}

void run_fused_linear(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* w,
                      CUstream_st* s) {
    const bool grads = check_linear_ce_run(a, o, "fused_linear");
    ZG_CHECK(!a.tuning.rows_outer || !grads || a.dweight_acc,
             "fused_linear: rows_outer needs dweight_acc (dW adds up across row blocks in fp32)");
    const int64_t N = a.N, C = a.C;
    const TileShape t = tile_shape(N, a.V, a.tuning);
    const bool rows_outer = grads && t.rows < N && a.dweight_acc && a.tuning.rows_outer;
    WorkspaceLayout layout(w);
    const Workspace ws = carve(layout, N, C, a.V, t, a.tuning.wgmma_epilogue);
    const ShardSteps sh{a, o, ce_view(a, &ws), t, ws.tiles, s};

    ce_count_valid(ws.n_valid, a.targets, N, o.ignore_index, s);
    if (rows_outer) {
        for (int64_t r = 0; r < N; r += t.rows) {
            const int64_t nr = std::min(t.rows, N - r);
            sh.stats_rows(ws.stats, r, nr);
            ce_finalize(ws.params + r, ws.stats + r, ws.n_valid, sh.rows_view(r, nr), o, s);
            for (int64_t v = 0; v < a.V; v += t.cols) {
                const int64_t vc = std::min(t.cols, a.V - v);
                // the block's dh in the first nr rows of dh_acc
                sh.grad_tile(ws.params, r, nr, v, vc, ws.dh_acc, false);
                sh.dw_tile(a.dweight_acc + v * C, r, nr, vc, true);
            }
            to_bf16(static_cast<__nv_bfloat16*>(a.dhidden) + r * C, ws.dh_acc, nr * C, s);
        }
    } else {
        for (int64_t r = 0; r < N; r += t.rows) sh.stats_rows(ws.stats, r, std::min(t.rows, N - r));
        ce_finalize(ws.params, ws.stats, ws.n_valid, sh.ce, o, s);
        if (grads) {
            sh.backward(ws.params, ws.dh_acc, false);
            to_bf16(a.dhidden, ws.dh_acc, N * C, s);
        }
    }
    ce_reduce(sh.ce, ws.stats, ws.n_valid, o, s);
}

LinearCrossEntropyArgs with_wgmma(LinearCrossEntropyArgs a) {
    a.tuning.wgmma_epilogue = true;
    return a;
}
size_t workspace_bytes_wgmma(int64_t N, int64_t C, int64_t V, const LinearCrossEntropyTuning& t) {
    LinearCrossEntropyTuning w = t;
    w.wgmma_epilogue = true;
    return workspace_bytes(N, C, V, w);
}
void run_fused_linear_wgmma(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* w,
                            CUstream_st* s) {
    run_fused_linear(with_wgmma(a), o, w, s);
}

}  // namespace

bool check_linear_ce_run(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o,
                         const std::string& who) {
    check_linear_args(a, o, who);
    ZG_CHECK(a.summary, who + ": summary is required");
    const bool grads = a.dhidden || a.dweight || a.dweight_acc;
    ZG_CHECK(!grads || (a.dhidden && (a.dweight || a.dweight_acc)),
             who + ": gradients need dhidden and one of dweight / dweight_acc");
    ZG_CHECK(a.v0 == 0 && a.local_vocab() == a.V,
             who +
                 ": run() takes the whole vocabulary; shards use linear_ce_shard_stats and "
                 "linear_ce_shard_backward");
    return grads;
}

CrossEntropyArgs ce_rows_view(const CrossEntropyArgs& all, int64_t r, int64_t n, Reduction red) {
    auto from = [r](auto* p) { return p ? p + r : p; };
    CrossEntropyArgs c = all;
    c.N = n;
    c.targets += r;
    if (red == Reduction::none) c.grad_output += r;
    c.loss_rows = from(c.loss_rows);
    c.ce_rows = from(c.ce_rows);
    c.z_rows = from(c.z_rows);
    c.lse_rows = from(c.lse_rows);
    return c;
}

size_t linear_ce_shard_workspace_bytes(int64_t N, int64_t C, int64_t V_local,
                                       const LinearCrossEntropyTuning& tuning) {
    WorkspaceLayout l(nullptr);
    carve_tiles(l, N, C, V_local, tile_shape(N, V_local, tuning), tuning.wgmma_epilogue);
    return l.bytes();
}

void linear_ce_shard_stats(RowStatsF* stats, const LinearCrossEntropyArgs& a,
                           const CrossEntropyOptions& o, void* workspace, CUstream_st* s) {
    check_linear_args(a, o);
    ZG_CHECK(stats, "linear_ce_shard_stats: stats are required");
    const TileShape t = tile_shape(a.N, a.local_vocab(), a.tuning);
    WorkspaceLayout l(workspace);
    const ShardSteps sh{a,
                        o,
                        ce_view(a, nullptr),
                        t,
                        carve_tiles(l, a.N, a.C, a.local_vocab(), t, a.tuning.wgmma_epilogue),
                        s};
    for (int64_t r = 0; r < a.N; r += t.rows) sh.stats_rows(stats, r, std::min(t.rows, a.N - r));
}

void linear_ce_shard_backward(float* dh_acc, const RowGradParams* params,
                              const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o,
                              void* workspace, CUstream_st* s) {
    check_linear_args(a, o);
    ZG_CHECK(dh_acc && params && (a.dweight || a.dweight_acc),
             "linear_ce_shard_backward: needs dh_acc, params and one of dweight / dweight_acc");
    const TileShape t = tile_shape(a.N, a.local_vocab(), a.tuning);
    WorkspaceLayout l(workspace);
    const ShardSteps sh{a,
                        o,
                        ce_view(a, nullptr),
                        t,
                        carve_tiles(l, a.N, a.C, a.local_vocab(), t, a.tuning.wgmma_epilogue),
                        s};
    sh.backward(params, dh_acc, /*dh_add=*/true);
}

const std::vector<LinearCrossEntropyVariant>& linear_cross_entropy_variants() {
    static const std::vector<LinearCrossEntropyVariant> v = {
        {"fused_linear",
         "tiles of rows x vocabulary chunks through cuBLASLt: logits twice, dh and dW "
         "accumulated in fp32, no N x V buffer",
         workspace_bytes, run_fused_linear},
        {"fused_linear_wgmma",
         "fused_linear's schedule with the logits on Hopper's wgmma and the cross-entropy in the "
         "GEMM's epilogue: no logits in memory for the statistics, dlogits tiles for cuBLASLt's "
         "dh and dW (sm_90, C % 8 == 0; elsewhere fused_linear's cuBLASLt tiles)",
         workspace_bytes_wgmma, run_fused_linear_wgmma},
        {"fused_linear_rows",
         "blocks of whole rows (Liger's schedule): logits once per block, the fast "
         "cross-entropy in place, dh and dW (added in fp32) from the block: 3 GEMMs, the block's "
         "R x V logits in memory (kernels/loss_head/linear_cross_entropy_rows.cu)",
         linear_ce_rows::workspace_bytes, linear_ce_rows::run},
        {"fused_linear_rows_filtered",
         "fused_linear_rows with Cut Cross-Entropy's gradient filtering: dh and dW skip every "
         "128 x 32 piece of dlogits below tuning.filter_eps (2^-12) of the gradient's scale, on "
         "mma.sync GEMMs of ours (kernels/gemm/filtered_gemm.cu); not exact, off by default",
         linear_ce_rows::workspace_bytes_filtered, linear_ce_rows::run_filtered},
    };
    return v;
}

const LinearCrossEntropyVariant& find_linear_cross_entropy_variant(const std::string& name) {
    for (const auto& v : linear_cross_entropy_variants())
        if (name == v.name) return v;
    throw Error("no fused linear cross-entropy variant '" + name + "'");
}

}  // namespace zgpt::cuda

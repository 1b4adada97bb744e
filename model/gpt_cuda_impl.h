// Private to model/ (not part of the public API): the definition of GptCuda::Impl, its members
// and small inline helpers; the bodies of the big methods are in gpt_cuda.cu (construction, the
// activation arena, forward, backward) and gpt_cuda_head.cu (the loss head).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>

#include "kernels/attention/attention.h"
#include "kernels/core/cuda_check.h"
#include "kernels/gemm/matmul.h"
#include "kernels/gemm/matmul_wgmma.h"
#include "kernels/loss_head/shard_one_read.h"
#include "kernels/norms/layernorm.h"
#include "kernels/ops/adamw.h"
#include "kernels/ops/encoder.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/global_norm.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "model/device_buffer.h"
#include "model/gpt_cuda.h"

namespace zgpt {

// The pipelined loss head's row chunks (fewer when the batch is small; at most kMaxHeadChunks,
// model/gpt_config.h). Chunking needs a per-row gradient that does not depend on the other rows,
// so `mean` runs in one piece.
constexpr int64_t kMinChunkRows = 1024;

struct GptCuda::Impl {
    ModelConfig cfg;
    CudaModelOptions opt;
    GptLayout layout;
    int64_t Vp;
    DType t;  // storage type of weights in matmuls and of activations
    size_t es;
    // The residual stream (and its gradient), the norms' inputs and their backward's weights, and
    // the embeddings: t, or fp32 under bf16 activations (CudaModelOptions::fp32_residual)
    DType rt;
    size_t res_es;
    // The block's widths (docs/llama.md): key/value heads, the qkv row C + 2 NKV hs, the MLP's
    // hidden width H and its first matmul's output (2H: SwiGLU's gate and up side by side).
    int64_t NKV, Cq, Hm, Fw;
    bool rms, rope, swiglu;  // model.norm rmsnorm, model.position rope, model.mlp swiglu
    cudaStream_t stream = nullptr;
    // Weight gradients run on a second stream, beside the input gradients and the norms of the
    // main stream: their GEMMs have few output tiles (768 x 768 at K = B x T), so on their own
    // they leave SMs idle. A buffer they read is rewritten only after they are done with it.
    cudaStream_t wstream = nullptr;
    cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
    // The loss head in row chunks: the cross-entropy of chunk c (memory-bound) runs on its own
    // stream beside the logits GEMM of chunk c + 1 and the input-gradient GEMM of chunk c - 1
    // (tensor-bound). Per chunk: an event after its logits GEMM and one after its cross-entropy.
    cudaStream_t cestream = nullptr;
    std::vector<cudaEvent_t> chunk_ev;
    bool head_pending = false;    // forward() left the logits GEMM to loss() or logits()
    bool head_dinp_done = false;  // loss() already wrote dlnf (the pipelined head)
    // Vocab parallel: the group, and whether loss() already did the head's backward (dlnf, dW).
    VocabGroup vgroup;
    bool head_sharded_done = false;
    // GptCuda::set_grad_ready_hook: the consumer stream, the hook, and the events it waits on.
    cudaStream_t grad_consumer = nullptr;
    std::function<void(int64_t, int64_t)> grad_ready;
    cudaEvent_t ready_main_ev = nullptr, ready_side_ev = nullptr;
    // The vocab-parallel buffers. The group's rows go through the head (and the embedding) in
    // chunks: chunk k holds rows [k vp_rows_per_chunk, ...) of every rank, so no buffer grows
    // with the group's P x B x T rows but the targets.
    DeviceBuffer vp_y;       // the group's tokens, or targets, rank by rank [P, BT]
    DeviceBuffer vp_yc;      // a chunk's targets in its row order [P, n]
    DeviceBuffer vp_h[2];    // a chunk's hidden states; the next chunk's are gathered beside
    DeviceBuffer vp_dhc[2];  // a chunk's dh (fp32) on its way to the reduce-scatter
    // a chunk's logits; in backward, the group's residual gradients (empty where those fit in
    // head_scratch)
    DeviceBuffer vp_work;
    DeviceBuffer vp_stats, vp_gathered, vp_params, vp_nvalid, vp_rows, vp_dh, vp_summary;
    DeviceBuffer vp_own_rows, vp_own_stats;  // this rank's rows' outputs and statistics
    // The one-read shard pass (kernels/loss_head/shard_one_read.h), where shard_one_read()
    // allows it: a chunk's local targets; its row buffers (cuda::one_read_rows: target logits,
    // ce and stat rows, the factors a and c); the scaled hidden states for dW; the sort's scratch;
    // a device 1.0 (the pass's grad output) and the pass's own summary.
    DeviceBuffer vp_local, vp_local_rows, vp_hs, vp_sort, vp_one, vp_local_summary;
    int64_t vp_rows_per_chunk = 0, vp_chunks = 0;
    cuda::LogitsType logits_type() const {
        return t == DType::bf16 ? cuda::LogitsType::bf16 : cuda::LogitsType::f32;
    }
    // The shards' one read (kernels.split_head_reads): the logits read once (one whole-row
    // pass, then per-row factors), not twice (statistics, exchange, gradient). "one" with fast or
    // online; not the fused linear heads (no logits), nor naive (its workspace is a row block of
    // probabilities), nor fast_lockstep (not measured). "auto" with fast only (online reads each
    // row twice inside its pass), by the length of rank 0's shard rows (the longest), so every
    // rank takes the same path. Per call, not with label smoothing or a non-negative
    // ignore_index, and only with a gradient.
    bool shard_one_read() const {
        const std::string& reads = opt.kernels.split_head_reads;
        if (reads == "two" || linear_ce || !ce || vgroup.size < 2) return false;
        const std::string name = ce->name;
        if (reads == "one") return name == "fast" || name == "online";
        return name == "fast" && size_t(shard_rows(0)) * es > size_t(cuda::kOneReadMinRowBytes);
    }
    // The gathers of the next chunk's hidden states and the reduce-scatters of the last chunk's
    // dh run on vpstream beside the head's GEMMs. Events (by buffer b = chunk % 2): h_ready[b],
    // h_free[b], dh_ready[b], dh_sent[b]; then the last collective's end, which the next one
    // waits for when it runs on the other stream (NCCL needs one order on every rank).
    cudaStream_t vpstream = nullptr;
    cudaEvent_t vp_ev[9] = {};
    // Rows [r0, r0 + n) of each rank's BT, and the chunk of rows they make: r0 = k x
    // vp_rows_per_chunk.
    int64_t vp_chunk_rows(int64_t k) const {
        return std::min(vp_rows_per_chunk, B * Tn - k * vp_rows_per_chunk);
    }
    std::map<const void*, cudaEvent_t> read_done;  // last weight-gradient read of each buffer
    const cuda::AttentionVariant* attention = nullptr;
    LayernormVariant ln_variant = LayernormVariant::fused_residual;  // resolved once
    // kernels.fc_bias_in_dw in effect (with biases and cuBLASLt's epilogues): ln2's rows are
    // ln2_ld() apart (C + 1 rounded up to kernels.fc_ones_align), column C holds ones and C + 1..
    // zeros, and fc's weight-gradient GEMM writes [H, ln2_ld()] into fc_dw_scratch, whose column
    // C is fc's bias gradient
    bool fc_bias_in_dw = false;
    int64_t ones_align = 8;
    int64_t ln2_ld() const {
        const int64_t C = cfg.n_embd;
        return fc_bias_in_dw ? (C + ones_align) / ones_align * ones_align : C;
    }
    DeviceBuffer fc_dw_scratch;
    MatmulVariant mm_variant = MatmulVariant::fused_epilogue;
    cuda::WgmmaSchedule wgmma_schedule = cuda::WgmmaSchedule::cooperative;  // with mm_variant wgmma
    const cuda::CrossEntropyVariant* ce = nullptr;  // null with fused_linear
    const cuda::LinearCrossEntropyVariant* linear_ce = nullptr;

    DeviceBuffer params, grads, params16;  // fp32 arenas; bf16 copy (bf16 precision only)
    // The gradient's deferred zeroing. Each weight matrix's gradient comes from one
    // weight-gradient GEMM a backward pass (`gemm_grads`: its output span, which may cover
    // several of the table's tensors, the table index linear_backward names it by, and whether
    // it is still fresh). zero_grad() zeroes only the rest of the arena
    // (biases, norms, embeddings: `zeroed_small` as one launch, the large tables by memset) and
    // marks these fresh: the pass's GEMM then writes them (beta 0) instead of adding to zeros,
    // which saves the memset of most of the arena and the GEMM's read of it. A reader of the
    // gradient before then (settle_fresh_grads) zeroes what is still fresh.
    struct GemmGrad {
        int64_t lo, hi;
        int idx;
        bool fresh;
    };
    std::vector<GemmGrad> gemm_grads;
    std::vector<int> gemm_grad_of;  // per table index: the GemmGrad it names, or -1
    std::vector<std::pair<int64_t, int64_t>> zeroed_large;  // memset
    DeviceBuffer zeroed_small;                              // cuda::FloatSpan[zeroed_small_count]
    int zeroed_small_count = 0;
    void plan_gradient_zeroing();
    void zero_grad();
    // Whether the gradient of table index idx is fresh (written, not added to, by its GEMM); it
    // is not fresh after this call.
    bool take_fresh(int idx);
    // Zeroes the fresh gradients that meet [lo, hi) (default: all of them).
    void settle_fresh_grads(int64_t lo = 0, int64_t hi = INT64_MAX);
    DeviceBuffer norm_scratch, norm_out;
    DeviceBuffer norm_parts;  // a sum of squares slice by slice (clip_and_adamw_step_sliced)
    // The sum of squares' copy for the host and its event: the host waits for the copy alone
    // (with clip_and_adamw_step_range, while the update runs)
    PinnedBuffer<double> h_norm;
    cudaEvent_t norm_ev = nullptr;

    // activations, per (B, T)
    int64_t B = 0, Tn = 0;
    struct Layer {
        DeviceBuffer ln1, ln1_mean, ln1_rstd, qkv_raw, q_mean, q_rstd, k_mean, k_rstd, qkv;
        DeviceBuffer att_saved, atty, res_attn, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
    };
    std::vector<DeviceBuffer> residual;  // [L + 1]
    std::vector<Layer> layers;           // one per block, or one shared by all (recompute_block)
    Layer& act_layer(int64_t l) { return layers[opt.recompute_block ? 0 : size_t(l)]; }
    bool recomputing = false;  // inside backward's run of a block's forward (recompute_block)
    DeviceBuffer lnf, lnf_mean, lnf_rstd, logits;
    DeviceBuffer tokens, targets, grad_out, summary;
    // the wte gradient's buckets (cuda::TokenBuckets): their six arrays in one buffer, n + 1
    // ints apart (upload_buckets()), on the device and in pinned host memory; the partials of
    // split tokens
    DeviceBuffer bucket_ints, bucket_partials;
    cuda::DeviceBuckets buckets;
    PinnedBuffer<int32_t> h_tokens, h_targets, h_bucket;
    PinnedBuffer<float> h_grad_out;
    PinnedBuffer<cuda::LossSummaryF> h_summary;
    std::vector<int32_t> last_tokens;
    DeviceBuffer branch_out;  // projection outputs before the residual add
    DeviceBuffer dres, dtmp, dqkv, dfch, gelu_tmp, att_scratch, ln_scratch, bias_scratch;
    DeviceBuffer dres_act;  // dres rounded to t for the matmuls (an fp32 residual stream only)
    DeviceBuffer dact;      // SwiGLU's output gradient [BT, H] (GELU's is computed in place)
    DeviceBuffer rope_tab;  // cuda::rope_table(Tn, hs, theta) on the device
    // Partial column sums of dqkv written by the attention backward when it can (the qkv bias
    // gradient without another pass over dqkv); empty otherwise.
    DeviceBuffer qkv_colsums;
    int64_t qkv_colsum_rows = 0;
    // Partial column sums of the residual gradient, left by the LayerNorm backward that writes it
    // (kernels.layernorm_bias_sums): the MLP projection's bias gradient (what LN1 of the next block
    // or the final LN wrote) and the attention projection's (what LN2 wrote); empty when off.
    DeviceBuffer mlp_bias_sums, attn_bias_sums;
    DeviceBuffer ce_workspace;
    // with a fused linear head: the memory its workspace shares with branch_out, dqkv and dfch
    // (and, with a split vocabulary, the embedding gradient's gathered rows)
    DeviceBuffer head_scratch;
    bool have_logits = false;
    bool profiling = false;
    cudaEvent_t ev[6] = {};  // head: forward matmul, cross-entropy, backward matmuls
    void mark(int i) {
        if (profiling) ZG_CUDA_CHECK(cudaEventRecord(ev[i], stream));
    }
    // Per-op timing (profile_ops): an event after each op; the time since the previous event
    // belongs to the op named. A null name starts a phase (host gaps are not attributed).
    bool profile_ops = false;
    std::vector<cudaEvent_t> pool;
    std::vector<std::pair<const char*, cudaEvent_t>> ticks;
    void tick(const char* name) {
        if (!profile_ops) return;
        if (recomputing && name) name = "block recompute";  // one line for a block's forward again
        if (ticks.size() == pool.size()) {
            pool.emplace_back();
            ZG_CUDA_CHECK(cudaEventCreate(&pool.back()));
        }
        cudaEvent_t e = pool[ticks.size()];
        ZG_CUDA_CHECK(cudaEventRecord(e, stream));
        ticks.emplace_back(name, e);
    }

    Impl(const ModelConfig& c, const CudaModelOptions& o);
    ~Impl();

    // Per-op timing puts its events on the main stream, so it runs everything there.
    bool overlapping() const { return !profile_ops; }
    // The main stream waits until the weight-gradient stream has read `buf`.
    void before_write(const void* buf) {
        auto it = read_done.find(buf);
        if (overlapping() && it != read_done.end())
            ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, it->second));
    }
    void mark_read(const void* buf) {
        cudaEvent_t& e = read_done[buf];
        if (!e) ZG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        ZG_CUDA_CHECK(cudaEventRecord(e, wstream));
    }

    // Weights as the matmuls and qk_norm's backward read them (bf16 copy or the fp32 master).
    const void* w(int idx) const {
        if (idx < 0) return nullptr;
        const int64_t off = layout.table[idx].offset;
        return t == DType::bf16 ? static_cast<const void*>(params16.as<bf16_t>() + off)
                                : static_cast<const void*>(params.as<float>() + off);
    }
    // The fp32 master weights: what the norms' forward passes read, whatever the types (with wr,
    // listed by GptCuda::master_read_spans: keep it in step).
    const float* wm(int idx) const {
        return idx < 0 ? nullptr : params.as<float>() + layout.table[idx].offset;
    }
    // Weights as the residual stream's ops read them (the norms' backward, embeddings): type rt.
    const void* wr(int idx) const { return rt == t ? w(idx) : wm(idx); }
    float* g(int idx) const {
        return idx < 0 ? nullptr : grads.as<float>() + layout.table[idx].offset;
    }
    using bf16_t = __nv_bfloat16;

    DeviceBuffer act(int64_t elems) const { return DeviceBuffer(size_t(elems) * es); }
    DeviceBuffer res_act(int64_t elems) const { return DeviceBuffer(size_t(elems) * res_es); }
    DeviceBuffer f32(int64_t elems) const { return DeviceBuffer(size_t(elems) * 4); }

    void ensure(int64_t b, int64_t tn);

    // The attention kernels' shape of this batch.
    cuda::AttentionShape attention_shape() const {
        cuda::AttentionShape sh{B, Tn, cfg.n_embd, cfg.n_head, opt.kernels.attention_tuning};
        sh.NKV = NKV;
        // backward turns dq and dk back itself (at the wgmma kernels' stores)
        if (rope) sh.rope_table = rope_tab.as<float>();
        return sh;
    }

    // model.norm's forward and backward: LayerNorm or RMSNorm (which takes no mean and no bias).
    // in_t: the type of inp (and dinp), t or rt; of the backward's weights too (the forward's are
    // the fp32 master weights).
    void norm_forward(void* out, cuda::RowMap om, float* mean, float* rstd, const void* inp,
                      cuda::RowMap im, const float* weight, const float* bias, int64_t N, int64_t C,
                      DType in_t) {
        if (rms)
            cuda::rmsnorm_forward(out, om, rstd, inp, im, weight, N, C, cfg.ln_eps, t, in_t,
                                  stream);
        else
            cuda::layernorm_forward(out, om, mean, rstd, inp, im, weight, bias, N, C, cfg.ln_eps, t,
                                    in_t, stream);
    }
    void norm_backward(void* dinp, cuda::RowMap dm, bool accumulate, float* dweight, float* dbias,
                       const void* dout, cuda::RowMap dom, const void* inp, cuda::RowMap im,
                       const void* weight, const float* mean, const float* rstd, int64_t N,
                       int64_t C, DType in_t, cuda::ColumnSumParts* dinp_sums = nullptr) {
        if (rms)
            cuda::rmsnorm_backward(dinp, dm, accumulate, dweight, dout, dom, inp, im, weight, rstd,
                                   N, C, ln_scratch.get(), t, in_t, stream, dinp_sums,
                                   opt.kernels.layernorm_split_rows);
        else
            cuda::layernorm_backward(dinp, dm, accumulate, dweight, dbias, dout, dom, inp, im,
                                     weight, mean, rstd, N, C, ln_scratch.get(), t, in_t, stream,
                                     dinp_sums, opt.kernels.layernorm_split_rows);
    }

    // out[M, N] = inp[M, K] @ W[N, K]^T, the forward GEMM of a linear layer (no epilogue).
    cuda::Gemm forward_gemm(void* out, const void* inp, const void* W, int64_t M, int64_t K,
                            int64_t N) const {
        cuda::Gemm gm = cuda::linear_forward_gemm(out, inp, W, M, K, N, t);
        gm.search = opt.kernels.matmul_search;
        return gm;
    }
    cuda::Gemm forward_gemm(void* out, const void* inp, int w_idx, int64_t M, int64_t K,
                            int64_t N) const {
        return forward_gemm(out, inp, w(w_idx), M, K, N);
    }

    // D[M, N] = A[M, K] @ W[N, K]^T (+ bias), the forward of a linear layer.
    void linear_forward(void* out, const void* inp, int w_idx, int b_idx, int64_t M, int64_t K,
                        int64_t N);

    // qkv = ln1 W_qkv^T (+ b), with rotary positions on q's and k's heads in the wgmma kernel's
    // epilogue where it runs (matmul=wgmma and matmul_wgmma_rope, rope without qk_norm, head
    // size 64): true when it rotated them; false when the caller runs the separate RoPE pass.
    bool qkv_forward(void* qkv, const void* inp, int w_idx, int b_idx);
    // fch = ln2 W_fc^T (+ b), gate and up, and out = SwiGLU(fch) in the wgmma kernel's epilogue
    // (matmul=wgmma and matmul_wgmma_swiglu, bf16, hidden width a multiple of 128): false
    // (nothing run) elsewhere, and the caller runs the GEMM and the separate SwiGLU pass.
    bool fc_swiglu_forward(void* fch, void* out, const void* inp, int w_idx, int b_idx);
    // fch = ln2 W_fc^T + b (pre-activation) and gelu = GELU(fch); inp's rows lda apart (0: K).
    void fc_gelu_forward(void* fch, void* gelu, const void* inp, int w_idx, int b_idx, int64_t M,
                         int64_t K, int64_t N, int64_t lda = 0);

    // dinp[M, K] = dout[M, N] @ W[N, K], the input gradient of a linear layer (no epilogue).
    cuda::Gemm input_grad_gemm(void* dinp, const void* dout, const void* W, int64_t M, int64_t K,
                               int64_t N) const {
        cuda::Gemm gm = cuda::linear_input_grad_gemm(dinp, dout, W, M, K, N, t);
        gm.search = opt.kernels.matmul_search;
        return gm;
    }
    cuda::Gemm input_grad_gemm(void* dinp, const void* dout, int w_idx, int64_t M, int64_t K,
                               int64_t N) const {
        return input_grad_gemm(dinp, dout, w(w_idx), M, K, N);
    }
    // dW[N, K] += dout[M, N]^T @ inp[M, K] in fp32, the weight gradient of a linear layer.
    cuda::Gemm weight_grad_gemm(float* dW, const void* dout, const void* inp, int64_t M, int64_t K,
                                int64_t N) const {
        cuda::Gemm gw = cuda::linear_weight_grad_gemm(dW, dout, inp, M, K, N, t);
        gw.search = opt.kernels.matmul_search;
        return gw;
    }

    // dinp = dout @ W (written); dW += dout^T @ inp; db += column sums of dout (b_idx -1: no
    // bias). With gelu_pre (the pre-activation of a GELU that fed this layer), dinp is multiplied
    // by GELU' in the GEMM epilogue when the fused variant runs, kernels.gelu_backward_in_gemm is
    // on and cuBLASLt supports it; returns whether it was (else the caller runs gelu_backward).
    // bias_parts: partial column sums of dout ([bias_part_rows, N]) that its producer wrote; the
    // bias gradient is then summed from them instead of from dout.
    // inp_ones: inp's rows are ln2_ld() apart with ones in column K (fc under fc_bias_in_dw):
    // dW and the bias gradient come from one GEMM over the K + 1 columns, through fc_dw_scratch.
    bool linear_backward(void* dinp, const void* dout, const void* inp, int w_idx, int b_idx,
                         int64_t M, int64_t K, int64_t N, const void* gelu_pre = nullptr,
                         bool head = false, const float* bias_parts = nullptr,
                         int64_t bias_part_rows = 0, bool inp_ones = false);

    // res_out = a + b; norm_out = LayerNorm(res_out): fused or as two passes. norm_out's rows
    // norm_ld apart (0: C, as the LayerNorm kernels read it).
    void add_norm(void* res_out, void* norm_out, float* mean, float* rstd, const void* a,
                  const void* b, int w_idx, int b_idx, int64_t N, int64_t C, int64_t norm_ld = 0);

    // A block's branch ends here: res_out = res_in + inp[M, K] W^T + bias, then norm_out =
    // LayerNorm(res_out) with weights (ln_w, ln_b). Under `residual_in_matmul` (bf16 residual
    // stream, GEMM epilogues on) the add is the GEMM's C operand and the LayerNorm reads one
    // tensor; otherwise the branch goes through branch_out and add_norm. Ticks "matmul fwd" and
    // "residual + layernorm fwd".
    void project_add_norm(void* res_out, void* norm_out, float* mean, float* rstd,
                          const void* res_in, const void* inp, int w_idx, int b_idx, int64_t K,
                          int ln_w, int ln_b, int64_t norm_ld = 0);
    bool residual_in_matmul() const {
        return ln_variant == LayernormVariant::residual_in_matmul && rt == t &&
               mm_variant != MatmulVariant::separate;
    }

    void forward(const int32_t* host_tokens, int64_t b, int64_t tn);
    // Block l's forward from its input residual[l] into act_layer(l). In forward its LayerNorm 1
    // output is there already past block 0 (the previous block's projection wrote it) and it ends
    // by adding the MLP into residual[l + 1] with the next norm; run again for backward
    // (recompute) it takes its LayerNorm 1 first and stops before that last projection, whose
    // output exists.
    void block_forward(int64_t l, bool recompute);

    // A vocab-parallel group holds wte split by rows: the token rows of this rank come from every
    // shard. The group's tokens are all-gathered; each rank looks up the rows its shard holds
    // (zeros elsewhere) for all of them, in fp32; a reduce-scatter gives each rank its own tokens'
    // rows, each the sum of one row and zeros (exact); the positions are added as
    // encoder_forward does. The wte gradient goes the other way in backward().
    void embed_from_shards();
    // The group's tokens on their way to h_tokens (embed_from_shards), read by upload_buckets
    // once the copy is done: the host does not wait for it in the middle of the forward pass.
    cudaEvent_t group_tokens_ev = nullptr;
    bool group_tokens_pending = false;

    // The wte-gradient buckets of the last forward's tokens (sorted on the host); with a split
    // table, of the group's tokens that this shard holds.
    void upload_buckets();

    // With defer_summary, loss() leaves its summary on the way to h_summary (summary_ev) and
    // returns an empty one; take_summary() waits for it (forward_loss_backward()). The
    // vocab-parallel head does not defer (its collectives synchronise anyway).
    CrossEntropySummary loss(const int32_t* host_targets, const CrossEntropyOptions& o,
                             double grad_output, bool compute_grad, bool defer_summary = false);
    bool grads_ready = false;
    int64_t pending_chunks = 0;  // > 0 while a deferred summary is on its way
    cudaEvent_t summary_ev = nullptr;
    CrossEntropySummary take_summary();

    // Rows of the LM head that vocab-parallel rank r owns: contiguous in the ids the model is
    // given, the first V % size ranks one more (train/vocab_parallel/vocab_parallel_head.h
    // splits the same way).
    int64_t shard_rows(int r) const {
        const int64_t V = cfg.vocab_size, P = vgroup.size;
        return V / P + (r < V % P ? 1 : 0);
    }
    // The row stride of a shard's logits: its rows rounded up to 128, as the whole head's are
    // (padded_vocab_size). Shards of odd length (V = 50257 over 2 ranks: 25129 and 25128 rows)
    // would otherwise put rows at unaligned addresses, where cuBLASLt and the cross-entropy take
    // their slow paths and the other ranks wait for that one.
    int64_t shard_logits_ld(int r) const { return padded_vocab_size(shard_rows(r)); }
    // The rows a shard's head GEMMs run over: its rows rounded up to 8, inside its table
    // (vocab_table_rows rounds the same way). cuBLASLt runs an odd width (rank 0's 25129 at
    // V = 50257) on slower kernels than an aligned one; the extra columns' dlogits are zeroed,
    // so they add nothing to dW or dh.
    int64_t shard_gemm_rows(int r) const { return (shard_rows(r) + 7) / 8 * 8; }
    int64_t shard_v0(int r) const {
        const int64_t V = cfg.vocab_size, P = vgroup.size;
        return r * (V / P) + std::min<int64_t>(r, V % P);
    }

    // The vocab-parallel head (see GptCuda::set_vocab_group). targets and grad_out are on the
    // device already.
    CrossEntropySummary loss_sharded(const CrossEntropyOptions& o, bool compute_grad);

    // Row chunks of a logits head over `rows` rows (this rank's, or a vocab-parallel group's).
    int64_t head_chunks(const CrossEntropyOptions& o, int64_t rows) const {
        if (linear_ce || o.reduction != Reduction::sum) return 1;
        return chunks_of(rows);
    }
    // kernels.head_chunks, fewer where chunks would hold under kMinChunkRows of `rows`
    int64_t chunks_of(int64_t rows) const {
        return std::max<int64_t>(1,
                                 std::min<int64_t>(opt.kernels.head_chunks, rows / kMinChunkRows));
    }
    // logits of rows [r0, r0 + n) (the forward's head GEMM, or a chunk of it)
    void head_logits(int64_t r0, int64_t n);
    // The cross-entropy of rows [r0, r0 + n): loss summary, dlogits in place.
    void head_cross_entropy(int64_t r0, int64_t n, const CrossEntropyOptions& o,
                            cuda::LossSummaryF* sum, cudaStream_t st);
    // dlnf of rows [r0, r0 + n) = dlogits @ W_head
    void head_input_grad(int64_t r0, int64_t n);
    static CrossEntropySummary to_summary(const cuda::LossSummaryF& f);
    // The chunks' summaries as one (sum reduction: every field adds, except the maximum).
    static cuda::LossSummaryF combine_summaries(const cuda::LossSummaryF* s, int64_t n);

    // Block l's gradients (block L - 1's with the final LayerNorm's) are enqueued: the consumer
    // stream waits for both streams that wrote them, then the hook hears which elements.
    void announce_block_grads(int64_t l);

    // The residual gradient as the matmuls read it: dres itself, or (an fp32 residual stream) a
    // copy rounded to t, as autocast rounds the gradient that enters a bf16 linear.
    const void* dres_for_matmul();

    void backward();

    void refresh_bf16() {
        if (t != DType::bf16) return;
        // a plain conversion pass, rounding to nearest as the AdamW kernel does
        cuda::cast_from_f32(params16.get(), params.as<float>(), layout.table.total(), DType::bf16,
                            stream);
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    size_t allocated() const;
};

}  // namespace zgpt

// GptCuda: the model on one GPU. Impl's construction, the activation arena (ensure()), the
// forward and backward passes, and the public GptCuda methods; the loss head is in
// gpt_cuda_head.cu, the profiling summaries in gpt_cuda_profile.cu.
#include "model/gpt_cuda.h"

#include <algorithm>
#include <cstring>

#include "kernels/core/workspace.h"
#include "kernels/ops/copy_spans.h"
#include "model/gpt_cuda_impl.h"

namespace zgpt {

void validate_kernels(const KernelChoice& k, DType precision) {
    // the names against the registry (kernels/core/registry.h), then the CUDA entries behind them
    for (const KernelFamily& f : kernel_families())
        kernel_variant(f.name, kernel_choice(k, f.name));
    cuda::find_attention_variant(k.attention);
    if (is_linear_cross_entropy(k.cross_entropy))
        cuda::find_linear_cross_entropy_variant(k.cross_entropy);
    else
        cuda::find_cross_entropy_variant(k.cross_entropy);
    if (is_linear_cross_entropy(k.cross_entropy) && precision != DType::bf16)
        throw Error("kernels.cross_entropy: " + k.cross_entropy +
                    " runs in bf16 only (train.precision=fp32)");
}

GptCuda::Impl::Impl(const ModelConfig& c, const CudaModelOptions& o)
    : cfg(c),
      opt(o),
      layout(make_gpt_layout(c, o.vocab_parts)),
      Vp(vocab_table_rows(c, o.vocab_parts)),
      t(o.precision),
      es(dtype_bytes(o.precision)),
      rt(o.fp32_residual ? DType::f32 : o.precision),
      res_es(dtype_bytes(rt)) {
    validate(cfg);
    NKV = kv_heads(cfg);
    Cq = cfg.n_embd + 2 * NKV * (cfg.n_embd / cfg.n_head);
    Hm = mlp_hidden_size(cfg);
    swiglu = cfg.mlp == "swiglu";
    Fw = swiglu ? 2 * Hm : Hm;
    rms = cfg.norm == "rmsnorm";
    rope = cfg.position == "rope";
    validate_kernels(opt.kernels, t);
    ZG_CHECK(opt.kernels.head_chunks >= 1 && opt.kernels.head_chunks <= kMaxHeadChunks,
             "kernels.head_chunks must be in [1, " + std::to_string(kMaxHeadChunks) + "]");
    attention = &cuda::find_attention_variant(opt.kernels.attention);
    ln_variant = LayernormVariant(kernel_variant("layernorm", opt.kernels.layernorm));
    mm_variant = MatmulVariant(kernel_variant("matmul", opt.kernels.matmul));
    // the ones column rides on fc's input rows into the GELU GEMM's epilogue path only
    fc_bias_in_dw = opt.kernels.fc_bias_in_dw && cfg.bias && !swiglu &&
                    mm_variant == MatmulVariant::fused_epilogue;
    ZG_CHECK(opt.kernels.fc_ones_align == 8 || opt.kernels.fc_ones_align == 64,
             "kernels.fc_ones_align: 8 or 64");
    ones_align = opt.kernels.fc_ones_align;
    ZG_CHECK(
        opt.kernels.split_head_reads == "auto" || opt.kernels.split_head_reads == "one" ||
            opt.kernels.split_head_reads == "two",
        "kernels.split_head_reads: auto, one or two, not '" + opt.kernels.split_head_reads + "'");
    ZG_CHECK(opt.kernels.matmul_wgmma_schedule == "cooperative" ||
                 opt.kernels.matmul_wgmma_schedule == "pingpong",
             "kernels.matmul_wgmma_schedule: cooperative or pingpong, not '" +
                 opt.kernels.matmul_wgmma_schedule + "'");
    wgmma_schedule = opt.kernels.matmul_wgmma_schedule == "pingpong"
                         ? cuda::WgmmaSchedule::pingpong
                         : cuda::WgmmaSchedule::cooperative;
    if (is_linear_cross_entropy(opt.kernels.cross_entropy))
        linear_ce = &cuda::find_linear_cross_entropy_variant(opt.kernels.cross_entropy);
    else
        ce = &cuda::find_cross_entropy_variant(opt.kernels.cross_entropy);
    ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&wstream, cudaStreamNonBlocking));
    ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&cestream, cudaStreamNonBlocking));
    ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&vpstream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : vp_ev)
        ZG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (int i = 0; i < 2 * kMaxHeadChunks; i++) {
        chunk_ev.emplace_back();
        ZG_CUDA_CHECK(cudaEventCreateWithFlags(&chunk_ev.back(), cudaEventDisableTiming));
    }
    ZG_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
    ZG_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));
    ZG_CUDA_CHECK(cudaEventCreateWithFlags(&group_tokens_ev, cudaEventDisableTiming));
    ZG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_main_ev, cudaEventDisableTiming));
    ZG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_side_ev, cudaEventDisableTiming));
    ZG_CUDA_CHECK(cudaEventCreateWithFlags(&norm_ev, cudaEventDisableTiming));
    const size_t n = size_t(layout.table.total());
    // the arenas with their zeroed tail (DeviceBuffer zeroes): a collective's padding
    const size_t capacity = n + size_t(GptCuda::kArenaTail);
    params = DeviceBuffer(capacity * 4);
    grads = DeviceBuffer(capacity * 4);
    if (t == DType::bf16) params16 = DeviceBuffer(capacity * 2);
    norm_scratch = DeviceBuffer(cuda::sum_of_squares_scratch_bytes());
    norm_out = DeviceBuffer(sizeof(double));
    norm_parts = DeviceBuffer(GptCuda::kMaxNormParts * sizeof(double));
    h_norm = PinnedBuffer<double>(1);
    grad_out = DeviceBuffer(sizeof(float));
    summary = DeviceBuffer(kMaxHeadChunks * sizeof(cuda::LossSummaryF));
    plan_gradient_zeroing();
}

void GptCuda::Impl::plan_gradient_zeroing() {
    const ParameterTable& tb = layout.table;
    const int64_t C = cfg.n_embd, n = tb.total(), count = int64_t(tb.specs().size());
    gemm_grad_of.assign(size_t(count), -1);
    // A weight-gradient GEMM's output: `elems` from tensor idx's start, whole tensors only.
    const auto add = [&](int idx, int64_t elems) {
        if (idx < 0) return;
        const int64_t lo = tb[idx].offset, hi = lo + elems;
        for (int i = 0; i < int(count); i++) {
            const int64_t a = tb[i].offset, b = a + tb[i].numel;
            ZG_CHECK(b <= lo || a >= hi || (a >= lo && b <= hi),
                     "a weight-gradient GEMM covers part of " + tb[i].name);
        }
        gemm_grads.push_back({lo, hi, idx, false});
    };
    // linear_backward's weight gradients of each block (q, k and v as one matrix, SwiGLU's gate
    // and up as one), and fc's bias with its weight under fc_bias_in_dw
    for (const BlockParams& p : layout.blocks) {
        add(p.qkv_w, Cq * C);
        add(p.proj_w, C * C);
        add(p.fc_w, Fw * C);
        if (fc_bias_in_dw) add(p.fc_b, Fw);
        add(p.fcproj_w, C * Hm);
    }
    std::sort(gemm_grads.begin(), gemm_grads.end(),
              [](const GemmGrad& x, const GemmGrad& y) { return x.lo < y.lo; });
    for (size_t k = 0; k < gemm_grads.size(); k++) gemm_grad_of[size_t(gemm_grads[k].idx)] = int(k);
    // the rest: large tables by memset, the small spans between the matrices in one launch
    constexpr int64_t kLarge = int64_t(1) << 20;
    std::vector<cuda::FloatSpan> small;
    const auto rest = [&](int64_t lo, int64_t hi) {
        if (hi <= lo) return;
        if (hi - lo >= kLarge)
            zeroed_large.push_back({lo, hi});
        else
            small.push_back({lo, hi - lo});
    };
    int64_t at = 0;
    for (const GemmGrad& gg : gemm_grads) {
        rest(at, gg.lo);
        at = gg.hi;
    }
    rest(at, n);
    ZG_CHECK(small.size() <= 65535, "plan_gradient_zeroing: too many spans between the matrices");
    zeroed_small_count = int(small.size());
    zeroed_small = DeviceBuffer(std::max<size_t>(1, small.size()) * sizeof(cuda::FloatSpan));
    if (!small.empty() && zeroed_small.get()) {  // (no memory while only sizing the model)
        ZG_CUDA_CHECK(cudaMemcpy(zeroed_small.get(), small.data(),
                                 small.size() * sizeof(cuda::FloatSpan), cudaMemcpyHostToDevice));
        // (a copy from pageable memory may return before it lands; the model's streams do not
        // wait for the default stream)
        ZG_CUDA_CHECK(cudaDeviceSynchronize());
    }
}

void GptCuda::Impl::zero_grad() {
    float* g0 = grads.as<float>();
    for (const auto& [lo, hi] : zeroed_large)
        ZG_CUDA_CHECK(cudaMemsetAsync(g0 + lo, 0, size_t(hi - lo) * 4, stream));
    cuda::zero_spans(g0, zeroed_small.as<cuda::FloatSpan>(), zeroed_small_count, stream);
    for (GemmGrad& gg : gemm_grads) gg.fresh = true;
}

bool GptCuda::Impl::take_fresh(int idx) {
    if (idx < 0 || gemm_grad_of[size_t(idx)] < 0) return false;
    GemmGrad& gg = gemm_grads[size_t(gemm_grad_of[size_t(idx)])];
    const bool fresh = gg.fresh;
    gg.fresh = false;
    return fresh;
}

void GptCuda::Impl::settle_fresh_grads(int64_t lo, int64_t hi) {
    for (GemmGrad& gg : gemm_grads)
        if (gg.fresh && gg.lo < hi && gg.hi > lo) {
            ZG_CUDA_CHECK(
                cudaMemsetAsync(grads.as<float>() + gg.lo, 0, size_t(gg.hi - gg.lo) * 4, stream));
            gg.fresh = false;
        }
}

GptCuda::Impl::~Impl() {
    for (cudaEvent_t e : pool) cudaEventDestroy(e);
    for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
    for (auto& [buf, e] : read_done) cudaEventDestroy(e);
    if (fork_ev) cudaEventDestroy(fork_ev);
    if (join_ev) cudaEventDestroy(join_ev);
    if (group_tokens_ev) cudaEventDestroy(group_tokens_ev);
    if (summary_ev) cudaEventDestroy(summary_ev);
    if (ready_main_ev) cudaEventDestroy(ready_main_ev);
    if (ready_side_ev) cudaEventDestroy(ready_side_ev);
    if (norm_ev) cudaEventDestroy(norm_ev);
    for (cudaEvent_t e : chunk_ev) cudaEventDestroy(e);
    for (cudaEvent_t e : vp_ev)
        if (e) cudaEventDestroy(e);
    if (vpstream) cudaStreamDestroy(vpstream);
    for (cudaStream_t s : {cestream, wstream, stream})
        if (s) {
            cuda::release_gemm_workspace(s);
            cudaStreamDestroy(s);
        }
}

namespace {
// Column `col` of a rows x ld matrix of type t set to 1 (the rest as it was: zeros from
// DeviceBuffer), once when the buffer is made.
void set_ones_column(void* m, int64_t rows, int64_t col, int64_t ld, DType t) {
    const size_t es = dtype_bytes(t);
    std::vector<unsigned char> ones(size_t(rows) * es);
    const float one_f = 1.0f;
    const __nv_bfloat16 one_b = __float2bfloat16(1.0f);
    for (int64_t r = 0; r < rows; r++)
        std::memcpy(
            ones.data() + size_t(r) * es,
            t == DType::f32 ? static_cast<const void*>(&one_f) : static_cast<const void*>(&one_b),
            es);
    ZG_CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(m) + size_t(col) * es, size_t(ld) * es,
                               ones.data(), es, es, size_t(rows), cudaMemcpyHostToDevice));
    ZG_CUDA_CHECK(cudaDeviceSynchronize());  // the model's streams do not wait for the copy
}
}  // namespace

void GptCuda::Impl::ensure(int64_t b, int64_t tn) {
    if (b == B && tn == Tn) return;
    B = b;
    Tn = tn;
    const int64_t BT = B * Tn, C = cfg.n_embd, NH = cfg.n_head, L = cfg.n_layer;
    const cuda::AttentionShape shape = attention_shape();  // for sizes (rope_tab is made below)
    residual.clear();
    layers.clear();
    if (fc_bias_in_dw) fc_dw_scratch = f32(Fw * ln2_ld());
    for (int64_t l = 0; l <= L; l++) residual.push_back(res_act(BT * C));
    // RMSNorm keeps no mean: its buffers stay empty (null)
    auto means = [&](int64_t rows) { return rms ? DeviceBuffer() : f32(rows); };
    for (int64_t l = 0; l < (opt.recompute_block ? 1 : L); l++) {
        Layer a;
        a.ln1 = act(BT * C);
        a.ln1_mean = means(BT);
        a.ln1_rstd = f32(BT);
        if (cfg.qk_norm) {
            a.qkv_raw = act(BT * Cq);
            a.q_mean = means(BT * NH);
            a.q_rstd = f32(BT * NH);
            a.k_mean = means(BT * NKV);
            a.k_rstd = f32(BT * NKV);
        }
        a.qkv = act(BT * Cq);
        a.att_saved = DeviceBuffer(attention->saved_bytes(shape));
        a.atty = act(BT * C);
        a.res_attn = res_act(BT * C);
        a.ln2 = act(BT * ln2_ld());
        if (fc_bias_in_dw && a.ln2.get()) set_ones_column(a.ln2.get(), BT, C, ln2_ld(), t);
        a.ln2_mean = means(BT);
        a.ln2_rstd = f32(BT);
        a.fch = act(BT * Fw);
        if (!opt.recompute_gelu) a.fch_gelu = act(BT * Hm);
        layers.push_back(std::move(a));
    }
    lnf = act(BT * C);
    lnf_mean = means(BT);
    lnf_rstd = f32(BT);
    const bool sharded = vgroup.size > 1;
    ZG_CHECK(!sharded || !is_whole_rows_linear_cross_entropy(opt.kernels.cross_entropy),
             "kernels.cross_entropy=" + opt.kernels.cross_entropy +
                 " runs the whole vocabulary on one GPU; the "
                 "vocab-parallel head (parallel.vocab_parallel > 1) takes fast, fused_linear or "
                 "fused_linear_wgmma");
    logits = linear_ce || sharded ? DeviceBuffer() : act(BT * Vp);
    if (sharded) {
        // The group's NA = P x BT rows in chunks of vp_rows_per_chunk rows of every rank: as many
        // as the one-GPU head's chunks (kernels.head_chunks) over the group's rows, each of
        // at least kMinChunkRows.
        const int64_t P = vgroup.size, NA = P * BT;
        const int64_t chunks = chunks_of(NA);
        // (a multiple of 4: a bf16 chunk of an odd width is still whole 4-byte words for the
        // all-gather, and every chunk but the last starts the embedding's rows 8-byte aligned,
        // as the 64-bit words of their exchange need)
        vp_rows_per_chunk = ((BT + chunks - 1) / chunks + 3) / 4 * 4;
        vp_chunks = (BT + vp_rows_per_chunk - 1) / vp_rows_per_chunk;
        const int64_t NC = P * vp_rows_per_chunk;  // the group's rows of a chunk, at most
        vp_y = DeviceBuffer(NA * 4);
        vp_yc = DeviceBuffer(NC * 4);
        for (int b = 0; b < 2; b++) {
            vp_h[b] = DeviceBuffer(size_t(NC * C) * es);
            vp_dhc[b] = f32(NC * C);  // also the embedding's rows of a chunk
        }
        vp_stats = DeviceBuffer(NC * sizeof(cuda::RowStatsF));
        vp_gathered = DeviceBuffer(P * NC * sizeof(cuda::RowStatsF));
        vp_params = DeviceBuffer(NC * sizeof(cuda::RowGradParams));
        vp_nvalid = DeviceBuffer(2 * sizeof(int));
        vp_rows = f32(4 * NC);  // loss, ce, z, lse of each row of a chunk
        vp_own_rows = f32(4 * BT);
        vp_own_stats = DeviceBuffer(BT * sizeof(cuda::RowStatsF));
        // (also the embedding's rows, whose last chunk may write up to 6 bytes past B x T rows)
        vp_dh = DeviceBuffer(size_t(BT * C) * 4 + 8);
        vp_summary = DeviceBuffer(sizeof(cuda::LossSummaryF));
        if (shard_one_read()) {
            vp_local = DeviceBuffer(NC * 4);
            vp_local_rows = DeviceBuffer(cuda::one_read_rows(nullptr, NC).bytes);
            vp_hs = DeviceBuffer(size_t(NC * C) * es);
            vp_sort = DeviceBuffer(cuda::shard_dw_target_scratch_bytes(NC));
            vp_one = f32(1);
            if (vp_one.get()) {  // (not when only sizing)
                const float one = 1.0f;
                ZG_CUDA_CHECK(cudaMemcpy(vp_one.get(), &one, 4, cudaMemcpyHostToDevice));
            }
            vp_local_summary = DeviceBuffer(sizeof(cuda::LossSummaryF));
        }
    }
    tokens = DeviceBuffer(BT * 4);
    targets = DeviceBuffer(BT * 4);
    // the wte gradient's buckets: of this rank's tokens, or of the group's in this shard
    const int64_t NB = vgroup.size * BT;
    // six arrays of at most NB + 1 ints: token, offset, position, slot, merge_token, merge_offset
    bucket_ints = DeviceBuffer(6 * (NB + 1) * 4);
    bucket_partials = f32(cuda::bucket_partial_rows(NB) * C);
    h_tokens = PinnedBuffer<int32_t>(NB);
    h_targets = PinnedBuffer<int32_t>(BT);
    h_bucket = PinnedBuffer<int32_t>(6 * (NB + 1));
    h_grad_out = PinnedBuffer<float>(1);
    h_summary = PinnedBuffer<cuda::LossSummaryF>(kMaxHeadChunks);
    dres = res_act(BT * C);
    if (rt != t) dres_act = act(BT * C);
    dtmp = act(BT * C);
    if (opt.recompute_gelu) gelu_tmp = act(BT * Hm);
    dact = swiglu ? act(BT * Hm) : DeviceBuffer();
    if (rope) {
        const std::vector<float> tab = cuda::rope_table(Tn, C / NH, cfg.rope_theta);
        rope_tab = DeviceBuffer(tab.size() * 4);
        if (rope_tab.get())  // (not when only sizing)
            ZG_CUDA_CHECK(
                cudaMemcpy(rope_tab.get(), tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
    }
    att_scratch = DeviceBuffer(attention->scratch_bytes(shape));
    // with qk_norm or rotary positions the bias gradient is of the q and k the qkv matmul wrote,
    // not of what attention read
    qkv_colsum_rows = 0;
    if (cfg.bias && !cfg.qk_norm && !rope) qkv_colsum_rows = attention->colsum_rows(shape, t);
    if (qkv_colsum_rows > 0)
        qkv_colsums = DeviceBuffer(size_t(qkv_colsum_rows) * Cq * sizeof(float));
    if (cfg.bias && opt.kernels.layernorm_bias_sums) {
        mlp_bias_sums = DeviceBuffer(cuda::layernorm_backward_sums_bytes(BT, C));
        attn_bias_sums = DeviceBuffer(cuda::layernorm_backward_sums_bytes(BT, C));
    }
    ln_scratch = DeviceBuffer(std::max(cuda::layernorm_backward_scratch_bytes(BT, C),
                                       cuda::layernorm_backward_scratch_bytes(BT * NH, C / NH)));
    bias_scratch = DeviceBuffer(cuda::bias_backward_scratch_bytes(BT, std::max({C, Cq, Fw})));
    const KernelChoice& k = opt.kernels;
    const size_t ws =
        linear_ce && sharded
            ? std::max(  // a shorter last chunk can take wider tiles, so more bytes
                  cuda::linear_ce_shard_workspace_bytes(vgroup.size * vp_rows_per_chunk, C,
                                                        shard_rows(vgroup.rank),
                                                        model_linear_ce_tuning(k)),
                  cuda::linear_ce_shard_workspace_bytes(vgroup.size * vp_chunk_rows(vp_chunks - 1),
                                                        C, shard_rows(vgroup.rank),
                                                        model_linear_ce_tuning(k)))
        : linear_ce
            ? linear_ce->workspace_bytes(BT, C, cfg.vocab_size, model_linear_ce_tuning(k))
            : std::max(ce->workspace_bytes(BT, Vp, logits_type()),
                       // the one-read shard pass: the variant over a chunk of the group's rows
                       shard_one_read() && sharded
                           ? ce->workspace_bytes(vgroup.size * vp_rows_per_chunk,
                                                 shard_rows(vgroup.rank), logits_type())
                           : size_t(0));
    // A fused linear head's workspace (fused_linear_rows: a block of logits, 1-2 GB) shares one
    // allocation with branch_out, dqkv and dfch: the head runs after the forward's last read of
    // branch_out (the final LayerNorm) and returns before the backward first writes dqkv or dfch.
    // The head with its logits in memory keeps them into the backward, so it shares nothing.
    // Their offsets come from a measuring WorkspaceLayout: each part 256-byte aligned.
    const size_t nb = size_t(BT * C) * es, nq = size_t(BT * Cq) * es, nf = size_t(BT * Fw) * es;
    WorkspaceLayout parts(nullptr);
    parts.take<unsigned char>(nb);
    const size_t q0 = parts.bytes();
    parts.take<unsigned char>(nq);
    const size_t f0 = parts.bytes();
    parts.take<unsigned char>(nf);
    const bool share = linear_ce != nullptr;
    head_scratch = DeviceBuffer(share ? std::max(ws, parts.bytes()) : 0);
    auto part = [&](size_t offset, size_t bytes) {
        return share ? DeviceBuffer::view(head_scratch, offset, bytes) : DeviceBuffer(bytes);
    };
    // residual_in_matmul's projections write the residual stream itself: no branch buffer
    branch_out = residual_in_matmul() && !share ? DeviceBuffer() : part(0, nb);
    dqkv = part(q0, nq);
    dfch = part(f0, nf);
    ce_workspace = part(0, ws);
    if (sharded) {
        // A chunk's logits; and at the end of the backward the group's residual gradients (type
        // rt), for the embedding's gradient. Those go into head_scratch where the block buffers
        // alone are large enough (the same on every rank, unlike the shard's workspace): it is
        // free then (block 0's backward is done with dqkv and dfch).
        const int64_t NC = vgroup.size * vp_rows_per_chunk;
        const size_t logits_bytes = linear_ce ? 0 : size_t(NC * shard_logits_ld(vgroup.rank)) * es;
        const size_t group_rows = size_t(vgroup.size * BT * C) * res_es;
        vp_work = DeviceBuffer(
            std::max(logits_bytes, share && parts.bytes() >= group_rows ? 0 : group_rows));
    }
}

void GptCuda::Impl::linear_forward(void* out, const void* inp, int w_idx, int b_idx, int64_t M,
                                   int64_t K, int64_t N) {
    cuda::Gemm gm = forward_gemm(out, inp, w_idx, M, K, N);
    const bool fused = mm_variant != MatmulVariant::separate;
    if (b_idx >= 0 && fused) {
        gm.epilogue = cuda::Epilogue::bias;
        gm.bias = w(b_idx);
    }
    // the wgmma variant's kernel where it runs (sm_90, bf16, aligned), cuBLASLt elsewhere
    if (!(mm_variant == MatmulVariant::wgmma && cuda::try_gemm_wgmma(gm, stream, wgmma_schedule)))
        cuda::gemm(gm, stream);
    if (b_idx >= 0 && !fused) cuda::add_bias(out, w(b_idx), M, N, t, stream);
}

bool GptCuda::Impl::qkv_forward(void* qkv, const void* inp, int w_idx, int b_idx) {
    const int64_t BT = B * Tn, C = cfg.n_embd, hs = C / cfg.n_head;
    if (rope && !cfg.qk_norm && mm_variant == MatmulVariant::wgmma &&
        opt.kernels.matmul_wgmma_rope) {
        cuda::Gemm gm = forward_gemm(qkv, inp, w_idx, BT, C, Cq);
        if (b_idx >= 0) {
            gm.epilogue = cuda::Epilogue::bias;
            gm.bias = w(b_idx);
        }
        gm.rope_table = rope_tab.as<float>();
        gm.rope_Tn = Tn;
        gm.rope_hs = hs;
        gm.rope_cols = (cfg.n_head + NKV) * hs;  // q's and k's heads, not v's
        if (cuda::try_gemm_wgmma(gm, stream, wgmma_schedule)) return true;
    }
    linear_forward(qkv, inp, w_idx, b_idx, BT, C, Cq);
    return false;
}

bool GptCuda::Impl::fc_swiglu_forward(void* fch, void* out, const void* inp, int w_idx, int b_idx) {
    if (mm_variant != MatmulVariant::wgmma || !opt.kernels.matmul_wgmma_swiglu) return false;
    cuda::Gemm gm = forward_gemm(out, inp, w_idx, B * Tn, cfg.n_embd, Fw);
    gm.epilogue = b_idx >= 0 ? cuda::Epilogue::swiglu_aux_bias : cuda::Epilogue::swiglu_aux;
    gm.bias = b_idx >= 0 ? w(b_idx) : nullptr;
    gm.aux = fch;
    return cuda::try_gemm_wgmma(gm, stream, wgmma_schedule);
}

void GptCuda::Impl::fc_gelu_forward(void* fch, void* gelu, const void* inp, int w_idx, int b_idx,
                                    int64_t M, int64_t K, int64_t N, int64_t lda) {
    ZG_CHECK(lda == 0 || lda == K || mm_variant == MatmulVariant::fused_epilogue,
             "fc_gelu_forward: strided input rows only with cuBLASLt's epilogues");
    if (mm_variant != MatmulVariant::separate) {
        cuda::Gemm gm = forward_gemm(gelu, inp, w_idx, M, K, N);
        if (lda != K) gm.lda = lda;
        gm.epilogue = b_idx >= 0 ? cuda::Epilogue::gelu_aux_bias : cuda::Epilogue::gelu_aux;
        gm.bias = w(b_idx);
        gm.aux = fch;
        if (!(mm_variant == MatmulVariant::wgmma &&
              cuda::try_gemm_wgmma(gm, stream, wgmma_schedule)))
            cuda::gemm(gm, stream);
    } else {
        linear_forward(fch, inp, w_idx, b_idx, M, K, N);
        cuda::gelu_forward(gelu, fch, M * N, t, stream);
    }
}

bool GptCuda::Impl::linear_backward(void* dinp, const void* dout, const void* inp, int w_idx,
                                    int b_idx, int64_t M, int64_t K, int64_t N,
                                    const void* gelu_pre, bool head, const float* bias_parts,
                                    int64_t bias_part_rows, bool inp_ones) {
    const bool fused = mm_variant != MatmulVariant::separate;  // wgmma: cuBLASLt's backward
    bool gelu_done = false;
    // the head's dW stays on the main stream: on the weight-gradient stream it measured no
    // better (H100, same call)
    const bool side = overlapping() && !head;
    if (dinp) {
        cuda::Gemm gm = input_grad_gemm(dinp, dout, w_idx, M, K, N);
        if (gelu_pre && fused && opt.kernels.gelu_backward_in_gemm) {
            gm.epilogue = cuda::Epilogue::dgelu;
            gm.aux = const_cast<void*>(gelu_pre);
            gelu_done = cuda::try_gemm(gm, stream);
            gm.epilogue = cuda::Epilogue::none;
            gm.aux = nullptr;
        }
        if (!gelu_done) cuda::gemm(gm, stream);
        tick(head ? "head matmul bwd dinp" : "matmul bwd dinp");
    }
    // Forked after the dinp GEMM: forking before it (so that the two GEMMs of one layer run
    // together) measured no better on the H100.
    cudaStream_t ws = side ? wstream : stream;
    if (side) {
        ZG_CUDA_CHECK(cudaEventRecord(fork_ev, stream));
        ZG_CUDA_CHECK(cudaStreamWaitEvent(wstream, fork_ev));
    }
    cuda::Gemm gw = weight_grad_gemm(g(w_idx), dout, inp, M, K, N);
    const bool fresh = take_fresh(w_idx);  // written, not added to zeros (zero_grad)
    // The bias gradient is its own pass over dout, not cuBLASLt's BGRADB epilogue: that
    // epilogue sums inside the GEMM's main loop and slowed the weight-gradient GEMMs by more than
    // the column sums cost, which on the side stream also overlap the input-gradient GEMMs. Nor
    // is fc's taken from the GELU' GEMM (Epilogue::dgelu_bias_grad): that GEMM became several
    // times slower than the plain one and its bias pass together (H200, bench_gemm, e466be5).
    if (inp_ones) {  // [N, ln2_ld()] with the bias gradient in column K (written, beta 0)
        ZG_CHECK(b_idx >= 0 && fc_bias_in_dw, "linear_backward: a ones column without its bias");
        gw.D = fc_dw_scratch.get();
        gw.N = ln2_ld();
        gw.beta = 0.0f;
        cuda::gemm(gw, ws);  // the scratch is only used on ws: in stream order
        tick("matmul bwd dW");
        ZG_CHECK(take_fresh(b_idx) == fresh, "linear_backward: fc's weight and bias both fresh");
        cuda::add_weight_and_bias_grad(g(w_idx), g(b_idx), fc_dw_scratch.as<float>(), N, K,
                                       ln2_ld(), ws, !fresh);
        tick("bias bwd");  // with the weight gradient's add: what replaces the bias pass
        if (side) {
            mark_read(dout);
            mark_read(inp);
        }
        return gelu_done;
    }
    if (fresh) gw.beta = 0.0f;
    cuda::gemm(gw, ws);
    tick(head ? "head matmul bwd dW" : "matmul bwd dW");
    if (b_idx >= 0) {
        if (bias_parts)
            cuda::bias_backward_from_partials(g(b_idx), bias_parts, bias_part_rows, N, ws);
        else
            cuda::bias_backward(g(b_idx), dout, M, N, t, bias_scratch.get(), ws);
        tick("bias bwd");
    }
    if (side) {
        mark_read(dout);
        mark_read(inp);
        if (bias_parts) mark_read(bias_parts);
    }
    return gelu_done;
}

void GptCuda::Impl::add_norm(void* res_out, void* norm_out, float* mean, float* rstd, const void* a,
                             const void* b, int w_idx, int b_idx, int64_t N, int64_t C,
                             int64_t norm_ld) {
    // residual_in_matmul where its GEMM cannot take the add (fp32 residual stream, separate
    // epilogues) falls back to the fused kernel
    if (ln_variant != LayernormVariant::separate && rms) {
        cuda::residual_rmsnorm_forward(res_out, norm_out, rstd, a, b, wm(w_idx), N, C, cfg.ln_eps,
                                       t, rt, stream, norm_ld);
    } else if (ln_variant != LayernormVariant::separate) {
        cuda::residual_layernorm_forward(res_out, norm_out, mean, rstd, a, b, wm(w_idx), wm(b_idx),
                                         N, C, cfg.ln_eps, t, rt, stream, norm_ld);
    } else {
        cuda::residual_forward(res_out, a, b, N * C, t, rt, stream);
        norm_forward(norm_out, {1, norm_ld}, mean, rstd, res_out, {1, C}, wm(w_idx), wm(b_idx), N,
                     C, rt);
    }
}

void GptCuda::Impl::project_add_norm(void* res_out, void* norm_out, float* mean, float* rstd,
                                     const void* res_in, const void* inp, int w_idx, int b_idx,
                                     int64_t K, int ln_w, int ln_b, int64_t norm_ld) {
    const int64_t BT = B * Tn, C = cfg.n_embd;
    if (!residual_in_matmul()) {
        linear_forward(branch_out.get(), inp, w_idx, b_idx, BT, K, C);
        tick("matmul fwd");
        add_norm(res_out, norm_out, mean, rstd, res_in, branch_out.get(), ln_w, ln_b, BT, C,
                 norm_ld);
        tick("residual + layernorm fwd");
        return;
    }
    // one rounding to bf16 of (product + bias + residual), where add_norm rounds the branch first
    cuda::Gemm gm = forward_gemm(res_out, inp, w_idx, BT, K, C);
    if (b_idx >= 0) {
        gm.epilogue = cuda::Epilogue::bias;
        gm.bias = w(b_idx);
    }
    gm.C = res_in;
    gm.beta = 1.0f;
    cuda::gemm(gm, stream);  // cuBLASLt: the wgmma kernel has no C operand
    tick("matmul fwd");
    norm_forward(norm_out, {1, norm_ld}, mean, rstd, res_out, {1, C}, wm(ln_w), wm(ln_b), BT, C,
                 rt);
    tick("residual + layernorm fwd");
}

void GptCuda::Impl::forward(const int32_t* host_tokens, int64_t b, int64_t tn) {
    ZG_CHECK(b > 0 && tn > 0 && tn <= cfg.block_size,
             "sequence length " + std::to_string(tn) +
                 " must be in [1, block_size=" + std::to_string(cfg.block_size) + "]");
    for (int64_t i = 0; i < b * tn; i++)
        ZG_CHECK(host_tokens[i] >= 0 && host_tokens[i] < cfg.vocab_size,
                 "token id " + std::to_string(host_tokens[i]) + " outside the vocabulary");
    ensure(b, tn);
    tick(nullptr);
    const int64_t BT = B * Tn, C = cfg.n_embd, L = cfg.n_layer;
    std::memcpy(h_tokens.get(), host_tokens, BT * 4);
    ZG_CUDA_CHECK(
        cudaMemcpyAsync(tokens.get(), h_tokens.get(), BT * 4, cudaMemcpyHostToDevice, stream));
    if (vgroup.size > 1) {
        embed_from_shards();
    } else {
        last_tokens.assign(host_tokens, host_tokens + BT);
        cuda::encoder_forward(residual[0].get(), tokens.as<int32_t>(), wr(layout.wte),
                              wr(layout.wpe), B, Tn, C, rt, stream);
    }
    tick("encoder fwd");
    for (int64_t l = 0; l < L; l++) block_forward(l, false);
    head_pending = !linear_ce;  // loss() runs the logits GEMM, chunked with the cross-entropy
    head_dinp_done = false;
    upload_buckets();  // host work while the GPU runs the forward pass
    have_logits = true;
}

void GptCuda::Impl::block_forward(int64_t l, bool recompute) {
    const int64_t BT = B * Tn, C = cfg.n_embd, NH = cfg.n_head, hs = C / NH, L = cfg.n_layer;
    const cuda::AttentionShape shape = attention_shape();
    const BlockParams& p = layout.blocks[l];
    Layer& a = act_layer(l);
    recomputing = recompute;
    if (recompute) {  // the side stream's weight gradients of block l + 1 read these buffers
        for (const DeviceBuffer* b : {&a.ln1, &a.qkv_raw, &a.qkv, &a.atty, &a.res_attn, &a.ln2,
                                      &a.fch, &a.fch_gelu, &gelu_tmp})
            before_write(b->get());
    }
    if (recompute || l == 0) {  // past block 0 in forward, the previous block's projection wrote it
        norm_forward(a.ln1.get(), {1, C}, a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(),
                     residual[l].get(), {1, C}, wm(p.ln1_w), wm(p.ln1_b), BT, C, rt);
        tick("layernorm fwd");
    }
    const int64_t KVC = NKV * hs;
    bool roped = false;  // RoPE taken in the qkv GEMM's epilogue
    if (cfg.qk_norm) {
        linear_forward(a.qkv_raw.get(), a.ln1.get(), p.qkv_w, p.qkv_b, BT, C, Cq);
        const cuda::RowMap qh{NH, Cq}, kh{NKV, Cq};
        const char* raw = a.qkv_raw.as<char>();
        char* qkv = a.qkv.as<char>();
        norm_forward(qkv, qh, a.q_mean.as<float>(), a.q_rstd.as<float>(), raw, qh, wm(p.q_norm_w),
                     wm(p.q_norm_b), BT * NH, hs, t);
        norm_forward(qkv + C * es, kh, a.k_mean.as<float>(), a.k_rstd.as<float>(), raw + C * es, kh,
                     wm(p.k_norm_w), wm(p.k_norm_b), BT * NKV, hs, t);
        ZG_CUDA_CHECK(cudaMemcpy2DAsync(qkv + (C + KVC) * es, Cq * es, raw + (C + KVC) * es,
                                        Cq * es, KVC * es, BT, cudaMemcpyDeviceToDevice, stream));
    } else {
        roped = qkv_forward(a.qkv.get(), a.ln1.get(), p.qkv_w, p.qkv_b);
    }
    tick("matmul fwd (qkv, qk_norm)");
    if (rope && !roped) {  // q's and k's heads, side by side at the start of each row
        cuda::rope_forward(a.qkv.get(), rope_tab.as<float>(), B, Tn, NH + NKV, hs, Cq, t, stream);
        tick("rope fwd");
    }
    attention->forward(a.atty.get(), a.att_saved.get(), a.qkv.get(), shape, t, stream);
    tick("attention fwd");
    project_add_norm(a.res_attn.get(), a.ln2.get(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                     residual[l].get(), a.atty.get(), p.proj_w, p.proj_b, C, p.ln2_w, p.ln2_b,
                     ln2_ld());
    void* gelu = opt.recompute_gelu ? gelu_tmp.get() : a.fch_gelu.get();  // or SwiGLU's
    if (swiglu && fc_swiglu_forward(a.fch.get(), gelu, a.ln2.get(), p.fc_w, p.fc_b)) {
        tick("matmul fwd (fc + SwiGLU)");
    } else if (swiglu) {  // gate and up: one matmul, then the elementwise gate
        linear_forward(a.fch.get(), a.ln2.get(), p.fc_w, p.fc_b, BT, C, Fw);
        tick("matmul fwd");
        cuda::swiglu_forward(gelu, a.fch.get(), BT, Hm, t, stream);
        tick("swiglu fwd");
    } else {
        fc_gelu_forward(a.fch.get(), gelu, a.ln2.get(), p.fc_w, p.fc_b, BT, C, Hm, ln2_ld());
        tick("matmul fwd (fc + GELU)");
    }
    recomputing = false;
    if (recompute) return;  // residual[l + 1] is there
    const bool last = l == L - 1;
    Layer& next = act_layer(last ? l : l + 1);  // (the same buffers under recompute_block)
    project_add_norm(residual[l + 1].get(), last ? lnf.get() : next.ln1.get(),
                     last ? lnf_mean.as<float>() : next.ln1_mean.as<float>(),
                     last ? lnf_rstd.as<float>() : next.ln1_rstd.as<float>(), a.res_attn.get(),
                     gelu, p.fcproj_w, p.fcproj_b, Hm,
                     last ? layout.lnf_w : layout.blocks[l + 1].ln1_w,
                     last ? layout.lnf_b : layout.blocks[l + 1].ln1_b);
}

void GptCuda::Impl::embed_from_shards() {
    const int64_t BT = B * Tn, C = cfg.n_embd, P = vgroup.size, NA = P * BT;
    vgroup.all_gather(tokens.get(), vp_y.get(), BT * 4, stream);
    tick("encoder fwd (vp): all-gather tokens");
    // Chunk by chunk (as the head's): for the chunk's tokens of every rank, the rows this shard
    // holds and zero bits for the rest, in the table's type; each token's row is in one shard,
    // so an integer reduce-scatter gives each rank its own tokens' rows bit for bit, at the
    // table's width (half of fp32's bytes in bf16). Each rank's block is padded to 8 bytes.
    const int64_t row_es = int64_t(res_es);  // bytes of the table's type, rt
    char* chunk_rows = vp_dhc[0].as<char>();
    char* own_rows = vp_dh.as<char>();  // (B x T rows of type rt; 8 bytes of slack at its end)
    for (int64_t k = 0; k < vp_chunks; k++) {
        const int64_t r0 = k * vp_rows_per_chunk, n = vp_chunk_rows(k);
        const int64_t used = n * C * row_es, block = (used + 7) / 8 * 8;
        cuda::lookup_rows_in_shard(chunk_rows, block / row_es, vp_y.as<int32_t>() + r0, BT, P, n,
                                   wr(layout.wte), shard_v0(vgroup.rank), shard_rows(vgroup.rank),
                                   C, rt, stream);
        if (block > used)
            for (int64_t q = 0; q < P; q++)
                ZG_CUDA_CHECK(
                    cudaMemsetAsync(chunk_rows + q * block + used, 0, block - used, stream));
        vgroup.reduce_scatter_owned(chunk_rows, own_rows + r0 * C * row_es, block, stream);
    }
    tick("encoder fwd (vp): rows, reduce-scatter");
    cuda::add_positions(residual[0].get(), own_rows, wr(layout.wpe), B, Tn, C, rt, stream);
    // The group's tokens to the host for the gradient's buckets; upload_buckets reads them at
    // the end of the forward pass, while the GPU runs it.
    ZG_CUDA_CHECK(
        cudaMemcpyAsync(h_tokens.get(), vp_y.get(), NA * 4, cudaMemcpyDeviceToHost, stream));
    ZG_CUDA_CHECK(cudaEventRecord(group_tokens_ev, stream));
    group_tokens_pending = true;
}

void GptCuda::Impl::upload_buckets() {
    if (group_tokens_pending) {
        // The group's tokens in this shard, as rows of the shard (-1: another shard's).
        group_tokens_pending = false;
        vgroup.settle();  // the tokens' all-gather, bounded by the timeout
        ZG_CUDA_CHECK(cudaEventSynchronize(group_tokens_ev));
        const int64_t NA = vgroup.size * B * Tn;
        const int64_t v0 = shard_v0(vgroup.rank), rows = shard_rows(vgroup.rank);
        last_tokens.resize(NA);
        for (int64_t i = 0; i < NA; i++) {
            const int64_t r = int64_t(h_tokens.get()[i]) - v0;
            last_tokens[i] = r >= 0 && r < rows ? int32_t(r) : -1;
        }
    }
    const int64_t n = int64_t(last_tokens.size());
    // other shards' tokens (-1) get no entry
    const cuda::TokenBuckets bk = cuda::bucket_tokens(last_tokens.data(), n);
    const std::vector<int32_t>* arrays[6] = {&bk.token, &bk.offset,      &bk.position,
                                             &bk.slot,  &bk.merge_token, &bk.merge_offset};
    const int32_t* dev[6];
    for (int k = 0; k < 6; k++) {
        const std::vector<int32_t>& a = *arrays[k];
        ZG_CHECK(int64_t(a.size()) <= n + 1, "upload_buckets: more entries than positions");
        int32_t* h = h_bucket.get() + k * (n + 1);
        int32_t* d = bucket_ints.as<int32_t>() + k * (n + 1);
        std::copy(a.begin(), a.end(), h);
        if (!a.empty())
            ZG_CUDA_CHECK(cudaMemcpyAsync(d, h, a.size() * 4, cudaMemcpyHostToDevice, stream));
        dev[k] = d;
    }
    buckets = {dev[0],       dev[1],      dev[2],
               dev[3],       dev[4],      dev[5],
               bk.entries(), bk.merged(), bucket_partials.as<float>()};
}

void GptCuda::Impl::announce_block_grads(int64_t l) {
    if (!grad_ready) return;
    const ParameterTable& tb = layout.table;
    const int64_t L = cfg.n_layer, lo = tb[layout.blocks[l].ln1_w].offset;
    const ParamSpec& last = tb[layout.lnf_b >= 0 ? layout.lnf_b : layout.lnf_w];
    const int64_t hi = l + 1 < L ? tb[layout.blocks[l + 1].ln1_w].offset : last.offset + last.numel;
    ZG_CUDA_CHECK(cudaEventRecord(ready_main_ev, stream));
    ZG_CUDA_CHECK(cudaStreamWaitEvent(grad_consumer, ready_main_ev));
    if (overlapping()) {
        ZG_CUDA_CHECK(cudaEventRecord(ready_side_ev, wstream));
        ZG_CUDA_CHECK(cudaStreamWaitEvent(grad_consumer, ready_side_ev));
    }
    grad_ready(lo, hi);
}

const void* GptCuda::Impl::dres_for_matmul() {
    if (rt == t) return dres.get();
    before_write(dres_act.get());
    cuda::cast_from_f32(dres_act.get(), dres.as<float>(), B * Tn * cfg.n_embd, t, stream);
    tick("residual gradient cast");
    return dres_act.get();
}

void GptCuda::Impl::backward() {
    ZG_CHECK(grads_ready, "backward() needs forward() and loss(..., compute_grad=true) first");
    grads_ready = false;
    const int64_t BT = B * Tn, C = cfg.n_embd, NH = cfg.n_head, hs = C / NH, L = cfg.n_layer;
    const cuda::AttentionShape shape = attention_shape();
    // head: dtmp = dlnf
    tick(nullptr);
    mark(4);
    if (!linear_ce && !head_sharded_done)
        linear_backward(head_dinp_done ? nullptr : dtmp.get(), logits.get(), lnf.get(),
                        layout.lm_head, -1, BT, C, Vp, nullptr, true);
    head_sharded_done = false;
    mark(5);
    // The residual gradient's column sums, when the LayerNorm backward leaves them: the bias
    // gradients of the projections that add into the residual stream.
    const bool ln_sums = mlp_bias_sums.bytes() > 0;
    cuda::ColumnSumParts mlp_sums{mlp_bias_sums.as<float>()}, attn_sums{attn_bias_sums.as<float>()};
    before_write(dres.get());
    before_write(mlp_sums.parts);
    norm_backward(dres.get(), {1, C}, false, g(layout.lnf_w), g(layout.lnf_b), dtmp.get(), {1, C},
                  residual[L].get(), {1, C}, wr(layout.lnf_w), lnf_mean.as<float>(),
                  lnf_rstd.as<float>(), BT, C, rt, ln_sums ? &mlp_sums : nullptr);
    tick("layernorm bwd");
    for (int64_t l = L - 1; l >= 0; l--) {
        const BlockParams& p = layout.blocks[l];
        // one block's buffers for all: block l's forward again (the last block's is still there)
        if (opt.recompute_block && l < L - 1) block_forward(l, true);
        Layer& a = act_layer(l);
        // MLP branch
        void* gelu = a.fch_gelu.get();  // or SwiGLU's output
        if (opt.recompute_gelu) {
            gelu = gelu_tmp.get();
            before_write(gelu);
            if (swiglu)
                cuda::swiglu_forward(gelu, a.fch.get(), BT, Hm, t, stream);
            else
                cuda::gelu_forward(gelu, a.fch.get(), BT * Hm, t, stream);
            tick("GELU recompute");
        }
        const float* mlp_parts = mlp_sums.rows > 0 ? mlp_sums.parts : nullptr;
        if (swiglu) {
            linear_backward(dact.get(), dres_for_matmul(), gelu, p.fcproj_w, p.fcproj_b, BT, Hm, C,
                            nullptr, false, mlp_parts, mlp_sums.rows);
            before_write(dfch.get());
            cuda::swiglu_backward(dfch.get(), a.fch.get(), dact.get(), BT, Hm, t, stream);
            tick("swiglu bwd");
        } else {
            before_write(dfch.get());
            if (!linear_backward(dfch.get(), dres_for_matmul(), gelu, p.fcproj_w, p.fcproj_b, BT,
                                 Hm, C, a.fch.get(), false, mlp_parts, mlp_sums.rows)) {
                cuda::gelu_backward(dfch.get(), a.fch.get(), dfch.get(), BT * Hm, t, stream);
                tick("GELU bwd");
            }
        }
        linear_backward(dtmp.get(), dfch.get(), a.ln2.get(), p.fc_w, p.fc_b, BT, C, Fw, nullptr,
                        false, nullptr, 0, fc_bias_in_dw);
        before_write(dres.get());
        before_write(attn_sums.parts);
        norm_backward(dres.get(), {1, C}, true, g(p.ln2_w), g(p.ln2_b), dtmp.get(), {1, C},
                      a.res_attn.get(), {1, C}, wr(p.ln2_w), a.ln2_mean.as<float>(),
                      a.ln2_rstd.as<float>(), BT, C, rt, ln_sums ? &attn_sums : nullptr);
        tick("layernorm bwd");
        // attention branch
        linear_backward(dtmp.get(), dres_for_matmul(), a.atty.get(), p.proj_w, p.proj_b, BT, C, C,
                        nullptr, false, attn_sums.rows > 0 ? attn_sums.parts : nullptr,
                        attn_sums.rows);
        before_write(dqkv.get());
        before_write(qkv_colsums.get());
        attention->backward(dqkv.get(), dtmp.get(), a.qkv.get(), a.atty.get(), a.att_saved.get(),
                            att_scratch.get(), qkv_colsums.as<float>(), shape, t, stream);
        tick("attention bwd");  // with rotary positions, dq and dk of the unrotated q and k
        if (cfg.qk_norm) {      // in place: dqkv's q and k parts become the pre-norm gradients
            const cuda::RowMap qh{NH, Cq}, kh{NKV, Cq};
            char* d = dqkv.as<char>();
            const char* raw = a.qkv_raw.as<char>();
            norm_backward(d, qh, false, g(p.q_norm_w), g(p.q_norm_b), d, qh, raw, qh, w(p.q_norm_w),
                          a.q_mean.as<float>(), a.q_rstd.as<float>(), BT * NH, hs, t);
            norm_backward(d + C * es, kh, false, g(p.k_norm_w), g(p.k_norm_b), d + C * es, kh,
                          raw + C * es, kh, w(p.k_norm_w), a.k_mean.as<float>(),
                          a.k_rstd.as<float>(), BT * NKV, hs, t);
        }
        if (cfg.qk_norm) tick("qk_norm bwd");
        linear_backward(dtmp.get(), dqkv.get(), a.ln1.get(), p.qkv_w, p.qkv_b, BT, C, Cq, nullptr,
                        false, qkv_colsums.as<float>(), qkv_colsum_rows);
        before_write(dres.get());
        before_write(mlp_sums.parts);  // block l - 1's MLP bias gradient (none below block 0)
        norm_backward(dres.get(), {1, C}, true, g(p.ln1_w), g(p.ln1_b), dtmp.get(), {1, C},
                      residual[l].get(), {1, C}, wr(p.ln1_w), a.ln1_mean.as<float>(),
                      a.ln1_rstd.as<float>(), BT, C, rt, ln_sums && l > 0 ? &mlp_sums : nullptr);
        tick("layernorm bwd");
        announce_block_grads(l);
    }
    if (vgroup.size > 1) {
        // wpe from this rank's rows; wte: the group's row gradients, of the tokens this
        // shard holds (in vp_work, the head's logits, or in head_scratch: see ensure)
        cuda::encoder_backward(nullptr, g(layout.wpe), dres.get(), {}, B, Tn, C, rt, stream);
        tick("encoder bwd");
        void* group_rows = vp_work.bytes() > 0 ? vp_work.get() : head_scratch.get();
        if (group_rows == head_scratch.get())  // (its views, which the dW stream may still read)
            for (const DeviceBuffer* b : {&branch_out, &dqkv, &dfch}) before_write(b->get());
        vgroup.all_gather(dres.get(), group_rows, BT * C * int64_t(res_es), stream);
        tick("encoder bwd (vp): all-gather dres");
        cuda::encoder_backward(g(layout.wte), nullptr, group_rows, buckets, vgroup.size * B, Tn, C,
                               rt, stream);
    } else {
        cuda::encoder_backward(g(layout.wte), g(layout.wpe), dres.get(), buckets, B, Tn, C, rt,
                               stream);
    }
    tick("encoder bwd");
    if (overlapping()) {  // the gradients are complete when the main stream goes on
        ZG_CUDA_CHECK(cudaEventRecord(join_ev, wstream));
        ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, join_ev));
    }
}

size_t GptCuda::Impl::allocated() const {
    size_t s = params.bytes() + grads.bytes() + params16.bytes() + zeroed_small.bytes() +
               norm_scratch.bytes() + norm_out.bytes() + grad_out.bytes() + summary.bytes();
    for (const DeviceBuffer& r : residual) s += r.bytes();
    for (const Layer& a : layers)
        for (const DeviceBuffer* b :
             {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv_raw, &a.q_mean, &a.q_rstd, &a.k_mean,
              &a.k_rstd, &a.qkv, &a.att_saved, &a.atty, &a.res_attn, &a.ln2, &a.ln2_mean,
              &a.ln2_rstd, &a.fch, &a.fch_gelu})
            s += b->bytes();
    for (const DeviceBuffer* b : {&lnf,          &lnf_mean,      &lnf_rstd,       &logits,
                                  &tokens,       &targets,       &bucket_ints,    &bucket_partials,
                                  &branch_out,   &dres,          &dres_act,       &dtmp,
                                  &dqkv,         &dfch,          &gelu_tmp,       &att_scratch,
                                  &ln_scratch,   &bias_scratch,  &qkv_colsums,    &ce_workspace,
                                  &head_scratch, &mlp_bias_sums, &attn_bias_sums, &fc_dw_scratch,
                                  &dact,         &rope_tab})
        s += b->owned_bytes();  // views of head_scratch count once, in it
    for (const DeviceBuffer* b :
         {&vp_y,        &vp_yc,        &vp_h[0],     &vp_h[1],         &vp_dhc[0], &vp_dhc[1],
          &vp_work,     &vp_stats,     &vp_gathered, &vp_params,       &vp_nvalid, &vp_rows,
          &vp_own_rows, &vp_own_stats, &vp_dh,       &vp_summary,      &vp_local,  &vp_local_rows,
          &vp_hs,       &vp_sort,      &vp_one,      &vp_local_summary})
        s += b->bytes();
    return s + cuda::gemm_workspace_bytes({stream, wstream, cestream});
}
GptCuda::GptCuda(const ModelConfig& config, const CudaModelOptions& options)
    : impl_(std::make_unique<Impl>(config, options)) {}
GptCuda::~GptCuda() = default;

const ModelConfig& GptCuda::config() const {
    return impl_->cfg;
}
const GptLayout& GptCuda::layout() const {
    return impl_->layout;
}
const CudaModelOptions& GptCuda::options() const {
    return impl_->opt;
}
int64_t GptCuda::padded_vocab() const {
    return impl_->Vp;
}
int64_t GptCuda::num_parameters() const {
    return impl_->layout.table.total();
}

void GptCuda::set_params(const float* host) {
    // what the model's streams still have queued (a ZeRO-1 gather after a step) lands first
    settle_collectives();
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    ZG_CUDA_CHECK(
        cudaMemcpy(impl_->params.get(), host, num_parameters() * 4, cudaMemcpyHostToDevice));
    // A copy from pageable memory may return before its DMA lands, and the legacy stream does not
    // order it before the model's non-blocking stream: wait for it.
    ZG_CUDA_CHECK(cudaDeviceSynchronize());
    impl_->refresh_bf16();
}
void GptCuda::settle_collectives() const {
    impl_->vgroup.settle();
}
void GptCuda::get_params(float* host) const {
    settle_collectives();
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    ZG_CUDA_CHECK(
        cudaMemcpy(host, impl_->params.get(), num_parameters() * 4, cudaMemcpyDeviceToHost));
}
void GptCuda::get_grads(float* host) const {
    impl_->settle_fresh_grads();
    settle_collectives();
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    ZG_CUDA_CHECK(
        cudaMemcpy(host, impl_->grads.get(), num_parameters() * 4, cudaMemcpyDeviceToHost));
}

void GptCuda::forward(const int32_t* tokens, int64_t B, int64_t Tn) {
    impl_->forward(tokens, B, Tn);
}
CrossEntropySummary GptCuda::loss(const int32_t* targets, const CrossEntropyOptions& opts,
                                  double grad_output, bool compute_grad) {
    return impl_->loss(targets, opts, grad_output, compute_grad);
}
void GptCuda::backward() {
    impl_->backward();
}
CrossEntropySummary GptCuda::forward_loss_backward(const int32_t* tokens, const int32_t* targets,
                                                   int64_t B, int64_t Tn,
                                                   const CrossEntropyOptions& opts,
                                                   double grad_output) {
    Impl& im = *impl_;
    im.forward(tokens, B, Tn);
    const CrossEntropySummary s = im.loss(targets, opts, grad_output, true, true);
    im.backward();
    return im.pending_chunks > 0 ? im.take_summary() : s;  // the vocab-parallel head did not defer
}
void GptCuda::set_vocab_group(VocabGroup group) {
    ZG_CHECK(group.size >= 1 && group.rank >= 0 && group.rank < group.size,
             "vocab group: rank outside [0, size)");
    ZG_CHECK(group.size == 1 ||
                 (group.all_gather && group.reduce_scatter_sum && group.reduce_scatter_owned),
             "vocab group: the collectives are missing");
    ZG_CHECK(bool(group.settle), "vocab group: settle is empty (its default does nothing)");
    ZG_CHECK(group.size == impl_->opt.vocab_parts,
             "vocab group of " + std::to_string(group.size) + " ranks for a model built for " +
                 std::to_string(impl_->opt.vocab_parts) + " vocabulary parts");
    impl_->vgroup = std::move(group);
    impl_->B = impl_->Tn = 0;  // buffers are sized again at the next forward
}
void GptCuda::set_grad_ready_hook(void* consumer_stream,
                                  std::function<void(int64_t lo, int64_t hi)> hook) {
    ZG_CHECK(!hook || consumer_stream, "set_grad_ready_hook: a hook needs a consumer stream");
    impl_->grad_consumer = static_cast<cudaStream_t>(consumer_stream);
    impl_->grad_ready = std::move(hook);
}

void* GptCuda::stream() const {
    return impl_->stream;
}
void GptCuda::zero_grad() {
    impl_->zero_grad();
}
double GptCuda::grad_norm() {
    return std::sqrt(grad_sum_of_squares(0, num_parameters()));
}

double GptCuda::grad_sum_of_squares(int64_t lo, int64_t hi) {
    queue_sum_of_squares(lo, hi);
    settle_collectives();  // the backward's last collectives
    ZG_CUDA_CHECK(cudaEventSynchronize(impl_->norm_ev));
    return *impl_->h_norm.get();
}

void GptCuda::queue_sum_of_squares(int64_t lo, int64_t hi) {
    Impl& im = *impl_;
    ZG_CHECK(0 <= lo && lo <= hi && hi <= num_parameters(), "grad_sum_of_squares: bad range");
    im.settle_fresh_grads();
    im.tick(nullptr);
    cuda::sum_of_squares(im.norm_out.as<double>(), im.grads.as<float>() + lo, hi - lo,
                         im.norm_scratch.get(), im.stream);
    im.tick("gradient norm");
    queue_norm_copy();
}

void GptCuda::queue_norm_copy() {
    Impl& im = *impl_;
    ZG_CUDA_CHECK(cudaMemcpyAsync(im.h_norm.get(), im.norm_out.get(), sizeof(double),
                                  cudaMemcpyDeviceToHost, im.stream));
    ZG_CUDA_CHECK(cudaEventRecord(im.norm_ev, im.stream));
}

void GptCuda::adamw_step(double lr, double beta1, double beta2, double eps, double weight_decay,
                         int64_t t, double grad_scale, float* m, float* v) {
    adamw_step_range(lr, beta1, beta2, eps, weight_decay, t, grad_scale, m, v, 0, num_parameters());
}

void GptCuda::refresh_bf16_copy() {
    impl_->refresh_bf16();
}

void GptCuda::adamw_step_range(double lr, double beta1, double beta2, double eps,
                               double weight_decay, int64_t t, double grad_scale, float* m,
                               float* v, int64_t lo, int64_t hi) {
    queue_adamw(lr, beta1, beta2, eps, weight_decay, t, grad_scale, {}, m, v, lo, hi);
}

double GptCuda::clip_and_adamw_step_range(double lr, double beta1, double beta2, double eps,
                                          double weight_decay, int64_t t, double max_norm, float* m,
                                          float* v, int64_t lo, int64_t hi) {
    Impl& im = *impl_;
    ZG_CHECK(im.vgroup.size == 1,
             "clip_and_adamw_step_range: a vocab-parallel model's norm is summed over its group "
             "(grad_sum_of_squares per rank)");
    // The norm on its way to the host before the update is queued: the host then waits for the
    // copy alone, and its work between steps runs beside the update.
    queue_sum_of_squares(0, num_parameters());
    queue_adamw(lr, beta1, beta2, eps, weight_decay, t, 1.0, {im.norm_out.as<double>(), max_norm},
                m, v, lo, hi);
    ZG_CUDA_CHECK(cudaEventSynchronize(im.norm_ev));
    return std::sqrt(*im.h_norm.get());
}

double GptCuda::clip_and_adamw_step_sliced(
    double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
    double max_norm, float* m, float* v, int64_t lo, int64_t hi,
    const std::vector<std::pair<int64_t, int64_t>>& slices, int own,
    const std::function<void(double* parts, void* stream)>& gather_parts) {
    Impl& im = *impl_;
    ZG_CHECK(im.vgroup.size == 1,
             "clip_and_adamw_step_sliced: a vocab-parallel model's norm is summed over its group");
    const int n = int(slices.size());
    ZG_CHECK(n >= 1 && n <= kMaxNormParts && own < n,
             "clip_and_adamw_step_sliced: 1 to " + std::to_string(kMaxNormParts) + " slices");
    auto* parts = im.norm_parts.as<double>();
    im.settle_fresh_grads();
    im.tick(nullptr);
    for (int r = 0; r < n; r++) {
        if (own >= 0 && r != own) continue;
        const auto [a, b] = slices[size_t(r)];
        ZG_CHECK(0 <= a && a <= b && b <= num_parameters(),
                 "clip_and_adamw_step_sliced: bad slice");
        cuda::sum_of_squares(parts + r, im.grads.as<float>() + a, b - a, im.norm_scratch.get(),
                             im.stream);
    }
    if (own >= 0) gather_parts(parts, im.stream);
    cuda::sum_of_parts(im.norm_out.as<double>(), parts, n, im.stream);
    im.tick("gradient norm");
    queue_norm_copy();
    queue_adamw(lr, beta1, beta2, eps, weight_decay, t, 1.0, {im.norm_out.as<double>(), max_norm},
                m, v, lo, hi);
    ZG_CUDA_CHECK(cudaEventSynchronize(im.norm_ev));
    return std::sqrt(*im.h_norm.get());
}

void GptCuda::queue_adamw(double lr, double beta1, double beta2, double eps, double weight_decay,
                          int64_t t, double grad_scale, const cuda::AdamWClip& clip, float* m,
                          float* v, int64_t lo, int64_t hi) {
    Impl& im = *impl_;
    ZG_CHECK(0 <= lo && lo <= hi && hi <= num_parameters(), "adamw: bad range of the arena");
    im.settle_fresh_grads();
    cpu::AdamWStep s;
    s.lr = lr;
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.eps = eps;
    s.t = t;
    s.grad_scale = grad_scale;
    s.weight_decay = weight_decay;
    // The tensors inside [lo, hi), each with its decay flag: one launch for all of them.
    std::vector<cuda::AdamWSpan> spans;
    for (const auto& spec : im.layout.table.specs()) {
        const int64_t off = std::max(spec.offset, lo), end = std::min(spec.offset + spec.numel, hi);
        if (off >= end) continue;
        if (!spans.empty() && spans.back().decay == spec.decay && spans.back().end == off) {
            spans.back().end = end;  // runs of same-decay tensors as one span
        } else {
            spans.push_back({off, end, spec.decay});
        }
    }
    void* p16 = im.t == DType::bf16 ? static_cast<void*>(im.params16.as<Impl::bf16_t>()) : nullptr;
    im.tick(nullptr);
    cuda::adamw_update(im.params.as<float>(), p16, im.grads.as<float>(), m, v, lo, spans, s,
                       im.stream, clip);
    im.tick("adamw");
}

std::vector<float> GptCuda::logits() const {
    const Impl& im = *impl_;
    ZG_CHECK(!im.linear_ce, "logits(): the fused_linear head never materialises logits");
    ZG_CHECK(im.vgroup.size == 1, "logits(): a vocab-parallel head holds only its shard's");
    ZG_CHECK(im.B > 0, "logits(): no forward yet");
    if (im.head_pending) impl_->head_logits(0, im.B * im.Tn);
    const int64_t n = im.B * im.Tn * im.Vp;
    ZG_CUDA_CHECK(cudaStreamSynchronize(im.stream));
    std::vector<float> r(n);
    if (im.t == DType::f32) {
        ZG_CUDA_CHECK(cudaMemcpy(r.data(), im.logits.get(), n * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<Impl::bf16_t> h(n);
        ZG_CUDA_CHECK(cudaMemcpy(h.data(), im.logits.get(), n * 2, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; i++) r[i] = __bfloat162float(h[i]);
    }
    return r;
}

float* GptCuda::params_device() {
    return impl_->params.as<float>();
}
float* GptCuda::grads_device() {
    impl_->settle_fresh_grads();  // the caller may read or add into any of it
    return impl_->grads.as<float>();
}
float* GptCuda::grads_device(int64_t lo, int64_t hi) {
    ZG_CHECK(0 <= lo && lo <= hi && hi <= num_parameters(), "grads_device: bad range");
    impl_->settle_fresh_grads(lo, hi);
    return impl_->grads.as<float>();
}
std::vector<std::pair<int64_t, int64_t>> GptCuda::master_read_spans() const {
    const Impl& im = *impl_;
    std::vector<int> idx = {im.layout.lnf_w, im.layout.lnf_b};
    for (const BlockParams& p : im.layout.blocks)
        for (int i :
             {p.ln1_w, p.ln1_b, p.ln2_w, p.ln2_b, p.q_norm_w, p.q_norm_b, p.k_norm_w, p.k_norm_b})
            idx.push_back(i);
    if (im.rt != im.t) idx.insert(idx.end(), {im.layout.wte, im.layout.wpe});
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (int i : idx) {
        if (i < 0) continue;
        const int64_t lo = im.layout.table[i].offset, hi = lo + im.layout.table[i].numel;
        spans.push_back({lo, hi});
    }
    std::sort(spans.begin(), spans.end());
    return spans;
}
void* GptCuda::params_bf16_device() {
    return impl_->t == DType::bf16 ? impl_->params16.get() : nullptr;
}
size_t GptCuda::allocated_bytes() const {
    return impl_->allocated();
}
size_t GptCuda::device_bytes_needed(const ModelConfig& config, const CudaModelOptions& options,
                                    int64_t B, int64_t T) {
    DeviceBuffer::SizingOnly sizing;  // outlives the model below
    Impl m(config, options);
    m.vgroup.size = options.vocab_parts;  // (sizing needs no collectives)
    m.ensure(B, T);
    return m.allocated() + 3 * cuda::gemm_workspace_bytes_per_stream();  // its three streams
}

}  // namespace zgpt

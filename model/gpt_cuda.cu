#include "model/gpt_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cuda_check.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"

namespace zgpt {

namespace {

// One device allocation, freed with its owner.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes) ZG_CUDA_CHECK(cudaMalloc(&p_, bytes));
        if (bytes) ZG_CUDA_CHECK(cudaMemset(p_, 0, bytes));
    }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
        o.p_ = nullptr;
        o.bytes_ = 0;
    }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    void* get() const { return p_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(p_);
    }
    size_t bytes() const { return bytes_; }

  private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

// Page-locked host memory: copies from it are truly asynchronous (a copy from pageable memory
// waits for the stream first). Each buffer is rewritten only after a sync that follows its copy.
template <typename T>
class PinnedBuffer {
  public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t n) : n_(n) {
        if (n) ZG_CUDA_CHECK(cudaMallocHost(&p_, n * sizeof(T)));
    }
    ~PinnedBuffer() {
        if (p_) cudaFreeHost(p_);
    }
    PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
        o.p_ = nullptr;
        o.n_ = 0;
    }
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        return *this;
    }
    T* get() const { return p_; }

  private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

// The pipelined loss head's row chunks (fewer when the batch is small). Chunking needs a
// per-row gradient that does not depend on the other rows, so `mean` runs in one piece.
constexpr int kMaxHeadChunks = 8;
constexpr int64_t kMinChunkRows = 1024;

}  // namespace

void validate_kernels(const KernelChoice& k, DType precision) {
    // the names against the registry (kernels/registry.h), then the CUDA entries behind them
    for (const KernelFamily& f : kernel_families())
        kernel_variant(f.name, kernel_choice(k, f.name));
    cuda::find_attention_variant(k.attention);
    if (k.cross_entropy != "fused_linear") cuda::find_cross_entropy_variant(k.cross_entropy);
    if (k.cross_entropy == "fused_linear" && precision != DType::bf16)
        throw Error("kernels.cross_entropy: fused_linear runs in bf16 only (train.precision=fp32)");
}

struct GptCuda::Impl {
    ModelConfig cfg;
    CudaModelOptions opt;
    GptLayout layout;
    int64_t Vp;
    DType t;  // storage type of weights in matmuls and of activations
    size_t es;
    // The residual stream (and its gradient), the LayerNorms' inputs and weights and the
    // embeddings: t, or fp32 under bf16 activations (CudaModelOptions::fp32_residual)
    DType rt;
    size_t res_es;
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
    DeviceBuffer vp_h, vp_y, vp_logits, vp_stats, vp_gathered, vp_params, vp_nvalid, vp_rows;
    DeviceBuffer vp_dh_all, vp_dh, vp_summary;
    std::map<const void*, cudaEvent_t> read_done;  // last weight-gradient read of each buffer
    const cuda::AttentionVariant* attention = nullptr;
    LayernormVariant ln_variant = LayernormVariant::fused_residual;  // resolved once
    MatmulVariant mm_variant = MatmulVariant::fused_epilogue;
    const cuda::CrossEntropyVariant* ce = nullptr;  // null with fused_linear
    const cuda::LinearCrossEntropyVariant* linear_ce = nullptr;

    DeviceBuffer params, grads, params16;  // fp32 arenas; bf16 copy (bf16 precision only)
    DeviceBuffer norm_scratch, norm_out;

    // activations, per (B, T)
    int64_t B = 0, Tn = 0;
    struct Layer {
        DeviceBuffer ln1, ln1_mean, ln1_rstd, qkv_raw, q_mean, q_rstd, k_mean, k_rstd, qkv;
        DeviceBuffer att_saved, atty, res_attn, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
    };
    std::vector<DeviceBuffer> residual;  // [L + 1]
    std::vector<Layer> layers;
    DeviceBuffer lnf, lnf_mean, lnf_rstd, logits;
    DeviceBuffer tokens, targets, grad_out, summary;
    DeviceBuffer bucket_token, bucket_offset, bucket_position;
    int64_t n_distinct = 0;
    PinnedBuffer<int32_t> h_tokens, h_targets, h_bucket;  // h_bucket: token, offset, position
    PinnedBuffer<float> h_grad_out;
    PinnedBuffer<cuda::LossSummaryF> h_summary;
    std::vector<int32_t> last_tokens;
    DeviceBuffer branch_out;  // projection outputs before the residual add
    DeviceBuffer dres, dtmp, dqkv, dfch, gelu_tmp, att_scratch, ln_scratch, bias_scratch;
    DeviceBuffer dres_act;  // dres rounded to t for the matmuls (an fp32 residual stream only)
    // Partial column sums of dqkv written by the attention backward when it can (the qkv bias
    // gradient without another pass over dqkv); empty otherwise.
    DeviceBuffer qkv_colsums;
    int64_t qkv_colsum_rows = 0;
    DeviceBuffer ce_workspace;
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
        if (ticks.size() == pool.size()) {
            pool.emplace_back();
            ZG_CUDA_CHECK(cudaEventCreate(&pool.back()));
        }
        cudaEvent_t e = pool[ticks.size()];
        ZG_CUDA_CHECK(cudaEventRecord(e, stream));
        ticks.emplace_back(name, e);
    }

    Impl(const ModelConfig& c, const CudaModelOptions& o)
        : cfg(c),
          opt(o),
          layout(make_gpt_layout(c, o.vocab_parts)),
          Vp(vocab_table_rows(c, o.vocab_parts)),
          t(o.precision),
          es(dtype_bytes(o.precision)),
          rt(o.fp32_residual ? DType::f32 : o.precision),
          res_es(dtype_bytes(rt)) {
        validate(cfg);
        validate_kernels(opt.kernels, t);
        ZG_CHECK(opt.head_chunks >= 1 && opt.head_chunks <= kMaxHeadChunks,
                 "head_chunks must be in [1, " + std::to_string(kMaxHeadChunks) + "]");
        attention = &cuda::find_attention_variant(opt.kernels.attention);
        ln_variant = LayernormVariant(kernel_variant("layernorm", opt.kernels.layernorm));
        mm_variant = MatmulVariant(kernel_variant("matmul", opt.kernels.matmul));
        if (opt.kernels.cross_entropy == "fused_linear")
            linear_ce = &cuda::linear_cross_entropy_variants().at(0);
        else
            ce = &cuda::find_cross_entropy_variant(opt.kernels.cross_entropy);
        ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&wstream, cudaStreamNonBlocking));
        ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&cestream, cudaStreamNonBlocking));
        for (int i = 0; i < 2 * kMaxHeadChunks; i++) {
            chunk_ev.emplace_back();
            ZG_CUDA_CHECK(cudaEventCreateWithFlags(&chunk_ev.back(), cudaEventDisableTiming));
        }
        ZG_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
        ZG_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));
        ZG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_main_ev, cudaEventDisableTiming));
        ZG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_side_ev, cudaEventDisableTiming));
        const size_t n = size_t(layout.table.total());
        params = DeviceBuffer(n * 4);
        grads = DeviceBuffer(n * 4);
        if (t == DType::bf16) params16 = DeviceBuffer(n * 2);
        norm_scratch = DeviceBuffer(cuda::sum_of_squares_scratch_bytes());
        norm_out = DeviceBuffer(sizeof(double));
        grad_out = DeviceBuffer(sizeof(float));
        summary = DeviceBuffer(kMaxHeadChunks * sizeof(cuda::LossSummaryF));
    }
    ~Impl() {
        for (cudaEvent_t e : pool) cudaEventDestroy(e);
        for (cudaEvent_t e : ev)
            if (e) cudaEventDestroy(e);
        for (auto& [buf, e] : read_done) cudaEventDestroy(e);
        if (fork_ev) cudaEventDestroy(fork_ev);
        if (join_ev) cudaEventDestroy(join_ev);
        if (ready_main_ev) cudaEventDestroy(ready_main_ev);
        if (ready_side_ev) cudaEventDestroy(ready_side_ev);
        for (cudaEvent_t e : chunk_ev) cudaEventDestroy(e);
        if (cestream) cudaStreamDestroy(cestream);
        if (wstream) cudaStreamDestroy(wstream);
        if (stream) cudaStreamDestroy(stream);
    }

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

    // Weights as the matmuls and norms read them (bf16 copy or the fp32 master).
    const void* w(int idx) const {
        if (idx < 0) return nullptr;
        const int64_t off = layout.table[idx].offset;
        return t == DType::bf16 ? static_cast<const void*>(params16.as<bf16_t>() + off)
                                : static_cast<const void*>(params.as<float>() + off);
    }
    // Weights as the residual stream's ops read them (LayerNorm, embeddings): type rt.
    const void* wr(int idx) const {
        if (rt == t || idx < 0) return w(idx);
        return params.as<float>() + layout.table[idx].offset;
    }
    float* g(int idx) const {
        return idx < 0 ? nullptr : grads.as<float>() + layout.table[idx].offset;
    }
    using bf16_t = __nv_bfloat16;

    DeviceBuffer act(int64_t elems) const { return DeviceBuffer(size_t(elems) * es); }
    DeviceBuffer res_act(int64_t elems) const { return DeviceBuffer(size_t(elems) * res_es); }
    DeviceBuffer f32(int64_t elems) const { return DeviceBuffer(size_t(elems) * 4); }

    void ensure(int64_t b, int64_t tn) {
        if (b == B && tn == Tn) return;
        B = b;
        Tn = tn;
        const int64_t BT = B * Tn, C = cfg.n_embd, NH = cfg.n_head, L = cfg.n_layer;
        const cuda::AttentionShape shape{B, Tn, C, NH, opt.kernels.attention_tuning};
        residual.clear();
        layers.clear();
        for (int64_t l = 0; l <= L; l++) residual.push_back(res_act(BT * C));
        for (int64_t l = 0; l < L; l++) {
            Layer a;
            a.ln1 = act(BT * C);
            a.ln1_mean = f32(BT);
            a.ln1_rstd = f32(BT);
            if (cfg.qk_norm) {
                a.qkv_raw = act(BT * 3 * C);
                a.q_mean = f32(BT * NH);
                a.q_rstd = f32(BT * NH);
                a.k_mean = f32(BT * NH);
                a.k_rstd = f32(BT * NH);
            }
            a.qkv = act(BT * 3 * C);
            a.att_saved = DeviceBuffer(attention->saved_bytes(shape));
            a.atty = act(BT * C);
            a.res_attn = res_act(BT * C);
            a.ln2 = act(BT * C);
            a.ln2_mean = f32(BT);
            a.ln2_rstd = f32(BT);
            a.fch = act(BT * 4 * C);
            if (!opt.recompute_gelu) a.fch_gelu = act(BT * 4 * C);
            layers.push_back(std::move(a));
        }
        lnf = act(BT * C);
        lnf_mean = f32(BT);
        lnf_rstd = f32(BT);
        const bool sharded = vgroup.size > 1;
        logits = linear_ce || sharded ? DeviceBuffer() : act(BT * Vp);
        if (sharded) {  // the group's rows: NA = size x BT
            const int64_t NA = vgroup.size * BT, Vl = shard_rows(vgroup.rank);
            // also the group's residual gradients in backward (type rt)
            vp_h = DeviceBuffer(size_t(NA * C) * std::max(es, res_es));
            vp_y = DeviceBuffer(NA * 4);
            vp_logits = linear_ce ? DeviceBuffer() : act(NA * Vl);
            vp_stats = DeviceBuffer(NA * sizeof(cuda::RowStatsF));
            vp_gathered = DeviceBuffer(vgroup.size * NA * sizeof(cuda::RowStatsF));
            vp_params = DeviceBuffer(NA * sizeof(cuda::RowGradParams));
            vp_nvalid = DeviceBuffer(2 * sizeof(int));
            vp_rows = f32(4 * NA);  // loss, ce, z, lse of each row
            vp_dh_all = f32(NA * C);
            vp_dh = f32(BT * C);
            vp_summary = DeviceBuffer(sizeof(cuda::LossSummaryF));
        }
        tokens = DeviceBuffer(BT * 4);
        targets = DeviceBuffer(BT * 4);
        // the wte gradient's buckets: of this rank's tokens, or of the group's in this shard
        const int64_t NB = vgroup.size * BT;
        bucket_token = DeviceBuffer(NB * 4);
        bucket_offset = DeviceBuffer((NB + 1) * 4);
        bucket_position = DeviceBuffer(NB * 4);
        h_tokens = PinnedBuffer<int32_t>(NB);
        h_targets = PinnedBuffer<int32_t>(BT);
        h_bucket = PinnedBuffer<int32_t>(3 * NB + 1);
        h_grad_out = PinnedBuffer<float>(1);
        h_summary = PinnedBuffer<cuda::LossSummaryF>(kMaxHeadChunks);
        branch_out = act(BT * C);
        dres = res_act(BT * C);
        if (rt != t) dres_act = act(BT * C);
        dtmp = act(BT * C);
        dqkv = act(BT * 3 * C);
        dfch = act(BT * 4 * C);
        if (opt.recompute_gelu) gelu_tmp = act(BT * 4 * C);
        att_scratch = DeviceBuffer(attention->scratch_bytes(shape));
        // with qk_norm the bias gradient is of the pre-norm q and k, not of what attention wrote
        if (cfg.bias && !cfg.qk_norm) qkv_colsum_rows = attention->colsum_rows(shape, t);
        if (qkv_colsum_rows > 0)
            qkv_colsums = DeviceBuffer(size_t(qkv_colsum_rows) * 3 * C * sizeof(float));
        ln_scratch =
            DeviceBuffer(std::max(cuda::layernorm_backward_scratch_bytes(BT, C),
                                  cuda::layernorm_backward_scratch_bytes(BT * NH, C / NH)));
        bias_scratch = DeviceBuffer(cuda::bias_backward_scratch_bytes(BT, 4 * C));
        const KernelChoice& k = opt.kernels;
        const size_t ws =
            linear_ce && sharded
                ? cuda::linear_ce_shard_workspace_bytes(
                      vgroup.size * BT, C, shard_rows(vgroup.rank), linear_ce_tuning(k))
            : linear_ce
                ? linear_ce->workspace_bytes(BT, C, cfg.vocab_size, linear_ce_tuning(k))
                : ce->workspace_bytes(
                      BT, Vp, t == DType::bf16 ? cuda::LogitsType::bf16 : cuda::LogitsType::f32);
        ce_workspace = DeviceBuffer(ws);
    }

    // out[M, N] = inp[M, K] @ W[N, K]^T, the forward GEMM of a linear layer (no epilogue).
    cuda::Gemm forward_gemm(void* out, const void* inp, const void* W, int64_t M, int64_t K,
                            int64_t N) const {
        cuda::Gemm gm;
        gm.D = out;
        gm.d_type = t;
        gm.ab_type = t;
        gm.A = inp;
        gm.B = W;
        gm.trans_b = true;
        gm.M = M;
        gm.N = N;
        gm.K = K;
        return gm;
    }
    cuda::Gemm forward_gemm(void* out, const void* inp, int w_idx, int64_t M, int64_t K,
                            int64_t N) const {
        return forward_gemm(out, inp, w(w_idx), M, K, N);
    }

    // D[M, N] = A[M, K] @ W[N, K]^T (+ bias), the forward of a linear layer.
    void linear_forward(void* out, const void* inp, int w_idx, int b_idx, int64_t M, int64_t K,
                        int64_t N) {
        cuda::Gemm gm = forward_gemm(out, inp, w_idx, M, K, N);
        const bool fused = mm_variant == MatmulVariant::fused_epilogue;
        if (b_idx >= 0 && fused) {
            gm.epilogue = cuda::Epilogue::bias;
            gm.bias = w(b_idx);
        }
        cuda::gemm(gm, stream);
        if (b_idx >= 0 && !fused) cuda::add_bias(out, w(b_idx), M, N, t, stream);
    }

    // fch = ln2 W_fc^T + b (pre-activation) and gelu = GELU(fch).
    void fc_gelu_forward(void* fch, void* gelu, const void* inp, int w_idx, int b_idx, int64_t M,
                         int64_t K, int64_t N) {
        if (mm_variant == MatmulVariant::fused_epilogue) {
            cuda::Gemm gm = forward_gemm(gelu, inp, w_idx, M, K, N);
            gm.epilogue = b_idx >= 0 ? cuda::Epilogue::gelu_aux_bias : cuda::Epilogue::gelu_aux;
            gm.bias = w(b_idx);
            gm.aux = fch;
            cuda::gemm(gm, stream);
        } else {
            linear_forward(fch, inp, w_idx, b_idx, M, K, N);
            cuda::gelu_forward(gelu, fch, M * N, t, stream);
        }
    }

    // dinp[M, K] = dout[M, N] @ W[N, K], the input gradient of a linear layer (no epilogue).
    cuda::Gemm input_grad_gemm(void* dinp, const void* dout, const void* W, int64_t M, int64_t K,
                               int64_t N) const {
        cuda::Gemm gm;
        gm.D = dinp;
        gm.d_type = t;
        gm.ab_type = t;
        gm.A = dout;
        gm.B = W;
        gm.M = M;
        gm.N = K;
        gm.K = N;
        return gm;
    }
    cuda::Gemm input_grad_gemm(void* dinp, const void* dout, int w_idx, int64_t M, int64_t K,
                               int64_t N) const {
        return input_grad_gemm(dinp, dout, w(w_idx), M, K, N);
    }
    // dW[N, K] += dout[M, N]^T @ inp[M, K] in fp32, the weight gradient of a linear layer.
    cuda::Gemm weight_grad_gemm(float* dW, const void* dout, const void* inp, int64_t M, int64_t K,
                                int64_t N) const {
        cuda::Gemm gw;
        gw.D = dW;
        gw.d_type = DType::f32;
        gw.ab_type = t;
        gw.A = dout;
        gw.trans_a = true;
        gw.B = inp;
        gw.M = N;
        gw.N = K;
        gw.K = M;
        gw.beta = 1.0f;
        return gw;
    }

    // dinp = dout @ W (written); dW += dout^T @ inp; db += column sums of dout (b_idx -1: no
    // bias). With gelu_pre (the pre-activation of a GELU that fed this layer), dinp is multiplied
    // by GELU' in the GEMM epilogue when the fused variant runs and cuBLASLt supports it; returns
    // whether it was (else the caller runs gelu_backward).
    // bias_parts: partial column sums of dout ([bias_part_rows, N]) that its producer wrote; the
    // bias gradient is then summed from them instead of from dout.
    bool linear_backward(void* dinp, const void* dout, const void* inp, int w_idx, int b_idx,
                         int64_t M, int64_t K, int64_t N, const void* gelu_pre = nullptr,
                         bool head = false, const float* bias_parts = nullptr,
                         int64_t bias_part_rows = 0) {
        const bool fused = mm_variant == MatmulVariant::fused_epilogue;
        bool gelu_done = false;
        // the head's dW stays on the main stream: on the weight-gradient stream it measured no
        // better (H100, same call: 123.57 against 123.54 ms)
        const bool side = overlapping() && !head;
        if (dinp) {
            cuda::Gemm gm = input_grad_gemm(dinp, dout, w_idx, M, K, N);
            if (gelu_pre && fused) {
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
        // together) measured no better on the H100 (124.3-125.0 against 124.0-124.9 ms).
        cudaStream_t ws = side ? wstream : stream;
        if (side) {
            ZG_CUDA_CHECK(cudaEventRecord(fork_ev, stream));
            ZG_CUDA_CHECK(cudaStreamWaitEvent(wstream, fork_ev));
        }
        cuda::Gemm gw = weight_grad_gemm(g(w_idx), dout, inp, M, K, N);
        // The bias gradient is its own pass over dout, not cuBLASLt's BGRADB epilogue: that
        // epilogue sums inside the GEMM's main loop and cost the step 6 ms on the H100 (the dW
        // GEMMs 21.6 -> 15.6 ms without it), against 4.5 ms for the column sums, which on the
        // side stream also overlap the input-gradient GEMMs.
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

    // res_out = a + b; norm_out = LayerNorm(res_out): fused or as two passes.
    void add_norm(void* res_out, void* norm_out, float* mean, float* rstd, const void* a,
                  const void* b, int w_idx, int b_idx, int64_t N, int64_t C) {
        if (ln_variant == LayernormVariant::fused_residual) {
            cuda::residual_layernorm_forward(res_out, norm_out, mean, rstd, a, b, wr(w_idx),
                                             wr(b_idx), N, C, cfg.ln_eps, t, rt, stream);
        } else {
            cuda::residual_forward(res_out, a, b, N * C, t, rt, stream);
            cuda::layernorm_forward(norm_out, {1, C}, mean, rstd, res_out, {1, C}, wr(w_idx),
                                    wr(b_idx), N, C, cfg.ln_eps, t, rt, stream);
        }
    }

    void forward(const int32_t* host_tokens, int64_t b, int64_t tn) {
        ZG_CHECK(b > 0 && tn > 0 && tn <= cfg.block_size,
                 "sequence length " + std::to_string(tn) +
                     " must be in [1, block_size=" + std::to_string(cfg.block_size) + "]");
        for (int64_t i = 0; i < b * tn; i++)
            ZG_CHECK(host_tokens[i] >= 0 && host_tokens[i] < cfg.vocab_size,
                     "token id " + std::to_string(host_tokens[i]) + " outside the vocabulary");
        ensure(b, tn);
        tick(nullptr);
        const int64_t BT = B * Tn, C = cfg.n_embd, NH = cfg.n_head, hs = C / NH, L = cfg.n_layer;
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
        const cuda::AttentionShape shape{B, Tn, C, NH, opt.kernels.attention_tuning};
        cuda::layernorm_forward(layers[0].ln1.get(), {1, C}, layers[0].ln1_mean.as<float>(),
                                layers[0].ln1_rstd.as<float>(), residual[0].get(), {1, C},
                                wr(layout.blocks[0].ln1_w), wr(layout.blocks[0].ln1_b), BT, C,
                                cfg.ln_eps, t, rt, stream);
        tick("layernorm fwd");
        for (int64_t l = 0; l < L; l++) {
            const BlockParams& p = layout.blocks[l];
            Layer& a = layers[l];
            if (cfg.qk_norm) {
                linear_forward(a.qkv_raw.get(), a.ln1.get(), p.qkv_w, p.qkv_b, BT, C, 3 * C);
                const cuda::RowMap heads{NH, 3 * C};
                const char* raw = a.qkv_raw.as<char>();
                char* qkv = a.qkv.as<char>();
                cuda::layernorm_forward(qkv, heads, a.q_mean.as<float>(), a.q_rstd.as<float>(), raw,
                                        heads, w(p.q_norm_w), w(p.q_norm_b), BT * NH, hs,
                                        cfg.ln_eps, t, stream);
                cuda::layernorm_forward(qkv + C * es, heads, a.k_mean.as<float>(),
                                        a.k_rstd.as<float>(), raw + C * es, heads, w(p.k_norm_w),
                                        w(p.k_norm_b), BT * NH, hs, cfg.ln_eps, t, stream);
                ZG_CUDA_CHECK(cudaMemcpy2DAsync(qkv + 2 * C * es, 3 * C * es, raw + 2 * C * es,
                                                3 * C * es, C * es, BT, cudaMemcpyDeviceToDevice,
                                                stream));
            } else {
                linear_forward(a.qkv.get(), a.ln1.get(), p.qkv_w, p.qkv_b, BT, C, 3 * C);
            }
            tick("matmul fwd (qkv, qk_norm)");
            attention->forward(a.atty.get(), a.att_saved.get(), a.qkv.get(), shape, t, stream);
            tick("attention fwd");
            linear_forward(branch_out.get(), a.atty.get(), p.proj_w, p.proj_b, BT, C, C);
            tick("matmul fwd");
            add_norm(a.res_attn.get(), a.ln2.get(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                     residual[l].get(), branch_out.get(), p.ln2_w, p.ln2_b, BT, C);
            tick("residual + layernorm fwd");
            void* gelu = opt.recompute_gelu ? gelu_tmp.get() : a.fch_gelu.get();
            fc_gelu_forward(a.fch.get(), gelu, a.ln2.get(), p.fc_w, p.fc_b, BT, C, 4 * C);
            tick("matmul fwd (fc + GELU)");
            linear_forward(branch_out.get(), gelu, p.fcproj_w, p.fcproj_b, BT, 4 * C, C);
            tick("matmul fwd");
            const bool last = l == L - 1;
            add_norm(residual[l + 1].get(), last ? lnf.get() : layers[l + 1].ln1.get(),
                     last ? lnf_mean.as<float>() : layers[l + 1].ln1_mean.as<float>(),
                     last ? lnf_rstd.as<float>() : layers[l + 1].ln1_rstd.as<float>(),
                     a.res_attn.get(), branch_out.get(),
                     last ? layout.lnf_w : layout.blocks[l + 1].ln1_w,
                     last ? layout.lnf_b : layout.blocks[l + 1].ln1_b, BT, C);
            tick("residual + layernorm fwd");
        }
        head_pending = !linear_ce;  // loss() runs the logits GEMM, chunked with the cross-entropy
        head_dinp_done = false;
        upload_buckets();  // host work while the GPU runs the forward pass
        have_logits = true;
    }

    // A vocab-parallel group holds wte split by rows: the token rows of this rank come from every
    // shard. The group's tokens are all-gathered; each rank looks up the rows its shard holds
    // (zeros elsewhere) for all of them, in fp32; a reduce-scatter gives each rank its own tokens'
    // rows, each the sum of one row and zeros (exact); the positions are added as
    // encoder_forward does. The wte gradient goes the other way in backward().
    void embed_from_shards() {
        const int64_t BT = B * Tn, C = cfg.n_embd, NA = vgroup.size * BT;
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        vgroup.all_gather(tokens.get(), vp_y.get(), BT * 4);
        cuda::lookup_rows_in_shard(vp_dh_all.as<float>(), vp_y.as<int32_t>(), NA, wr(layout.wte),
                                   shard_v0(vgroup.rank), shard_rows(vgroup.rank), C, rt, stream);
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        vgroup.reduce_scatter_sum(vp_dh_all.as<float>(), vp_dh.as<float>(), BT * C);
        cuda::add_positions(residual[0].get(), vp_dh.as<float>(), wr(layout.wpe), B, Tn, C, rt,
                            stream);
        // The group's tokens in this shard, as rows of the shard (-1: another shard's), for the
        // gradient's buckets.
        last_tokens.resize(NA);
        ZG_CUDA_CHECK(
            cudaMemcpyAsync(h_tokens.get(), vp_y.get(), NA * 4, cudaMemcpyDeviceToHost, stream));
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        const int64_t v0 = shard_v0(vgroup.rank), rows = shard_rows(vgroup.rank);
        for (int64_t i = 0; i < NA; i++) {
            const int64_t r = int64_t(h_tokens.get()[i]) - v0;
            last_tokens[i] = r >= 0 && r < rows ? int32_t(r) : -1;
        }
    }

    // The wte-gradient buckets of the last forward's tokens (sorted on the host); with a split
    // table, of the group's tokens that this shard holds.
    void upload_buckets() {
        const int64_t n = int64_t(last_tokens.size());
        cuda::TokenBuckets bk = cuda::bucket_tokens(last_tokens.data(), n);
        if (!bk.token.empty() && bk.token[0] < 0) {  // other shards' tokens: sorted first, dropped
            bk.token.erase(bk.token.begin());
            bk.offset.erase(bk.offset.begin());
        }
        n_distinct = int64_t(bk.token.size());
        int32_t* h = h_bucket.get();
        std::copy(bk.token.begin(), bk.token.end(), h);
        std::copy(bk.offset.begin(), bk.offset.end(), h + n);
        std::copy(bk.position.begin(), bk.position.end(), h + 2 * n + 1);
        ZG_CUDA_CHECK(
            cudaMemcpyAsync(bucket_token.get(), h, n_distinct * 4, cudaMemcpyHostToDevice, stream));
        ZG_CUDA_CHECK(cudaMemcpyAsync(bucket_offset.get(), h + n, (n_distinct + 1) * 4,
                                      cudaMemcpyHostToDevice, stream));
        ZG_CUDA_CHECK(cudaMemcpyAsync(bucket_position.get(), h + 2 * n + 1, n * 4,
                                      cudaMemcpyHostToDevice, stream));
    }

    CrossEntropySummary loss(const int32_t* host_targets, const CrossEntropyOptions& o,
                             double grad_output, bool compute_grad) {
        ZG_CHECK(have_logits, "loss() needs a forward() first");
        validate(o);
        const int64_t BT = B * Tn, C = cfg.n_embd;
        std::memcpy(h_targets.get(), host_targets, BT * 4);
        ZG_CUDA_CHECK(cudaMemcpyAsync(targets.get(), h_targets.get(), BT * 4,
                                      cudaMemcpyHostToDevice, stream));
        *h_grad_out.get() = float(grad_output);
        ZG_CUDA_CHECK(
            cudaMemcpyAsync(grad_out.get(), h_grad_out.get(), 4, cudaMemcpyHostToDevice, stream));
        if (vgroup.size > 1) return loss_sharded(o, compute_grad);
        auto* sum = summary.as<cuda::LossSummaryF>();
        const int64_t chunks = head_chunks(o);
        tick(nullptr);
        if (linear_ce) {
            mark(0);  // no logits GEMM: the head is one fused pass in [ev2, ev3]
            mark(1);
            mark(2);
            cuda::LinearCrossEntropyArgs a;
            a.hidden = lnf.get();
            a.weight = w(layout.lm_head);
            a.N = BT;
            a.C = C;
            a.V = cfg.vocab_size;
            a.targets = targets.as<int32_t>();
            a.grad_output = grad_out.as<float>();
            a.summary = sum;
            a.tuning = linear_ce_tuning(opt.kernels);
            if (compute_grad) {
                a.dhidden = dtmp.get();
                a.dweight_acc = g(layout.lm_head);
            }
            linear_ce->run(a, o, ce_workspace.get(), stream);
            mark(3);
            tick("head (fused_linear)");
        } else if (chunks == 1) {
            mark(0);
            if (head_pending) head_logits(0, BT);
            mark(1);
            tick("head matmul fwd");
            mark(2);
            head_cross_entropy(0, BT, o, sum, stream);
            mark(3);
            tick("cross-entropy");
        } else {
            // chunk c's cross-entropy on cestream after its logits; dlnf of chunk c on the main
            // stream after its cross-entropy
            mark(0);
            const int64_t rows = (BT + chunks - 1) / chunks;
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t r0 = c * rows, n = std::min(rows, BT - r0);
                head_logits(r0, n);
                ZG_CUDA_CHECK(cudaEventRecord(chunk_ev[2 * c], stream));
                ZG_CUDA_CHECK(cudaStreamWaitEvent(cestream, chunk_ev[2 * c]));
                head_cross_entropy(r0, n, o, sum + c, cestream);
                ZG_CUDA_CHECK(cudaEventRecord(chunk_ev[2 * c + 1], cestream));
            }
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t r0 = c * rows, n = std::min(rows, BT - r0);
                ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, chunk_ev[2 * c + 1]));
                if (compute_grad) head_input_grad(r0, n);
            }
            head_dinp_done = compute_grad;
            mark(1);
            mark(2);  // the cross-entropy is inside [ev0, ev1]
            mark(3);
        }
        ZG_CUDA_CHECK(cudaMemcpyAsync(h_summary.get(), sum, chunks * sizeof(cuda::LossSummaryF),
                                      cudaMemcpyDeviceToHost, stream));
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        const cuda::LossSummaryF f = combine_summaries(h_summary.get(), chunks);
        have_logits = compute_grad ? have_logits : false;
        const CrossEntropySummary s = to_summary(f);
        grads_ready = compute_grad;
        return s;
    }
    bool grads_ready = false;

    // Rows of the LM head that vocab-parallel rank r owns: contiguous, the first V % size ranks
    // one more (train/vocab_parallel_head.h splits the same way).
    int64_t shard_rows(int r) const {
        const int64_t V = cfg.vocab_size, P = vgroup.size;
        return V / P + (r < V % P ? 1 : 0);
    }
    int64_t shard_v0(int r) const {
        const int64_t V = cfg.vocab_size, P = vgroup.size;
        return r * (V / P) + std::min<int64_t>(r, V % P);
    }

    // The vocab-parallel head (see GptCuda::set_vocab_group). targets and grad_out are on the
    // device already.
    CrossEntropySummary loss_sharded(const CrossEntropyOptions& o, bool compute_grad) {
        ZG_CHECK(o.reduction == Reduction::sum,
                 "the vocab-parallel head takes reduction sum (the trainer's)");
        const int P = vgroup.size, p = vgroup.rank;
        const int64_t BT = B * Tn, C = cfg.n_embd, NA = P * BT;
        const int64_t v0 = shard_v0(p), Vl = shard_rows(p);
        const void* W = w(layout.lm_head);  // this shard's rows only
        float* dW = g(layout.lm_head);
        auto* stats = vp_stats.as<cuda::RowStatsF>();
        auto* gathered = vp_gathered.as<cuda::RowStatsF>();
        auto* params_ = vp_params.as<cuda::RowGradParams>();
        int* n_all = vp_nvalid.as<int>();
        int* n_own = n_all + 1;
        float* rows = vp_rows.as<float>();
        tick(nullptr);
        // The group's hidden states and targets, in rank order.
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        vgroup.all_gather(lnf.get(), vp_h.get(), BT * C * int64_t(es));
        vgroup.all_gather(targets.get(), vp_y.get(), BT * 4);
        const int32_t* y_all = vp_y.as<int32_t>();

        cuda::CrossEntropyArgs a;  // this shard, every row of the group
        a.type = t == DType::bf16 ? cuda::LogitsType::bf16 : cuda::LogitsType::f32;
        a.N = NA;
        a.V_local = Vl;
        a.v0 = v0;
        a.V = cfg.vocab_size;
        a.targets = y_all;
        a.grad_output = grad_out.as<float>();
        a.loss_rows = rows;
        a.ce_rows = rows + NA;
        a.z_rows = rows + 2 * NA;
        a.lse_rows = rows + 3 * NA;
        a.summary = vp_summary.as<cuda::LossSummaryF>();
        cuda::LinearCrossEntropyArgs la;  // fused_linear: the same shard from hidden states
        if (linear_ce) {
            la.hidden = vp_h.get();
            la.weight = W;
            la.N = NA;
            la.C = C;
            la.V = cfg.vocab_size;
            la.v0 = v0;
            la.V_local = Vl;
            la.targets = y_all;
            la.grad_output = a.grad_output;
            la.summary = a.summary;
            la.tuning = linear_ce_tuning(opt.kernels);  // (shards ignore rows_outer)
            if (compute_grad) la.dweight_acc = dW;
            cuda::linear_ce_shard_stats(stats, la, o, ce_workspace.get(), stream);
        } else {
            // logits [NA, Vl] = H_all W_shard^T
            cuda::gemm(forward_gemm(vp_logits.get(), vp_h.get(), W, NA, C, Vl), stream);
            a.logits = vp_logits.get();
            a.dlogits = vp_logits.get();
            a.ld = Vl;
            cuda::ce_shard_stats(stats, a, o, stream);
        }
        // One collective for the statistics; every rank merges them in rank order.
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        vgroup.all_gather(stats, gathered, NA * int64_t(sizeof(cuda::RowStatsF)));
        ZG_CUDA_CHECK(cudaMemcpyAsync(stats, gathered, NA * sizeof(cuda::RowStatsF),
                                      cudaMemcpyDeviceToDevice, stream));
        for (int r = 1; r < P; r++) cuda::ce_merge_stats(stats, gathered + r * NA, NA, stream);
        cuda::ce_count_valid(n_all, y_all, NA, o.ignore_index, stream);
        cuda::ce_finalize(params_, stats, n_all, a, o, stream);
        if (compute_grad) {
            if (linear_ce) {  // it adds each vocabulary chunk's dh into vp_dh_all
                ZG_CUDA_CHECK(cudaMemsetAsync(vp_dh_all.get(), 0, vp_dh_all.bytes(), stream));
                cuda::linear_ce_shard_backward(vp_dh_all.as<float>(), params_, la, o,
                                               ce_workspace.get(), stream);
            } else {
                cuda::ce_shard_backward(a, params_, o, stream);
                // dW_shard += dlogits^T H_all (fp32, into the arena)
                cuda::gemm(weight_grad_gemm(dW, vp_logits.get(), vp_h.get(), NA, C, Vl), stream);
                // dH_all [NA, C] = dlogits W_shard, in fp32 for the sum over the shards
                cuda::Gemm gi = input_grad_gemm(vp_dh_all.get(), vp_logits.get(), W, NA, C, Vl);
                gi.d_type = DType::f32;
                cuda::gemm(gi, stream);
            }
            // Each rank gets its own rows' gradient summed over the shards.
            ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
            vgroup.reduce_scatter_sum(vp_dh_all.as<float>(), vp_dh.as<float>(), BT * C);
            cuda::cast_from_f32(dtmp.get(), vp_dh.as<float>(), BT * C, t, stream);
        }
        // This rank's rows for what it reports (the group's loss adds up over the ranks).
        cuda::CrossEntropyArgs own = a;
        own.N = BT;
        own.targets = y_all + p * BT;
        own.loss_rows = rows + p * BT;
        own.ce_rows = rows + NA + p * BT;
        own.z_rows = rows + 2 * NA + p * BT;
        own.lse_rows = rows + 3 * NA + p * BT;
        cuda::ce_count_valid(n_own, own.targets, BT, o.ignore_index, stream);
        cuda::ce_reduce(own, stats + p * BT, n_own, o, stream);
        tick("head (vocab parallel)");
        ZG_CUDA_CHECK(cudaMemcpyAsync(h_summary.get(), a.summary, sizeof(cuda::LossSummaryF),
                                      cudaMemcpyDeviceToHost, stream));
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        const cuda::LossSummaryF f = h_summary.get()[0];
        const CrossEntropySummary s = to_summary(f);
        head_sharded_done = compute_grad;
        grads_ready = compute_grad;
        if (!compute_grad) have_logits = false;
        return s;
    }

    int64_t head_chunks(const CrossEntropyOptions& o) const {
        if (linear_ce || !overlapping() || o.reduction != Reduction::sum) return 1;
        return std::max<int64_t>(1, std::min<int64_t>(opt.head_chunks, B * Tn / kMinChunkRows));
    }
    // logits of rows [r0, r0 + n) (the forward's head GEMM, or a chunk of it)
    void head_logits(int64_t r0, int64_t n) {
        head_pending = false;
        linear_forward(logits.as<char>() + r0 * Vp * es, lnf.as<char>() + r0 * cfg.n_embd * es,
                       layout.lm_head, -1, n, cfg.n_embd, Vp);
    }
    // The cross-entropy of rows [r0, r0 + n): loss summary, dlogits in place.
    void head_cross_entropy(int64_t r0, int64_t n, const CrossEntropyOptions& o,
                            cuda::LossSummaryF* sum, cudaStream_t st) {
        cuda::CrossEntropyArgs a;
        a.logits = logits.as<char>() + r0 * Vp * es;
        a.type = t == DType::bf16 ? cuda::LogitsType::bf16 : cuda::LogitsType::f32;
        a.ld = Vp;
        a.N = n;
        a.V_local = a.V = cfg.vocab_size;
        a.targets = targets.as<int32_t>() + r0;
        a.grad_output = grad_out.as<float>();
        a.dlogits = const_cast<void*>(a.logits);
        a.summary = sum;
        a.tuning = opt.kernels.cross_entropy_tuning;
        ce->run(a, o, ce_workspace.get(), st);
        if (Vp > cfg.vocab_size)  // padded columns carry no gradient
            ZG_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(a.dlogits) + cfg.vocab_size * es,
                                            Vp * es, 0, (Vp - cfg.vocab_size) * es, n, st));
    }
    // dlnf of rows [r0, r0 + n) = dlogits @ W_head
    void head_input_grad(int64_t r0, int64_t n) {
        cuda::gemm(
            input_grad_gemm(dtmp.as<char>() + r0 * cfg.n_embd * es,
                            logits.as<char>() + r0 * Vp * es, layout.lm_head, n, cfg.n_embd, Vp),
            stream);
    }
    static CrossEntropySummary to_summary(const cuda::LossSummaryF& f) {
        CrossEntropySummary s;
        s.loss = f.loss;
        s.sum_loss = f.sum_loss;
        s.sum_ce = f.sum_ce;
        s.sum_z_loss = f.sum_z_loss;
        s.sum_lse = f.sum_lse;
        s.sum_lse_sq = f.sum_lse_sq;
        s.n_valid = f.n_valid;
        s.max_logit = f.max_logit;
        return s;
    }
    // The chunks' summaries as one (sum reduction: every field adds, except the maximum).
    static cuda::LossSummaryF combine_summaries(const cuda::LossSummaryF* s, int64_t n) {
        if (n == 1) return s[0];
        double acc[6] = {};
        cuda::LossSummaryF f = s[0];
        f.n_valid = 0;
        for (int64_t i = 0; i < n; i++) {
            const float v[6] = {s[i].loss,       s[i].sum_loss, s[i].sum_ce,
                                s[i].sum_z_loss, s[i].sum_lse,  s[i].sum_lse_sq};
            for (int k = 0; k < 6; k++) acc[k] += v[k];
            f.max_logit = std::max(f.max_logit, s[i].max_logit);
            f.n_valid += s[i].n_valid;
        }
        f.loss = float(acc[0]);
        f.sum_loss = float(acc[1]);
        f.sum_ce = float(acc[2]);
        f.sum_z_loss = float(acc[3]);
        f.sum_lse = float(acc[4]);
        f.sum_lse_sq = float(acc[5]);
        return f;
    }

    // Block l's gradients (block L - 1's with the final LayerNorm's) are enqueued: the consumer
    // stream waits for both streams that wrote them, then the hook hears which elements.
    void announce_block_grads(int64_t l) {
        if (!grad_ready) return;
        const ParameterTable& tb = layout.table;
        const int64_t L = cfg.n_layer, lo = tb[layout.blocks[l].ln1_w].offset;
        const ParamSpec& last = tb[layout.lnf_b >= 0 ? layout.lnf_b : layout.lnf_w];
        const int64_t hi =
            l + 1 < L ? tb[layout.blocks[l + 1].ln1_w].offset : last.offset + last.numel;
        ZG_CUDA_CHECK(cudaEventRecord(ready_main_ev, stream));
        ZG_CUDA_CHECK(cudaStreamWaitEvent(grad_consumer, ready_main_ev));
        if (overlapping()) {
            ZG_CUDA_CHECK(cudaEventRecord(ready_side_ev, wstream));
            ZG_CUDA_CHECK(cudaStreamWaitEvent(grad_consumer, ready_side_ev));
        }
        grad_ready(lo, hi);
    }

    // The residual gradient as the matmuls read it: dres itself, or (an fp32 residual stream) a
    // copy rounded to t, as autocast rounds the gradient that enters a bf16 linear.
    const void* dres_for_matmul() {
        if (rt == t) return dres.get();
        before_write(dres_act.get());
        cuda::cast_from_f32(dres_act.get(), dres.as<float>(), B * Tn * cfg.n_embd, t, stream);
        tick("residual gradient cast");
        return dres_act.get();
    }

    void backward() {
        ZG_CHECK(grads_ready, "backward() needs forward() and loss(..., compute_grad=true) first");
        grads_ready = false;
        const int64_t BT = B * Tn, C = cfg.n_embd, NH = cfg.n_head, hs = C / NH, L = cfg.n_layer;
        const cuda::AttentionShape shape{B, Tn, C, NH, opt.kernels.attention_tuning};
        // head: dtmp = dlnf
        tick(nullptr);
        mark(4);
        if (!linear_ce && !head_sharded_done)
            linear_backward(head_dinp_done ? nullptr : dtmp.get(), logits.get(), lnf.get(),
                            layout.lm_head, -1, BT, C, Vp, nullptr, true);
        head_sharded_done = false;
        mark(5);
        before_write(dres.get());
        cuda::layernorm_backward(dres.get(), {1, C}, false, g(layout.lnf_w), g(layout.lnf_b),
                                 dtmp.get(), {1, C}, residual[L].get(), {1, C}, wr(layout.lnf_w),
                                 lnf_mean.as<float>(), lnf_rstd.as<float>(), BT, C,
                                 ln_scratch.get(), t, rt, stream);
        tick("layernorm bwd");
        for (int64_t l = L - 1; l >= 0; l--) {
            const BlockParams& p = layout.blocks[l];
            Layer& a = layers[l];
            // MLP branch
            void* gelu = a.fch_gelu.get();
            if (opt.recompute_gelu) {
                gelu = gelu_tmp.get();
                before_write(gelu);
                cuda::gelu_forward(gelu, a.fch.get(), BT * 4 * C, t, stream);
                tick("GELU recompute");
            }
            before_write(dfch.get());
            if (!linear_backward(dfch.get(), dres_for_matmul(), gelu, p.fcproj_w, p.fcproj_b, BT,
                                 4 * C, C, a.fch.get())) {
                cuda::gelu_backward(dfch.get(), a.fch.get(), dfch.get(), BT * 4 * C, t, stream);
                tick("GELU bwd");
            }
            linear_backward(dtmp.get(), dfch.get(), a.ln2.get(), p.fc_w, p.fc_b, BT, C, 4 * C);
            before_write(dres.get());
            cuda::layernorm_backward(dres.get(), {1, C}, true, g(p.ln2_w), g(p.ln2_b), dtmp.get(),
                                     {1, C}, a.res_attn.get(), {1, C}, wr(p.ln2_w),
                                     a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(), BT, C,
                                     ln_scratch.get(), t, rt, stream);
            tick("layernorm bwd");
            // attention branch
            linear_backward(dtmp.get(), dres_for_matmul(), a.atty.get(), p.proj_w, p.proj_b, BT, C,
                            C);
            before_write(dqkv.get());
            before_write(qkv_colsums.get());
            attention->backward(dqkv.get(), dtmp.get(), a.qkv.get(), a.atty.get(),
                                a.att_saved.get(), att_scratch.get(), qkv_colsums.as<float>(),
                                shape, t, stream);
            tick("attention bwd");
            if (cfg.qk_norm) {  // in place: dqkv's q and k parts become the pre-norm gradients
                const cuda::RowMap heads{NH, 3 * C};
                char* d = dqkv.as<char>();
                const char* raw = a.qkv_raw.as<char>();
                cuda::layernorm_backward(d, heads, false, g(p.q_norm_w), g(p.q_norm_b), d, heads,
                                         raw, heads, w(p.q_norm_w), a.q_mean.as<float>(),
                                         a.q_rstd.as<float>(), BT * NH, hs, ln_scratch.get(), t,
                                         stream);
                cuda::layernorm_backward(d + C * es, heads, false, g(p.k_norm_w), g(p.k_norm_b),
                                         d + C * es, heads, raw + C * es, heads, w(p.k_norm_w),
                                         a.k_mean.as<float>(), a.k_rstd.as<float>(), BT * NH, hs,
                                         ln_scratch.get(), t, stream);
            }
            if (cfg.qk_norm) tick("qk_norm bwd");
            linear_backward(dtmp.get(), dqkv.get(), a.ln1.get(), p.qkv_w, p.qkv_b, BT, C, 3 * C,
                            nullptr, false, qkv_colsums.as<float>(), qkv_colsum_rows);
            before_write(dres.get());
            cuda::layernorm_backward(dres.get(), {1, C}, true, g(p.ln1_w), g(p.ln1_b), dtmp.get(),
                                     {1, C}, residual[l].get(), {1, C}, wr(p.ln1_w),
                                     a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), BT, C,
                                     ln_scratch.get(), t, rt, stream);
            tick("layernorm bwd");
            announce_block_grads(l);
        }
        if (vgroup.size > 1) {
            // wpe from this rank's rows; wte: the group's row gradients, of the tokens this
            // shard holds (vp_h is free once the head is done)
            cuda::encoder_backward(nullptr, g(layout.wpe), dres.get(), nullptr, nullptr, nullptr, 0,
                                   B, Tn, C, rt, stream);
            ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
            vgroup.all_gather(dres.get(), vp_h.get(), BT * C * int64_t(res_es));
            cuda::encoder_backward(g(layout.wte), nullptr, vp_h.get(), bucket_token.as<int32_t>(),
                                   bucket_offset.as<int32_t>(), bucket_position.as<int32_t>(),
                                   n_distinct, vgroup.size * B, Tn, C, rt, stream);
        } else {
            cuda::encoder_backward(g(layout.wte), g(layout.wpe), dres.get(),
                                   bucket_token.as<int32_t>(), bucket_offset.as<int32_t>(),
                                   bucket_position.as<int32_t>(), n_distinct, B, Tn, C, rt, stream);
        }
        tick("encoder bwd");
        if (overlapping()) {  // the gradients are complete when the main stream goes on
            ZG_CUDA_CHECK(cudaEventRecord(join_ev, wstream));
            ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, join_ev));
        }
    }

    void refresh_bf16() {
        if (t != DType::bf16) return;
        // a plain conversion pass, rounding to nearest as the AdamW kernel does
        cuda::cast_from_f32(params16.get(), params.as<float>(), layout.table.total(), DType::bf16,
                            stream);
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    size_t allocated() const {
        size_t s = params.bytes() + grads.bytes() + params16.bytes() + norm_scratch.bytes() +
                   norm_out.bytes() + grad_out.bytes() + summary.bytes();
        for (const DeviceBuffer& r : residual) s += r.bytes();
        for (const Layer& a : layers)
            for (const DeviceBuffer* b :
                 {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv_raw, &a.q_mean, &a.q_rstd, &a.k_mean,
                  &a.k_rstd, &a.qkv, &a.att_saved, &a.atty, &a.res_attn, &a.ln2, &a.ln2_mean,
                  &a.ln2_rstd, &a.fch, &a.fch_gelu})
                s += b->bytes();
        for (const DeviceBuffer* b : {&lnf,          &lnf_mean,      &lnf_rstd,
                                      &logits,       &tokens,        &targets,
                                      &bucket_token, &bucket_offset, &bucket_position,
                                      &branch_out,   &dres,          &dres_act,
                                      &dtmp,         &dqkv,          &dfch,
                                      &gelu_tmp,     &att_scratch,   &ln_scratch,
                                      &bias_scratch, &qkv_colsums,   &ce_workspace})
            s += b->bytes();
        for (const DeviceBuffer* b : {&vp_h, &vp_y, &vp_logits, &vp_stats, &vp_gathered, &vp_params,
                                      &vp_nvalid, &vp_rows, &vp_dh_all, &vp_dh, &vp_summary})
            s += b->bytes();
        return s + cuda::gemm_workspace_bytes();
    }
};

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
    ZG_CUDA_CHECK(
        cudaMemcpy(impl_->params.get(), host, num_parameters() * 4, cudaMemcpyHostToDevice));
    // A copy from pageable memory may return before its DMA lands, and the legacy stream does not
    // order it before the model's non-blocking stream: wait for it.
    ZG_CUDA_CHECK(cudaDeviceSynchronize());
    impl_->refresh_bf16();
}
void GptCuda::get_params(float* host) const {
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    ZG_CUDA_CHECK(
        cudaMemcpy(host, impl_->params.get(), num_parameters() * 4, cudaMemcpyDeviceToHost));
}
void GptCuda::get_grads(float* host) const {
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
void GptCuda::set_vocab_group(VocabGroup group) {
    ZG_CHECK(group.size >= 1 && group.rank >= 0 && group.rank < group.size,
             "vocab group: rank outside [0, size)");
    ZG_CHECK(group.size == 1 || (group.all_gather && group.reduce_scatter_sum),
             "vocab group: the collectives are missing");
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
    ZG_CUDA_CHECK(cudaMemsetAsync(impl_->grads.get(), 0, num_parameters() * 4, impl_->stream));
}
double GptCuda::grad_norm() {
    return std::sqrt(grad_sum_of_squares(0, num_parameters()));
}

double GptCuda::grad_sum_of_squares(int64_t lo, int64_t hi) {
    ZG_CHECK(0 <= lo && lo <= hi && hi <= num_parameters(), "grad_sum_of_squares: bad range");
    cuda::sum_of_squares(impl_->norm_out.as<double>(), impl_->grads.as<float>() + lo, hi - lo,
                         impl_->norm_scratch.get(), impl_->stream);
    double s = 0;
    ZG_CUDA_CHECK(cudaMemcpyAsync(&s, impl_->norm_out.get(), sizeof s, cudaMemcpyDeviceToHost,
                                  impl_->stream));
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    return s;
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
    Impl& im = *impl_;
    ZG_CHECK(0 <= lo && lo <= hi && hi <= num_parameters(), "adamw_step_range: bad range");
    cpu::AdamWStep s;
    s.lr = lr;
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.eps = eps;
    s.t = t;
    s.grad_scale = grad_scale;
    // Runs of consecutive tensors with the same decay flag: one launch each.
    const auto& specs = im.layout.table.specs();
    for (size_t i = 0; i < specs.size();) {
        size_t j = i;
        int64_t n = 0;
        while (j < specs.size() && specs[j].decay == specs[i].decay) n += specs[j++].numel;
        s.weight_decay = specs[i].decay ? weight_decay : 0.0;
        // this run of tensors inside [lo, hi)
        const int64_t off = std::max(specs[i].offset, lo);
        const int64_t end = std::min(specs[i].offset + n, hi);
        i = j;
        if (off >= end) continue;
        void* p16 = im.t == DType::bf16 ? static_cast<void*>(im.params16.as<Impl::bf16_t>() + off)
                                        : nullptr;
        cuda::adamw_update(im.params.as<float>() + off, p16, im.grads.as<float>() + off,
                           m + (off - lo), v + (off - lo), end - off, s, im.stream);
    }
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
    return impl_->grads.as<float>();
}
size_t GptCuda::allocated_bytes() const {
    return impl_->allocated();
}

void GptCuda::set_profiling(bool on) {
    for (cudaEvent_t& e : impl_->ev)
        if (!e) ZG_CUDA_CHECK(cudaEventCreate(&e));
    impl_->profiling = on;
}

void GptCuda::set_op_profiling(bool on) {
    impl_->profile_ops = on;
    impl_->ticks.clear();
}

std::vector<std::pair<std::string, double>> GptCuda::take_op_times() {
    Impl& im = *impl_;
    ZG_CUDA_CHECK(cudaStreamSynchronize(im.stream));
    std::vector<std::pair<std::string, double>> r;
    for (size_t i = 1; i < im.ticks.size(); i++) {
        if (!im.ticks[i].first) continue;
        float ms = 0;
        ZG_CUDA_CHECK(cudaEventElapsedTime(&ms, im.ticks[i - 1].second, im.ticks[i].second));
        auto it = std::find_if(r.begin(), r.end(),
                               [&](const auto& x) { return x.first == im.ticks[i].first; });
        if (it == r.end())
            r.emplace_back(im.ticks[i].first, ms);
        else
            it->second += ms;
    }
    im.ticks.clear();
    return r;
}

double GptCuda::head_ms() const {
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    float a = 0, b = 0, c = 0;
    ZG_CUDA_CHECK(cudaEventElapsedTime(&a, impl_->ev[0], impl_->ev[1]));
    ZG_CUDA_CHECK(cudaEventElapsedTime(&b, impl_->ev[2], impl_->ev[3]));
    ZG_CUDA_CHECK(cudaEventElapsedTime(&c, impl_->ev[4], impl_->ev[5]));
    return double(a) + b + c;
}

}  // namespace zgpt

#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/attention/attention.h"
#include "kernels/core/check.h"
#include "kernels/core/rng.h"
#include "kernels/gemm/matmul.h"
#include "kernels/norms/layernorm.h"
#include "kernels/norms/rmsnorm.h"
#include "kernels/ops/encoder.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"

namespace zgpt {

namespace {

// Copies a [rows, width] block between row strides (q or k columns in and out of qkv).
template <typename T>
void copy_block(T* dst, int64_t dst_ld, const T* src, int64_t src_ld, int64_t rows, int64_t width) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) std::copy_n(src + r * src_ld, width, dst + r * dst_ld);
}

template <typename T>
void fill_zero(std::vector<T>& v) {
    std::fill(v.begin(), v.end(), T(0));
}

}  // namespace

template <typename T>
GPT<T>::GPT(const ModelConfig& config, int vocab_parts)
    : cfg_(config),
      layout_(make_gpt_layout(config, vocab_parts)),
      vocab_parts_(vocab_parts),
      Vp_(vocab_table_rows(config, vocab_parts)) {
    params.assign(layout_.table.total(), T(0));
    grads.assign(layout_.table.total(), T(0));
}

namespace {
// The walk over the tensors both overloads share: `normals(p, n, first_draw, sd)` writes n values
// of the normal stream from draw first_draw on, times sd.
template <typename T, typename Normals>
void init_gpt_tensors(const ModelConfig& c, const GptLayout& layout, T* params,
                      const Normals& normals) {
    const double residual_std = c.init_std / std::sqrt(2.0 * c.n_layer);
    // One normal stream over the tensors in table order: each tensor starts at its own offset
    // into it (`draws`), so the tensors, and blocks within them, can be drawn in any order.
    int64_t draws = 0;  // normal values before this tensor's
    for (const ParamSpec& s : layout.table.specs()) {
        T* p = params + s.offset;
        if (s.init == Init::zeros || s.init == Init::ones) {
            std::fill(p, p + s.numel, T(s.init == Init::ones ? 1 : 0));
            continue;
        }
        normals(p, s.numel, uint64_t(draws), s.init == Init::normal ? c.init_std : residual_std);
        draws += s.numel;
    }
    // Padded vocabulary rows never see a token; keep them at zero so their logits are inert.
    const int64_t Vp = vocab_table_rows(c);
    for (int idx : {layout.wte, layout.lm_head}) {
        T* w = params + layout.table[idx].offset;
        std::fill(w + int64_t(c.vocab_size) * c.n_embd, w + Vp * c.n_embd, T(0));
    }
}
}  // namespace

template <typename T>
void init_gpt_weights(const ModelConfig& c, const GptLayout& layout, uint64_t seed, T* params) {
    // The generator is a counter, so each block of values starts from its own offset into the
    // stream and the blocks run in parallel (GPT-2 1558M's 1.6G values took about a minute on one
    // core), with the same bits as one pass.
    init_gpt_tensors(c, layout, params, [&](T* p, int64_t n, uint64_t first, double sd) {
        constexpr int64_t kBlock = int64_t(1) << 16;
        const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            Rng rng(seed);
            rng.skip_normals(first + uint64_t(b * kBlock));
            const int64_t end = std::min(n, (b + 1) * kBlock);
            for (int64_t i = b * kBlock; i < end; i++) p[i] = T(sd * rng.normal());
        }
    });
}
template void init_gpt_weights<float>(const ModelConfig&, const GptLayout&, uint64_t, float*);
template void init_gpt_weights<double>(const ModelConfig&, const GptLayout&, uint64_t, double*);

void init_gpt_weights(const ModelConfig& c, const GptLayout& layout, float* params,
                      const NormalFill& normals) {
    init_gpt_tensors(c, layout, params, normals);
}

template <typename T>
void GPT<T>::init_weights(uint64_t seed) {
    ZG_CHECK(vocab_parts_ == 1, "init_weights: initialise the whole model, then take the shard");
    init_gpt_weights(cfg_, layout_, seed, params.data());
}

template <typename T>
void GPT<T>::set_op_profiling(bool on) {
    profile_ = on;
    op_times_.clear();
}

template <typename T>
std::vector<std::pair<std::string, double>> GPT<T>::take_op_times() {
    return std::exchange(op_times_, {});
}

template <typename T>
void GPT<T>::tick(const char* op) {
    if (!profile_) return;
    const auto now = std::chrono::steady_clock::now();
    if (op) {
        const double ms = std::chrono::duration<double, std::milli>(now - last_tick_).count();
        auto it = std::find_if(op_times_.begin(), op_times_.end(),
                               [&](const auto& x) { return x.first == op; });
        if (it == op_times_.end())
            op_times_.emplace_back(op, ms);
        else
            it->second += ms;
    }
    last_tick_ = now;
}

template <typename T>
void GPT<T>::zero_grad() {
    fill_zero(grads);
}

template <typename T>
void GPT<T>::norm_forward(T* out, T* mean, T* rstd, const T* inp, int w, int b, int64_t N,
                          int64_t C) {
    if (cfg_.norm == "rmsnorm")
        cpu::rmsnorm_forward(out, rstd, inp, maybe(w), N, C, cfg_.ln_eps);
    else
        cpu::layernorm_forward(out, mean, rstd, inp, maybe(w), maybe(b), N, C, cfg_.ln_eps);
}

template <typename T>
void GPT<T>::norm_backward(T* dinp, const T* dout, const T* inp, int w, int b, const T* mean,
                           const T* rstd, int64_t N, int64_t C) {
    if (cfg_.norm == "rmsnorm")
        cpu::rmsnorm_backward(dinp, maybe_grad(w), dout, inp, maybe(w), rstd, N, C);
    else
        cpu::layernorm_backward(dinp, maybe_grad(w), maybe_grad(b), dout, inp, maybe(w), mean, rstd,
                                N, C);
}

template <typename T>
void GPT<T>::ensure_activations(int64_t B, int64_t Tn) {
    if (B == B_ && Tn == T_) return;
    B_ = B;
    T_ = Tn;
    const int64_t BT = B * Tn, C = cfg_.n_embd, NH = cfg_.n_head, L = cfg_.n_layer;
    const int64_t NKV = kv_heads(cfg_), KVC = NKV * (C / NH), Cq = C + 2 * KVC;
    const int64_t H = mlp_hidden_size(cfg_), Fw = cfg_.mlp == "swiglu" ? 2 * H : H;
    residual_.assign(L + 1, std::vector<T>(BT * C));
    blocks_.assign(L, BlockActs{});
    for (BlockActs& a : blocks_) {
        a.ln1.resize(BT * C);
        a.ln1_mean.resize(BT);
        a.ln1_rstd.resize(BT);
        if (cfg_.qk_norm) {
            a.qkv_raw.resize(BT * Cq);
            a.q_in.resize(BT * C);
            a.k_in.resize(BT * KVC);
            for (auto* v : {&a.q_mean, &a.q_rstd}) v->resize(BT * NH);
            for (auto* v : {&a.k_mean, &a.k_rstd}) v->resize(BT * NKV);
        }
        a.qkv.resize(BT * Cq);
        a.att.resize(B * NH * Tn * Tn);
        a.atty.resize(BT * C);
        a.res_attn.resize(BT * C);
        a.ln2.resize(BT * C);
        a.ln2_mean.resize(BT);
        a.ln2_rstd.resize(BT);
        a.fch.resize(BT * Fw);
        a.fch_gelu.resize(BT * H);
    }
    lnf_.resize(BT * C);
    lnf_mean_.resize(BT);
    lnf_rstd_.resize(BT);
    for (auto* v : {&dres_, &dtmp_c_, &dq_, &dk_}) v->resize(BT * C);
    for (auto* v : {&dqkv_, &dqkv_raw_}) v->resize(BT * Cq);
    dfch_.resize(BT * Fw);
    dgelu_.resize(BT * H);
}

template <typename T>
void GPT<T>::forward(const int32_t* tokens, int64_t B, int64_t Tn) {
    forward_hidden(tokens, B, Tn);
    logits_.resize(B * Tn * Vp_);  // here, not with the activations: a sharded head has none
    cpu::matmul_forward(logits_.data(), lnf_.data(), maybe(layout_.lm_head), (const T*)nullptr,
                        B * Tn, int64_t(cfg_.n_embd), Vp_);
    tick("head matmul fwd");
}

template <typename T>
void GPT<T>::forward_hidden(const int32_t* tokens, int64_t B, int64_t Tn, const T* token_rows) {
    ZG_CHECK(token_rows || vocab_parts_ == 1,
             "a model holding a shard of the vocabulary needs the token rows from outside");
    ZG_CHECK(B > 0 && Tn > 0 && Tn <= cfg_.block_size,
             "sequence length " + std::to_string(Tn) +
                 " must be in [1, block_size=" + std::to_string(cfg_.block_size) + "]");
    for (int64_t i = 0; i < B * Tn; i++)
        ZG_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size,
                 "token id " + std::to_string(tokens[i]) + " outside the vocabulary");
    ensure_activations(B, Tn);
    tick(nullptr);
    tokens_.assign(tokens, tokens + B * Tn);
    const int64_t BT = B * Tn, C = cfg_.n_embd, NH = cfg_.n_head, hs = C / NH;
    const int64_t NKV = kv_heads(cfg_), KVC = NKV * hs, Cq = C + 2 * KVC;
    const int64_t H = mlp_hidden_size(cfg_), Fw = cfg_.mlp == "swiglu" ? 2 * H : H;
    const bool rope = cfg_.position == "rope";
    outside_rows_ = token_rows != nullptr;
    if (outside_rows_)
        cpu::add_positions(residual_[0].data(), token_rows, maybe(layout_.wpe), B, Tn, C);
    else
        cpu::encoder_forward(residual_[0].data(), tokens, maybe(layout_.wte), maybe(layout_.wpe), B,
                             Tn, C);
    tick("encoder fwd");
    std::vector<T> scratch(BT * C);
    for (int l = 0; l < cfg_.n_layer; l++) {
        const BlockParams& p = layout_.blocks[l];
        BlockActs& a = blocks_[l];
        const T* x = residual_[l].data();
        norm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1_w, p.ln1_b, BT,
                     C);
        tick("layernorm fwd");
        // q, k and v: one matmul (their weights are one [Cq, C] matrix, BlockParams)
        if (cfg_.qk_norm) {
            cpu::matmul_forward(a.qkv_raw.data(), a.ln1.data(), maybe(p.qkv_w), maybe(p.qkv_b), BT,
                                C, Cq);
            tick("matmul fwd");
            a.qkv = a.qkv_raw;
            // q and k of each token are NH (NKV) contiguous rows of hs: normalise each row.
            copy_block(a.q_in.data(), C, a.qkv_raw.data(), Cq, BT, C);
            copy_block(a.k_in.data(), KVC, a.qkv_raw.data() + C, Cq, BT, KVC);
            norm_forward(scratch.data(), a.q_mean.data(), a.q_rstd.data(), a.q_in.data(),
                         p.q_norm_w, p.q_norm_b, BT * NH, hs);
            tick("layernorm fwd");
            copy_block(a.qkv.data(), Cq, scratch.data(), C, BT, C);
            norm_forward(scratch.data(), a.k_mean.data(), a.k_rstd.data(), a.k_in.data(),
                         p.k_norm_w, p.k_norm_b, BT * NKV, hs);
            tick("layernorm fwd");
            copy_block(a.qkv.data() + C, Cq, scratch.data(), KVC, BT, KVC);
        } else {
            cpu::matmul_forward(a.qkv.data(), a.ln1.data(), maybe(p.qkv_w), maybe(p.qkv_b), BT, C,
                                Cq);
            tick("matmul fwd");
        }
        if (rope) {  // q's NH heads and k's NKV heads, after qk_norm as in Qwen3 and OLMo 2
            cpu::rope_forward(a.qkv.data(), B, Tn, NH, hs, Cq, cfg_.rope_theta);
            cpu::rope_forward(a.qkv.data() + C, B, Tn, NKV, hs, Cq, cfg_.rope_theta);
            tick("rope fwd");
        }
        cpu::attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, Tn, C, NH, NKV);
        tick("attention fwd");
        cpu::matmul_forward(scratch.data(), a.atty.data(), maybe(p.proj_w), maybe(p.proj_b), BT, C,
                            C);
        tick("matmul fwd");
        cpu::residual_forward(a.res_attn.data(), x, scratch.data(), BT * C);
        tick("residual fwd");
        norm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res_attn.data(), p.ln2_w,
                     p.ln2_b, BT, C);
        tick("layernorm fwd");
        // fc: [H, C] (gelu) or gate and up as one [2H, C] matrix (swiglu)
        cpu::matmul_forward(a.fch.data(), a.ln2.data(), maybe(p.fc_w), maybe(p.fc_b), BT, C, Fw);
        tick("matmul fwd");
        if (cfg_.mlp == "swiglu") {
            cpu::swiglu_forward(a.fch_gelu.data(), a.fch.data(), BT, H);
            tick("swiglu fwd");
        } else {
            cpu::gelu_forward(a.fch_gelu.data(), a.fch.data(), BT * H);
            tick("gelu fwd");
        }
        cpu::matmul_forward(scratch.data(), a.fch_gelu.data(), maybe(p.fcproj_w), maybe(p.fcproj_b),
                            BT, H, C);
        tick("matmul fwd");
        cpu::residual_forward(residual_[l + 1].data(), a.res_attn.data(), scratch.data(), BT * C);
        tick("residual fwd");
    }
    norm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual_[cfg_.n_layer].data(),
                 layout_.lnf_w, layout_.lnf_b, BT, C);
    tick("layernorm fwd");
}

template <typename T>
CrossEntropySummary GPT<T>::loss(const int32_t* targets, const CrossEntropyOptions& opts,
                                 GradOutput grad_output, bool compute_grad, CrossEntropyRows rows) {
    ZG_CHECK(B_ > 0 && int64_t(logits_.size()) == B_ * T_ * Vp_, "loss() needs a forward() first");
    const int64_t BT = B_ * T_;
    tick(nullptr);
    CrossEntropySummary s = cpu::cross_entropy(logits_.data(), Vp_, targets, BT, cfg_.vocab_size,
                                               opts, grad_output, rows, compute_grad);
    if (compute_grad) {  // padded vocabulary columns are masked: no gradient flows through them
        for (int64_t i = 0; i < BT; i++)
            std::fill(logits_.data() + i * Vp_ + cfg_.vocab_size, logits_.data() + (i + 1) * Vp_,
                      T(0));
    }
    tick("cross-entropy");
    return s;
}

template <typename T>
void GPT<T>::backward() {
    const int64_t BT = B_ * T_, C = cfg_.n_embd;
    ZG_CHECK(BT > 0 && int64_t(logits_.size()) == BT * Vp_,
             "backward() needs forward() and loss() first");
    tick(nullptr);
    // lm head (logits_ holds dlogits now)
    fill_zero(dtmp_c_);
    cpu::matmul_backward(dtmp_c_.data(), maybe_grad(layout_.lm_head), (T*)nullptr, logits_.data(),
                         lnf_.data(), maybe(layout_.lm_head), BT, C, Vp_);
    tick("head matmul bwd");
    backward_from_hidden(dtmp_c_.data());
}

template <typename T>
void GPT<T>::backward_from_hidden(const T* dhidden) {
    const int64_t B = B_, Tn = T_, BT = B * Tn, C = cfg_.n_embd, NH = cfg_.n_head, hs = C / NH;
    const int64_t NKV = kv_heads(cfg_), KVC = NKV * hs, Cq = C + 2 * KVC;
    const int64_t H = mlp_hidden_size(cfg_), Fw = cfg_.mlp == "swiglu" ? 2 * H : H;
    ZG_CHECK(BT > 0, "backward() needs forward() first");
    if (dhidden != dtmp_c_.data()) tick(nullptr);  // called alone (a sharded head ran before)
    fill_zero(dres_);
    norm_backward(dres_.data(), dhidden, residual_[cfg_.n_layer].data(), layout_.lnf_w,
                  layout_.lnf_b, lnf_mean_.data(), lnf_rstd_.data(), BT, C);
    tick("layernorm bwd");
    // dres_ is the gradient of the residual stream; each block adds its branch's input gradient.
    for (int l = cfg_.n_layer - 1; l >= 0; l--) {
        const BlockParams& p = layout_.blocks[l];
        BlockActs& a = blocks_[l];
        // MLP branch: residual_[l+1] = res_attn + fcproj(act(fc(ln2(res_attn))))
        fill_zero(dgelu_);
        cpu::matmul_backward(dgelu_.data(), maybe_grad(p.fcproj_w), maybe_grad(p.fcproj_b),
                             dres_.data(), a.fch_gelu.data(), maybe(p.fcproj_w), BT, H, C);
        tick("matmul bwd");
        fill_zero(dfch_);
        if (cfg_.mlp == "swiglu") {
            cpu::swiglu_backward(dfch_.data(), a.fch.data(), dgelu_.data(), BT, H);
            tick("swiglu bwd");
        } else {
            cpu::gelu_backward(dfch_.data(), a.fch.data(), dgelu_.data(), BT * H);
            tick("gelu bwd");
        }
        fill_zero(dtmp_c_);
        cpu::matmul_backward(dtmp_c_.data(), maybe_grad(p.fc_w), maybe_grad(p.fc_b), dfch_.data(),
                             a.ln2.data(), maybe(p.fc_w), BT, C, Fw);
        tick("matmul bwd");
        norm_backward(dres_.data(), dtmp_c_.data(), a.res_attn.data(), p.ln2_w, p.ln2_b,
                      a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
        tick("layernorm bwd");
        // attention branch: res_attn = x + proj(attn(rope(qk_norm(qkv(ln1(x))))))
        fill_zero(dtmp_c_);
        cpu::matmul_backward(dtmp_c_.data(), maybe_grad(p.proj_w), maybe_grad(p.proj_b),
                             dres_.data(), a.atty.data(), maybe(p.proj_w), BT, C, C);
        tick("matmul bwd");
        fill_zero(dqkv_);
        cpu::attention_backward(dqkv_.data(), dtmp_c_.data(), a.qkv.data(), a.att.data(), B, Tn, C,
                                NH, NKV);
        tick("attention bwd");
        if (cfg_.position == "rope") {
            cpu::rope_backward(dqkv_.data(), B, Tn, NH, hs, Cq, cfg_.rope_theta);
            cpu::rope_backward(dqkv_.data() + C, B, Tn, NKV, hs, Cq, cfg_.rope_theta);
            tick("rope bwd");
        }
        T* dqkv_in = dqkv_.data();
        if (cfg_.qk_norm) {
            dqkv_raw_ = dqkv_;  // v passes through unchanged; q and k are replaced below
            copy_block(dtmp_c_.data(), C, dqkv_.data(), Cq, BT, C);
            fill_zero(dq_);
            norm_backward(dq_.data(), dtmp_c_.data(), a.q_in.data(), p.q_norm_w, p.q_norm_b,
                          a.q_mean.data(), a.q_rstd.data(), BT * NH, hs);
            tick("layernorm bwd");
            copy_block(dqkv_raw_.data(), Cq, dq_.data(), C, BT, C);
            copy_block(dtmp_c_.data(), KVC, dqkv_.data() + C, Cq, BT, KVC);
            fill_zero(dk_);
            norm_backward(dk_.data(), dtmp_c_.data(), a.k_in.data(), p.k_norm_w, p.k_norm_b,
                          a.k_mean.data(), a.k_rstd.data(), BT * NKV, hs);
            tick("layernorm bwd");
            copy_block(dqkv_raw_.data() + C, Cq, dk_.data(), KVC, BT, KVC);
            dqkv_in = dqkv_raw_.data();
        }
        fill_zero(dtmp_c_);
        cpu::matmul_backward(dtmp_c_.data(), maybe_grad(p.qkv_w), maybe_grad(p.qkv_b), dqkv_in,
                             a.ln1.data(), maybe(p.qkv_w), BT, C, Cq);
        tick("matmul bwd");
        norm_backward(dres_.data(), dtmp_c_.data(), residual_[l].data(), p.ln1_w, p.ln1_b,
                      a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
        tick("layernorm bwd");
    }
    // dres_ now holds the gradient of the embedding rows (dtoken_rows()).
    cpu::encoder_backward(outside_rows_ ? nullptr : maybe_grad(layout_.wte),
                          maybe_grad(layout_.wpe), dres_.data(), tokens_.data(), B, Tn, C);
    tick("encoder bwd");
}

template class GPT<float>;
template class GPT<double>;

}  // namespace zgpt

// GPT-2 style model on the CPU reference ops: forward to logits, the loss head, backward; with the
// Llama-style options (RMSNorm, rotary positions, SwiGLU, grouped-query attention) too.
// T is float for training and double for gradient checks.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/loss_head/cross_entropy.h"
#include "model/gpt_config.h"
#include "model/parameters.h"

namespace zgpt {

// GPT-2 initialisation of a whole model's parameters (layout of make_gpt_layout(c), one vocabulary
// part) into params: N(0, init_std), residual projections N(0, init_std / sqrt(2 n_layer)),
// LayerNorm weight 1, biases 0, padded vocabulary rows 0. Every element is written.
template <typename T>
void init_gpt_weights(const ModelConfig& c, const GptLayout& layout, uint64_t seed, T* params);
// The same, its normal values drawn by `normals(out, n, first_draw, sd)`: n values of the stream
// of Rng(seed).normal() from draw first_draw on, times sd (the GPU's, kernels/ops/normal_fill.h,
// where the host's cores would take seconds).
using NormalFill = std::function<void(float* out, int64_t n, uint64_t first_draw, double sd)>;
void init_gpt_weights(const ModelConfig& c, const GptLayout& layout, float* params,
                      const NormalFill& normals);

template <typename T>
class GPT {
  public:
    // vocab_parts > 1: the vocabulary tables hold one vocab-parallel shard (make_gpt_layout);
    // the token rows then come from outside (forward_hidden's token_rows).
    explicit GPT(const ModelConfig& config, int vocab_parts = 1);

    const ModelConfig& config() const { return cfg_; }
    const GptLayout& layout() const { return layout_; }
    int64_t padded_vocab() const { return Vp_; }
    int64_t num_parameters() const { return layout_.table.total(); }

    T* param(int idx) { return params.data() + layout_.table[idx].offset; }
    T* grad(int idx) { return grads.data() + layout_.table[idx].offset; }

    // GPT-2 initialisation: N(0, init_std), residual projections N(0, init_std / sqrt(2 n_layer)),
    // LayerNorm weight 1, biases 0, padded vocabulary rows 0.
    void init_weights(uint64_t seed);

    // Forward B x Tn tokens (Tn <= block_size) to logits [B * Tn, padded_vocab].
    void forward(const int32_t* tokens, int64_t B, int64_t Tn);
    // The same up to the final LayerNorm's output, hidden() [B * Tn, n_embd]: where a
    // vocab-parallel loss head (train/vocab_parallel/vocab_parallel_head.h) takes over. token_rows
    // [B * Tn, n_embd]: the tokens' wte rows, looked up elsewhere (a table split over ranks,
    // train/vocab_parallel/vocab_parallel_embedding.h); null: looked up in this model's wte.
    void forward_hidden(const int32_t* tokens, int64_t B, int64_t Tn,
                        const T* token_rows = nullptr);
    const T* hidden() const { return lnf_.data(); }

    // The loss head on the last forward's logits (only the first vocab_size columns count).
    // With compute_grad, dlogits replace the logits in place, ready for backward().
    CrossEntropySummary loss(const int32_t* targets, const CrossEntropyOptions& opts,
                             GradOutput grad_output, bool compute_grad, CrossEntropyRows rows = {});

    // Backward from dlogits; adds into grads.
    void backward();
    // Backward from the gradient of hidden() [B * Tn, n_embd] (the LM head's part already done);
    // adds into grads. When the forward took token_rows, their gradient is left in
    // dtoken_rows() [B * Tn, n_embd] instead of being added into wte's.
    void backward_from_hidden(const T* dhidden);
    const T* dtoken_rows() const { return dres_.data(); }

    void zero_grad();
    const T* logits() const { return logits_.data(); }

    // Per-op wall time (ms) of forward, loss and backward since set_op_profiling(true) or the
    // last take, by op family (tools/bench/bench_cpu). Off: one branch per op.
    void set_op_profiling(bool on);
    std::vector<std::pair<std::string, double>> take_op_times();

    std::vector<T> params, grads;

  private:
    struct BlockActs {
        std::vector<T> ln1, ln1_mean, ln1_rstd;
        std::vector<T> qkv_raw;  // qkv matmul output (qk_norm only)
        std::vector<T> q_in, q_mean, q_rstd, k_in, k_mean, k_rstd;  // qk_norm only
        std::vector<T> qkv;  // attention input [BT, C + 2 KVC] (after qk_norm and rope)
        std::vector<T> att, atty, res_attn;  // probabilities, output, residual after attn
        std::vector<T> ln2, ln2_mean, ln2_rstd;
        std::vector<T> fch, fch_gelu;  // fc output [BT, H] (swiglu: [BT, 2 H]); activation [BT, H]
    };
    void ensure_activations(int64_t B, int64_t Tn);
    // model.norm (LayerNorm or RMSNorm, whose mean is not written) with table tensors w and b.
    void norm_forward(T* out, T* mean, T* rstd, const T* inp, int w, int b, int64_t N, int64_t C);
    void norm_backward(T* dinp, const T* dout, const T* inp, int w, int b, const T* mean,
                       const T* rstd, int64_t N, int64_t C);
    const T* maybe(int idx) const {
        return idx < 0 ? nullptr : params.data() + layout_.table[idx].offset;
    }
    T* maybe_grad(int idx) { return idx < 0 ? nullptr : grads.data() + layout_.table[idx].offset; }

    void tick(const char* op);  // adds the time since the previous tick to op (null: restart)
    bool profile_ = false;
    std::chrono::steady_clock::time_point last_tick_;
    std::vector<std::pair<std::string, double>> op_times_;

    ModelConfig cfg_;
    GptLayout layout_;
    int vocab_parts_;
    int64_t Vp_;                 // rows of the vocabulary tables
    bool outside_rows_ = false;  // the last forward took token_rows
    int64_t B_ = 0, T_ = 0;
    std::vector<int32_t> tokens_;
    std::vector<std::vector<T>> residual_;  // residual_[l]: input of block l; [L]: final
    std::vector<BlockActs> blocks_;
    std::vector<T> lnf_, lnf_mean_, lnf_rstd_, logits_;
    // backward scratch, shared by all blocks
    std::vector<T> dres_, dtmp_c_, dqkv_, dqkv_raw_, dfch_, dgelu_, dq_, dk_;
};

extern template class GPT<float>;
extern template class GPT<double>;

}  // namespace zgpt

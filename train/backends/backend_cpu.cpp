#include <omp.h>

#include <chrono>
#include <cmath>

#include "kernels/core/check.h"
#include "kernels/core/rng.h"
#include "kernels/ops/global_norm.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "train/backends/backend.h"
#include "train/backends/backend_init.h"
#include "train/backends/zero1_share.h"
#include "train/optimizer.h"
#include "train/vocab_parallel/vocab_parallel_embedding.h"
#include "train/vocab_parallel/vocab_parallel_head.h"
#include "train/vocab_parallel/vocab_sharded_arena.h"

namespace zgpt {

namespace {

class CpuBackend final : public Backend {
  public:
    CpuBackend(const Config& cfg, VocabParallel vocab, Communicator* zero1)
        : cfg_(cfg),
          vocab_(vocab),
          arena_(cfg.model, vocab.split() ? vocab.group->size() : 1,
                 vocab.split() ? vocab.group->rank() : 0),
          model_(cfg.model, arena_.parts()),
          share_(arena_, zero1, vocab.peers),
          opt_(model_.layout().table, cfg.optim, share_.ranges()) {
        set_params(initial_params(cfg));
    }
    std::string name() const override { return "cpu"; }
    const GptLayout& layout() const override { return arena_.whole(); }
    int64_t num_parameters() const override { return arena_.whole().table.total(); }
    int64_t stored_parameters() const override { return model_.num_parameters(); }
    int64_t padded_vocab() const override { return padded_vocab_size(cfg_.model.vocab_size); }

    CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets, int64_t B,
                                          int64_t T, const CrossEntropyOptions& opts,
                                          double grad_output) override {
        if (vocab_.split()) {  // (the split model takes its ids in shard order)
            forward_split(arena_.in_shard_order(inputs, B * T, ids_[0]), B, T);
            dhidden_.resize(B * T * model_.config().n_embd);
            const CrossEntropySummary s =
                head(arena_.in_shard_order(targets, B * T, ids_[1]), B * T,
                     arena_.in_shard_order(opts), grad_output, true);
            model_.backward_from_hidden(dhidden_.data());
            embed_.backward(*vocab_.group, model_.dtoken_rows(), B * T, model_.config().n_embd,
                            model_.grad(model_.layout().wte), arena_.shard());
            return s;
        }
        model_.forward(inputs, B, T);
        const CrossEntropySummary s = model_.loss(targets, opts, {&grad_output, false}, true);
        model_.backward();
        return s;
    }
    CrossEntropySummary evaluate(const int32_t* inputs, const int32_t* targets, int64_t B,
                                 int64_t T, const CrossEntropyOptions& opts) override {
        const double one = 1.0;
        if (vocab_.split()) {
            forward_split(arena_.in_shard_order(inputs, B * T, ids_[0]), B, T);
            return head(arena_.in_shard_order(targets, B * T, ids_[1]), B * T,
                        arena_.in_shard_order(opts), one, false);
        }
        model_.forward(inputs, B, T);
        return model_.loss(targets, opts, {&one, false}, false);
    }
    void zero_grad() override { model_.zero_grad(); }
    double all_reduce_grads(Communicator& comm) override {
        const auto t0 = std::chrono::steady_clock::now();
        float* g = model_.grads.data();
        if (!vocab_.split()) {
            comm.all_reduce_sum(g, model_.num_parameters());
        } else {
            for (const ArenaSlice& s : arena_.replicated_spans())
                comm.all_reduce_sum(g + s.lo, s.hi - s.lo);
            if (vocab_.peers && vocab_.peers->size() > 1)
                for (const ArenaSlice& s : arena_.vocab_spans())
                    vocab_.peers->all_reduce_sum(g + s.lo, s.hi - s.lo);
        }
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
            .count();
    }
    double grad_norm() override {
        const float* g = model_.grads.data();
        if (!vocab_.split()) return global_grad_norm(g, model_.num_parameters());
        // The replicated part is the same on every rank; the shards' parts add over the group.
        double replicated = 0, mine = 0;
        for (const ArenaSlice& s : arena_.replicated_spans())
            replicated += cpu::sum_of_squares(g + s.lo, s.hi - s.lo);
        for (const ArenaSlice& s : arena_.vocab_spans())
            mine += cpu::sum_of_squares(g + s.lo, s.hi - s.lo);
        return std::sqrt(replicated + vocab_.group->sum(mine));
    }
    void optimizer_step(double lr, double grad_scale) override {
        opt_.step(model_.params.data(), model_.grads.data(), lr, grad_scale);
        share_.gather_in_place(model_.params.data());  // ZeRO-1: the other ranks' slices
    }
    std::vector<float> params() const override { return whole(model_.params); }
    void set_params(const std::vector<float>& p) override { model_.params = arena_.take_shard(p); }
    std::vector<float> adam_m() const override { return whole(stored(opt_.m())); }
    std::vector<float> adam_v() const override { return whole(stored(opt_.v())); }
    void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                  int64_t steps) override {
        const int64_t n = num_parameters();
        ZG_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n,
                 "optimizer state has the wrong size");
        opt_.m() = share_.take(arena_.take_shard(m));
        opt_.v() = share_.take(arena_.take_shard(v));
        opt_.set_steps_taken(steps);
    }
    void set_op_profiling(bool on) override { model_.set_op_profiling(on); }
    std::vector<std::pair<std::string, double>> take_op_times() override {
        return model_.take_op_times();
    }
    int64_t adam_steps() const override { return opt_.steps_taken(); }
    std::string describe() const override {
        return "CPU reference ops in fp32, " + std::to_string(omp_get_max_threads()) +
               " threads (the kernels: section applies to the GPU only)";
    }

  private:
    // A moment as this rank's stored arena from its ZeRO-1 share (collective under ZeRO-1).
    std::vector<float> stored(const std::vector<float>& mine) const {
        return share_.gather(mine.data(), model_.num_parameters());
    }
    // A whole-model arena from a stored one (collective over the vocab group when split).
    std::vector<float> whole(const std::vector<float>& stored) const {
        return arena_.gather(vocab_.group, stored.data());
    }
    // Up to the final LayerNorm, the token rows looked up across the group's shards of wte.
    void forward_split(const int32_t* inputs, int64_t B, int64_t T) {
        const int64_t C = model_.config().n_embd;
        token_rows_.resize(B * T * C);
        embed_.forward(*vocab_.group, inputs, B * T, C, model_.param(model_.layout().wte),
                       arena_.shard(), token_rows_.data());
        model_.forward_hidden(inputs, B, T, token_rows_.data());
    }
    CrossEntropySummary head(const int32_t* targets, int64_t N, const CrossEntropyOptions& opts,
                             double grad_output, bool grad) {
        const int lm = model_.layout().lm_head;
        return head_.run(*vocab_.group, model_.hidden(), targets, N, model_.config().n_embd,
                         model_.param(lm), model_.grad(lm), model_.config().vocab_size, opts,
                         {&grad_output, false}, grad ? dhidden_.data() : nullptr);
    }

    Config cfg_;
    VocabParallel vocab_;
    VocabShardedArena arena_;
    GPT<float> model_;
    Zero1Share share_;  // the AdamW moments this rank keeps (all of them without ZeRO-1)
    AdamW opt_;
    VocabParallelHead<float> head_;
    VocabParallelEmbedding<float> embed_;
    std::vector<float> dhidden_, token_rows_;
    std::vector<int32_t> ids_[2];  // a split's inputs and targets in shard order
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg, VocabParallel vocab,
                                          Communicator* zero1) {
    return std::make_unique<CpuBackend>(cfg, vocab, zero1);
}

#ifndef ZGPT_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const Config&, VocabParallel, Communicator*) {
    throw Error("this build has no CUDA backend");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& device, const Config& cfg,
                                      VocabParallel vocab, Communicator* zero1) {
    return device == "cuda" ? make_cuda_backend(cfg, vocab, zero1)
                            : make_cpu_backend(cfg, vocab, zero1);
}

namespace {
// model.init_jitter: every weight times 1 + jitter x N(0, 1) (zeros stay zero). The seed is mixed
// so that the draws are not the initialisation's own when the two seeds are equal; blocks of one
// counter stream in parallel, as init_gpt_weights draws.
std::vector<float> jittered(std::vector<float> p, const ModelConfig& m) {
    if (m.init_jitter == 0) return p;
    const uint64_t seed = uint64_t(m.init_jitter_seed) ^ 0x6a09e667f3bcc909ull;
    constexpr int64_t kBlock = int64_t(1) << 16;
    const int64_t n = int64_t(p.size()), blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        Rng rng(seed);
        rng.skip_normals(uint64_t(b * kBlock));
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); i++)
            p[size_t(i)] = float(double(p[size_t(i)]) * (1.0 + m.init_jitter * rng.normal()));
    }
    return p;
}
}  // namespace

std::vector<float> initial_params(const Config& cfg, const NormalFill& normals) {
    if (cfg.model.init_from.empty()) {  // without a GPT<float>, whose gradients would double
        const GptLayout layout = make_gpt_layout(cfg.model);  // the host memory of start-up
        std::vector<float> p(size_t(layout.table.total()));
        if (normals)
            init_gpt_weights(cfg.model, layout, p.data(), normals);
        else
            init_gpt_weights(cfg.model, layout, uint64_t(cfg.train.seed), p.data());
        return jittered(std::move(p), cfg.model);
    }
    GPT<float> m(cfg.model);
    m.init_weights(uint64_t(cfg.train.seed));
    if (!cfg.model.init_from.empty()) {
        try {
            import_hf_gpt2(m, cfg.model.init_from);
        } catch (const std::exception& e) {
            throw Error(std::string("model.init_from: ") + e.what());
        }
    }
    return jittered(std::move(m.params), cfg.model);
}

}  // namespace zgpt

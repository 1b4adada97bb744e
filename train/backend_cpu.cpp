#include <omp.h>

#include <chrono>

#include "kernels/check.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "train/backend.h"
#include "train/backend_init.h"
#include "train/optimizer.h"
#include "train/vocab_parallel_head.h"

namespace zgpt {

namespace {

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(const Config& cfg)
        : cfg_(cfg),
          model_(cfg.model),
          opt_(std::make_unique<AdamW>(model_.layout().table, cfg.optim)) {
        model_.params = initial_params(cfg);
    }
    std::string name() const override { return "cpu"; }
    const GptLayout& layout() const override { return model_.layout(); }
    int64_t num_parameters() const override { return model_.num_parameters(); }
    int64_t padded_vocab() const override { return model_.padded_vocab(); }

    CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets, int64_t B,
                                          int64_t T, const CrossEntropyOptions& opts,
                                          double grad_output) override {
        if (sharded()) {
            model_.forward_hidden(inputs, B, T);
            dhidden_.resize(B * T * model_.config().n_embd);
            const CrossEntropySummary s = head(targets, B * T, opts, grad_output, true);
            model_.backward_from_hidden(dhidden_.data());
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
        if (sharded()) {
            model_.forward_hidden(inputs, B, T);
            return head(targets, B * T, opts, one, false);
        }
        model_.forward(inputs, B, T);
        return model_.loss(targets, opts, {&one, false}, false);
    }
    void zero_grad() override { model_.zero_grad(); }
    void set_vocab_group(Communicator* group) override { group_ = group; }
    double all_reduce_grads(Communicator& comm) override {
        const auto t0 = std::chrono::steady_clock::now();
        comm.all_reduce_sum(model_.grads.data(), model_.num_parameters());
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
            .count();
    }
    double grad_norm() override {
        return global_grad_norm(model_.grads.data(), model_.num_parameters());
    }
    void shard_optimizer(Communicator& comm) override {
        zero_ = &comm;
        const ArenaSlice sl = arena_slice(model_.num_parameters(), comm.size(), comm.rank());
        opt_ = std::make_unique<AdamW>(model_.layout().table, cfg_.optim, sl.lo, sl.hi);
    }
    void optimizer_step(double lr, double grad_scale) override {
        opt_->step(model_.params.data(), model_.grads.data(), lr, grad_scale);
        if (zero_) model_.params = gather(model_.params.data() + opt_->lo());
    }
    std::vector<float> params() const override { return model_.params; }
    void set_params(const std::vector<float>& p) override { model_.params = p; }
    std::vector<float> adam_m() const override {
        return zero_ ? gather(opt_->m().data()) : opt_->m();
    }
    std::vector<float> adam_v() const override {
        return zero_ ? gather(opt_->v().data()) : opt_->v();
    }
    void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                  int64_t steps) override {
        const int64_t n = model_.num_parameters();
        ZG_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n,
                 "optimizer state has the wrong size");
        opt_->m().assign(m.begin() + opt_->lo(), m.begin() + opt_->hi());
        opt_->v().assign(v.begin() + opt_->lo(), v.begin() + opt_->hi());
        opt_->set_steps_taken(steps);
    }
    int64_t adam_steps() const override { return opt_->steps_taken(); }
    std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SampleOptions& so,
                                  Rng& rng) override {
        return zgpt::generate(model_, prompt, so, rng);
    }
    std::string describe() const override {
        return "CPU reference ops in fp32, " + std::to_string(omp_get_max_threads()) +
               " threads (the kernels: section applies to the GPU only)";
    }

  private:
    // The whole arena from every rank's ZeRO-1 slice, `mine` being this rank's. Collective.
    std::vector<float> gather(const float* mine) const {
        return all_gather_slices(*zero_, mine, model_.num_parameters());
    }
    bool sharded() const { return group_ && group_->size() > 1; }
    CrossEntropySummary head(const int32_t* targets, int64_t N, const CrossEntropyOptions& opts,
                             double grad_output, bool grad) {
        const int lm = model_.layout().lm_head;
        return head_.run(*group_, model_.hidden(), targets, N, model_.config().n_embd,
                         model_.param(lm), model_.grad(lm), model_.config().vocab_size, opts,
                         {&grad_output, false}, grad ? dhidden_.data() : nullptr);
    }

    Config cfg_;
    GPT<float> model_;
    std::unique_ptr<AdamW> opt_;
    Communicator* zero_ = nullptr;  // ZeRO-1: the ranks that share the optimizer state
    Communicator* group_ = nullptr;
    VocabParallelHead<float> head_;
    std::vector<float> dhidden_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg) {
    return std::make_unique<CpuBackend>(cfg);
}

#ifndef ZGPT_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const Config&) {
    throw Error("this build has no CUDA backend");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& device, const Config& cfg) {
    return device == "cuda" ? make_cuda_backend(cfg) : make_cpu_backend(cfg);
}

std::vector<float> initial_params(const Config& cfg) {
    GPT<float> m(cfg.model);
    m.init_weights(uint64_t(cfg.train.seed));
    if (!cfg.model.init_from.empty()) import_hf_gpt2(m, cfg.model.init_from);
    return std::move(m.params);
}

}  // namespace zgpt

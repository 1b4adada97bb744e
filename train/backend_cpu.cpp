#include <omp.h>

#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "train/backend.h"
#include "train/backend_init.h"
#include "train/optimizer.h"

namespace zgpt {

namespace {

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(const Config& cfg)
        : model_(cfg.model), opt_(model_.layout().table, cfg.optim) {
        model_.params = initial_params(cfg);
    }
    std::string name() const override { return "cpu"; }
    const GptLayout& layout() const override { return model_.layout(); }
    int64_t num_parameters() const override { return model_.num_parameters(); }
    int64_t padded_vocab() const override { return model_.padded_vocab(); }

    CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets, int64_t B,
                                          int64_t T, const CrossEntropyOptions& opts,
                                          double grad_output) override {
        model_.forward(inputs, B, T);
        const CrossEntropySummary s = model_.loss(targets, opts, {&grad_output, false}, true);
        model_.backward();
        return s;
    }
    CrossEntropySummary evaluate(const int32_t* inputs, const int32_t* targets, int64_t B,
                                 int64_t T, const CrossEntropyOptions& opts) override {
        const double one = 1.0;
        model_.forward(inputs, B, T);
        return model_.loss(targets, opts, {&one, false}, false);
    }
    void zero_grad() override { model_.zero_grad(); }
    double grad_norm() override {
        return global_grad_norm(model_.grads.data(), model_.num_parameters());
    }
    void optimizer_step(double lr, double grad_scale) override {
        opt_.step(model_.params.data(), model_.grads.data(), lr, grad_scale);
    }
    std::vector<float> params() const override { return model_.params; }
    void set_params(const std::vector<float>& p) override { model_.params = p; }
    std::vector<float> adam_m() const override { return opt_.m(); }
    std::vector<float> adam_v() const override { return opt_.v(); }
    void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                  int64_t steps) override {
        opt_.m() = m;
        opt_.v() = v;
        opt_.set_steps_taken(steps);
    }
    int64_t adam_steps() const override { return opt_.steps_taken(); }
    std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SampleOptions& so,
                                  Rng& rng) override {
        return zgpt::generate(model_, prompt, so, rng);
    }
    std::string describe() const override {
        return "CPU reference ops in fp32, " + std::to_string(omp_get_max_threads()) +
               " threads (the kernels: section applies to the GPU only)";
    }

  private:
    GPT<float> model_;
    mutable AdamW opt_;
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

// parity_inputs: what a run of `train` starts from and reads, for the PyTorch parity check
// (tools/dev/parity_torch.py): the initial weights, the parameter table and the first N steps'
// batches, exactly as the trainer makes them (initial_params, train_loader_options, one rank).
//   parity_inputs -c X.yaml [--set k=v ...] --steps N --out DIR
// DIR/run.json     the resolved config and the parameter table (name, shape, offset, decay)
// DIR/init.f32     the initial weight arena, float32, in table order
// DIR/batches.i32  int32 [N][grad_accum][2 (inputs, targets)][B][T]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "kernels/core/check.h"
#include "model/parameters.h"
#include "train/backends/backend_init.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

void write_raw(const std::string& path, const void* p, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(p), std::streamsize(bytes));
    ZG_CHECK(f.good(), "cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Dump a run's initial weights and first batches for the PyTorch parity check."};
    zgpt::report_cli_errors(app);
    std::string config_path, out;
    std::vector<std::string> overrides;
    int64_t steps = 20;
    app.add_option("-c,--config", config_path, "YAML config")->required()->check(CLI::ExistingFile);
    app.add_option("--set", overrides, "override a config key (as for train)");
    app.add_option("--steps", steps, "steps of batches to dump")->check(CLI::Range(1, 1000000));
    app.add_option("-o,--out", out, "output directory")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        zgpt::Config cfg = zgpt::load_config(config_path, overrides);
        zgpt::resolve_vocab_size(cfg);
        std::filesystem::create_directories(out);
        const zgpt::GptLayout layout = zgpt::make_gpt_layout(cfg.model);
        const std::vector<float> init = zgpt::initial_params(cfg);
        write_raw(out + "/init.f32", init.data(), init.size() * 4);

        zgpt::DataLoader loader(cfg.data.train, zgpt::train_loader_options(cfg, 0, 1));
        const int64_t B = cfg.train.batch_size, A = cfg.train.grad_accum;
        const int64_t T = zgpt::sequence_length(cfg);
        std::ofstream f(out + "/batches.i32", std::ios::binary);
        std::vector<int32_t> x(B * T), y(B * T);
        for (int64_t s = 0; s < steps * A; s++) {
            loader.next_batch(x.data(), y.data());
            f.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
            f.write(reinterpret_cast<const char*>(y.data()), std::streamsize(y.size() * 4));
        }
        ZG_CHECK(f.good(), "cannot write " + out + "/batches.i32");

        nlohmann::json table = nlohmann::json::array();
        // each tensor's initialisation (model/gpt.cpp), for a PyTorch run from its own weights
        const char* kInit[] = {"normal", "residual_normal", "zeros", "ones"};
        for (const zgpt::ParamSpec& p : layout.table.specs())
            table.push_back({{"name", p.name},
                             {"shape", p.shape},
                             {"offset", p.offset},
                             {"decay", p.decay},
                             {"init", kInit[int(p.init)]}});
        const zgpt::ModelConfig& m = cfg.model;
        const zgpt::OptimConfig& o = cfg.optim;
        nlohmann::json run{{"model",
                            {{"n_layer", m.n_layer},
                             {"n_head", m.n_head},
                             {"n_embd", m.n_embd},
                             {"block_size", m.block_size},
                             {"vocab_size", m.vocab_size},
                             {"padded_vocab", zgpt::padded_vocab_size(m.vocab_size)},
                             {"tie_embeddings", m.tie_embeddings},
                             {"bias", m.bias},
                             {"qk_norm", m.qk_norm},
                             {"ln_eps", m.ln_eps},
                             {"norm", m.norm},
                             {"position", m.position},
                             {"rope_theta", m.rope_theta},
                             {"mlp", m.mlp},
                             {"mlp_hidden", zgpt::mlp_hidden_size(m)},
                             {"n_kv_head", zgpt::kv_heads(m)},
                             {"init_std", m.init_std}}},
                           {"optim",
                            {{"lr", o.lr},
                             {"min_lr", o.min_lr},
                             {"warmup_steps", o.warmup_steps},
                             {"decay", o.decay},
                             {"decay_steps", o.decay_steps},
                             {"beta1", o.beta1},
                             {"beta2", o.beta2},
                             {"eps", o.eps},
                             // the coefficient of lr (independent decay folded in)
                             {"weight_decay", zgpt::decoupled_weight_decay(o)},
                             {"grad_clip", o.grad_clip}}},
                           {"loss",
                            {{"z_loss_weight", cfg.loss.z_loss_weight},
                             {"label_smoothing", cfg.loss.label_smoothing},
                             {"ignore_index", cfg.loss.ignore_index}}},
                           {"train",
                            {{"batch_size", B},
                             {"seq_len", T},
                             {"grad_accum", A},
                             {"max_steps", cfg.train.max_steps},
                             {"precision", cfg.train.precision},
                             {"steps_dumped", steps}}},
                           {"params", table},
                           {"num_parameters", layout.table.total()}};
        std::ofstream(out + "/run.json") << run.dump(1) << "\n";
        std::printf("%s: %lld parameters, %lld steps of %lld x %lld x %lld tokens\n", out.c_str(),
                    (long long)layout.table.total(), (long long)steps, (long long)A, (long long)B,
                    (long long)T);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

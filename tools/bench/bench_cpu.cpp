// Times training steps of the CPU reference trainer on random tokens: tokens/s and where the time
// goes (wall time per op family: forward, loss head, backward, grad norm, AdamW).
//
//   bench_cpu -c configs/shakespeare-char-cpu.yaml [--steps 20] [--from 5] [--out result.json]
//
// A step is what the trainer does on the CPU: zero_grad, forward + loss + backward per
// micro-batch, the global grad norm, clipping and AdamW. Steps --from..--steps are timed; the op
// table is their sum divided by the timed steps. The threads are train.threads (0: all cores).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "kernels/core/check.h"
#include "kernels/core/rng.h"
#include "kernels/gemm/cpu_blas.h"
#include "kernels/ops/global_norm.h"
#include "model/gpt.h"
#include "train/backends/backend_init.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace zgpt;

namespace {

struct Options {
    std::string config_path, out;
    std::vector<std::string> overrides;
    int steps = 20, from = 5;
};

// What the timed steps took: their wall time, and its part in each op family.
struct StepTimes {
    int64_t B = 0, T = 0, tokens_per_step = 0;
    int timed = 0;        // steps timed
    double total_ms = 0;  // their wall time
    double loss = 0;      // the last micro-batch's
    // each op family's ms over the timed steps, longest first
    std::vector<std::pair<std::string, double>> ops;

    double step_ms() const { return total_ms / timed; }
    double tokens_per_s() const { return double(tokens_per_step) / (step_ms() / 1e3); }
};

// ---- parse -------------------------------------------------------------------------------------

std::optional<Options> parse(int argc, char** argv, int& exit_code) {
    CLI::App app{"time CPU training steps on random tokens, op by op"};
    zgpt::report_cli_errors(app);
    Options o;
    app.add_option("-c,--config", o.config_path, "run config (YAML)")->required();
    app.add_option("--set", o.overrides, "section.key=value overrides");
    app.add_option("--steps", o.steps, "steps to run");
    app.add_option("--from", o.from, "first step that is timed (earlier ones warm up)");
    app.add_option("--out", o.out, "write the result as JSON here");
    if (const std::optional<int> code = zgpt::parse_cli(app, argc, argv)) {
        exit_code = *code;
        return std::nullopt;
    }
    return o;
}

// ---- cases -------------------------------------------------------------------------------------

// The run config with its overrides, the vocabulary resolved.
Config config_of(const Options& o) {
    Config cfg = load_config(o.config_path, o.overrides);
    resolve_vocab_size(cfg);
    ZG_CHECK(o.from >= 1 && o.from <= o.steps, "--from must be in [1, --steps]");
    return cfg;
}

// ---- run ---------------------------------------------------------------------------------------

StepTimes time_steps(const Config& cfg, const Options& o) {
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    StepTimes r;
    const int64_t B = r.B = cfg.train.batch_size;
    const int64_t T = r.T = zgpt::sequence_length(cfg);
    r.tokens_per_step = B * T * cfg.train.grad_accum;
    GPT<float> model(cfg.model);
    model.params = initial_params(cfg);
    AdamW opt(model.layout().table, cfg.optim);
    Rng rng(uint64_t(cfg.train.seed));
    std::vector<int32_t> x(B * T), y(B * T);
    CrossEntropyOptions ce;
    ce.reduction = Reduction::sum;
    ce.z_loss_weight = cfg.loss.z_loss_weight;
    ce.label_smoothing = cfg.loss.label_smoothing;
    ce.ignore_index = cfg.loss.ignore_index;
    using Clock = std::chrono::steady_clock;
    const auto ms = [](auto a, auto b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    double norm_ms = 0, adamw_ms = 0;
    for (int s = 1; s <= o.steps; s++) {
        const bool timed = s >= o.from;
        if (s == o.from) model.set_op_profiling(true);  // the model sums its ops from here
        const auto t0 = Clock::now();
        model.zero_grad();
        const double g = 1.0 / double(B * T * cfg.train.grad_accum);
        for (int a = 0; a < cfg.train.grad_accum; a++) {
            for (auto& t : x) t = int32_t(rng.uniform() * cfg.model.vocab_size);
            for (auto& t : y) t = int32_t(rng.uniform() * cfg.model.vocab_size);
            model.forward(x.data(), B, T);
            r.loss = model.loss(y.data(), ce, {&g, false}, true).sum_loss * g;
            model.backward();
        }
        const auto t1 = Clock::now();
        const double norm = global_grad_norm(model.grads.data(), model.num_parameters());
        const auto t2 = Clock::now();
        opt.step(model.params.data(), model.grads.data(), cfg.optim.lr,
                 cpu::clip_scale(norm, cfg.optim.grad_clip));
        const auto t3 = Clock::now();
        if (!timed) continue;
        norm_ms += ms(t1, t2);
        adamw_ms += ms(t2, t3);
        r.total_ms += ms(t0, t3);
    }
    r.ops = model.take_op_times();
    r.ops.emplace_back("grad norm", norm_ms);
    r.ops.emplace_back("adamw", adamw_ms);
    r.timed = o.steps - o.from + 1;
    std::sort(r.ops.begin(), r.ops.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    return r;
}

void print_table(const StepTimes& r) {
    std::printf(
        "%d threads, B=%lld T=%lld, %d timed steps: %.2f ms/step, %.0f tokens/s (loss "
        "%.4f)\n",
        omp_get_max_threads(), (long long)r.B, (long long)r.T, r.timed, r.step_ms(),
        r.tokens_per_s(), r.loss);
    std::printf("%s\n", cpu::cpu_blas_summary().c_str());
    std::printf("%-18s %10s %7s\n", "op", "ms/step", "share");
    double listed = 0;
    for (const auto& [name, ms] : r.ops) {
        std::printf("%-18s %10.3f %6.1f%%\n", name.c_str(), ms / r.timed, 100.0 * ms / r.total_ms);
        listed += ms;
    }
    std::printf("%-18s %10.3f %6.1f%%\n", "(other)", (r.total_ms - listed) / r.timed,
                100.0 * (r.total_ms - listed) / r.total_ms);
}

void write_json(const StepTimes& r, const Options& o) {
    nlohmann::json jops = nlohmann::json::array();
    for (const auto& [name, ms] : r.ops)
        jops.push_back({{"op", name}, {"ms_per_step", ms / r.timed}});
    nlohmann::json j{{"config", o.config_path},
                     {"overrides", o.overrides},
                     {"threads", omp_get_max_threads()},
                     {"batch_size", r.B},
                     {"seq_len", r.T},
                     {"timed_steps", r.timed},
                     {"step_ms", r.step_ms()},
                     {"tok_per_s", r.tokens_per_s()},
                     {"cpu_isa", cpu::isa_name(cpu::cpu_vector_isa())},
                     {"blas_kernel", cpu::blas_info().kernel},
                     {"blas", cpu::cpu_blas_summary()},
                     {"ops", jops}};
    std::ofstream(o.out) << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
    cpu::ensure_blas_kernel(argv);  // first: it may restart the program
    int code = 0;
    const std::optional<Options> opt = parse(argc, argv, code);
    if (!opt) return code;
    try {
        const Config cfg = config_of(*opt);
        const StepTimes r = time_steps(cfg, *opt);
        print_table(r);
        if (!opt->out.empty()) write_json(r, *opt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

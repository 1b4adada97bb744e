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

int main(int argc, char** argv) {
    cpu::ensure_blas_kernel(argv);  // first: it may restart the program
    CLI::App app{"time CPU training steps on random tokens, op by op"};
    zgpt::report_cli_errors(app);
    std::string config_path, out;
    std::vector<std::string> overrides;
    int steps = 20, from = 5;
    app.add_option("-c,--config", config_path, "run config (YAML)")->required();
    app.add_option("--set", overrides, "section.key=value overrides");
    app.add_option("--steps", steps, "steps to run");
    app.add_option("--from", from, "first step that is timed (earlier ones warm up)");
    app.add_option("--out", out, "write the result as JSON here");
    CLI11_PARSE(app, argc, argv);
    try {
        Config cfg = load_config(config_path, overrides);
        resolve_vocab_size(cfg);
        ZG_CHECK(from >= 1 && from <= steps, "--from must be in [1, --steps]");
        if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
        const int64_t B = cfg.train.batch_size;
        const int64_t T = cfg.train.seq_len > 0 ? cfg.train.seq_len : cfg.model.block_size;
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
        double total_ms = 0, norm_ms = 0, adamw_ms = 0, loss = 0;
        for (int s = 1; s <= steps; s++) {
            const bool timed = s >= from;
            if (s == from) model.set_op_profiling(true);  // the model sums its ops from here
            const auto t0 = Clock::now();
            model.zero_grad();
            const double g = 1.0 / double(B * T * cfg.train.grad_accum);
            for (int a = 0; a < cfg.train.grad_accum; a++) {
                for (auto& t : x) t = int32_t(rng.uniform() * cfg.model.vocab_size);
                for (auto& t : y) t = int32_t(rng.uniform() * cfg.model.vocab_size);
                model.forward(x.data(), B, T);
                loss = model.loss(y.data(), ce, {&g, false}, true).sum_loss * g;
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
            total_ms += ms(t0, t3);
        }
        std::vector<std::pair<std::string, double>> ops = model.take_op_times();
        ops.emplace_back("grad norm", norm_ms);
        ops.emplace_back("adamw", adamw_ms);
        const int timed = steps - from + 1;
        const double step_ms = total_ms / timed;
        const double tok_s = double(B * T * cfg.train.grad_accum) / (step_ms / 1e3);
        std::sort(ops.begin(), ops.end(),
                  [](const auto& a, const auto& b) { return a.second > b.second; });
        std::printf(
            "%d threads, B=%lld T=%lld, %d timed steps: %.2f ms/step, %.0f tokens/s (loss "
            "%.4f)\n",
            omp_get_max_threads(), (long long)B, (long long)T, timed, step_ms, tok_s, loss);
        std::printf("%s\n", cpu::cpu_blas_summary().c_str());
        std::printf("%-18s %10s %7s\n", "op", "ms/step", "share");
        double listed = 0;
        nlohmann::json jops = nlohmann::json::array();
        for (const auto& [name, ms] : ops) {
            std::printf("%-18s %10.3f %6.1f%%\n", name.c_str(), ms / timed, 100.0 * ms / total_ms);
            listed += ms;
            jops.push_back({{"op", name}, {"ms_per_step", ms / timed}});
        }
        std::printf("%-18s %10.3f %6.1f%%\n", "(other)", (total_ms - listed) / timed,
                    100.0 * (total_ms - listed) / total_ms);
        if (!out.empty()) {
            nlohmann::json j{{"config", config_path},
                             {"overrides", overrides},
                             {"threads", omp_get_max_threads()},
                             {"batch_size", B},
                             {"seq_len", T},
                             {"timed_steps", timed},
                             {"step_ms", step_ms},
                             {"tok_per_s", tok_s},
                             {"cpu_isa", cpu::isa_name(cpu::cpu_vector_isa())},
                             {"blas_kernel", cpu::blas_info().kernel},
                             {"blas", cpu::cpu_blas_summary()},
                             {"ops", jops}};
            std::ofstream(out) << j.dump(2) << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

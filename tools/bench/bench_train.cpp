// Times training steps of the CUDA trainer on random tokens (or a token shard's, --data): tokens/s,
// MFU, device memory and the loss head's share of the step (CUDA events around the LM-head matmuls
// and the cross-entropy).
//
//   bench_train -c configs/gpt2-124m.yaml [--set kernels.cross_entropy=fused_linear]
//               [--steps 40] [--from 10] [--data train_000000.bin] [--out result.json]
//               [--timeline 3] [--ops]
//
// A step is what the trainer does: zero_grad, forward + loss + backward per micro-batch (the
// trainer's call, GptCuda::forward_loss_backward), the global grad norm, clipping and AdamW,
// then a device sync. Steps --from..--steps are averaged,
// and the board's power and SM clock are sampled over them (NVML; kernels/core/gpu_power.h): at the
// power limit a step's time is its energy over that limit.
//
// --timeline N runs N more steps with CUPTI recording every kernel, copy, memset and runtime call
// (tools/bench/gpu_timeline.h): how long the GPU was busy in each, how long it sat idle between its
// first and last kernel (what launches, host synchronisations and a CUDA graph are about), the
// longest of those gaps with their neighbours and the host's runtime call during them, and the
// kernels that took the time. Recording starts before those steps, with a synchronised no-op so
// that CUPTI's own start-up is not in them. --ops then runs its two steps after those.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/shard.h"
#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/core/gpu_power.h"
#include "kernels/core/registry.h"
#include "kernels/gemm/matmul.h"
#include "kernels/ops/global_norm.h"
#include "model/gpt_cuda.h"
#include "tools/bench/gpu_timeline.h"
#include "train/backends/backend_init.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/device.h"
#include "train/trainer.h"

using namespace zgpt;

namespace {
// Prints the recorded steps' timeline (means over the steps; the longest gaps of any step, the
// kernels of the first) and returns it as JSON.
nlohmann::json report_timeline(const GpuTimeline& tl, const std::vector<TimelineSummary>& r,
                               const std::vector<double>& wall_ms) {
    if (!tl.unavailable().empty() || r.empty()) {
        std::printf("timeline not recorded: %s\n",
                    tl.unavailable().empty() ? "no steps" : tl.unavailable().c_str());
        return {{"unavailable", tl.unavailable()}};
    }
    double span = 0, busy = 0, idle = 0, wall = 0, kernels = 0, over5 = 0, dropped = 0, api = 0;
    std::vector<std::pair<int, TimelineGap>> gaps;  // (step, gap)
    for (size_t i = 0; i < r.size(); i++) {
        span += r[i].span_ms;
        busy += r[i].busy_ms;
        idle += r[i].idle_ms;
        wall += wall_ms[i];
        kernels += double(r[i].kernels + r[i].copies + r[i].memsets);
        over5 += double(r[i].gaps_over_5us);
        dropped = double(r[i].dropped);  // CUPTI's count for the whole recording
        api += r[i].api_ms;
        for (const TimelineGap& g : r[i].largest_gaps) gaps.emplace_back(int(i), g);
    }
    const double n = double(r.size());
    std::stable_sort(gaps.begin(), gaps.end(),
                     [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    if (gaps.size() > 8) gaps.resize(8);
    std::printf(
        "GPU timeline (CUPTI), means of %d steps: wall %.2f ms (host clock, from the first "
        "launch to the final sync), GPU busy %.2f ms, first to last activity %.2f ms, idle "
        "inside that %.3f ms (%.2f%%) in %.0f gaps over 5 us; %.0f kernels, copies and "
        "memsets a step; the host %.2f ms inside CUDA runtime calls%s\n",
        int(r.size()), wall / n, busy / n, span / n, idle / n, 100 * idle / span, over5 / n,
        kernels / n, api / n, dropped > 0 ? " (CUPTI dropped records: the figures are low)" : "");
    nlohmann::json steps_detail = nlohmann::json::array();
    for (size_t i = 0; i < r.size(); i++) {
        std::printf("  step %zu: wall %.2f, busy %.2f, first to last activity %.2f, idle %.3f ms\n",
                    i + 1, wall_ms[i], r[i].busy_ms, r[i].span_ms, r[i].idle_ms);
        steps_detail.push_back({{"wall_ms", wall_ms[i]},
                                {"busy_ms", r[i].busy_ms},
                                {"span_ms", r[i].span_ms},
                                {"idle_ms", r[i].idle_ms},
                                {"host_runtime_call_ms", r[i].api_ms}});
    }
    nlohmann::json jg = nlohmann::json::array();
    for (const auto& [step, g] : gaps) {
        std::printf(
            "  idle %8.1f us at %7.2f ms of step %d: after %s, before %s; the host in %s "
            "for %.1f us of it\n",
            g.us, g.at_ms, step + 1, g.before.c_str(), g.after.c_str(),
            g.host_call.empty() ? "no runtime call" : g.host_call.c_str(), g.host_call_us);
        jg.push_back({{"us", g.us},
                      {"at_ms", g.at_ms},
                      {"step", step + 1},
                      {"before", g.before},
                      {"after", g.after},
                      {"host_call", g.host_call},
                      {"host_call_us", g.host_call_us}});
    }
    nlohmann::json jk = nlohmann::json::array();
    std::printf("  kernels with the most time in the first recorded step (ms, calls):\n");
    for (const TimelineKernel& k : r.front().top_kernels) {
        std::printf("  %9.3f %5lld  %s\n", k.total_ms, (long long)k.calls, k.name.c_str());
        jk.push_back({{"name", k.name}, {"calls", k.calls}, {"ms", k.total_ms}});
    }
    nlohmann::json j;
    j["steps"] = r.size();
    j["wall_ms"] = wall / n;
    j["busy_ms"] = busy / n;
    j["span_ms"] = span / n;
    j["idle_ms"] = idle / n;
    j["idle_share"] = idle / span;
    j["gaps_over_5us"] = over5 / n;
    j["activities_per_step"] = kernels / n;
    j["host_runtime_call_ms"] = api / n;
    j["dropped_records"] = dropped;
    j["steps_detail"] = steps_detail;
    j["largest_gaps"] = jg;
    j["top_kernels_first_step"] = jk;
    return j;
}
}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"time CUDA training steps on random tokens"};
    zgpt::report_cli_errors(app);
    std::string config_path, out;
    std::vector<std::string> overrides;
    int steps = 40, from = 10;
    app.add_option("-c,--config", config_path, "run config (YAML)")->required();
    app.add_option("--set", overrides, "section.key=value overrides");
    app.add_option("--steps", steps, "steps to run");
    app.add_option("--from", from, "first step that is timed (earlier ones warm up)");
    app.add_option("--out", out, "write the result as JSON here");
    bool ops = false;
    int head_chunks = CudaModelOptions{}.head_chunks;
    app.add_option("--head-chunks", head_chunks,
                   "row chunks of the pipelined loss head (1: in one piece)");
    app.add_flag("--ops", ops, "time each op family (an event after every op) in one extra step");
    bool separate_calls = false;
    app.add_flag("--separate-calls", separate_calls,
                 "forward, loss and backward as three calls, the host waiting for the loss before "
                 "it queues the backward pass, and the gradient norm read by the host before the "
                 "update (the schedule before forward_loss_backward and the clip on the GPU), to "
                 "compare");
    int timeline_steps = 0;
    app.add_option("--timeline", timeline_steps,
                   "record N extra steps' kernels with CUPTI: busy and idle time, the longest "
                   "idle gaps, the kernels with the most time")
        ->check(CLI::Range(0, 100));
    std::string data;
    app.add_option("--data", data,
                   "a token shard (prepare_data's .bin): consecutive windows of its text instead "
                   "of random tokens (real text repeats tokens, which random tokens do not); after "
                   "its last token it starts again from its first")
        ->check(CLI::ExistingFile);
    CLI11_PARSE(app, argc, argv);
    try {
        // start-up phases, printed before the first step: the weights' initialisation on the
        // host, the model's device allocation and copy, and the first step (cuBLASLt's
        // heuristics and kernels.matmul_search's timing of each GEMM shape happen there)
        const auto started = std::chrono::steady_clock::now();
        auto seconds_since = [](std::chrono::steady_clock::time_point t) {
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        };
        Config cfg = load_config(config_path, overrides);
        resolve_vocab_size(cfg);  // 0: from tokenizer.json beside data.train, as train does
        ZG_CHECK(from >= 1 && from <= steps, "--from must be in [1, --steps]");
        const cuda::DeviceInfo dev = cuda::query_devices();
        ZG_CHECK(dev.count > 0, "no CUDA device: " + dev.error);
        CudaModelOptions mo;
        mo.precision = cfg.train.precision == "fp32" ? DType::f32 : DType::bf16;
        mo.kernels = cfg.kernels;
        mo.recompute_gelu = cfg.train.recompute_gelu;
        mo.fp32_residual = cfg.train.fp32_residual;
        mo.head_chunks = head_chunks;
        // the trainer's count, printed before it allocates (train/backends/backend_cuda.cpp); the
        // summary's memory is what the model then holds (plus the moments)
        const int64_t B = cfg.train.batch_size;
        const int64_t T = cfg.train.seq_len > 0 ? cfg.train.seq_len : cfg.model.block_size;
        const double estimate_gb = double(GptCuda::device_bytes_needed(cfg.model, mo, B, T)) / 1e9;
        auto phase = std::chrono::steady_clock::now();
        const std::vector<float> init = initial_params(cfg);
        const double init_s = seconds_since(phase);
        phase = std::chrono::steady_clock::now();
        GptCuda model(cfg.model, mo);
        model.set_params(init.data());
        model.set_profiling(true);
        const int64_t n = model.num_parameters();
        float *m = nullptr, *v = nullptr;
        ZG_CUDA_CHECK(cudaMalloc(&m, n * 4));
        ZG_CUDA_CHECK(cudaMalloc(&v, n * 4));
        ZG_CUDA_CHECK(cudaMemset(m, 0, n * 4));
        ZG_CUDA_CHECK(cudaMemset(v, 0, n * 4));
        const int64_t tokens_per_step = B * T * cfg.train.grad_accum;
        CrossEntropyOptions o;
        o.z_loss_weight = cfg.loss.z_loss_weight;
        o.reduction = Reduction::sum;
        ZG_CUDA_CHECK(cudaDeviceSynchronize());
        const double model_s = seconds_since(phase);
        double first_step_s = 0;
        Rng rng(uint64_t(cfg.train.seed));
        // one row of B * T + 1 tokens per micro-batch
        std::vector<int32_t> x(size_t(cfg.train.grad_accum) * size_t(B * T + 1));
        std::optional<TokenShard> shard;
        int64_t shard_pos = 0;
        if (!data.empty()) {
            shard.emplace(data);
            shard->check_vocab(cfg.model.vocab_size);
            ZG_CHECK(shard->size() > 0, data + ": no tokens");
        }
        std::vector<double> step_ms, head_ms;
        double loss = 0;
        nlohmann::json op_table = nlohmann::json::array();
        // --timeline: N extra steps, recorded together and summarised one by one (so the host's
        // work between steps is not counted as idle); --ops: two more, not in the averages, the op
        // table from the second (the first leaves the pipelined schedule for the one-stream one)
        const int timeline_end = steps + timeline_steps;
        const int last = timeline_end + (ops ? 2 : 0);
        std::optional<GpuTimeline> timeline;
        if (timeline_steps > 0) timeline.emplace();
        std::vector<TimelineSummary> recorded;
        std::vector<double> recorded_wall_ms;
        cuda::PowerSampler power;
        cuda::PowerSummary board;
        for (int step = 1; step <= last; step++) {
            const bool op_step = step > timeline_end;
            const bool timeline_step = step > steps && !op_step;
            model.set_op_profiling(op_step);
            // The tokens are drawn before the clock starts: they stand for a data loader that
            // prepares the next batch while the GPU works (drawing 65,537 of them takes ~0.2 ms).
            if (shard) {
                for (auto& t : x) t = int32_t((*shard)[shard_pos++ % shard->size()]);
            } else {
                for (auto& t : x) t = int32_t(rng.below(uint64_t(cfg.model.vocab_size)));
            }
            ZG_CUDA_CHECK(cudaDeviceSynchronize());
            if (step == from) power.start();
            if (timeline_step && step == steps + 1) timeline->start();
            if (timeline_step) timeline->mark();
            const auto t0 = std::chrono::steady_clock::now();
            model.zero_grad();
            double head = 0;
            // The trainer's micro-batch call; the head's events are read once the step is done
            // (head_ms() waits for the stream), or after each micro-batch when there are several
            // (each records them again), which leaves that wait in the step.
            const bool accumulating = cfg.train.grad_accum > 1;
            for (int a = 0; a < cfg.train.grad_accum; a++) {
                const int32_t* xa = x.data() + size_t(a) * size_t(B * T + 1);
                const double go = 1.0 / double(tokens_per_step);
                CrossEntropySummary s;
                if (separate_calls) {
                    model.forward(xa, B, T);
                    s = model.loss(xa + 1, o, go, true);
                    model.backward();
                } else {
                    s = model.forward_loss_backward(xa, xa + 1, B, T, o, go);
                }
                if (accumulating) head += model.head_ms();
                loss = s.sum_loss / double(s.n_valid);
            }
            if (separate_calls) {  // the old schedule: the host reads the norm, then updates
                const double norm = model.grad_norm();
                model.adamw_step(cfg.optim.lr, cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps,
                                 cfg.optim.weight_decay, step,
                                 cpu::clip_scale(norm, cfg.optim.grad_clip), m, v);
            } else {  // the trainer's: the clip factor taken on the GPU
                model.clip_and_adamw_step_range(cfg.optim.lr, cfg.optim.beta1, cfg.optim.beta2,
                                                cfg.optim.eps, cfg.optim.weight_decay, step,
                                                cfg.optim.grad_clip, m, v, 0,
                                                model.num_parameters());
            }
            ZG_CUDA_CHECK(cudaDeviceSynchronize());
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
            if (!accumulating) head = model.head_ms();
            if (step == steps) board = power.stop();
            if (step == 1) {
                first_step_s = ms / 1e3;
                std::printf(
                    "start-up: %.1f s to the end of the first step (weights initialised on the "
                    "host %.1f s, the model on the device %.1f s, first step %.1f s)\n",
                    seconds_since(started), init_s, model_s, first_step_s);
            }
            if (timeline_step) {
                recorded_wall_ms.push_back(ms);
                if (step == timeline_end) recorded = timeline->stop(8, 25);
                continue;
            }
            if (op_step) {
                auto t2 = model.take_op_times();
                if (step < last) continue;
                std::sort(t2.begin(), t2.end(),
                          [](const auto& a2, const auto& b2) { return a2.second > b2.second; });
                double total = 0;
                for (const auto& [name, v2] : t2) total += v2;
                std::printf("per-op GPU time in one step (%.2f ms of ops, %.2f ms wall):\n", total,
                            ms);
                for (const auto& [name, v2] : t2) {
                    std::printf("  %-28s %8.2f ms %5.1f%%\n", name.c_str(), v2, 100 * v2 / total);
                    op_table.push_back({{"op", name}, {"ms", v2}});
                }
                continue;
            }
            if (step >= from) {
                step_ms.push_back(ms);
                head_ms.push_back(head);
            }
            std::printf("step %d: %.2f ms, loss %.4f, head %.2f ms\n", step, ms, loss, head);
        }
        auto mean = [](const std::vector<double>& a) {
            double s = 0;
            for (double x2 : a) s += x2;
            return s / double(a.size());
        };
        const double ms = mean(step_ms), hms = mean(head_ms);
        const double tok_s = double(tokens_per_step) / (ms / 1e3);
        const double peak = peak_flops(dev.name, mo.precision == DType::bf16);
        const double mfu = peak > 0 ? training_flops_per_token(cfg.model, T) * tok_s / peak : 0;
        size_t free_b = 0, total_b = 0;
        ZG_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const double model_gb = (double(model.allocated_bytes()) + 8.0 * double(n)) / 1e9;
        const double head_mem_gb =
            (is_linear_cross_entropy(cfg.kernels.cross_entropy)
                 ? 0.0
                 : double(B * T) * double(model.padded_vocab()) * dtype_bytes(mo.precision)) /
            1e9;
        const nlohmann::json timeline_json =
            timeline ? report_timeline(*timeline, recorded, recorded_wall_ms) : nlohmann::json();
        // before the summary, which stays the last line
        if (board.samples > 0)
            std::printf(
                "board power %.0f W (limit %.0f W), SM clock %.0f MHz: means of %d samples "
                "over the timed steps\n",
                board.power_w, board.limit_w, board.sm_clock_mhz, board.samples);
        else
            std::printf("board power not sampled: %s\n", power.unavailable().empty()
                                                             ? "the timed steps were too short"
                                                             : power.unavailable().c_str());
        std::printf(
            "%s | %s | B=%lld T=%lld V=%d | step %.2f ms | %.0f tok/s | MFU %.1f%% | head %.2f ms "
            "(%.1f%%) | memory %.2f GB (device used %.2f GB; logits %.2f GB)\n",
            dev.name.c_str(), cfg.kernels.cross_entropy.c_str(), (long long)B, (long long)T,
            cfg.model.vocab_size, ms, tok_s, 100 * mfu, hms, 100 * hms / ms, model_gb,
            double(total_b - free_b) / 1e9, head_mem_gb);
        if (!out.empty()) {
            nlohmann::json j{{"gpu", dev.name},
                             {"config", config_path},
                             {"overrides", overrides},
                             {"data", data.empty() ? "random tokens" : data},
                             {"batch", B},
                             {"seq_len", T},
                             {"vocab_size", cfg.model.vocab_size},
                             {"precision", cfg.train.precision},
                             {"kernels",
                              {{"attention", cfg.kernels.attention},
                               {"cross_entropy", cfg.kernels.cross_entropy},
                               {"layernorm", cfg.kernels.layernorm},
                               {"matmul", cfg.kernels.matmul}}},
                             {"kernel_tuning", kernel_tuning_json(cfg)},
                             {"recompute_gelu", cfg.train.recompute_gelu},
                             {"fp32_residual", cfg.train.fp32_residual},
                             {"head_chunks", head_chunks},
                             {"steps_timed", step_ms.size()},
                             {"step_ms", ms},
                             {"step_ms_min", *std::min_element(step_ms.begin(), step_ms.end())},
                             {"tok_per_s", tok_s},
                             {"mfu", mfu},
                             {"head_ms", hms},
                             {"head_share", hms / ms},
                             {"model_memory_gb", model_gb},
                             {"model_memory_counted_before_gb", estimate_gb + 8e-9 * double(n)},
                             {"device_used_gb", double(total_b - free_b) / 1e9},
                             {"logits_gb", head_mem_gb},
                             {"final_loss", loss},
                             {"startup_s",
                              {{"init_weights", init_s},
                               {"model_to_device", model_s},
                               {"first_step", first_step_s}}},
                             {"power_samples", board.samples},
                             {"power_w", board.power_w},
                             {"power_limit_w", board.limit_w},
                             {"sm_clock_mhz", board.sm_clock_mhz},
                             {"ops", op_table},
                             {"timeline", timeline_json},
                             // kernels.matmul_search's picks (gemm_choices' text): which
                             // candidate each GEMM shape ran, to tell runs apart
                             {"gemm_choices", cuda::gemm_choices()}};
            std::ofstream(out) << j.dump(2) << "\n";
        }
        cudaFree(m);
        cudaFree(v);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_train: %s\n", e.what());
        return 1;
    }
    return 0;
}

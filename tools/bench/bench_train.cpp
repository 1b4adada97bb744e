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
// (kernels/core/gpu_timeline.h): how long the GPU was busy in each, how long it sat idle between
// its first and last kernel (what launches, host synchronisations and a CUDA graph are about), the
// longest of those gaps with their neighbours and the host's runtime call during them, and the
// kernels that took the time. Recording starts before those steps, with a synchronised no-op so
// that CUPTI's own start-up is not in them. --ops then runs its two steps after those.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/shard.h"
#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/core/gpu_power.h"
#include "kernels/core/gpu_timeline.h"
#include "kernels/core/registry.h"
#include "kernels/gemm/matmul.h"
#include "kernels/ops/global_norm.h"
#include "model/gpt_cuda.h"
#include "train/backends/backend_init.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/device.h"
#include "train/trainer.h"

using namespace zgpt;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
    std::string config_path, out, data;
    std::vector<std::string> overrides;
    int steps = 40, from = 10, timeline_steps = 0;
    bool ops = false, separate_calls = false;
};

// Which steps do what: 1..--steps train (from --from on they are averaged); --timeline: N extra
// steps, recorded together and summarised one by one (so the host's work between steps is not
// counted as idle); --ops: two more, not in the averages, the op table from the second (the first
// leaves the pipelined schedule for the one-stream one).
struct Schedule {
    int steps = 0, timeline_end = 0, last = 0;
    bool op_step(int step) const { return step > timeline_end; }
    bool timeline_step(int step) const { return step > steps && !op_step(step); }
};

// The model on the device and its AdamW moments.
struct Model {
    GptCuda gpt;
    float *m = nullptr, *v = nullptr;
    Model(const Config& cfg, const CudaModelOptions& mo, const std::vector<float>& init)
        : gpt(cfg.model, mo) {
        gpt.set_params(init.data());
        gpt.set_profiling(true);
        const int64_t n = gpt.num_parameters();
        ZG_CUDA_CHECK(cudaMalloc(&m, n * 4));
        ZG_CUDA_CHECK(cudaMalloc(&v, n * 4));
        ZG_CUDA_CHECK(cudaMemset(m, 0, n * 4));
        ZG_CUDA_CHECK(cudaMemset(v, 0, n * 4));
    }
    ~Model() {
        cudaFree(m);
        cudaFree(v);
    }
};

// The steps' tokens: random, or consecutive windows of --data's shard (after its last token it
// starts again from its first).
class Tokens {
  public:
    Tokens(const Options& o, const Config& cfg)
        : rng_(uint64_t(cfg.train.seed)), vocab_(uint64_t(cfg.model.vocab_size)) {
        if (o.data.empty()) return;
        shard_.emplace(o.data);
        shard_->check_vocab(cfg.model.vocab_size);
        ZG_CHECK(shard_->size() > 0, o.data + ": no tokens");
    }
    void fill(std::vector<int32_t>& x) {
        if (shard_) {
            for (auto& t : x) t = int32_t((*shard_)[pos_++ % shard_->size()]);
        } else {
            for (auto& t : x) t = int32_t(rng_.below(vocab_));
        }
    }

  private:
    Rng rng_;
    uint64_t vocab_;
    std::optional<TokenShard> shard_;
    int64_t pos_ = 0;
};

// What the steps share, and what they record.
struct Bench {
    Options opt;
    Config cfg;
    CudaModelOptions mo;
    CrossEntropyOptions ce;
    double estimate_gb = 0;  // the model's device memory as counted before it allocates
    double init_s = 0, model_s = 0, first_step_s = 0;  // start-up phases
    std::vector<double> step_ms, head_ms;              // the averaged steps'
    double loss = 0;                                   // the last micro-batch's
    nlohmann::json op_table = nlohmann::json::array();
    std::optional<GpuTimeline> timeline;
    std::vector<TimelineSummary> recorded;
    std::vector<double> recorded_wall_ms;
    std::optional<cuda::PowerSampler> power;
    cuda::PowerSummary board;

    int64_t B() const { return cfg.train.batch_size; }
    int64_t T() const { return zgpt::sequence_length(cfg); }
    int64_t tokens_per_step() const { return B() * T() * cfg.train.grad_accum; }
};

// The timed steps' means, and the memory they ran in.
struct Summary {
    double ms = 0, head_ms = 0, tok_s = 0, mfu = 0;
    double model_gb = 0, device_used_gb = 0, logits_gb = 0;
};

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- parse -------------------------------------------------------------------------------------

std::optional<Options> parse(int argc, char** argv, int& exit_code) {
    CLI::App app{"time CUDA training steps on random tokens"};
    zgpt::report_cli_errors(app);
    Options o;
    app.add_option("-c,--config", o.config_path, "run config (YAML)")->required();
    app.add_option("--set", o.overrides, "section.key=value overrides");
    app.add_option("--steps", o.steps, "steps to run");
    app.add_option("--from", o.from, "first step that is timed (earlier ones warm up)");
    app.add_option("--out", o.out, "write the result as JSON here");
    app.add_flag("--ops", o.ops, "time each op family (an event after every op) in one extra step");
    app.add_flag("--separate-calls", o.separate_calls,
                 "forward, loss and backward as three calls, the host waiting for the loss before "
                 "it queues the backward pass, and the gradient norm read by the host before the "
                 "update (the schedule before forward_loss_backward and the clip on the GPU), to "
                 "compare");
    app.add_option("--timeline", o.timeline_steps,
                   "record N extra steps' kernels with CUPTI: busy and idle time, the longest "
                   "idle gaps, the kernels with the most time")
        ->check(CLI::Range(0, 100));
    app.add_option("--data", o.data,
                   "a token shard (prepare_data's .bin): consecutive windows of its text instead "
                   "of random tokens (real text repeats tokens, which random tokens do not); after "
                   "its last token it starts again from its first")
        ->check(CLI::ExistingFile);
    if (const std::optional<int> code = zgpt::parse_cli(app, argc, argv)) {
        exit_code = *code;
        return std::nullopt;
    }
    return o;
}

// ---- cases -------------------------------------------------------------------------------------

Config config_of(const Options& o) {
    Config cfg = load_config(o.config_path, o.overrides);
    resolve_vocab_size(cfg);  // 0: from tokenizer.json beside data.train, as train does
    ZG_CHECK(o.from >= 1 && o.from <= o.steps, "--from must be in [1, --steps]");
    return cfg;
}

CrossEntropyOptions loss_options(const Config& cfg) {
    CrossEntropyOptions o;
    o.z_loss_weight = cfg.loss.z_loss_weight;
    o.reduction = Reduction::sum;
    return o;
}

Schedule schedule_of(const Options& o) {
    Schedule s;
    s.steps = o.steps;
    s.timeline_end = o.steps + o.timeline_steps;
    s.last = s.timeline_end + (o.ops ? 2 : 0);
    return s;
}

// ---- run ---------------------------------------------------------------------------------------

// The weights initialised (their normal values drawn on the GPU, as the trainer does), then the
// model on the device, each phase timed into b.
std::unique_ptr<Model> start_model(Bench& b) {
    // the trainer's count, printed before it allocates (train/backends/backend_cuda.cpp); the
    // summary's memory is what the model then holds (plus the moments)
    b.estimate_gb = double(GptCuda::device_bytes_needed(b.cfg.model, b.mo, b.B(), b.T())) / 1e9;
    auto phase = Clock::now();
    const std::vector<float> init = initial_params_on_gpu(b.cfg);
    b.init_s = seconds_since(phase);
    phase = Clock::now();
    auto model = std::make_unique<Model>(b.cfg, b.mo, init);
    ZG_CUDA_CHECK(cudaDeviceSynchronize());
    b.model_s = seconds_since(phase);
    return model;
}

// One step as the trainer runs it (or as it did, --separate-calls), through its final sync: its
// wall time (ms) and the loss head's (ms); the loss goes into b.
std::pair<double, double> train_step(Bench& b, Model& model, const std::vector<int32_t>& x,
                                     int step) {
    const Config& cfg = b.cfg;
    const int64_t B = b.B(), T = b.T();
    GptCuda& gpt = model.gpt;
    const auto t0 = Clock::now();
    gpt.zero_grad();
    double head = 0;
    // The trainer's micro-batch call; the head's events are read once the step is done
    // (head_ms() waits for the stream), or after each micro-batch when there are several
    // (each records them again), which leaves that wait in the step.
    const bool accumulating = cfg.train.grad_accum > 1;
    for (int a = 0; a < cfg.train.grad_accum; a++) {
        const int32_t* xa = x.data() + size_t(a) * size_t(B * T + 1);
        const double go = 1.0 / double(b.tokens_per_step());
        CrossEntropySummary s;
        if (b.opt.separate_calls) {
            gpt.forward(xa, B, T);
            s = gpt.loss(xa + 1, b.ce, go, true);
            gpt.backward();
        } else {
            s = gpt.forward_loss_backward(xa, xa + 1, B, T, b.ce, go);
        }
        if (accumulating) head += gpt.head_ms();
        b.loss = s.sum_loss / double(s.n_valid);
    }
    if (b.opt.separate_calls) {  // the old schedule: the host reads the norm, then updates
        const double norm = gpt.grad_norm();
        gpt.adamw_step(cfg.optim.lr, cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps,
                       cfg.optim.weight_decay, step, cpu::clip_scale(norm, cfg.optim.grad_clip),
                       model.m, model.v);
    } else {  // the trainer's: the clip factor taken on the GPU
        gpt.clip_and_adamw_step_range(cfg.optim.lr, cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps,
                                      cfg.optim.weight_decay, step, cfg.optim.grad_clip, model.m,
                                      model.v, 0, gpt.num_parameters());
    }
    ZG_CUDA_CHECK(cudaDeviceSynchronize());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!accumulating) head = gpt.head_ms();
    return {ms, head};
}

// --ops' last step: each op family's GPU time, printed and recorded in b.op_table.
void record_ops(Bench& b, std::vector<std::pair<std::string, double>> t2, double ms) {
    std::sort(t2.begin(), t2.end(),
              [](const auto& a2, const auto& b2) { return a2.second > b2.second; });
    double total = 0;
    for (const auto& [name, v2] : t2) total += v2;
    std::printf("per-op GPU time in one step (%.2f ms of ops, %.2f ms wall):\n", total, ms);
    for (const auto& [name, v2] : t2) {
        std::printf("  %-28s %8.2f ms %5.1f%%\n", name.c_str(), v2, 100 * v2 / total);
        b.op_table.push_back({{"op", name}, {"ms", v2}});
    }
}

// Every step of the schedule; start-up ends with the first, printed then.
void run_steps(Bench& b, Model& model, Clock::time_point started) {
    const Schedule sched = schedule_of(b.opt);
    Tokens tokens(b.opt, b.cfg);
    // one row of B * T + 1 tokens per micro-batch
    std::vector<int32_t> x(size_t(b.cfg.train.grad_accum) * size_t(b.B() * b.T() + 1));
    if (b.opt.timeline_steps > 0) b.timeline.emplace();
    b.power.emplace();
    for (int step = 1; step <= sched.last; step++) {
        const bool op_step = sched.op_step(step);
        const bool timeline_step = sched.timeline_step(step);
        model.gpt.set_op_profiling(op_step);
        // The tokens are drawn before the clock starts: they stand for a data loader that
        // prepares the next batch while the GPU works (drawing 65,537 of them takes ~0.2 ms).
        tokens.fill(x);
        ZG_CUDA_CHECK(cudaDeviceSynchronize());
        if (step == b.opt.from) b.power->start();
        if (timeline_step && step == b.opt.steps + 1) b.timeline->start();
        if (timeline_step) b.timeline->mark();
        const auto [ms, head] = train_step(b, model, x, step);
        if (step == b.opt.steps) b.board = b.power->stop();
        if (step == 1) {
            b.first_step_s = ms / 1e3;
            std::printf(
                "start-up: %.1f s to the end of the first step (weights initialised %.1f s, "
                "the model on the device %.1f s, first step %.1f s)\n",
                seconds_since(started), b.init_s, b.model_s, b.first_step_s);
        }
        if (timeline_step) {
            b.recorded_wall_ms.push_back(ms);
            if (step == sched.timeline_end) b.recorded = b.timeline->stop(8, 25);
            continue;
        }
        if (op_step) {
            auto t2 = model.gpt.take_op_times();
            if (step == sched.last) record_ops(b, std::move(t2), ms);
            continue;
        }
        if (step >= b.opt.from) {
            b.step_ms.push_back(ms);
            b.head_ms.push_back(head);
        }
        std::printf("step %d: %.2f ms, loss %.4f, head %.2f ms\n", step, ms, b.loss, head);
    }
}

Summary summarise(const Bench& b, const Model& model, const cuda::DeviceInfo& dev) {
    auto mean = [](const std::vector<double>& a) {
        double s = 0;
        for (double x2 : a) s += x2;
        return s / double(a.size());
    };
    Summary s;
    s.ms = mean(b.step_ms), s.head_ms = mean(b.head_ms);
    s.tok_s = double(b.tokens_per_step()) / (s.ms / 1e3);
    const double peak = peak_flops(dev.name, b.mo.precision == DType::bf16);
    s.mfu = peak > 0 ? training_flops_per_token(b.cfg.model, b.T()) * s.tok_s / peak : 0;
    size_t free_b = 0, total_b = 0;
    ZG_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    s.device_used_gb = double(total_b - free_b) / 1e9;
    s.model_gb =
        (double(model.gpt.allocated_bytes()) + 8.0 * double(model.gpt.num_parameters())) / 1e9;
    s.logits_gb = (is_linear_cross_entropy(b.cfg.kernels.cross_entropy)
                       ? 0.0
                       : double(b.B() * b.T()) * double(model.gpt.padded_vocab()) *
                             dtype_bytes(b.mo.precision)) /
                  1e9;
    return s;
}

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

void print_power(const Bench& b) {
    if (b.board.samples > 0)
        std::printf(
            "board power %.0f W (limit %.0f W), SM clock %.0f MHz: means of %d samples "
            "over the timed steps\n",
            b.board.power_w, b.board.limit_w, b.board.sm_clock_mhz, b.board.samples);
    else
        std::printf("board power not sampled: %s\n", b.power->unavailable().empty()
                                                         ? "the timed steps were too short"
                                                         : b.power->unavailable().c_str());
}

void print_summary(const Bench& b, const cuda::DeviceInfo& dev, const Summary& s) {
    std::printf(
        "%s | %s | B=%lld T=%lld V=%d | step %.2f ms | %.0f tok/s | MFU %.1f%% | head %.2f ms "
        "(%.1f%%) | memory %.2f GB (device used %.2f GB; logits %.2f GB)\n",
        dev.name.c_str(), b.cfg.kernels.cross_entropy.c_str(), (long long)b.B(), (long long)b.T(),
        b.cfg.model.vocab_size, s.ms, s.tok_s, 100 * s.mfu, s.head_ms, 100 * s.head_ms / s.ms,
        s.model_gb, s.device_used_gb, s.logits_gb);
}

void write_json(const Bench& b, const cuda::DeviceInfo& dev, const Summary& s,
                const nlohmann::json& timeline, int64_t n_params) {
    const Config& cfg = b.cfg;
    const Options& o = b.opt;
    nlohmann::json j{{"gpu", dev.name},
                     {"config", o.config_path},
                     {"overrides", o.overrides},
                     {"data", o.data.empty() ? "random tokens" : o.data},
                     {"batch", b.B()},
                     {"seq_len", b.T()},
                     {"vocab_size", cfg.model.vocab_size},
                     {"precision", cfg.train.precision},
                     {"kernels",
                      {{"attention", cfg.kernels.attention},
                       {"cross_entropy", cfg.kernels.cross_entropy},
                       {"layernorm", cfg.kernels.layernorm},
                       {"matmul", cfg.kernels.matmul}}},
                     {"kernel_tuning", kernel_tuning_json(cfg)},
                     {"recompute_gelu", cfg.train.recompute_gelu},
                     {"recompute_block", cfg.train.recompute_block},
                     {"fp32_residual", cfg.train.fp32_residual},
                     {"head_chunks", cfg.kernels.head_chunks},
                     {"steps_timed", b.step_ms.size()},
                     {"step_ms", s.ms},
                     {"step_ms_min", *std::min_element(b.step_ms.begin(), b.step_ms.end())},
                     {"tok_per_s", s.tok_s},
                     {"mfu", s.mfu},
                     {"head_ms", s.head_ms},
                     {"head_share", s.head_ms / s.ms},
                     {"model_memory_gb", s.model_gb},
                     {"model_memory_counted_before_gb", b.estimate_gb + 8e-9 * double(n_params)},
                     {"device_used_gb", s.device_used_gb},
                     {"logits_gb", s.logits_gb},
                     {"final_loss", b.loss},
                     {"startup_s",
                      {{"init_weights", b.init_s},
                       {"model_to_device", b.model_s},
                       {"first_step", b.first_step_s}}},
                     {"power_samples", b.board.samples},
                     {"power_w", b.board.power_w},
                     {"power_limit_w", b.board.limit_w},
                     {"sm_clock_mhz", b.board.sm_clock_mhz},
                     {"ops", b.op_table},
                     {"timeline", timeline},
                     // kernels.matmul_search's picks (gemm_choices' text): which
                     // candidate each GEMM shape ran, to tell runs apart
                     {"gemm_choices", cuda::gemm_choices()}};
    std::ofstream(o.out) << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
    int code = 0;
    const std::optional<Options> opt = parse(argc, argv, code);
    if (!opt) return code;
    try {
        // start-up phases, printed before the first step: the weights' initialisation on the
        // host, the model's device allocation and copy, and the first step (cuBLASLt's
        // heuristics and kernels.matmul_search's timing of each GEMM shape happen there)
        const auto started = Clock::now();
        Bench b;
        b.opt = *opt;
        b.cfg = config_of(b.opt);
        const cuda::DeviceInfo dev = cuda::query_devices();
        ZG_CHECK(dev.count > 0, "no CUDA device: " + dev.error);
        b.mo = cuda_model_options(b.cfg, 1);  // the trainer's, one vocabulary shard
        b.ce = loss_options(b.cfg);
        const std::unique_ptr<Model> model = start_model(b);
        run_steps(b, *model, started);
        const Summary s = summarise(b, *model, dev);
        const nlohmann::json timeline_json =
            b.timeline ? report_timeline(*b.timeline, b.recorded, b.recorded_wall_ms)
                       : nlohmann::json();
        // before the summary, which stays the last line
        print_power(b);
        print_summary(b, dev, s);
        if (!b.opt.out.empty()) write_json(b, dev, s, timeline_json, model->gpt.num_parameters());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_train: %s\n", e.what());
        return 1;
    }
    return 0;
}

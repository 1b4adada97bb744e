#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "kernels/check.h"
#include "kernels/global_norm.h"
#include "model/parameters.h"
#include "model/sample.h"
#include "train/backend.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/run_dir.h"

namespace zgpt {

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
    g_stop = 1;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Batch {
    std::vector<int32_t> inputs, targets;
};

CrossEntropyOptions loss_options(const LossConfig& l, Reduction r) {
    CrossEntropyOptions o;
    o.ignore_index = l.ignore_index;
    o.label_smoothing = l.label_smoothing;
    o.z_loss_weight = l.z_loss_weight;
    o.reduction = r;
    return o;
}

struct EvalResult {
    double loss = 0, ce = 0;
};

// Mean loss and CE over eval_batches validation batches, always the same ones (the loader
// restarts).
EvalResult evaluate(Backend& model, DataLoader& val, const Config& c, int64_t T) {
    const int64_t B = c.train.batch_size;
    Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
    val.reset();
    const CrossEntropyOptions opts = loss_options(c.loss, Reduction::sum);
    double loss = 0, ce = 0;
    int64_t n = 0;
    for (int i = 0; i < c.train.eval_batches; i++) {
        val.next_batch(b.inputs.data(), b.targets.data());
        const CrossEntropySummary s = model.evaluate(b.inputs.data(), b.targets.data(), B, T, opts);
        loss += s.sum_loss;
        ce += s.sum_ce;
        n += s.n_valid;
    }
    return {n ? loss / double(n) : 0.0, n ? ce / double(n) : 0.0};
}

// The kernel variants a run uses, for its metrics and provenance.
nlohmann::json kernels_json(const Config& c, const DeviceChoice& device) {
    if (device.device != "cuda") return {{"cpu", "reference"}};
    return {{"attention", c.kernels.attention}, {"cross_entropy", c.kernels.cross_entropy},
            {"layernorm", c.kernels.layernorm}, {"matmul", c.kernels.matmul},
            {"precision", c.train.precision},   {"recompute_gelu", c.train.recompute_gelu}};
}

// Keeps the metrics lines of steps <= step (a resumed run re-does the steps after its checkpoint).
void truncate_metrics(const std::string& path, int64_t step) {
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        try {
            if (nlohmann::json::parse(line).value("step", int64_t(0)) <= step) kept += line + "\n";
        } catch (const std::exception&) {  // a line cut short by a crash: drop it
        }
    }
    write_text_file(path, kept);
}

}  // namespace

void resolve_vocab_size(Config& c) {
    if (c.model.vocab_size > 0) return;
    const auto dir = std::filesystem::path(c.data.train).parent_path();
    const std::string tok = (dir / "tokenizer.json").string();
    if (!std::filesystem::exists(tok))
        throw Error("model.vocab_size is 0 (auto) but there is no " + tok +
                    " beside data.train; set model.vocab_size");
    c.model.vocab_size = int(Tokenizer::load(tok).vocab_size());
}

TrainResult train(Config cfg, const std::string& config_path, const std::string& command_line) {
    resolve_vocab_size(cfg);
    validate(cfg.model);
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    const DeviceChoice device = choose_device(cfg.train.device);
    const int64_t B = cfg.train.batch_size;
    const int64_t T = cfg.train.seq_len > 0 ? cfg.train.seq_len : cfg.model.block_size;
    const int64_t max_steps = cfg.train.max_steps;

    LoaderOptions lo;
    lo.batch_size = B;
    lo.seq_len = T;
    lo.shuffle = cfg.data.shuffle;
    lo.sampling = cfg.data.sampling == "random" ? Sampling::random : Sampling::epochs;
    lo.seed = uint64_t(cfg.train.seed);
    lo.vocab_size = cfg.model.vocab_size;
    DataLoader train_loader(cfg.data.train, lo);
    std::unique_ptr<DataLoader> val_loader;
    if (!cfg.data.val.empty()) {
        LoaderOptions vo = lo;
        vo.shuffle = true;  // a fixed random sample of the validation set, the same at every eval
        vo.sampling = Sampling::epochs;
        vo.seed = 0x5EEDull;
        val_loader = std::make_unique<DataLoader>(cfg.data.val, vo);
    }

    TrainResult result;
    result.run_dir = make_run_dir(cfg.train, config_path);
    const std::string yaml = config_to_yaml(cfg);
    const std::string ckpt_dir = result.run_dir + "/checkpoints";

    std::unique_ptr<Backend> backend = make_backend(device.device, cfg);
    Backend& model = *backend;
    int64_t start_step = 0, tokens = 0;
    std::string resumed_from;
    if (cfg.train.resume == "auto") {
        std::vector<std::string> refused;
        CheckpointState st;
        resumed_from = latest_valid_checkpoint(ckpt_dir, model.layout().table, &refused, &st);
        for (const std::string& r : refused) std::printf("warning: %s\n", r.c_str());
        if (!resumed_from.empty()) {
            model.set_params(st.params);
            model.set_adam(st.m, st.v, st.adam_steps);
            train_loader.set_position(st.loader);
            start_step = st.step;
            tokens = st.tokens;
            truncate_metrics(result.run_dir + "/metrics.jsonl", start_step);
        }
    }
    write_text_file(result.run_dir + "/config.yaml", yaml);
    const std::string prov_name = start_step
                                      ? "/provenance-resume-" + std::to_string(start_step) + ".json"
                                      : "/provenance.json";
    nlohmann::json prov = provenance(device, command_line);
    prov["kernels"] = kernels_json(cfg, device);
    write_text_file(result.run_dir + prov_name, prov.dump(2) + "\n");
    MetricsWriter metrics(result.run_dir + "/metrics.jsonl");
    auto checkpoint = [&](int64_t step) {
        CheckpointState st;
        st.step = step;
        st.tokens = tokens;
        st.loader = train_loader.position();
        st.adam_steps = model.adam_steps();
        st.config_yaml = yaml;
        st.params = model.params();
        st.m = model.adam_m();
        st.v = model.adam_v();
        save_checkpoint(ckpt_dir, model.layout().table, st, cfg.train.keep_checkpoints);
    };

    std::printf("resolved config:\n%s", yaml.c_str());
    std::printf("%s\n", device.reason.c_str());
    std::printf("model: %.3fM parameters (vocab %d padded to %lld); %s\n",
                double(model.num_parameters()) / 1e6, cfg.model.vocab_size,
                (long long)model.padded_vocab(), model.describe().c_str());
    std::printf("data: %lld train tokens in %zu shard(s), %lld batches of %lldx%lld per epoch\n",
                (long long)train_loader.num_tokens(), train_loader.num_shards(),
                (long long)train_loader.batches_per_epoch(), (long long)B, (long long)T);
    std::printf("run directory: %s\n", result.run_dir.c_str());
    if (!resumed_from.empty())
        std::printf("resumed from %s at step %lld\n", resumed_from.c_str(), (long long)start_step);
    else if (cfg.train.resume == "auto")
        std::printf("no valid checkpoint in %s: starting from step 0\n", ckpt_dir.c_str());
    std::fflush(stdout);

    Progress progress(cfg.train.log_every);
    // A sample from the current weights, seeded by the step (the training stream is untouched).
    std::unique_ptr<Tokenizer> tokenizer;
    auto print_sample = [&](int64_t step) {
        if (!tokenizer) {
            const auto dir = std::filesystem::path(cfg.data.train).parent_path();
            tokenizer =
                std::make_unique<Tokenizer>(Tokenizer::load((dir / "tokenizer.json").string()));
        }
        SampleOptions so;
        so.max_new_tokens = cfg.train.sample_tokens;
        so.temperature = 0.8;
        so.top_k = 40;
        so.stop_token = tokenizer->document_separator();
        Rng rng(uint64_t(cfg.train.seed) ^ uint64_t(step));
        const std::vector<uint32_t> p = tokenizer->default_prompt();
        const auto out = model.generate(std::vector<int32_t>(p.begin(), p.end()), so, rng);
        progress.message("sample at step " + std::to_string(step) + ":\n" +
                         tokenizer->decode(std::vector<uint32_t>(out.begin(), out.end())));
    };
    auto run_eval = [&](int64_t step, nlohmann::json& rec) {
        if (!val_loader) return;
        const EvalResult e = evaluate(model, *val_loader, cfg, T);
        rec["val_loss"] = e.loss;
        rec["val_ce"] = e.ce;
        result.val_loss = e.loss;
        result.val_ce = e.ce;
        char line[128];
        std::snprintf(line, sizeof line, "step %lld: val loss %.4f (ce %.4f)", (long long)step,
                      e.loss, e.ce);
        progress.message(line);
    };
    if (start_step == 0) {
        nlohmann::json rec{{"step", 0}, {"tokens", 0}};
        run_eval(0, rec);
        if (val_loader) metrics.write(rec);
    }

    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    const CrossEntropyOptions train_opts = loss_options(cfg.loss, Reduction::sum);
    std::vector<Batch> micro(cfg.train.grad_accum,
                             Batch{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)});
    const double peak =
        device.device == "cuda" ? peak_flops(device.gpu_name, cfg.train.precision == "bf16") : 0.0;
    const double flops_per_token = training_flops_per_token(cfg.model, T);
    const nlohmann::json kernels = kernels_json(cfg, device);
    const auto t_start = Clock::now();
    const int64_t tokens_at_start = tokens;
    for (int64_t step = start_step + 1; step <= max_steps && !g_stop; step++) {
        const auto t0 = Clock::now();
        const double lr = learning_rate(cfg.optim, step - 1, max_steps);
        // Normalise once by the valid tokens of the whole step, not per micro-batch.
        int64_t n_valid = 0;
        for (Batch& b : micro) {
            train_loader.next_batch(b.inputs.data(), b.targets.data());
            for (int32_t y : b.targets) n_valid += y != cfg.loss.ignore_index;
        }
        const double grad_out = n_valid ? 1.0 / double(n_valid) : 0.0;
        model.zero_grad();
        CrossEntropySummary sum;
        for (Batch& b : micro) {
            const CrossEntropySummary s = model.train_micro_batch(b.inputs.data(), b.targets.data(),
                                                                  B, T, train_opts, grad_out);
            sum.sum_loss += s.sum_loss;
            sum.sum_ce += s.sum_ce;
            sum.sum_z_loss += s.sum_z_loss;
            sum.sum_lse += s.sum_lse;
            sum.sum_lse_sq += s.sum_lse_sq;
            sum.n_valid += s.n_valid;
            sum.max_logit = std::max(sum.max_logit, s.max_logit);
        }
        const double norm = model.grad_norm();
        model.optimizer_step(lr, cpu::clip_scale(norm, cfg.optim.grad_clip));
        const double dt = seconds_since(t0);
        tokens += B * T * cfg.train.grad_accum;
        const double inv = sum.n_valid ? 1.0 / double(sum.n_valid) : 0.0;
        result.train_loss = sum.sum_loss * inv;
        result.steps = step;

        nlohmann::json rec{{"step", step},
                           {"loss", sum.sum_loss * inv},
                           {"ce", sum.sum_ce * inv},
                           {"z_loss", sum.sum_z_loss * inv},
                           {"lse_mean", sum.sum_lse * inv},
                           {"lse_sq_mean", sum.sum_lse_sq * inv},
                           {"max_logit", sum.max_logit},
                           {"grad_norm", norm},
                           {"lr", lr},
                           {"tokens", tokens},
                           {"step_ms", dt * 1e3},
                           {"tok_per_s", double(B * T * cfg.train.grad_accum) / dt},
                           {"mfu", nullptr}};
        // MFU on a GPU with a known peak; the CPU has none (no peak FLOP/s for an arbitrary CPU).
        if (peak > 0)
            rec["mfu"] = flops_per_token * double(B * T * cfg.train.grad_accum) / dt / peak;
        if (model.device_memory_bytes() > 0) rec["peak_mem_gb"] = model.device_memory_bytes() / 1e9;
        rec["kernels"] = kernels;
        const double tok_s = double(tokens - tokens_at_start) / seconds_since(t_start);
        progress.update({step, max_steps, step - start_step, sum.sum_loss * inv, sum.sum_ce * inv,
                         sum.sum_z_loss * inv, lr, norm, tok_s, seconds_since(t_start),
                         peak > 0 ? flops_per_token * tok_s / peak : -1.0});
        // A non-finite loss cannot recover (AdamW would spread NaN into every weight): stop, keep
        // the last good checkpoint, and say so in the summary so a sweep counts the run as done.
        if (!std::isfinite(result.train_loss) || !std::isfinite(norm)) {
            result.diverged = true;
            metrics.write(rec);
            progress.message("step " + std::to_string(step) +
                             ": the loss or gradient norm is not finite; stopping (diverged)");
            break;
        }
        const bool last = step == max_steps || g_stop;
        if (last || (cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0))
            run_eval(step, rec);
        metrics.write(rec);
        if (last || (cfg.train.checkpoint_every > 0 && step % cfg.train.checkpoint_every == 0))
            checkpoint(step);
        if (cfg.train.sample_every > 0 && step % cfg.train.sample_every == 0) print_sample(step);
    }
    progress.finish();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    result.seconds = seconds_since(t_start);
    nlohmann::json summary{{"steps", result.steps},         {"train_loss", result.train_loss},
                           {"seconds", result.seconds},     {"tokens", tokens},
                           {"stopped_early", bool(g_stop)}, {"diverged", result.diverged}};
    if (val_loader) {
        summary["val_loss"] = result.val_loss;
        summary["val_ce"] = result.val_ce;
    }
    write_text_file(result.run_dir + "/summary.json", summary.dump(2) + "\n");
    std::printf("done: %lld steps in %s, train loss %.4f%s; run directory %s\n",
                (long long)result.steps, format_duration(result.seconds).c_str(), result.train_loss,
                val_loader ? (", val loss " + std::to_string(result.val_loss)).c_str() : "",
                result.run_dir.c_str());
    return result;
}

}  // namespace zgpt

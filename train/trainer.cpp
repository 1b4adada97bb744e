#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "data/file_read.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "kernels/core/check.h"
#include "kernels/gemm/cpu_blas.h"
#include "model/gpt.h"
#include "model/parameters.h"
#include "model/sample.h"
#include "train/backends/backend.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/op_profile.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/step_timeline.h"
#include "train/timed_choices.h"

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
EvalResult evaluate(Backend& model, DataLoader& val, const Config& c, int64_t T,
                    Communicator& world) {
    const int64_t B = c.train.batch_size;
    Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
    val.reset();
    const CrossEntropyOptions opts = loss_options(c.loss, Reduction::sum);
    double loss = 0, ce = 0;
    int64_t n = 0;
    const int64_t batches =
        c.train.eval_batches > 0 ? c.train.eval_batches : val.batches_per_epoch();
    for (int64_t i = 0; i < batches; i++) {
        val.next_batch(b.inputs.data(), b.targets.data());
        const CrossEntropySummary s = model.evaluate(b.inputs.data(), b.targets.data(), B, T, opts);
        loss += s.sum_loss;
        ce += s.sum_ce;
        n += s.n_valid;
    }
    double sums[3] = {loss, ce, double(n)};  // every rank evaluates its own batches
    world.all_reduce_sum(sums, 3);
    loss = sums[0];
    ce = sums[1];
    n = int64_t(sums[2]);
    return {n ? loss / double(n) : 0.0, n ? ce / double(n) : 0.0};
}

// The kernel variants a run uses, for its metrics and provenance.
nlohmann::json kernels_json(const Config& c, const DeviceChoice& device) {
    if (device.device != "cuda") return {{"cpu", "reference"}};
    nlohmann::json j = {{"attention", c.kernels.attention},
                        {"cross_entropy", c.kernels.cross_entropy},
                        {"layernorm", c.kernels.layernorm},
                        {"matmul", c.kernels.matmul},
                        {"precision", c.train.precision},
                        {"recompute_gelu", c.train.recompute_gelu},
                        {"recompute_block", c.train.recompute_block},
                        {"fp32_residual", c.train.fp32_residual}};
    j.update(kernel_tuning_json(c));  // every other kernels key, the tuning knobs nested
    return j;
}

// Keeps the metrics lines of steps <= step (a resumed run re-does the steps after its checkpoint).
void truncate_metrics(const std::string& path, int64_t step) {
    std::error_code ec;
    std::istringstream in(std::filesystem::exists(path, ec)
                              ? read_regular_file(path, "metrics file", uint64_t(1) << 36)
                              : std::string());
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

// What the host must hold, refused before anything is allocated: an allocation past the machine's
// memory is killed by the kernel, not reported. CPU: weights, gradients, AdamW moments and the
// initial copy (20 bytes a parameter) plus the activations of a step; a GPU run's host keeps the
// initial weights and a checkpoint's gathered state. `local` ranks (threads) share the machine.
void check_host_memory(const Config& cfg, const std::string& device, int64_t B, int64_t T,
                       int local) {
    const double P = double(make_gpt_layout(cfg.model).table.total());
    const double C = cfg.model.n_embd, L = cfg.model.n_layer, NH = cfg.model.n_head;
    const double BT = double(B) * double(T), Vp = double(padded_vocab_size(cfg.model.vocab_size));
    double bytes = 16.0 * P;
    if (device == "cpu")
        bytes = 20.0 * P + 4.0 * BT * (L * (16 * C + NH * double(T)) + 2 * Vp + 16 * C);
    const double have = host_memory_bytes() / double(local);
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "this config needs about %.1f GB of host memory (%.3gM parameters, batch %lld x "
                  "%lld) and this machine has %.1f GB%s",
                  bytes / 1e9, P / 1e6, (long long)B, (long long)T, have * local / 1e9,
                  local > 1 ? " for all its local ranks" : "");
    ZG_CHECK(have <= 0 || bytes <= 0.9 * have, msg);
}

}  // namespace

void resolve_vocab_size(Config& c) {
    if (c.model.vocab_size > 0) return;
    // The shards first: a glob that matches nothing is the problem to report, not the tokenizer.
    ZG_CHECK(!c.data.train.empty(), "data.train is not set (a glob of token shards)");
    try {
        glob_paths(c.data.train);
    } catch (const Error& e) {
        throw Error(std::string("data.train: ") + e.what());
    }
    const auto dir = std::filesystem::path(c.data.train).parent_path();
    const std::string tok = (dir / "tokenizer.json").string();
    if (!std::filesystem::exists(tok))
        throw Error("model.vocab_size is 0 (auto) but there is no " + tok +
                    " beside data.train; set model.vocab_size");
    c.model.vocab_size = int(Tokenizer::load(tok).vocab_size());
}

TrainResult train(Config cfg, const std::string& config_path, const std::string& command_line) {
    if (cfg.parallel.local_ranks > 1) return train_local_ranks(cfg, config_path, command_line);
    auto single = make_single_rank_comm();
    return train(cfg, config_path, command_line, *single);
}

TrainResult train_local_ranks(const Config& cfg, const std::string& config_path,
                              const std::string& command_line) {
    const int n = cfg.parallel.local_ranks;
    auto comms = make_local_group(n, cfg.parallel.timeout_s);
    std::vector<TrainResult> results(n);
    std::vector<std::string> errors(n);
    std::vector<char> own(n, 0);  // the rank failed by itself, not through a peer's abort
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; r++) {
        // Each rank runs the user's config unchanged (it is what the run directory and the
        // checkpoints record, so a resume gets the same ranks); train() sees the local group.
        ranks.emplace_back([&, r] {
            try {
                results[r] = train(cfg, config_path, command_line, *comms[r]);
            } catch (const std::exception& e) {
                errors[r] = e.what();
                own[r] = !local_group_failed(*comms[r]);
                abort_local_group(*comms[r], "rank " + std::to_string(r) + " failed: " + e.what());
            }
        });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < n; r++)  // the first rank that failed by itself
        if (own[r]) throw Error("rank " + std::to_string(r) + " failed: " + errors[r]);
    for (int r = 0; r < n; r++)
        if (!errors[r].empty()) throw Error(errors[r]);
    return results[0];
}

LoaderOptions train_loader_options(const Config& cfg, int rank, int world_size) {
    LoaderOptions lo;
    lo.batch_size = cfg.train.batch_size;
    lo.seq_len = sequence_length(cfg);
    lo.shuffle = cfg.data.shuffle;
    lo.sampling = cfg.data.sampling == "random" ? Sampling::random : Sampling::epochs;
    lo.seed = uint64_t(cfg.train.seed);
    lo.vocab_size = cfg.model.vocab_size;
    lo.rank = rank;
    lo.world_size = world_size;
    return lo;
}

namespace {

// Test hooks, read once from the environment (tests/test_parallel.cpp, tests/test_multi_gpu.cpp,
// tests/test_train.cpp): a rank that throws, or one that stops answering while its process stays
// alive, at a given step (..._AT_STEP=rank:step) or before a given micro-batch of a step, after
// the step's first collectives (ZGPT_TEST_HANG_RANK_AT_MICRO_BATCH=rank:step:micro-batch, from 1),
// and weights turned to NaN at a given step, as a diverging run's would be. before_step() and
// before_micro_batch() are the places they act.
struct FaultHooks {
    int64_t fail_rank = -1, fail_step = -1, hang_rank = -1, hang_step = -1, poison_step = -1;
    int64_t micro_rank = -1, micro_step = -1, micro_index = -1;
    FaultHooks() {
        if (const char* f = std::getenv("ZGPT_TEST_FAIL_RANK_AT_STEP"))
            std::sscanf(f, "%ld:%ld", &fail_rank, &fail_step);
        if (const char* f = std::getenv("ZGPT_TEST_HANG_RANK_AT_STEP"))
            std::sscanf(f, "%ld:%ld", &hang_rank, &hang_step);
        if (const char* f = std::getenv("ZGPT_TEST_HANG_RANK_AT_MICRO_BATCH"))
            std::sscanf(f, "%ld:%ld:%ld", &micro_rank, &micro_step, &micro_index);
        if (const char* f = std::getenv("ZGPT_TEST_POISON_WEIGHTS_AT_STEP"))
            std::sscanf(f, "%ld", &poison_step);
    }
    void before_micro_batch(int64_t step, int64_t index, int rank) const {
        if (micro_rank == rank && micro_step == step && micro_index == index)
            for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    void before_step(int64_t step, int rank, Backend& model) const {
        if (fail_rank == rank && fail_step == step)  // a rank that fails mid-run
            throw Error("test failure injected at step " + std::to_string(step));
        if (hang_rank == rank && hang_step == step)
            for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        if (poison_step == step)
            model.set_params(std::vector<float>(model.num_parameters(),
                                                std::numeric_limits<float>::quiet_NaN()));
    }
};

// One training run on one rank, in the phases train() calls in order: set-up (the constructor),
// the GEMM choices of earlier runs, resume, the run folder's files, the start-up report, the
// steps (each with its evaluation, checkpoint and sample when due) and the finish.
class TrainingRun {
  public:
    TrainingRun(Config c, const std::string& config_path, const std::string& command_line,
                Communicator& world);
    void load_gemm_choices();
    void resume();
    void write_run_files();
    void announce() const;
    void run_steps();
    TrainResult finish();

    const Config& config() const { return cfg_; }

  private:
    Backend& model() const { return *backend_; }
    std::unique_ptr<DataLoader> open_loader(const char* key, const std::string& glob,
                                            const LoaderOptions& o) const;
    void save_gemm_choices();
    void write_metrics(const nlohmann::json& rec) {
        if (metrics_file_) metrics_file_->write(rec);
    }
    void message(const std::string& line) {
        if (lead_) progress_.message(line);
    }
    std::string zero1_description() const;
    void checkpoint(int64_t step);
    void print_sample(int64_t step);
    void evaluate_into(int64_t step, nlohmann::json& rec);
    // One optimizer step; false when the run must stop (a non-finite loss).
    bool step(int64_t step, std::vector<Batch>& micro);

    Config cfg_;
    const std::string config_path_, command_line_;
    Communicator& world_;
    int local_ = 1;
    DeviceChoice device_;
    int R_ = 1, rank_ = 0, P_ = 1, gpus_ = 1;
    bool lead_ = true;  // rank 0 writes the run directory, metrics and checkpoints
    std::unique_ptr<Communicator> vocab_group_, vocab_peers_;
    int64_t B_ = 0, T_ = 0, max_steps_ = 0, windows_per_batch_ = 0;
    std::unique_ptr<DataLoader> train_loader_, val_loader_;
    TrainResult result_;
    std::string yaml_, ckpt_dir_;
    std::unique_ptr<Backend> backend_;
    bool zero1_ = false;
    int64_t start_step_ = 0, tokens_ = 0;
    std::string resumed_from_;
    std::string choices_path_, gemm_choices_read_;
    std::unique_ptr<MetricsWriter> metrics_file_;
    Progress progress_{0};
    std::unique_ptr<Tokenizer> tokenizer_;
    const FaultHooks hooks_;
    bool stop_all_ = false;        // a stop request seen by any rank, agreed by all
    bool choices_shared_ = false;  // rank 0's timed kernel choices handed to the others
    // what every step reads, set when the steps start
    CrossEntropyOptions train_opts_;
    double peak_ = 0, flops_per_token_ = 0;
    int64_t step_tokens_ = 0;  // over all ranks
    nlohmann::json kernels_;
    Clock::time_point t_created_ = Clock::now(), t_start_;
    double model_seconds_ = 0;  // of the start-up: the model, its weights and their upload
    // the progress line's tokens/s over the last max(log_every, 10) steps (in logs, with the
    // default log_every, the steps since the previous line); the ETA keeps the whole run's pace
    std::unique_ptr<RecentRate> recent_;
    // the board's power and SM clock over each step (GPU only): at the power limit a step's time
    // is its energy over that limit, so an ablation wants both
    std::unique_ptr<PowerMeter> power_;
};

// Set-up: the config resolved and checked, the device, the rank groups, the host memory, the
// data, the run directory, the model and the optimizer's sharding.
TrainingRun::TrainingRun(Config c, const std::string& config_path, const std::string& command_line,
                         Communicator& world)
    : cfg_(std::move(c)), config_path_(config_path), command_line_(command_line), world_(world) {
    try {
        resolve_vocab_size(cfg_);
    } catch (const Error& e) {  // data.train's glob or its tokenizer.json: name the config too
        if (config_path_.empty()) throw;
        throw Error(config_path_ + ": " + e.what());
    }
    validate(cfg_.model);
    // Ranks that are threads of this process share its CPU threads.
    local_ = world_.name() == "local" ? std::max(1, cfg_.parallel.local_ranks) : 1;
    if (cfg_.train.threads > 0 || local_ > 1)
        omp_set_num_threads(std::max(
            1, (cfg_.train.threads > 0 ? cfg_.train.threads : omp_get_num_procs()) / local_));
    device_ = choose_device(cfg_.train.device);
    R_ = world_.size();
    rank_ = world_.rank();
    P_ = cfg_.parallel.vocab_parallel;
    // GPUs in use: local ranks share this process's one GPU (MFU is per GPU)
    gpus_ = std::max(1, R_ / local_);
    lead_ = rank_ == 0;
    ZG_CHECK(R_ % P_ == 0, "parallel.vocab_parallel=" + std::to_string(P_) +
                               " must divide the number of ranks (" + std::to_string(R_) + ")");
    ZG_CHECK(P_ <= cfg_.model.vocab_size, "parallel.vocab_parallel exceeds the vocabulary");
    // Vocab-parallel groups: P consecutive ranks each; the peers: the ranks that hold the same
    // shard of the vocabulary (rank p of every group).
    if (P_ > 1) {
        vocab_group_ = world_.split(rank_ / P_, rank_);
        vocab_peers_ = world_.split(rank_ % P_, rank_);
    }
    B_ = cfg_.train.batch_size;
    T_ = sequence_length(cfg_);
    max_steps_ = cfg_.train.max_steps;
    windows_per_batch_ = B_ * R_;

    check_host_memory(cfg_, device_.device, B_, T_, local_);
    const LoaderOptions lo = train_loader_options(cfg_, rank_, R_);
    train_loader_ = open_loader("data.train", cfg_.data.train, lo);
    if (!cfg_.data.val.empty()) {
        LoaderOptions vo = lo;
        vo.shuffle = true;  // a fixed random sample of the validation set, the same at every eval
        vo.sampling = Sampling::epochs;
        vo.seed = 0x5EEDull;
        val_loader_ = open_loader("data.val", cfg_.data.val, vo);
    }

    if (lead_) result_.run_dir = make_run_dir(cfg_.train, config_path_);
    yaml_ = config_to_yaml(cfg_);
    ckpt_dir_ = result_.run_dir + "/checkpoints";

    // ZeRO-1 shares the AdamW moments of the weights every rank stores over all ranks and, with
    // a split vocabulary, those of a shard's rows over its peers (train/backends/zero1_share.h).
    zero1_ = cfg_.parallel.zero1 && R_ > 1;
    const auto t_model = Clock::now();
    try {
        backend_ = make_backend(device_.device, cfg_, {vocab_group_.get(), vocab_peers_.get()},
                                zero1_ ? &world_ : nullptr);
    } catch (const Error& e) {  // what it refuses comes from this config (model.init_from, say)
        if (config_path_.empty()) throw;
        throw Error(config_path_ + ": " + e.what());
    }
    model_seconds_ = seconds_since(t_model);
    progress_ = Progress(lead_ ? cfg_.train.log_every : 0);  // only rank 0 shows progress
}

// A shard's error names the key that chose it.
std::unique_ptr<DataLoader> TrainingRun::open_loader(const char* key, const std::string& glob,
                                                     const LoaderOptions& o) const {
    try {
        return std::make_unique<DataLoader>(glob, o);
    } catch (const Error& e) {
        throw Error((config_path_.empty() ? "" : config_path_ + ": ") + key + ": " + e.what());
    }
}

// The GEMM algorithms earlier runs in this runs folder chose by timing: rank 0's file, on every
// rank (a resumed run then takes its checkpoint's).
void TrainingRun::load_gemm_choices() {
    choices_path_ = timed_choices_path(cfg_.train);
    if (cfg_.kernels.matmul_search <= 1) return;
    gemm_choices_read_ = broadcast_text(world_, lead_ ? read_timed_choices(choices_path_) : "");
    if (gemm_choices_read_.empty()) return;
    const bool taken = model().set_timed_choices(gemm_choices_read_);
    if (lead_ && taken)
        std::printf("GEMM algorithms as earlier runs chose them: %s\n", choices_path_.c_str());
    else if (lead_)
        std::printf("note: %s is for another GPU or cuBLASLt; timing them again\n",
                    choices_path_.c_str());
}

// Rank 0 keeps what this run chose for the next runs (merged with the file as it is now: runs of
// other shapes may have added to it); a failed write costs only the next run's timing.
void TrainingRun::save_gemm_choices() {
    if (!lead_ || cfg_.kernels.matmul_search <= 1) return;
    const std::string merged =
        merge_timed_choices(model().timed_choices(), read_timed_choices(choices_path_));
    if (merged.empty() || merged == gemm_choices_read_) return;
    try {
        write_text_file(choices_path_, merged);
        gemm_choices_read_ = merged;
    } catch (const std::exception& e) {
        std::printf("warning: the GEMM algorithms were not saved: %s\n", e.what());
    }
}

// train.resume=auto: the newest checkpoint that loads completely. Rank 0 reads it and hands it to
// the others (no shared file system needed).
void TrainingRun::resume() {
    CheckpointState st;
    std::vector<std::string> refused;
    // Where the data goes on from, checked as part of loading a checkpoint: one whose position
    // this run's data cannot take is refused like a damaged one.
    LoaderPosition pos;
    int64_t old_windows = 0;
    auto load = [&](const std::string& path) {
        CheckpointState s = load_checkpoint(path, model().layout().table);
        old_windows = s.loader_windows_per_batch;
        if (old_windows == 0)  // written by one rank, before
            old_windows = load_config_text(s.config_yaml, path).train.batch_size;
        pos = s.loader;
        // The same point of the data on another rank count or batch size.
        if (old_windows > 0 && old_windows != windows_per_batch_) {
            const int64_t done = pos.batch * old_windows;
            // random sampling has no order to keep: its position only seeds the draws
            const bool ordered = cfg_.data.sampling != "random";
            ZG_CHECK(!ordered || done % windows_per_batch_ == 0,
                     "cannot resume: the checkpoint stopped after " + std::to_string(done) +
                         " windows of its epoch, not a whole number of this run's global "
                         "batches of " +
                         std::to_string(windows_per_batch_) + " (train.batch_size x ranks)");
            pos.batch = done / windows_per_batch_;
        }
        if (pos.batch > train_loader_->batches_per_epoch())
            throw Error("its data position (epoch " + std::to_string(pos.epoch) + ", batch " +
                        std::to_string(pos.batch) + ") is past the end of an " +
                        "epoch of data.train (" +
                        std::to_string(train_loader_->batches_per_epoch()) + " batches)");
        return s;
    };
    if (lead_) resumed_from_ = latest_valid_checkpoint(ckpt_dir_, load, &refused, &st);
    // Checkpoints that are all refused (another model shape, corruption) are never replaced by a
    // run from step 0: that would destroy what the user asked to continue.
    const bool refused_all = resumed_from_.empty() && !refused.empty();
    int64_t head[7] = {refused_all ? -1 : int64_t(!resumed_from_.empty()),
                       st.step,
                       st.tokens,
                       pos.epoch,
                       pos.batch,
                       st.adam_steps,
                       old_windows};
    world_.broadcast(head, 7, CommType::i64, 0);
    if (head[0] < 0) {
        // every rank says why (which rank's error a local group reports first is a race)
        std::string why;
        for (const std::string& r : refused) why += "\n  " + r;
        why = broadcast_text(world_, why);
        throw Error("train.resume=auto: every checkpoint in " +
                    (lead_ ? ckpt_dir_ : std::string("rank 0's run directory")) +
                    " was refused, and starting from step 0 would overwrite them; nothing "
                    "was changed. Resume with the config that wrote them, or start a new run "
                    "(another train.run_name)" +
                    why);
    }
    if (head[0] > 0) {
        const int64_t n = model().num_parameters();
        for (auto* v : {&st.params, &st.m, &st.v}) {
            v->resize(n);
            world_.broadcast(v->data(), n, CommType::f32, 0);
        }
        if (lead_ && head[6] > 0 && head[6] != windows_per_batch_)
            std::printf(
                "warning: the checkpoint's global batch was %lld windows, this "
                "run's is %lld (train.batch_size x ranks): the data continues "
                "where it stopped, the steps are of another size\n",
                (long long)head[6], (long long)windows_per_batch_);
        model().set_params(st.params);
        model().set_adam(st.m, st.v, head[5]);
        // the GEMM algorithms the run chose by timing, so that it goes on bit for bit
        model().set_timed_choices(broadcast_text(world_, st.timed_choices));
        train_loader_->set_position({head[3], head[4]});
        start_step_ = head[1];
        tokens_ = head[2];
    }
    // The metrics after the checkpoint are done again; with no checkpoint (a run stopped before
    // its first one), all of them.
    if (lead_) truncate_metrics(result_.run_dir + "/metrics.jsonl", head[0] > 0 ? start_step_ : -1);
}

// The run folder's config.yaml, provenance (of this start: a resume writes its own) and metrics.
void TrainingRun::write_run_files() {
    if (!lead_) return;
    write_text_file(result_.run_dir + "/config.yaml", yaml_);
    const std::string prov_name =
        start_step_ ? "/provenance-resume-" + std::to_string(start_step_) + ".json"
                    : "/provenance.json";
    nlohmann::json prov = provenance(device_, command_line_);
    prov["kernels"] = kernels_json(cfg_, device_);
    prov["parallel"] = {
        {"ranks", R_}, {"communicator", world_.name()}, {"vocab_parallel", P_}, {"zero1", zero1_}};
    write_text_file(result_.run_dir + prov_name, prov.dump(2) + "\n");
    metrics_file_ = std::make_unique<MetricsWriter>(result_.run_dir + "/metrics.jsonl");
}

// What runs, on what, from where: rank 0's start-up report.
void TrainingRun::announce() const {
    if (!lead_) return;
    std::printf("resolved config:\n%s", yaml_.c_str());
    std::printf("%s\n", device_.reason.c_str());
    if (device_.device == "cpu") std::printf("%s\n", cpu::cpu_blas_summary().c_str());
    std::printf("model: %.3fM parameters (vocab %d padded to %lld); %s\n",
                double(model().num_parameters()) / 1e6, cfg_.model.vocab_size,
                (long long)model().padded_vocab(), model().describe().c_str());
    if (model().stored_parameters() != model().num_parameters())
        std::printf("each rank stores %.3fM of them: 1/%d of the vocabulary's rows\n",
                    double(model().stored_parameters()) / 1e6, P_);
    if (R_ > 1)
        std::printf(
            "ranks: %d (%s communicator), batch %lld per rank; vocab-parallel "
            "groups of %d%s\n",
            R_, world_.name().c_str(), (long long)B_, P_, zero1_description().c_str());
    std::printf("data: %lld train tokens in %zu shard(s), %lld batches of %lldx%lld per epoch\n",
                (long long)train_loader_->num_tokens(), train_loader_->num_shards(),
                (long long)train_loader_->batches_per_epoch(), (long long)B_, (long long)T_);
    std::printf("run directory: %s\n", result_.run_dir.c_str());
    if (!resumed_from_.empty())
        std::printf("resumed from %s at step %lld\n", resumed_from_.c_str(),
                    (long long)start_step_);
    else if (cfg_.train.resume == "auto")
        std::printf("no valid checkpoint in %s: starting from step 0\n", ckpt_dir_.c_str());
    std::fflush(stdout);
}

// What ZeRO-1 shards, for the start-up report ("" without it).
std::string TrainingRun::zero1_description() const {
    if (!zero1_) return "";
    if (P_ == 1)
        return "; AdamW moments sharded over the " + std::to_string(R_) + " ranks (ZeRO-1)";
    const int peers = R_ / P_;
    return "; AdamW moments sharded (ZeRO-1): the replicated weights' over all " +
           std::to_string(R_) + " ranks, " +
           (peers > 1 ? "each vocabulary shard's over the " + std::to_string(peers) +
                            " ranks that hold it"
                      : "each vocabulary shard's whole on the one rank that holds it");
}

// Collective: every rank calls it (the weights and moments may be split); rank 0 writes.
void TrainingRun::checkpoint(int64_t step) {
    const auto t0 = Clock::now();
    CheckpointState st;
    st.step = step;
    st.tokens = tokens_;
    st.loader = train_loader_->position();
    st.loader_windows_per_batch = windows_per_batch_;
    st.adam_steps = model().adam_steps();
    st.config_yaml = yaml_;
    st.timed_choices = model().timed_choices();
    st.m = model().adam_m();
    st.v = model().adam_v();
    model().gather_master_weights();
    if (!lead_ && P_ == 1) return;  // params() is collective only over a split vocabulary
    st.params = model().params();
    if (!lead_) return;
    const std::string path =
        save_checkpoint(ckpt_dir_, model().layout().table, st, cfg_.train.keep_checkpoints);
    // large models take long here (GPT-2 1558M: 20 GB), so say what it cost
    char line[256];
    std::snprintf(line, sizeof line, "step %lld: checkpoint %s, %.2f GB in %.1f s", (long long)step,
                  path.c_str(), 4e-9 * double(st.params.size() + st.m.size() + st.v.size()),
                  seconds_since(t0));
    message(line);
}

// A sample from the current weights, seeded by the step (the training stream is untouched).
// Sampling runs the CPU reference on a copy of the whole model. Collective: the weights may be
// split across the ranks; rank 0 samples.
void TrainingRun::print_sample(int64_t step) {
    model().gather_master_weights();
    if (!lead_ && P_ == 1) return;  // params() is collective only over a split vocabulary
    std::vector<float> weights = model().params();
    if (!lead_) return;
    if (!tokenizer_) {
        const auto dir = std::filesystem::path(cfg_.data.train).parent_path();
        tokenizer_ =
            std::make_unique<Tokenizer>(Tokenizer::load((dir / "tokenizer.json").string()));
    }
    SampleOptions so;
    so.max_new_tokens = cfg_.train.sample_tokens;
    so.temperature = 0.8;
    so.top_k = 40;
    so.stop_token = tokenizer_->document_separator();
    Rng rng(uint64_t(cfg_.train.seed) ^ uint64_t(step));
    const std::vector<uint32_t> p = tokenizer_->default_prompt();
    GPT<float> cpu(cfg_.model);
    cpu.params = std::move(weights);
    const auto out = generate(cpu, std::vector<int32_t>(p.begin(), p.end()), so, rng);
    message("sample at step " + std::to_string(step) + ":\n" +
            tokenizer_->decode(std::vector<uint32_t>(out.begin(), out.end())));
}

// The validation loss into the step's metrics record (collective).
void TrainingRun::evaluate_into(int64_t step, nlohmann::json& rec) {
    if (!val_loader_) return;
    const EvalResult e = evaluate(model(), *val_loader_, cfg_, T_, world_);
    rec["val_loss"] = e.loss;
    rec["val_ce"] = e.ce;
    result_.val_loss = e.loss;
    result_.val_ce = e.ce;
    char line[128];
    std::snprintf(line, sizeof line, "step %lld: val loss %.4f (ce %.4f)", (long long)step, e.loss,
                  e.ce);
    message(line);
}

// The steps from the start (or the checkpoint) to train.max_steps, or to a stop request any rank
// saw (SIGINT, SIGTERM), or to a non-finite loss.
void TrainingRun::run_steps() {
    if (start_step_ == 0) {
        nlohmann::json rec{{"step", 0}, {"tokens", 0}};
        evaluate_into(0, rec);
        if (val_loader_) write_metrics(rec);
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::vector<Batch> micro(cfg_.train.grad_accum,
                             Batch{std::vector<int32_t>(B_ * T_), std::vector<int32_t>(B_ * T_)});
    train_opts_ = loss_options(cfg_.loss, Reduction::sum);
    peak_ = device_.device == "cuda" ? peak_flops(device_.gpu_name, cfg_.train.precision == "bf16")
                                     : 0.0;
    flops_per_token_ = training_flops_per_token(cfg_.model, T_);
    kernels_ = kernels_json(cfg_, device_);
    step_tokens_ = B_ * T_ * cfg_.train.grad_accum * R_;
    recent_ = std::make_unique<RecentRate>(std::max<int64_t>(cfg_.train.log_every, 10));
    power_ = std::make_unique<PowerMeter>(device_.device == "cuda");
    char line[128];
    std::snprintf(line, sizeof line,
                  "start-up took %.1f s (the model, its weights and their upload: %.1f s)",
                  seconds_since(t_created_), model_seconds_);
    message(line);
    t_start_ = Clock::now();
    for (int64_t s = start_step_ + 1; s <= max_steps_ && !stop_all_; s++)
        if (!step(s, micro)) break;
    if (lead_) progress_.finish();
    save_gemm_choices();  // shapes first met after the first step (evaluation's)
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
}

bool TrainingRun::step(int64_t step, std::vector<Batch>& micro) {
    power_->read();  // not what ran between the steps (evaluation, checkpoints)
    const auto t0 = Clock::now();
    hooks_.before_step(step, rank_, model());
    const double lr = learning_rate(cfg_.optim, step - 1, max_steps_);
    // Normalise once by the valid tokens of the whole step on all ranks, not per micro-batch or
    // per rank (x1/n1 + x2/n2 is not (x1 + x2)/(n1 + n2)).
    int64_t n_valid = 0;
    for (Batch& b : micro) {
        train_loader_->next_batch(b.inputs.data(), b.targets.data());
        for (int32_t y : b.targets) n_valid += y != cfg_.loss.ignore_index;
    }
    n_valid = world_.sum(n_valid);
    const double grad_out = n_valid ? 1.0 / double(n_valid) : 0.0;
    const bool profile = step == cfg_.train.profile_step;
    model().set_op_profiling(profile);
    const bool timeline = step == cfg_.train.timeline_step;
    // CUPTI records per process: of the GPU ranks that are threads of one process, rank 0
    // records for all of them
    const std::string timeline_why_not =
        !timeline ? ""
        : local_ > 1 && world_.rank() > 0 && device_.device == "cuda"
            ? "a thread of rank 0's process, whose timeline holds this rank's work"
            : model().start_timeline();
    model().zero_grad();
    CrossEntropySummary sum;
    for (Batch& b : micro) {
        hooks_.before_micro_batch(step, &b - micro.data() + 1, rank_);
        // the last micro-batch's backward pass may start the gradient all-reduce
        if (R_ > 1 && &b == &micro.back()) model().begin_grad_sync(world_);
        const CrossEntropySummary s = model().train_micro_batch(b.inputs.data(), b.targets.data(),
                                                                B_, T_, train_opts_, grad_out);
        sum.sum_loss += s.sum_loss;
        sum.sum_ce += s.sum_ce;
        sum.sum_z_loss += s.sum_z_loss;
        sum.sum_lse += s.sum_lse;
        sum.sum_lse_sq += s.sum_lse_sq;
        sum.n_valid += s.n_valid;
        sum.max_logit = std::max(sum.max_logit, s.max_logit);
    }
    // The gradient all-reduce: what the backward pass did not already do (docs/parallel.md).
    const double comm_ms = R_ > 1 ? model().all_reduce_grads(world_) : 0.0;
    {  // the step's sums over the ranks, and whether any rank was asked to stop
        double v[7] = {sum.sum_loss,   sum.sum_ce,          sum.sum_z_loss,     sum.sum_lse,
                       sum.sum_lse_sq, double(sum.n_valid), double(g_stop != 0)};
        world_.all_reduce_sum(v, 7);
        sum.sum_loss = v[0];
        sum.sum_ce = v[1];
        sum.sum_z_loss = v[2];
        sum.sum_lse = v[3];
        sum.sum_lse_sq = v[4];
        sum.n_valid = int64_t(v[5]);
        stop_all_ = v[6] > 0;
        std::vector<double> maxes(R_);
        world_.all_gather(&sum.max_logit, maxes.data(), 1, CommType::f64);
        sum.max_logit = *std::max_element(maxes.begin(), maxes.end());
    }
    const double norm = model().clip_and_step(lr, cfg_.optim.grad_clip);
    // The GEMM algorithms this first step chose by timing (kernels.matmul_search) may differ
    // between ranks: from the next step on every rank runs, for each shape, the choice of the
    // lowest rank that ran it; rank 0 holds them all, and the checkpoints keep them.
    if (!choices_shared_) {
        if (R_ > 1 && cfg_.kernels.matmul_search > 1)
            model().set_timed_choices(all_ranks_choices(world_, model().timed_choices()));
        save_gemm_choices();
    }
    choices_shared_ = true;
    const double dt = seconds_since(t0);
    if (profile) {
        OpTimes ops = model().take_op_times();
        if (R_ > 1) ops.emplace_back("gradient all-reduce (host)", comm_ms);
        const nlohmann::json p = gather_op_profile(world_, ops, step, dt * 1e3);
        model().set_op_profiling(false);
        if (lead_) {
            write_text_file(result_.run_dir + "/op_profile_step_" + std::to_string(step) + ".json",
                            p.dump(1) + "\n");
            message(format_op_profile(p));
        }
    }
    if (timeline) {
        const nlohmann::json mine = timeline_json(model().stop_timeline(), timeline_why_not);
        const nlohmann::json t = gather_rank_reports(world_, mine, step, dt * 1e3);
        if (lead_) {
            write_text_file(result_.run_dir + "/timeline_step_" + std::to_string(step) + ".json",
                            t.dump(1) + "\n");
            message(format_step_timeline(t));
        }
    }
    tokens_ += step_tokens_;
    const double inv = sum.n_valid ? 1.0 / double(sum.n_valid) : 0.0;
    result_.train_loss = sum.sum_loss * inv;
    result_.steps = step;

    nlohmann::json rec{{"step", step},
                       {"loss", sum.sum_loss * inv},
                       {"ce", sum.sum_ce * inv},
                       {"z_loss", sum.sum_z_loss * inv},
                       {"lse_mean", sum.sum_lse * inv},
                       {"lse_sq_mean", sum.sum_lse_sq * inv},
                       {"max_logit", sum.max_logit},
                       {"grad_norm", norm},
                       {"lr", lr},
                       {"tokens", tokens_},
                       {"step_ms", dt * 1e3},
                       {"tok_per_s", double(step_tokens_) / dt},
                       {"mfu", nullptr}};
    // MFU on a GPU with a known peak; the CPU has none (no peak FLOP/s for an arbitrary CPU).
    if (peak_ > 0) rec["mfu"] = flops_per_token_ * double(step_tokens_) / dt / (peak_ * gpus_);
    if (model().device_memory_bytes() > 0) rec["peak_mem_gb"] = model().device_memory_bytes() / 1e9;
    if (model().device_memory_in_use_bytes() > 0)
        rec["gpu_mem_in_use_gb"] = model().device_memory_in_use_bytes() / 1e9;
    if (R_ > 1) {
        rec["grad_all_reduce_ms"] = comm_ms;
        if (const double c = model().compute_ms(); c >= 0) rec["compute_ms"] = c;
    }
    if (const PowerMeter::Reading pw = power_->read(); pw.samples > 0) {
        rec["power_w"] = pw.power_w;  // this rank's GPU
        rec["sm_clock_mhz"] = pw.sm_clock_mhz;
    }
    rec["kernels"] = kernels_;
    recent_->add(dt, step_tokens_);
    const double tok_s = recent_->tokens_per_s();
    if (lead_)
        progress_.update({step, max_steps_, step - start_step_, sum.sum_loss * inv,
                          sum.sum_ce * inv, sum.sum_z_loss * inv, lr, norm, tok_s,
                          seconds_since(t_start_),
                          peak_ > 0 ? flops_per_token_ * tok_s / (peak_ * gpus_) : -1.0});
    // A non-finite loss cannot recover (AdamW would spread NaN into every weight): stop, keep the
    // last good checkpoint, and say so in the summary so a sweep counts the run as done.
    if (!std::isfinite(result_.train_loss) || !std::isfinite(norm)) {
        result_.diverged = true;
        write_metrics(rec);
        message("step " + std::to_string(step) +
                ": the loss or gradient norm is not finite; stopping (diverged)");
        return false;
    }
    const bool last = step == max_steps_ || stop_all_;
    if (last || (cfg_.train.eval_every > 0 && step % cfg_.train.eval_every == 0))
        evaluate_into(step, rec);
    write_metrics(rec);
    // the last step keeps its weights unless told not to; a stopped run always does
    if ((last && (stop_all_ || cfg_.train.checkpoint_at_end)) ||
        (cfg_.train.checkpoint_every > 0 && step % cfg_.train.checkpoint_every == 0))
        checkpoint(step);
    if (cfg_.train.sample_every > 0 && step % cfg_.train.sample_every == 0) print_sample(step);
    return true;
}

// The summary: summary.json and the last line of the log (rank 0).
TrainResult TrainingRun::finish() {
    result_.seconds = seconds_since(t_start_);
    nlohmann::json summary{{"steps", result_.steps},     {"train_loss", result_.train_loss},
                           {"seconds", result_.seconds}, {"tokens", tokens_},
                           {"stopped_early", stop_all_}, {"diverged", result_.diverged}};
    if (val_loader_) {
        summary["val_loss"] = result_.val_loss;
        summary["val_ce"] = result_.val_ce;
    }
    if (!lead_) return result_;
    write_text_file(result_.run_dir + "/summary.json", summary.dump(2) + "\n");
    std::printf("done: %lld steps in %s, train loss %.4f%s; run directory %s\n",
                (long long)result_.steps, format_duration(result_.seconds).c_str(),
                result_.train_loss,
                val_loader_ ? (", val loss " + std::to_string(result_.val_loss)).c_str() : "",
                result_.run_dir.c_str());
    return result_;
}

}  // namespace

TrainResult train(Config cfg, const std::string& config_path, const std::string& command_line,
                  Communicator& world) {
    TrainingRun run(std::move(cfg), config_path, command_line, world);
    run.load_gemm_choices();
    if (run.config().train.resume == "auto") run.resume();
    run.write_run_files();
    run.announce();
    run.run_steps();
    return run.finish();
}

}  // namespace zgpt

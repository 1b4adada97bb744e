// Run configuration: YAML sections mapped onto structs whose defaults live here, in code.
// Config files hold only overrides. One field table (config_fields) drives parsing, `--set`
// overrides, range checks, `train --help` and the resolved config saved with each run.
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/gpt_config.h"

namespace zgpt {

struct DataConfig {
    std::string train;  // glob of training shards, e.g. data/shards/kjv/train_*.bin
    std::string val;    // glob of validation shards; empty: no validation
    bool shuffle = true;
    std::string sampling =
        "epochs";  // epochs | random (nanoGPT's: random offsets, with replacement)
};

struct TrainConfig {
    int batch_size = 8;  // sequences per micro-batch
    int seq_len = 0;     // 0: model.block_size
    int grad_accum = 1;  // micro-batches per optimizer step
    int64_t max_steps = 1000;
    int64_t eval_every = 250;  // 0: only at the end
    int eval_batches = 20;
    int64_t log_every = 10;
    int64_t seed = 1337;
    std::string out_dir = "runs";
    std::string run_name;            // empty: <config name>-<date>-<time>
    std::string device = "auto";     // auto | cpu | cuda
    int threads = 0;                 // CPU threads; 0: all cores
    int64_t checkpoint_every = 500;  // 0: only at the end (and on SIGINT/SIGTERM)
    int keep_checkpoints = 3;
    // a checkpoint after the last step (a stop request always writes one); benchmarks turn it
    // off: GPT-2 1558M's weights and AdamW moments are 20 GB
    bool checkpoint_at_end = true;
    std::string resume;  // "" | "auto": continue from the newest valid checkpoint of the run dir
    int64_t sample_every = 0;  // print a generated sample every N steps; 0: never
    int64_t sample_tokens = 200;
    // Time each op of this step on every rank and write the table (op_profile_step_N.json in the
    // run directory, and the log); 0: never. That step runs every op on one stream.
    int64_t profile_step = 0;
    // Record the GPU's timeline of this step on every rank (timeline_step_N.json in the run
    // directory, and the log): busy, idle and communication-alone time, the longest idle gaps
    // and the kernels with the most time; 0: never. The streams run as in any other step.
    int64_t timeline_step = 0;
    std::string precision = "bf16";  // bf16 | fp32 (GPU; the CPU always trains in fp32)
    bool recompute_gelu = false;     // GPU: recompute GELU in backward instead of storing it
    // GPU: keep each block's input only, and run the block's forward again in backward
    bool recompute_block = false;
    // GPU bf16: the residual stream, its gradient, the norms' inputs and their backward's weights
    // in fp32 (PyTorch autocast's recipe) instead of bf16 (the norms' forward reads fp32 weights
    // either way)
    bool fp32_residual = false;
};

struct OptimConfig {
    double lr = 6e-4;
    double min_lr = 6e-5;
    int64_t warmup_steps = 0;
    std::string decay = "cosine";  // cosine | linear | constant
    int64_t decay_steps = 0;       // 0: train.max_steps
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double weight_decay = 0.1;  // decoupled, on matrices only
    // Wortsman et al.'s independent decay: a step shrinks the weights by weight_decay x lr / lr
    // (the schedule's shape alone) instead of weight_decay x lr
    bool weight_decay_independent = false;
    double grad_clip = 1.0;  // global norm; 0: off
};

// The coefficient AdamW multiplies by the step's LR: weight_decay, or weight_decay / optim.lr
// when the decay is independent of the LR's size.
inline double decoupled_weight_decay(const OptimConfig& o) {
    return o.weight_decay_independent ? o.weight_decay / o.lr : o.weight_decay;
}

struct LossConfig {
    double z_loss_weight = 0.0;
    double label_smoothing = 0.0;
    int ignore_index = -100;
};

// Several ranks (processes started by `train --nproc N`, torchrun, srun or mpirun; or threads of
// one process with local_ranks). train.batch_size is per rank: the global batch of a step is
// batch_size x grad_accum x ranks.
struct ParallelConfig {
    int local_ranks = 1;     // > 1: this many ranks as threads of one process (local communicator)
    int vocab_parallel = 1;  // ranks per vocab-parallel group of the loss head; 1: off
    bool zero1 = false;      // shard the AdamW moments across the ranks (ZeRO-1)
    // Gradient all-reduce buckets of about this many MB, started during the backward pass as
    // the blocks' gradients become final (GPU, nccl); 0: one all-reduce after the backward pass.
    // -1 (the default): chosen by the link, grad_bucket_mb_for_link() (docs/parallel.md).
    double grad_bucket_mb = -1;
    // SMs the GEMMs leave to NCCL while collectives run beside them (the bucketed all-reduce, the
    // split head's chunks), and the most CTAs NCCL may use; 0: the GEMMs take every SM, and a
    // GEMM launched beside a resident NCCL kernel waits for it (docs/parallel.md).
    int collective_sms = 0;
    double timeout_s = 300;  // a peer that does not arrive within this stops every rank
    // How the host waits for the vocabulary group's collectives (GPU, nccl). each: every call
    // returns once its collective is done (bounded by timeout_s; a hang is named at its
    // collective), so the host queues nothing behind it meanwhile. at_sync: a call returns once
    // queued, and the host waits (bounded the same) only where it next reads their results: the
    // loss, the gradient norm. at_sync keeps the GPU fed between the split's collectives.
    std::string vocab_collective_wait = "at_sync";
};

struct Config {
    ModelConfig model;
    DataConfig data;
    TrainConfig train;
    OptimConfig optim;
    LossConfig loss;
    KernelChoice kernels;
    ParallelConfig parallel;
};

// One entry of the field table.
struct ConfigField {
    std::string section, key, help;
    std::variant<int*, int64_t*, double*, bool*, std::string*> value;
    double lo = -1e300, hi = 1e300;  // allowed numeric range
    bool lo_open = false, hi_open = false;
    std::vector<std::string> choices;  // allowed strings; empty: any
    std::string path() const { return section + "." + key; }
};

std::vector<ConfigField> config_fields(Config& c);

// The tokens a sequence of a batch holds: train.seq_len, or model.block_size where it is 0.
inline int64_t sequence_length(const Config& c) {
    return c.train.seq_len > 0 ? c.train.seq_len : c.model.block_size;
}

// parallel.grad_bucket_mb as a run uses it: a value of 0 or more as given; -1 by the link, 0
// inside one node (over NVLink the overlap slows the backward pass by more than it hides) and
// kGradBucketMbAcrossNodes across nodes (a link-bound all-reduce then hides the passes).
constexpr double kGradBucketMbAcrossNodes = 25;
double grad_bucket_mb_for_link(double configured, int nodes);

// Loads a YAML file (may be empty: defaults), applies `section.key=value` overrides, then checks
// every value. Errors throw zgpt::Error naming the key path and file:line (or the override).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from YAML text (a checkpoint's saved config); `origin` names it in messages.
Config load_config_text(const std::string& yaml, const std::string& origin);

// Cross-field checks (also run by load_config).
void validate(const Config& c);

// Applies `section.key=value` overrides to c with each value's own checks (type, range, choices)
// but not the cross-field ones: for tools that take a few keys without a whole config (bench_ce).
void apply_overrides(Config& c, const std::vector<std::string>& overrides);

// The kernels' keys other than the families' variant choices (kernels.linear_ce_*,
// kernels.fc_bias_in_dw, kernels.<family>_tuning.*, ...) as JSON, nested as in the config, for
// metrics, provenance and the bench tools' results.
nlohmann::json kernel_tuning_json(const Config& c);

// Why `name` cannot be a train.run_name (a run directory must stay inside out_dir); empty: it can.
std::string run_name_problem(const std::string& name);

std::string config_to_yaml(const Config& c);
std::string config_reference();  // every key with its default and meaning, for --help
// The same as the Markdown of docs/config.md (`train --config-reference`).
std::string config_reference_markdown();

}  // namespace zgpt

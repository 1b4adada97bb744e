#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>

#include "data/file_read.h"
#include "kernels/core/check.h"

namespace zgpt {

std::vector<ConfigField> config_fields(Config& c) {
    using F = ConfigField;
    const double inf = 1e300;
    std::vector<F> f;
    auto add = [&](F x) { f.push_back(std::move(x)); };
    ModelConfig& m = c.model;
    add({"model", "n_layer", "transformer blocks", &m.n_layer, 1, 1024});
    add({"model", "n_head", "attention heads", &m.n_head, 1, 1024});
    add({"model", "n_embd", "channels", &m.n_embd, 1, 65536});
    add({"model", "block_size", "maximum context length", &m.block_size, 1, 1 << 20});
    add({"model", "vocab_size", "vocabulary; 0: read from tokenizer.json beside the train shards",
         &m.vocab_size, 0, 1 << 30});
    add({"model", "tie_embeddings", "share wte with the LM head", &m.tie_embeddings});
    add({"model", "bias", "biases in linear layers and LayerNorms", &m.bias});
    add({"model", "qk_norm", "model.norm on each head's q and k", &m.qk_norm});
    add({"model", "init_std", "std of the normal initialisation", &m.init_std, 0, 10, true});
    add({"model", "init_jitter",
         "each initial weight times (1 + init_jitter x a normal draw): another, equally valid "
         "start on the same batches, to measure how far runs spread (0: none)",
         &m.init_jitter, 0, 1});
    add({"model", "init_jitter_seed", "the seed of model.init_jitter's draws", &m.init_jitter_seed,
         0, 2147483647});
    add({"model", "ln_eps", "epsilon of the norms (LayerNorm or RMSNorm)", &m.ln_eps, 0, 1, true});
    add({"model", "init_from",
         "start from a Hugging Face GPT-2 or Llama model.safetensors (export_hf's)", &m.init_from});
    add({"model",
         "norm",
         "the block's norms: GPT-2's LayerNorm, or RMSNorm (weight only)",
         &m.norm,
         0,
         0,
         false,
         false,
         {"layernorm", "rmsnorm"}});
    add({"model",
         "position",
         "positions: a learned table (wpe), or rotary embeddings on q and k",
         &m.position,
         0,
         0,
         false,
         false,
         {"learned", "rope"}});
    add({"model", "rope_theta", "rope: base of the rotation frequencies", &m.rope_theta, 1, 1e12});
    add({"model",
         "mlp",
         "MLP: fc, GELU, proj; or SwiGLU, down(silu(gate) * up)",
         &m.mlp,
         0,
         0,
         false,
         false,
         {"gelu", "swiglu"}});
    add({"model", "mlp_hidden",
         "MLP hidden width; 0: 4 n_embd (gelu), 2/3 of 4 n_embd rounded up to mlp_multiple_of "
         "(swiglu)",
         &m.mlp_hidden, 0, 1 << 20});
    add({"model", "mlp_multiple_of", "swiglu with mlp_hidden 0: the hidden width's multiple",
         &m.mlp_multiple_of, 1, 1 << 16});
    add({"model", "n_kv_head",
         "key/value heads, grouped-query attention (divides n_head); 0: n_head", &m.n_kv_head, 0,
         1024});
    DataConfig& d = c.data;
    add({"data", "train", "glob of training token shards (.bin)", &d.train});
    add({"data", "val", "glob of validation shards; empty: no validation", &d.val});
    add({"data", "shuffle", "shuffle windows each epoch (seeded)", &d.shuffle});
    add({"data",
         "sampling",
         "epochs: each window once per epoch; random: nanoGPT's random offsets",
         &d.sampling,
         0,
         0,
         false,
         false,
         {"epochs", "random"}});
    TrainConfig& t = c.train;
    add({"train", "batch_size", "sequences per micro-batch", &t.batch_size, 1, 1 << 20});
    add({"train", "seq_len", "tokens per sequence; 0: model.block_size", &t.seq_len, 0, 1 << 20});
    add({"train", "grad_accum", "micro-batches per optimizer step", &t.grad_accum, 1, 1 << 20});
    add({"train", "max_steps", "optimizer steps", &t.max_steps, 1, 1e15});
    add({"train", "eval_every", "validation every N steps (and at 0 and the end); 0: end only",
         &t.eval_every, 0, 1e15});
    add({"train", "eval_batches",
         "validation batches per evaluation; 0: the whole validation split (every window once)",
         &t.eval_batches, 0, 1 << 20});
    add({"train", "log_every", "progress line every N steps when not on a terminal", &t.log_every,
         1, 1e15});
    add({"train", "seed", "seed for initialisation and data order", &t.seed, 0, 9.2e18});
    add({"train", "out_dir", "directory that holds run directories", &t.out_dir});
    add({"train", "run_name", "run directory name; empty: <config>-<date>-<time>", &t.run_name});
    add({"train",
         "device",
         "where to train: auto = the GPU when there is one, else the CPU (the log says why)",
         &t.device,
         0,
         0,
         false,
         false,
         {"auto", "cpu", "cuda"}});
    add({"train", "threads", "CPU threads; 0: all cores", &t.threads, 0, 4096});
    add({"train", "checkpoint_every", "checkpoint every N steps (and at the end); 0: end only",
         &t.checkpoint_every, 0, 1e15});
    add({"train", "keep_checkpoints", "newest checkpoints kept", &t.keep_checkpoints, 1, 1 << 20});
    add({"train", "checkpoint_at_end",
         "write a checkpoint after the last step (a stop request always writes one)",
         &t.checkpoint_at_end});
    add({"train", "sample_every",
         "print a sample (temperature 0.8, top-k 40) every N steps; 0: never", &t.sample_every, 0,
         1e15});
    add({"train", "sample_tokens", "tokens per printed sample", &t.sample_tokens, 1, 1e6});
    add({"train", "profile_step",
         "time each op of this step on every rank (op_profile_step_N.json); 0: never",
         &t.profile_step, 0, 1e15});
    add({"train", "timeline_step",
         "record the GPU's timeline of this step on every rank (timeline_step_N.json): busy, "
         "idle and communication-alone time, the longest gaps; 0: never",
         &t.timeline_step, 0, 1e15});
    add({"train",
         "resume",
         "auto: continue from the run directory's newest valid checkpoint",
         &t.resume,
         0,
         0,
         false,
         false,
         {"", "auto"}});
    add({"train",
         "precision",
         "GPU arithmetic: bf16 weights/activations with fp32 master weights, or fp32 throughout",
         &t.precision,
         0,
         0,
         false,
         false,
         {"bf16", "fp32"}});
    add({"train", "recompute_gelu",
         "GPU: recompute GELU (or SwiGLU) in backward (saves B x T x the MLP's width)",
         &t.recompute_gelu});
    add({"train", "recompute_block",
         "GPU: keep only each block's input and run the block's forward again in backward (one "
         "block's activations instead of n_layer's, for about a third more forward work)",
         &t.recompute_block});
    add({"train", "fp32_residual",
         "GPU bf16: residual stream, its gradient and LayerNorm inputs in fp32 (as autocast)",
         &t.fp32_residual});
    OptimConfig& o = c.optim;
    add({"optim", "lr", "peak learning rate", &o.lr, 0, 100, true});
    add({"optim", "min_lr", "learning rate at the end of the decay", &o.min_lr, 0, 100});
    add({"optim", "warmup_steps", "linear warmup steps", &o.warmup_steps, 0, 1e15});
    add({"optim",
         "decay",
         "schedule after warmup",
         &o.decay,
         0,
         0,
         false,
         false,
         {"cosine", "linear", "constant"}});
    add({"optim", "decay_steps", "step where the decay reaches min_lr; 0: train.max_steps",
         &o.decay_steps, 0, 1e15});
    add({"optim", "beta1", "AdamW beta1", &o.beta1, 0, 1, false, true});
    add({"optim", "beta2", "AdamW beta2", &o.beta2, 0, 1, false, true});
    add({"optim", "eps", "AdamW epsilon", &o.eps, 0, 1, true});
    add({"optim", "weight_decay", "decoupled weight decay (matrices only)", &o.weight_decay, 0,
         10});
    add({"optim", "weight_decay_independent",
         "decay independent of the LR's size (Wortsman et al.): weights shrink by weight_decay x "
         "lr / optim.lr a step",
         &o.weight_decay_independent});
    add({"optim", "grad_clip", "global grad-norm clip; 0: off", &o.grad_clip, 0, inf});
    LossConfig& l = c.loss;
    add({"loss", "z_loss_weight", "z-loss weight: adds w * lse^2 per token", &l.z_loss_weight, 0,
         1e6});
    add({"loss", "label_smoothing", "label smoothing eps", &l.label_smoothing, 0, 1, false, true});
    add({"loss", "ignore_index", "target id that is ignored", &l.ignore_index, -(1 << 30),
         1 << 30});
    ParallelConfig& par = c.parallel;
    add({"parallel", "local_ranks",
         "ranks as threads of this process (local communicator; CPU, or several on one GPU)",
         &par.local_ranks, 1, 1024});
    add({"parallel", "vocab_parallel",
         "ranks per vocab-parallel group: the LM head's rows split among them; 1: off",
         &par.vocab_parallel, 1, 1024});
    add({"parallel", "zero1",
         "shard the AdamW moments across the ranks (ZeRO-1; a split vocabulary's rows across the "
         "ranks that hold the same ones)",
         &par.zero1});
    add({"parallel", "grad_bucket_mb",
         "gradient all-reduce buckets of about this many MB, started during the backward pass "
         "(GPU, nccl); 0: one all-reduce after the backward pass; -1: by the link, 25 when the "
         "ranks span several nodes and 0 inside one (docs/parallel.md)",
         &par.grad_bucket_mb, -1, 1e6});
    add({"parallel", "collective_sms",
         "SMs the GEMMs leave to NCCL while a collective overlaps them (grad_bucket_mb, the split "
         "head's chunks), and NCCL's most CTAs (GPU, nccl); 0: GEMMs take every SM",
         &par.collective_sms, 0, 64});
    add({"parallel", "timeout_s",
         "a rank that fails or a peer that never arrives stops all ranks within this many "
         "seconds; keep it above the longest step, checkpoint write or printed sample",
         &par.timeout_s, 0, 1e7, true});
    add({"parallel",
         "vocab_collective_wait",
         "how the host waits for the vocabulary group's collectives (GPU, nccl): each, once done "
         "(a hang is named at its collective), or at_sync, where it next reads their results (the "
         "loss, the gradient norm), queueing the work behind them meanwhile; both bounded by "
         "timeout_s",
         &par.vocab_collective_wait,
         0,
         0,
         false,
         false,
         {"each", "at_sync"}});
    KernelChoice& k = c.kernels;
    // one key per registered family (kernels/core/registry.h), its variants the allowed values
    for (const KernelFamily& f : kernel_families())
        add({"kernels", f.name, f.help, &kernel_choice(k, f.name), 0, 0, false, false, f.variants});
    add({"kernels", "linear_ce_row_block",
         "fused_linear*: rows per tile (0: 16384 in training, 8192 in bench_ce; fused_linear_rows: "
         "8192)",
         &k.linear_ce_row_block, 0, 1 << 30});
    add({"kernels", "linear_ce_vocab_chunk",
         "fused_linear: vocabulary columns per tile (0: from linear_ce_chunk_mb)",
         &k.linear_ce_vocab_chunk, 0, 1 << 30});
    add({"kernels", "linear_ce_rows_outer",
         "fused_linear: each row block's whole head before the next (with linear_ce_row_block)",
         &k.linear_ce_rows_outer});
    add({"kernels", "linear_ce_chunk_mb",
         "fused_linear*: MB of bf16 logits per tile, with linear_ce_vocab_chunk 0 (0: 192 in "
         "training, 48 in bench_ce; fused_linear_rows: its rows from the MB when "
         "linear_ce_row_block is 0)",
         &k.linear_ce_chunk_mb, 0, 1 << 20});
    add({"kernels", "linear_ce_filter_eps",
         "fused_linear_rows_filtered: dh and dW skip each 128 x 32 piece of dlogits whose "
         "|softmax - target| are all below this (Cut Cross-Entropy's filter; not exact); 0 skips "
         "nothing",
         &k.linear_ce_filter_eps, 0, 1});
    add({"kernels", "linear_ce_wgmma_cluster",
         "fused_linear_wgmma: CTAs per cluster of its kernels, 1 or 2 (a pair shares each weight "
         "tile by TMA multicast, reading half as much of it from L2; as fast on an H100) "
         "(0: 1)",
         &k.linear_ce_wgmma_cluster, 0, 2});
    add({"kernels", "matmul_search",
         "cuBLASLt GEMMs (the layers', the LM head's, and the fused heads' tile products): "
         "candidate algorithms timed at the first use of each shape, the fastest kept for the "
         "run (0 or 1: cuBLASLt's first choice; at most 32)",
         &k.matmul_search, 0, 32});
    add({"kernels",
         "matmul_wgmma_schedule",
         "matmul=wgmma: both consumer warpgroups on each 128 x 256 tile beside an epilogue "
         "warpgroup (cooperative), or alternate 128 x 128 tiles, each warpgroup storing its own "
         "while the other multiplies (pingpong); the same bits",
         &k.matmul_wgmma_schedule,
         0,
         0,
         false,
         false,
         {"cooperative", "pingpong"}});
    add({"kernels", "matmul_wgmma_rope",
         "matmul=wgmma, model.position=rope without qk_norm: q and k rotated in the qkv GEMM's "
         "epilogue (false: the plain GEMM, then the rotation's own pass)",
         &k.matmul_wgmma_rope});
    add({"kernels", "matmul_wgmma_swiglu",
         "matmul=wgmma, model.mlp=swiglu: SwiGLU in the gate-and-up GEMM's epilogue (false: the "
         "plain GEMM, then SwiGLU's own pass; slower fused on an H200, so off)",
         &k.matmul_wgmma_swiglu});
    add({"kernels", "layernorm_bias_sums",
         "GPU: the attention and MLP projections' bias gradients summed inside the LayerNorm "
         "backward that writes their output gradient (false: a column-sum pass of their own)",
         &k.layernorm_bias_sums});
    add({"kernels", "layernorm_split_rows",
         "GPU, bf16: the norms' backward above 1280 columns two warps a row, each with its half's "
         "weight-gradient sums in registers (false: one warp a row, the sums in shared memory; "
         "slower at GPT-2 1558M on an H200, so off)",
         &k.layernorm_split_rows});
    add({"kernels", "fc_bias_in_dw",
         "GPU, matmul: fused_epilogue: the MLP fc layer's bias gradient as one more column of its "
         "weight-gradient GEMM (ln2 stored with a column of ones; false: a column-sum pass)",
         &k.fc_bias_in_dw});
    add({"kernels", "fc_ones_align",
         "GPU, fc_bias_in_dw: ln2's rows, with their column of ones, are C + 1 rounded up to a "
         "multiple of this many elements apart: 8 (16-byte bf16 rows) or 64 (128-byte rows; at "
         "GPT-2 1558M fc's GEMM is faster, the power-capped step is not)",
         &k.fc_ones_align, 8, 64});
    add({"kernels", "gelu_backward_in_gemm",
         "GPU, matmul: fused_epilogue or wgmma, model.mlp=gelu: GELU's derivative in the "
         "epilogue of the MLP projection's input-gradient GEMM (cuBLASLt's DGELU; false: the "
         "plain GEMM, then a GELU-backward pass)",
         &k.gelu_backward_in_gemm});
    add({"kernels",
         "split_head_reads",
         "GPU, parallel.vocab_parallel > 1: how often a shard's logits are read. two: "
         "statistics, exchange, then a second read for the gradient; one: once, with "
         "cross_entropy fast or online (the head's pass writes the local softmax in place; "
         "per-row factors after the statistics' exchange make it the gradient; label smoothing "
         "keeps two reads); auto: one with fast where a shard's row of logits is longer than "
         "48 KB (where fast runs its own kernels), two below",
         &k.split_head_reads,
         0,
         0,
         false,
         false,
         {"auto", "one", "two"}});
    add({"kernels", "head_chunks",
         "GPU: row chunks of the loss head (logits GEMM, cross-entropy, dlnf GEMM) pipelined over "
         "two streams, each of at least 1024 rows; 1: one piece. The vocab-parallel head takes as "
         "many chunks of its group's rows",
         &k.head_chunks, 1, kMaxHeadChunks});
    // The kernels' tuning knobs (CrossEntropyTuning in kernels/loss_head/cross_entropy.h,
    // AttentionTuning in kernels/attention/attention.h): nested keys,
    // kernels.<family>_tuning.<knob>, every default the kernels' own choice. Values outside a
    // knob's set are refused in check_cross.
    cuda::CrossEntropyTuning& ct = k.cross_entropy_tuning;
    const std::string ce = "cross_entropy_tuning.";
    add({"kernels", ce + "cluster",
         "fast*: CTAs per cluster, 1 to 8 (0: the fewest of 1-6 or 8 that fit the stages; "
         "fast then leaves rows of up to 48 KB to the two-pass kernels, and its other knobs do not "
         "apply to them)",
         &ct.cluster, 0, 8});
    add({"kernels", ce + "groups",
         "fast: warp groups per CTA, 2 or 3 (0: by the row length, kFastBands in plan.h)",
         &ct.groups, 0, 3});
    add({"kernels", ce + "parts", "fast: bulk copies per buffer, 1, 2 or 4 (0: 2)", &ct.parts, 0,
         4});
    add({"kernels", ce + "threads",
         "fast*: threads per CTA, 256, 512 or 1024 (0: by row length; fast's three groups "
         "have 768, so for fast it applies with groups: 2)",
         &ct.threads, 0, 1024});
    add({"kernels", ce + "smem_kb",
         "fast*: the row buffers' shared memory per CTA, KB (0: the planner's budget)", &ct.smem_kb,
         0, 1024});
    add({"kernels", ce + "min_stages",
         "fast*: row buffers the cluster size is chosen for (0: the planner's)", &ct.min_stages, 0,
         8});
    add({"kernels", ce + "helper_parts",
         "fast: the 2-CTA helper grid's bulk copies per buffer, 1, 2 or 4 (0: 1)", &ct.helper_parts,
         0, 4});
    add({"kernels", ce + "helper_weight",
         "fast: the helper grid's rows per SM against the main grid's, percent (0: no helper "
         "rows; -1: the planner's, 60-80 by the cluster size)",
         &ct.helper_weight, -1, 10000});
    add({"kernels", ce + "stats_sweeps",
         "fast: a row slice's statistics in 1 sweep (max and sums together) or 2 (max, then sums); "
         "0: the planner's, by warp group and cluster size (kStatsSweeps in plan.h)",
         &ct.stats_sweeps, 0, 2});
    add({"kernels", ce + "l2_evict_last",
         "fast: the rows' bulk copies evict last from L2 (their lines still cached when dlogits "
         "are written over them); false: the normal policy",
         &ct.l2_evict_last});
    cuda::AttentionTuning& at = k.attention_tuning;
    const std::string att = "attention_tuning.";
    add({"kernels", att + "fwd_m_tiles",
         "flash*: mma.sync forward's m-tiles of 16 query rows per warp, 1 or 2 (0: 2)",
         &at.fwd_m_tiles, 0, 2});
    add({"kernels", att + "wgmma_fwd", "flash on Hopper: the wgmma forward kernel", &at.wgmma_fwd});
    add({"kernels", att + "wgmma_bwd", "flash on Hopper: the wgmma backward kernels",
         &at.wgmma_bwd});
    add({"kernels", att + "wgmma_fwd_pipeline",
         "flash on Hopper: the wgmma forward issues tile t + 1's scores before tile t's P V",
         &at.wgmma_fwd_pipeline});
    add({"kernels", att + "wgmma_dq_tile",
         "flash on Hopper: keys per dQ tile of the wgmma backward, 32, 64 or 128 (128: the "
         "warp-specialised kernel, a TMA loader warpgroup beside two computing ones) (0: 64)",
         &at.wgmma_dq_tile, 0, 128});
    add({"kernels", att + "wgmma_dkdv_tile",
         "flash on Hopper: queries per dK/dV tile of the wgmma backward, 32, 64 or 128 (128: "
         "the warp-specialised kernel, a TMA loader warpgroup beside two computing ones; T a "
         "multiple of 4, two warpgroups) (0: 128 where that kernel runs with the TMA ring, else "
         "64)",
         &at.wgmma_dkdv_tile, 0, 128});
    add({"kernels", att + "wgmma_dkdv_wgs",
         "flash on Hopper: warpgroups per dK/dV block of the wgmma backward, 1 (blocks drift "
         "apart) or 2 (two share each tile) (0: 2)",
         &at.wgmma_dkdv_wgs, 0, 2});
    add({"kernels", att + "wgmma_dkdv_tma",
         "flash on Hopper: the dK/dV kernel's query tiles loaded by TMA into a ring handed over "
         "by mbarriers (the default tiles and warpgroups; T a multiple of 4)",
         &at.wgmma_dkdv_tma});
    add({"kernels", att + "wgmma_dq_tma",
         "flash on Hopper: the dQ kernel's key tiles loaded by TMA into a ring handed over by "
         "mbarriers (64-key tiles)",
         &at.wgmma_dq_tma});
    add({"kernels", att + "wgmma_fwd_tma",
         "flash on Hopper: the forward kernel's key tiles loaded by TMA into a ring handed over "
         "by mbarriers",
         &at.wgmma_fwd_tma});
    add({"kernels", att + "wgmma_fwd_keys",
         "flash on Hopper: keys per tile of the wgmma forward, 64 or 128 (128: with the TMA "
         "ring; half the tiles, the diagonal one of a block's first warpgroup half masked) (0: "
         "128 with the TMA ring, 64 without)",
         &at.wgmma_fwd_keys, 0, 128});
    add({"kernels", att + "unrounded_dsum",
         "flash in bf16: the forward also keeps its output's rounding residual (2 bytes an "
         "element more a layer), so that the backward's D = rowsum(dO O) reads the output "
         "unrounded; with peaked attention rows D from the rounded output drowns the gradient at "
         "a row's winning key",
         &at.unrounded_dsum});
    return f;
}

nlohmann::json kernel_tuning_json(const Config& c0) {
    Config c = c0;
    nlohmann::json j = nlohmann::json::object();
    for (const ConfigField& f : config_fields(c)) {
        if (f.section != "kernels") continue;
        const size_t dot = f.key.find('.');
        if (find_kernel_family(f.key)) continue;  // a variant choice: kernels_json's
        nlohmann::json& at = dot == std::string::npos ? j : j[f.key.substr(0, dot)];
        const std::string name = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
        std::visit([&](auto* p) { at[name] = *p; }, f.value);
    }
    return j;
}

namespace {

std::string where(const std::string& file, const YAML::Node& n) {
    return file + ":" + std::to_string(n.Mark().line + 1);
}

std::string describe(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
}

std::string range_text(const ConfigField& f) {
    std::ostringstream s;
    s << (f.lo_open ? "(" : "[") << f.lo << ", " << f.hi << (f.hi_open ? ")" : "]");
    return s.str();
}

// The test that matters: what nlohmann-json (provenance, checkpoints) accepts as UTF-8.
bool valid_utf8(const std::string& s) {
    try {
        (void)nlohmann::json(s).dump();
        return true;
    } catch (const nlohmann::json::type_error&) {
        return false;
    }
}

// A mapping's key as text, or an error naming where it is (a list or a map as a key).
std::string key_text(const YAML::Node& k, const std::string& file) {
    if (!k.IsScalar())
        throw Error(where(file, k) + ": a key must be a plain name, got " + describe(k));
    return k.Scalar();
}

// Sets one field from a YAML node; `ctx` is "file:line" or "--set ...".
void set_field(const ConfigField& f, const YAML::Node& n, const std::string& ctx) {
    const std::string at = ctx + ": " + f.path() + ": ";
    auto check_range = [&](double v) {
        const bool ok = std::isfinite(v) && (f.lo_open ? v > f.lo : v >= f.lo) &&
                        (f.hi_open ? v < f.hi : v <= f.hi);
        if (!ok) throw Error(at + "value " + n.Scalar() + " is out of range " + range_text(f));
    };
    std::visit(
        [&](auto* p) {
            using P = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<P, std::string>) {
                if (n.IsNull()) {
                    *p = "";
                    return;
                }
                if (!n.IsScalar()) throw Error(at + "expected a string, got " + describe(n));
                // Every string ends up in JSON (provenance, checkpoints), which takes UTF-8 only:
                // refused here, not at the first checkpoint.
                if (!valid_utf8(n.Scalar())) throw Error(at + "the value is not valid UTF-8");
                if (!f.choices.empty()) {
                    bool ok = false;
                    std::string all;
                    for (const auto& c : f.choices) {
                        ok = ok || c == n.Scalar();
                        all += (all.empty() ? "" : ", ") + c;
                    }
                    if (!ok) throw Error(at + "'" + n.Scalar() + "' is not one of: " + all);
                }
                *p = n.Scalar();
            } else {
                const char* kind = std::is_same_v<P, bool>     ? "true or false"
                                   : std::is_same_v<P, double> ? "a number"
                                                               : "an integer";
                P v{};
                if (!n.IsScalar() || !YAML::convert<P>::decode(n, v))
                    throw Error(at + "expected " + kind + ", got " + describe(n));
                if constexpr (!std::is_same_v<P, bool>) check_range(double(v));
                *p = v;
            }
        },
        f.value);
}

ConfigField* find_field(std::vector<ConfigField>& fields, const std::string& section,
                        const std::string& key) {
    for (auto& f : fields)
        if (f.section == section && f.key == key) return &f;
    return nullptr;
}

// Whether `group` is the first part of dotted keys of the section (cross_entropy_tuning).
bool has_group(const std::vector<ConfigField>& fields, const std::string& section,
               const std::string& group) {
    for (const auto& f : fields)
        if (f.section == section && f.key.rfind(group + ".", 0) == 0) return true;
    return false;
}

std::string known_keys(const std::vector<ConfigField>& fields, const std::string& section) {
    std::string s;
    for (const auto& f : fields)
        if (section.empty() ? s.find(f.section) == std::string::npos : f.section == section)
            s += (s.empty() ? "" : ", ") + (section.empty() ? f.section : f.key);
    return s;
}

// Applies one `section.key=value` (the key may be dotted: kernels.cross_entropy_tuning.parts);
// returns the key's path.
std::string set_override(std::vector<ConfigField>& fields, const std::string& o) {
    const auto eq = o.find('='), dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
        throw Error("--set " + o + ": expected section.key=value");
    const std::string sname = o.substr(0, dot), key = o.substr(dot + 1, eq - dot - 1);
    ConfigField* f = find_field(fields, sname, key);
    if (!f) throw Error("--set " + o + ": unknown key " + sname + "." + key);
    YAML::Node n;
    try {
        n = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
        throw Error("--set " + o + ": cannot parse the value: " + e.msg);
    }
    set_field(*f, n, "--set " + o);
    return f->path();
}

// key path -> "file:line" of where it was set, for cross-field error messages
using Origins = std::map<std::string, std::string>;

// The tuning knobs whose values form a set, not a range; `at(key)` says where the key was set.
void check_tuning_sets(const KernelChoice& k,
                       const std::function<std::string(const std::string&)>& at) {
    const std::string cet = "kernels.cross_entropy_tuning.", att = "kernels.attention_tuning.";
    const cuda::CrossEntropyTuning& ct = k.cross_entropy_tuning;
    const cuda::AttentionTuning& tt = k.attention_tuning;
    auto one_of = [&](const std::string& key, int v, std::initializer_list<int> set) {
        std::string all;
        for (int x : set) {
            if (v == x) return;
            all += (all.empty() ? "" : ", ") + std::to_string(x);
        }
        throw Error(at(key) + std::to_string(v) + " is not one of: " + all);
    };
    one_of(cet + "groups", ct.groups, {0, 2, 3});
    one_of("kernels.fc_ones_align", k.fc_ones_align, {8, 64});
    one_of(cet + "parts", ct.parts, {0, 1, 2, 4});
    one_of(cet + "threads", ct.threads, {0, 256, 512, 1024});
    one_of(cet + "helper_parts", ct.helper_parts, {0, 1, 2, 4});
    one_of(cet + "stats_sweeps", ct.stats_sweeps, {0, 1, 2});
    one_of(att + "wgmma_dq_tile", tt.wgmma_dq_tile, {0, 32, 64, 128});
    one_of(att + "wgmma_dkdv_tile", tt.wgmma_dkdv_tile, {0, 32, 64, 128});
    one_of(att + "wgmma_dkdv_wgs", tt.wgmma_dkdv_wgs, {0, 1, 2});
    one_of(att + "wgmma_fwd_keys", tt.wgmma_fwd_keys, {0, 64, 128});
    if (tt.wgmma_fwd_keys == 128 && (!tt.wgmma_fwd_tma || tt.wgmma_fwd_pipeline))
        throw Error(at(att + "wgmma_fwd_keys") +
                    "128-key tiles are the forward kernel's with the TMA ring: they need " + att +
                    "wgmma_fwd_tma true and " + att + "wgmma_fwd_pipeline false");
    if (tt.wgmma_dkdv_tile == 128 && tt.wgmma_dkdv_wgs == 1)
        throw Error(at(att + "wgmma_dkdv_tile") +
                    "128 is the warp-specialised kernel, whose two computing warpgroups share "
                    "each tile: it needs " +
                    att + "wgmma_dkdv_wgs 2 (or 0)");
}

void check_cross(const Config& c, const Origins& origins) {
    auto at = [&](const std::string& key) {
        auto it = origins.find(key);
        return (it == origins.end() ? std::string("(default)") : it->second) + ": " + key + ": ";
    };
    if (c.model.n_embd % c.model.n_head != 0)
        throw Error(at("model.n_embd") + std::to_string(c.model.n_embd) +
                    " is not divisible by model.n_head = " + std::to_string(c.model.n_head));
    if (c.parallel.grad_bucket_mb < 0 && c.parallel.grad_bucket_mb != -1)
        throw Error(at("parallel.grad_bucket_mb") +
                    "takes -1 (by the link), 0 (off) or a size in MB above 0");
    const ModelConfig& m = c.model;
    const int kv = m.n_kv_head == 0 ? m.n_head : m.n_kv_head;
    if (m.n_kv_head > m.n_head || m.n_head % kv != 0)
        throw Error(at("model.n_kv_head") + std::to_string(m.n_kv_head) +
                    " does not divide model.n_head = " + std::to_string(m.n_head));
    if (m.position == "rope" && (m.n_embd / m.n_head) % 2 != 0)
        throw Error(at("model.position") + "rope rotates pairs of channels: the head size " +
                    "model.n_embd / model.n_head = " + std::to_string(m.n_embd / m.n_head) +
                    " must be even");
    if (c.train.seq_len > c.model.block_size)
        throw Error(at("train.seq_len") + std::to_string(c.train.seq_len) +
                    " exceeds model.block_size = " + std::to_string(c.model.block_size));
    if (c.optim.min_lr > c.optim.lr) throw Error(at("optim.min_lr") + "must not exceed optim.lr");
    if (c.data.train.empty())
        throw Error(at("data.train") + "must name the training shards (a glob of .bin files)");
    if (const std::string p = run_name_problem(c.train.run_name); !p.empty())
        throw Error(at("train.run_name") + p);
    const KernelChoice& k = c.kernels;
    const bool linear_head = is_linear_cross_entropy(k.cross_entropy);
    if (linear_head && c.train.precision == "fp32")
        throw Error(at("kernels.cross_entropy") + k.cross_entropy +
                    " runs in bf16 only; set train.precision=bf16 or another head");
    if (k.attention_tuning.unrounded_dsum && c.train.precision == "fp32")
        throw Error(at("kernels.attention_tuning.unrounded_dsum") +
                    "keeps the bf16 output's rounding residual; in fp32 nothing is rounded (set "
                    "it false or train.precision=bf16)");
    if (is_whole_rows_linear_cross_entropy(k.cross_entropy) && c.parallel.vocab_parallel > 1)
        throw Error(at("kernels.cross_entropy") + k.cross_entropy +
                    " runs the whole vocabulary on one GPU; with "
                    "parallel.vocab_parallel > 1 take fast, fused_linear or fused_linear_wgmma");
    check_tuning_sets(k, at);
    // Each tuning key away from its default must be one the chosen variant of its family reads
    // (the registry's data, kernels/core/registry.cpp): with another variant it would be silently
    // ignored.
    const std::string cet = "cross_entropy_tuning.", att = "attention_tuning.";
    const cuda::CrossEntropyTuning& ct = k.cross_entropy_tuning;
    const cuda::AttentionTuning& tt = k.attention_tuning;
    const cuda::CrossEntropyTuning cd;
    const cuda::AttentionTuning ad;
    const KernelChoice kd;
    struct Knob {
        std::string key;
        const char* family;
        bool set;
    };
    const std::vector<Knob> knobs = {
        {"linear_ce_row_block", "cross_entropy", k.linear_ce_row_block != 0},
        {"linear_ce_vocab_chunk", "cross_entropy", k.linear_ce_vocab_chunk != 0},
        {"linear_ce_rows_outer", "cross_entropy", k.linear_ce_rows_outer},
        {"linear_ce_chunk_mb", "cross_entropy", k.linear_ce_chunk_mb != 0},
        {"linear_ce_filter_eps", "cross_entropy",
         k.linear_ce_filter_eps != kd.linear_ce_filter_eps},
        {"linear_ce_wgmma_cluster", "cross_entropy", k.linear_ce_wgmma_cluster != 0},
        {cet + "cluster", "cross_entropy", ct.cluster != cd.cluster},
        {cet + "threads", "cross_entropy", ct.threads != cd.threads},
        {cet + "smem_kb", "cross_entropy", ct.smem_kb != cd.smem_kb},
        {cet + "min_stages", "cross_entropy", ct.min_stages != cd.min_stages},
        {cet + "groups", "cross_entropy", ct.groups != cd.groups},
        {cet + "parts", "cross_entropy", ct.parts != cd.parts},
        {cet + "helper_parts", "cross_entropy", ct.helper_parts != cd.helper_parts},
        {cet + "helper_weight", "cross_entropy", ct.helper_weight != cd.helper_weight},
        {cet + "stats_sweeps", "cross_entropy", ct.stats_sweeps != cd.stats_sweeps},
        {cet + "l2_evict_last", "cross_entropy", ct.l2_evict_last != cd.l2_evict_last},
        {att + "fwd_m_tiles", "attention", tt.fwd_m_tiles != ad.fwd_m_tiles},
        {att + "wgmma_fwd", "attention", tt.wgmma_fwd != ad.wgmma_fwd},
        {att + "wgmma_bwd", "attention", tt.wgmma_bwd != ad.wgmma_bwd},
        {att + "wgmma_fwd_pipeline", "attention", tt.wgmma_fwd_pipeline != ad.wgmma_fwd_pipeline},
        {att + "wgmma_dq_tile", "attention", tt.wgmma_dq_tile != ad.wgmma_dq_tile},
        {att + "wgmma_dkdv_tile", "attention", tt.wgmma_dkdv_tile != ad.wgmma_dkdv_tile},
        {att + "wgmma_dkdv_wgs", "attention", tt.wgmma_dkdv_wgs != ad.wgmma_dkdv_wgs},
        {att + "wgmma_dkdv_tma", "attention", tt.wgmma_dkdv_tma != ad.wgmma_dkdv_tma},
        {att + "wgmma_dq_tma", "attention", tt.wgmma_dq_tma != ad.wgmma_dq_tma},
        {att + "wgmma_fwd_tma", "attention", tt.wgmma_fwd_tma != ad.wgmma_fwd_tma},
        {att + "wgmma_fwd_keys", "attention", tt.wgmma_fwd_keys != ad.wgmma_fwd_keys},
        {att + "unrounded_dsum", "attention", tt.unrounded_dsum != ad.unrounded_dsum},
        {"matmul_wgmma_schedule", "matmul", k.matmul_wgmma_schedule != kd.matmul_wgmma_schedule},
        {"matmul_wgmma_rope", "matmul", k.matmul_wgmma_rope != kd.matmul_wgmma_rope},
        {"matmul_wgmma_swiglu", "matmul", k.matmul_wgmma_swiglu != kd.matmul_wgmma_swiglu},
    };
    for (const Knob& n : knobs) {
        if (!n.set) continue;
        const std::string& chosen = kernel_choice(k, n.family);
        const std::vector<std::string>& reads = variant_traits(n.family, chosen).reads;
        if (std::find(reads.begin(), reads.end(), n.key) == reads.end())
            throw Error(at("kernels." + n.key) + "applies to kernels." + n.family + "=" +
                        variants_reading(n.family, n.key) + " only (it is " + chosen + ")");
    }
    if (k.linear_ce_rows_outer && k.linear_ce_row_block == 0)
        throw Error(at("kernels.linear_ce_rows_outer") +
                    "needs kernels.linear_ce_row_block > 0 (the rows of each block it loops "
                    "over)");
}

}  // namespace

void validate(const Config& c) {
    check_cross(c, {});
}

void apply_overrides(Config& c, const std::vector<std::string>& overrides) {
    std::vector<ConfigField> fields = config_fields(c);
    Origins origins;
    for (const std::string& o : overrides) origins[set_override(fields, o)] = "--set " + o;
    check_tuning_sets(c.kernels, [&](const std::string& key) {
        auto it = origins.find(key);
        return (it == origins.end() ? std::string("(default)") : it->second) + ": " + key + ": ";
    });
}

namespace {

// The config in `root` (from `path`, used in messages), then the overrides, then the checks.
Config config_from_yaml(const YAML::Node& root, const std::string& path,
                        const std::vector<std::string>& overrides) {
    Config c;
    std::vector<ConfigField> fields = config_fields(c);
    Origins origins;
    if (!root.IsNull() && !root.IsMap())
        throw Error(where(path, root) + ": the config must be a mapping of sections");
    if (root.IsMap()) {
        std::map<std::string, std::string> seen;  // "section" / "section.key" -> where
        auto once = [&](const std::string& name, const YAML::Node& at) {
            const auto [it, fresh] = seen.emplace(name, where(path, at));
            if (!fresh)
                throw Error(where(path, at) + ": '" + name + "' appears twice (first at " +
                            it->second + "); YAML would silently keep the last");
        };
        for (const auto& sec : root) {
            const std::string sname = key_text(sec.first, path);
            once(sname, sec.first);
            if (known_keys(fields, sname).empty())
                throw Error(where(path, sec.first) + ": unknown section '" + sname +
                            "' (known: " + known_keys(fields, "") + ")");
            if (sec.second.IsNull()) continue;
            if (!sec.second.IsMap())
                throw Error(where(path, sec.second) + ": " + sname +
                            ": expected a mapping of keys");
            // a key, or a group of nested keys (kernels: {cross_entropy_tuning: {parts: 2}} is
            // kernels.cross_entropy_tuning.parts, which may also be written as one dotted key)
            std::function<void(const std::string&, const YAML::Node&)> keys =
                [&](const std::string& prefix, const YAML::Node& map) {
                    for (const auto& kv : map) {
                        const std::string key = prefix + key_text(kv.first, path);
                        ConfigField* f = find_field(fields, sname, key);
                        if (!f && kv.second.IsMap() && has_group(fields, sname, key)) {
                            keys(key + ".", kv.second);
                            continue;
                        }
                        once(sname + "." + key, kv.first);
                        if (!f)
                            throw Error(where(path, kv.first) + ": unknown key " + sname + "." +
                                        key + " (known in " + sname + ": " +
                                        known_keys(fields, sname) + ")");
                        set_field(*f, kv.second, where(path, kv.second));
                        origins[f->path()] = where(path, kv.second);
                    }
                };
            keys("", sec.second);
        }
    }
    for (const std::string& o : overrides) origins[set_override(fields, o)] = "--set " + o;
    check_cross(c, origins);
    return c;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
    const std::string text = read_regular_file(path, "config file");
    std::vector<YAML::Node> docs;
    try {
        docs = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
        throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
    }
    // A second document would be ignored by a plain load: say so instead.
    ZG_CHECK(docs.size() <= 1, path + ": " + std::to_string(docs.size()) +
                                   " YAML documents (separated by ---); a config is one");
    return config_from_yaml(docs.empty() ? YAML::Node() : docs[0], path, overrides);
}

Config load_config_text(const std::string& yaml, const std::string& origin) {
    YAML::Node root;
    try {
        root = YAML::Load(yaml);
    } catch (const YAML::Exception& e) {
        throw Error(origin + ":" + std::to_string(e.mark.line + 1) +
                    ": YAML syntax error: " + e.msg);
    }
    return config_from_yaml(root, origin, {});
}

double grad_bucket_mb_for_link(double configured, int nodes) {
    if (configured >= 0) return configured;
    return nodes > 1 ? kGradBucketMbAcrossNodes : 0;
}

std::string run_name_problem(const std::string& name) {
    if (name != "." && name != ".." && name.find('/') == std::string::npos) return "";
    return "\"" + name +
           "\" must be one plain folder name inside train.out_dir (no '/', not '.' or '..')";
}

// The shortest decimal that reads back as exactly x.
static std::string shortest(double x) {
    char buf[40];
    for (int digits = 1; digits <= 17; digits++) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (std::strtod(buf, nullptr) == x) break;
    }
    return buf;
}

std::string config_to_yaml(const Config& c0) {
    Config c = c0;
    YAML::Emitter e;
    e << YAML::BeginMap;
    std::string section, group;  // group: the open nested map of dotted keys ("" none)
    for (const ConfigField& f : config_fields(c)) {
        const size_t dot = f.key.find('.');
        const std::string g = dot == std::string::npos ? "" : f.key.substr(0, dot);
        if ((f.section != section || g != group) && !group.empty()) e << YAML::EndMap;
        if (f.section != section) {
            if (!section.empty()) e << YAML::EndMap;
            section = f.section;
            e << YAML::Key << section << YAML::Value << YAML::BeginMap;
            group.clear();
        }
        if (g != group && !g.empty()) e << YAML::Key << g << YAML::Value << YAML::BeginMap;
        group = g;
        e << YAML::Key << (g.empty() ? f.key : f.key.substr(dot + 1)) << YAML::Value;
        std::visit(
            [&](auto* p) {
                using P = std::remove_pointer_t<decltype(p)>;
                if constexpr (std::is_same_v<P, double>)
                    e << shortest(*p);  // 0.003, not 0.0030000000000000001
                else
                    e << *p;
            },
            f.value);
    }
    if (!group.empty()) e << YAML::EndMap;
    e << YAML::EndMap << YAML::EndMap;
    return std::string(e.c_str()) + "\n";
}

// A field's default as the references print it: strings quoted, doubles as the stream writes
// them (--help) or in the fewest digits that read back the same (docs/config.md).
static std::string default_text(const ConfigField& f, bool shortest_doubles) {
    std::ostringstream def;
    std::visit(
        [&](auto* p) {
            using P = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<P, bool>)
                def << (*p ? "true" : "false");
            else if constexpr (std::is_same_v<P, std::string>)
                def << '"' << *p << '"';
            else if constexpr (std::is_same_v<P, double>)
                shortest_doubles ? def << shortest(*p) : def << *p;
            else
                def << *p;
        },
        f.value);
    return def.str();
}

std::string config_reference() {
    Config c;
    std::ostringstream s;
    std::string section;
    for (const ConfigField& f : config_fields(c)) {
        if (f.section != section) s << "\n" << (section = f.section) << ":\n";
        std::string line = "  " + f.key + ": " + default_text(f, false);
        line.resize(std::max<size_t>(line.size() + 1, 34), ' ');
        s << line << "# " << f.help;
        if (!f.choices.empty()) {
            s << " (";
            for (size_t i = 0; i < f.choices.size(); i++) s << (i ? "|" : "") << f.choices[i];
            s << ")";
        }
        s << "\n";
    }
    return s.str();
}

std::string config_reference_markdown() {
    Config c;
    std::ostringstream s;
    s << "# Config reference\n\n"
         "Generated by `build/train --config-reference > docs/config.md` from the field table in "
         "train/config.cpp, the same table that drives `--set`, the range checks and `--help`; "
         "the test `docs_config_reference` fails when this file differs from it.\n\n"
         "A config file holds only overrides of these defaults. An unknown key, a wrong type or "
         "an out-of-range value is an error that names the key path and `file:line`. "
         "`--set section.key=value` overrides a key from the command line; in YAML the tuning "
         "keys nest (`kernels: {cross_entropy_tuning: {parts: 4}}`) or stay dotted.\n";
    // A table cell holds no '|' of its own.
    const auto cell = [](const std::string& t) {
        std::string r;
        for (char ch : t) {
            if (ch == '|') r += '\\';
            r += ch;
        }
        return r;
    };
    std::string section;
    for (const ConfigField& f : config_fields(c)) {
        if (f.section != section)
            s << "\n## " << (section = f.section) << "\n\n| key | default | meaning |\n"
              << "| --- | --- | --- |\n";
        s << "| `" << f.path() << "` | `" << default_text(f, true) << "` | " << cell(f.help);
        if (!f.choices.empty()) {
            s << " (";
            for (size_t i = 0; i < f.choices.size(); i++)
                s << (i ? ", " : "") << "`" << f.choices[i] << "`";
            s << ")";
        }
        s << " |\n";
    }
    return s.str();
}

}  // namespace zgpt

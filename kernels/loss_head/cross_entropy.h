// The loss head: vocab-parallel cross-entropy with z-loss and label smoothing. CPU reference.
//
// Per row i with target y, over the global vocabulary of size V:
//   lse  = m + log d                    (m: max logit, d: sum exp(x - m); online softmax)
//   ce   = (1 - eps) (lse - x_y) + eps (lse - sum(x) / V)      (PyTorch's label smoothing)
//   z    = z_loss_weight * lse^2
//   loss = ce + z
//   dloss/dx_j = softmax_j (1 + 2 z_loss_weight lse) - (1 - eps) [j == y] - eps / V
// Rows whose target is ignore_index contribute nothing and get a zero gradient.
//
// A row may be split into vocabulary shards [v0, v0 + V_local). Each shard computes RowStats; stats
// merge exactly (like online-softmax blocks), then every shard writes its own dlogits from the
// merged lse. One shard covering [0, V) is the unsharded case.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zgpt {

enum class Reduction { mean, sum, none };
Reduction parse_reduction(const std::string& s);  // "mean" | "sum" | "none"
const char* reduction_name(Reduction r);

struct CrossEntropyOptions {
    int64_t ignore_index = -100;
    double label_smoothing = 0.0;  // in [0, 1)
    double z_loss_weight = 0.0;    // >= 0 and finite
    Reduction reduction = Reduction::mean;
};

// Throws zgpt::Error naming the bad option (z < 0, NaN or inf; label_smoothing outside [0, 1)).
void validate(const CrossEntropyOptions& opts);

// Online-softmax statistics of one row over one shard (double: the reference is the oracle).
struct RowStats {
    double max = -__builtin_inf();  // max logit
    double sum_exp = 0.0;           // sum of exp(x - max)
    double target_logit = 0.0;      // x_y if this shard owns y, else 0 (merge adds)
    double sum_logits = 0.0;        // for label smoothing
};

// Exact merge of two shards' statistics of the same row.
RowStats merge(const RowStats& a, const RowStats& b);

// Gradient of the final loss w.r.t. the reduced loss: one scalar (mean, sum) or one value per row
// (none).
struct GradOutput {
    const double* values = nullptr;
    bool per_row = false;
};

// Per-row outputs (length N each); a null pointer means "not wanted".
struct CrossEntropyRows {
    double* loss = nullptr;
    double* ce = nullptr;
    double* z_loss = nullptr;
    double* lse = nullptr;
};

// Sums over non-ignored rows, and the loss reduced as asked (for none: the sum of rows).
struct CrossEntropySummary {
    double loss = 0.0;
    double sum_loss = 0.0, sum_ce = 0.0, sum_z_loss = 0.0, sum_lse = 0.0;
    double sum_lse_sq = 0.0;  // sum of lse^2 (log^2 Z), whatever the z-loss weight
    int64_t n_valid = 0;
    double max_logit = -__builtin_inf();  // over all rows (read before dlogits overwrite logits)
};

namespace cpu {

// Statistics of rows [0, N) over the shard's V_local columns. Row i starts at logits + i * ld.
template <typename T>
void ce_shard_stats(RowStats* stats, const T* logits, int64_t ld, const int32_t* targets, int64_t N,
                    int64_t V_local, int64_t v0, int64_t ignore_index);

// acc[i] = merge(acc[i], shard[i])
void ce_merge_stats(RowStats* acc, const RowStats* shard, int64_t N);

// From merged statistics: per-row outputs, the summary, and each row's gradient factor
// (grad_output, divided by the number of valid rows for mean; 0 on ignored rows). lse_out (N) is
// required: the backward pass needs it.
CrossEntropySummary ce_finalize(const RowStats* stats, const int32_t* targets, int64_t N, int64_t V,
                                const CrossEntropyOptions& opts, GradOutput grad_output,
                                CrossEntropyRows rows, double* lse_out, double* row_grad);

// dlogits of one shard; dlogits may equal logits (gradient written in place).
template <typename T>
void ce_shard_backward(T* dlogits, const T* logits, int64_t ld, const int32_t* targets,
                       const double* lse, const double* row_grad, int64_t N, int64_t V_local,
                       int64_t v0, int64_t V, const CrossEntropyOptions& opts);

// The whole head on unsharded rows (columns [0, V) of a row of stride ld): loss, per-row outputs,
// and, when compute_grad, dlogits written in place over the logits.
template <typename T>
CrossEntropySummary cross_entropy(T* logits, int64_t ld, const int32_t* targets, int64_t N,
                                  int64_t V, const CrossEntropyOptions& opts,
                                  GradOutput grad_output, CrossEntropyRows rows, bool compute_grad);

}  // namespace cpu
}  // namespace zgpt

// ---------------------------------------------------------------------------------------------
// CUDA loss head (kernels/loss_head/cross_entropy/*.cu; CUDA builds only). All pointers are device
// pointers, nothing is read on the host, and every launch is stream-ordered: the head can be
// captured in a CUDA graph. Indexing is 64-bit. Results are deterministic (no atomics).
struct CUstream_st;
namespace zgpt::cuda {

enum class LogitsType { f32, bf16 };

// Per-row statistics of one shard. sum_excl excludes the target column (its exp(x_y - max) is
// added back when the row is finalised): 1 - p_y = sum_excl / d stays exact when p_y -> 1.
struct RowStatsF {
    float max;
    float sum_excl;
    float target_logit;  // 0 in shards that do not own the target
    float sum_logits;
};

// What the finalise step leaves for the backward pass of each shard.
struct RowGradParams {
    float max, log2_d;  // p_j = 2^((x_j - max) log2(e) - log2_d)
    float coef;         // g (1 + 2 z lse); 0 on ignored rows
    float d_target;     // the target column's dlogit, computed without cancellation
    float smooth;       // g eps / V, subtracted from every column
};

// Reduced results, left on the device.
struct LossSummaryF {
    float loss;  // reduced per the reduction (mean over valid rows, sum, or sum of rows for none)
    float sum_loss, sum_ce, sum_z_loss, sum_lse, sum_lse_sq, max_logit;
    int n_valid;
};

// The `fast` variants' tuning knobs (the planners in kernels/loss_head/cross_entropy/plan.h), for
// sweeps and tests. Every default leaves the choice to the planner, which picks what the H100
// measurements chose (docs/cross_entropy.md); a value outside a knob's set is ignored (the
// planner's choice), and the config (kernels.cross_entropy_tuning.*) refuses it. The variants
// other than fast and fast_lockstep ignore them all.
struct CrossEntropyTuning {
    // CTAs per cluster, 1..8; 0: the fewest whose slices fit the wanted stages, and `fast` leaves
    // rows of up to ce::kFastOnlineMaxRowBytes to the two-pass kernels (its knobs then unused)
    int cluster = 0;
    int groups = 0;  // fast: warp groups per CTA, 2 | 3; 0: by the row length (ce::kFastBands)
    int parts = 0;   // fast: bulk copies per buffer, 1 | 2 | 4 (4: 256-thread groups); 0: 2
    // threads per CTA, 256 | 512 | 1024 (fast with two groups: 512 | 1024; three have 768);
    // 0: by the row length
    int threads = 0;
    int smem_kb = 0;       // the buffers' shared memory per CTA in KB; 0: the planner's budget
    int min_stages = 0;    // the stages the cluster size is chosen for; 0: the planner's
    int helper_parts = 0;  // fast's 2-CTA helper grid: bulk copies per buffer, 1 | 2 | 4; 0: 1
    // fast's helper grid: its rows per SM against the main grid's, in percent (0: no helper
    // rows); -1: the planner's, by the main grid's cluster size (ce::kHelperBands)
    int helper_weight = -1;
    // fast: the statistics of a row's slice in 1 sweep over shared memory (a running max, the sums
    // against a reference chunk's max) or 2 (the max, then the sums); 0: by the warp groups'
    // threads and the cluster size (ce::kStatsSweeps)
    int stats_sweeps = 0;
    // fast: each row's bulk copy marked to be evicted last from L2, so that its lines are still
    // there when the row's dlogits are written over them; false: the normal policy
    bool l2_evict_last = true;
    // fast, bf16 logits, outside graph capture: run the kernel that records where a row's time
    // goes, wait for it and print the phases to stderr. A diagnostic, not a tuning (it
    // synchronises the stream and prints at every launch), so bench_ce --trace sets it and the
    // trainer's config has no key for it.
    bool trace = false;
};

struct CrossEntropyArgs {
    const void* logits = nullptr;  // [N, ld], columns [0, V_local) are this shard
    LogitsType type = LogitsType::bf16;
    int64_t ld = 0, N = 0, V_local = 0, v0 = 0, V = 0;  // V: the global vocabulary
    const int32_t* targets = nullptr;
    const float* grad_output = nullptr;  // scalar, or per row when reduction is none
    void* dlogits = nullptr;             // may equal logits (in place)
    float* loss_rows = nullptr;          // N each; optional
    float* ce_rows = nullptr;
    float* z_rows = nullptr;
    float* lse_rows = nullptr;
    // [N, 2]: each row's largest logit and log2 of sum_j exp(x_j - max); optional
    float* stat_rows = nullptr;
    LossSummaryF* summary = nullptr;  // required
    CrossEntropyTuning tuning;        // the defaults: the planners' choices
    // A target outside [0, V) that is not ignore_index lies in another vocabulary shard: its row
    // is valid, has no target column here, and its dlogits are p_j alone (the one-read shard
    // pass, kernels/loss_head/shard_one_read.h). Off: every valid target is a column of the row.
    bool absent_targets = false;
};

// A registered implementation of the whole head on rows that hold the full vocabulary on this
// device (v0 == 0, V_local == V). The bench tool, the tests and the trainer iterate this table.
struct CrossEntropyVariant {
    const char* name;
    const char* description;
    size_t (*workspace_bytes)(int64_t N, int64_t V_local, LogitsType type);
    void (*run)(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
                CUstream_st* stream);
};
const std::vector<CrossEntropyVariant>& cross_entropy_variants();
const CrossEntropyVariant& find_cross_entropy_variant(const std::string& name);

// The vocab-parallel building blocks (a shard is [v0, v0 + V_local) of each row):
// stats of one shard -> merge across shards (NCCL across GPUs, this kernel on one) -> finalise
// -> backward of each shard -> reduce.
void ce_count_valid(int* n_valid, const int32_t* targets, int64_t N, int64_t ignore_index,
                    CUstream_st* s);
// accumulate: merge the shard's statistics into `stats` (as ce_merge_stats would) instead of
// overwriting them, saving the merge's launch and the partials' buffer.
void ce_shard_stats(RowStatsF* stats, const CrossEntropyArgs& a, const CrossEntropyOptions& o,
                    CUstream_st* s, bool accumulate = false);
void ce_merge_stats(RowStatsF* acc, const RowStatsF* shard, int64_t N, CUstream_st* s);
void ce_finalize(RowGradParams* params, const RowStatsF* stats, const int* n_valid,
                 const CrossEntropyArgs& a, const CrossEntropyOptions& o, CUstream_st* s);
void ce_shard_backward(const CrossEntropyArgs& a, const RowGradParams* params,
                       const CrossEntropyOptions& o, CUstream_st* s);
// Needs a.ce_rows and a.lse_rows (each row's z-loss and loss are recomputed from them, with
// finalize's rounding); writes a.summary.
void ce_reduce(const CrossEntropyArgs& a, const RowStatsF* stats, const int* n_valid,
               const CrossEntropyOptions& o, CUstream_st* s);

}  // namespace zgpt::cuda

// ---------------------------------------------------------------------------------------------
// The fused linear + cross-entropy head (kernels/loss_head/linear_cross_entropy.cu; CUDA builds
// only): from hidden states and the LM-head weight; the full logits never exist. A variant's run()
// takes the whole vocabulary; the vocab-parallel path is linear_ce_shard_stats / _backward below.
namespace zgpt::cuda {

// fused_linear's schedule: tiles of row_block rows x vocab_chunk columns of bf16 logits. Every
// default (0, false) is the H100 sweep's choice (kernels/loss_head/linear_cross_entropy.cu). The
// config keys are kernels.linear_ce_row_block, _vocab_chunk, _chunk_mb and _rows_outer.
// fused_linear_rows reads row_block (0: 8192) or chunk_mb, and fp32_dweight_only. A variant's
// workspace_bytes must be given the tuning its run() will get: the workspace's layout follows it.
struct LinearCrossEntropyTuning {
    int64_t vocab_chunk = 0;  // vocabulary columns per tile; 0: from the tile's memory budget
    int64_t row_block = 0;    // rows per tile; 0: 8192 (fused_linear_rows too)
    int64_t chunk_mb = 0;     // the tile's MB of bf16 logits, when vocab_chunk is 0; 0: 48
    // With dweight_acc and several row blocks: each row block's whole head (statistics, then
    // gradients over every vocabulary chunk) before the next block, so dh needs only a row
    // block's fp32 accumulator; dW accumulates across blocks in dweight_acc.
    bool rows_outer = false;
    // The logits tiles on Hopper's wgmma with the CE in the GEMM's epilogue: set by the
    // fused_linear_wgmma variant (and by a caller of the shard functions that chose it), not a
    // config key. Where the kernels cannot run (not sm_90, C % 8 != 0) the cuBLASLt tiles do.
    bool wgmma_epilogue = false;
    // CTAs per cluster of the wgmma kernels, 1 or 2 (a pair shares each weight tile by TMA
    // multicast, kernels/gemm/hopper_gemm.cuh; as fast as single CTAs on an H100); 0: 1
    int wgmma_cluster = 0;
    // cuBLASLt candidates timed for the tiles' products (Gemm::search; the model passes
    // kernels.matmul_search); 0 or 1: the heuristic's first
    int gemm_search = 0;
    // fused_linear_rows: the caller passes dweight_acc (a trainer's fp32 gradient), so the
    // workspace holds no fp32 [V, C] accumulator for a bf16 dweight over several row blocks
    bool fp32_dweight_only = false;
    // fused_linear_rows_filtered: dh and dW skip each 128 x 32 piece of dlogits whose
    // |softmax - target| are all below this (2^-12, Cut Cross-Entropy's bf16 threshold, by
    // default; kernels.linear_ce_filter_eps); 0 skips nothing. The other heads ignore it.
    float filter_eps = 0x1p-12f;
};

struct LinearCrossEntropyArgs {
    const void* hidden = nullptr;  // [N, C] bf16
    const void* weight = nullptr;  // [V, C] bf16, or a shard's rows [V_local, C]
    // Rows the weight table has (0: V). fused_linear_rows runs its GEMMs over V rounded up to 8
    // where weight_rows allows (those rows must be zero; cuBLASLt runs odd widths on slow
    // kernels), and then writes or adds that many rows of dweight / dweight_acc (zeros past V).
    int64_t weight_rows = 0;
    int64_t N = 0, C = 0, V = 0;  // V: the global vocabulary
    int64_t v0 = 0, V_local = 0;  // the shard's rows of W: [v0, v0 + V_local); V_local 0: all V
    const int32_t* targets = nullptr;
    const float* grad_output = nullptr;  // scalar, or per row when reduction is none
    // Gradients; all null: loss only (evaluation), the second pass is skipped.
    void* dhidden = nullptr;  // [N, C] bf16, written
    // [V_local, C] bf16, written (fp32 accumulation inside the GEMM); fused_linear_rows with
    // weight_rows >= V rounded up to 8 writes that many rows (of dweight_acc too)
    void* dweight = nullptr;
    float* dweight_acc = nullptr;  // or [V_local, C] fp32, added into (a trainer's gradient arena)
    float* loss_rows = nullptr;    // N each; optional
    float* ce_rows = nullptr;
    float* z_rows = nullptr;
    float* lse_rows = nullptr;
    LossSummaryF* summary = nullptr;                                   // required
    LinearCrossEntropyTuning tuning;                                   // the schedule
    int64_t local_vocab() const { return V_local > 0 ? V_local : V; }  // the shard's rows of W
};

struct LinearCrossEntropyVariant {
    const char* name;
    const char* description;
    // Enough for either loop order.
    size_t (*workspace_bytes)(int64_t N, int64_t C, int64_t V,
                              const LinearCrossEntropyTuning& tuning);
    void (*run)(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o, void* workspace,
                CUstream_st* stream);
};
const std::vector<LinearCrossEntropyVariant>& linear_cross_entropy_variants();
// The checks a fused linear head's run() makes, `who` (its name) in the messages: the arguments,
// the options, a summary, gradients as dhidden with dweight or dweight_acc, the whole vocabulary.
// Returns whether gradients are asked for.
bool check_linear_ce_run(const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o,
                         const std::string& who);
// A fused linear head's CE view of all its rows, `all`, narrowed to rows [r, r + n): the
// targets and the per-row outputs (those given) move with it, and the per-row grad_output for
// reduction `red` none. Logits and summary stay the caller's to set.
CrossEntropyArgs ce_rows_view(const CrossEntropyArgs& all, int64_t r, int64_t n, Reduction red);
const LinearCrossEntropyVariant& find_linear_cross_entropy_variant(const std::string& name);

// Vocab-parallel building blocks of fused_linear, for a shard holding the weight's rows
// [a.v0, a.v0 + a.V_local) of the global vocabulary a.V (always the vocabulary-outside order):
//   linear_ce_shard_stats on each shard -> merge the statistics across shards (ce_merge_stats on
//   one GPU) -> ce_finalize -> linear_ce_shard_backward on each shard, adding its dh into one fp32
//   [N, C] buffer (to be summed across GPUs) and writing or adding its own dW rows -> ce_reduce.
// The workspace holds one tile (linear_ce_shard_workspace_bytes); the per-row outputs and the
// summary come from the ce_finalize / ce_reduce steps.
size_t linear_ce_shard_workspace_bytes(int64_t N, int64_t C, int64_t V_local,
                                       const LinearCrossEntropyTuning& tuning);
void linear_ce_shard_stats(RowStatsF* stats, const LinearCrossEntropyArgs& a,
                           const CrossEntropyOptions& o, void* workspace, CUstream_st* s);
void linear_ce_shard_backward(float* dh_acc, const RowGradParams* params,
                              const LinearCrossEntropyArgs& a, const CrossEntropyOptions& o,
                              void* workspace, CUstream_st* s);

}  // namespace zgpt::cuda

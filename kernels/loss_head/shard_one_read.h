// The vocab-parallel head's one-read shard pass (CUDA builds only; the model's loss_sharded wires
// it). The two-read path reads a shard's logits once for the row statistics, exchanges them, and
// reads them again for the gradient. The one-read path instead runs a whole-row variant (fast,
// online) once over the shard with its local targets (CrossEntropyArgs::absent_targets), grad
// output 1 and no z-loss, so each row's logits become, in place,
//     q_j = p_local_j = exp(x_j - lse_local)       and  q_t = p_local_t - 1 at a local target t.
// After the exchange the row's true dlogits are a q_j, plus c at t, with per-row factors
//     a = g (1 + 2 z lse) exp(lse_local - lse),    c = d_target - a q_t,
// so the backward GEMMs take q as it is: dh_i = a_i (q W)_i + c_i W[t_i], and
// dW = q^T (a h) + sum over rows of c_i h_i into row t_i. Label smoothing's constant term is not
// folded in: with it the head keeps the two-read path.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/core/dtype.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/cross_entropy/plan.h"

struct CUstream_st;
namespace zgpt::cuda {

// Where the one read pays (kernels.split_head_reads: auto): shard rows that `fast` runs in its own
// cluster kernels (longer than 48 KB; shorter rows it leaves to online, whose pass reads each row
// twice anyway). There fast's one pass beats online's two at every length measured on an H200
// (docs/results/ce_vocab_sweep_h200.json), and the split's step with one read against two is in
// docs/results/vocab_split_h200x2.json (one_read).
constexpr int64_t kOneReadMinRowBytes = int64_t(ce::kFastOnlineMaxRowBytes);

// The local target of every row: t - v0 where t is in [v0, v0 + V_local); ignore_index (which
// must be negative) stays; any other target becomes ce_absent_target(), outside every row. Also
// each row's target logit (0 where the target is not local) from `logits` ([N, ld] of type t),
// read before the pass overwrites them.
int32_t ce_absent_target();
void ce_local_targets(int32_t* local, float* target_logit, const int32_t* targets,
                      const void* logits, DType t, int64_t ld, int64_t N, int64_t v0,
                      int64_t V_local, int64_t ignore_index, CUstream_st* s);

// The pass's row buffers for N rows, in one allocation: each row's target logit, the pass's ce
// and stat rows (CrossEntropyArgs::ce_rows, stat_rows: 2 a row), and the factors a and c. On a
// null base it only measures (bytes), so the size and the layout are one code.
struct OneReadRows {
    float *target_logit, *ce, *stat, *a, *c;
    size_t bytes;
};
OneReadRows one_read_rows(void* base, int64_t N);

// The shard's statistics for the exchange, from the pass's stat and ce rows
// (CrossEntropyArgs::stat_rows, ce_rows) and the target logits: what ce_shard_stats would give
// without label smoothing.
void ce_local_shard_stats(RowStatsF* stats, const float* stat_rows, const float* ce_rows,
                          const float* target_logit, const int32_t* local, int64_t N,
                          int64_t V_local, CUstream_st* s);

// a and c of every row from the merged, finalised parameters (0 and 0 on ignored rows; c = 0
// where the target is not local).
void ce_local_factors(float* a, float* c, const RowGradParams* params, const float* stat_rows,
                      const float* ce_rows, const int32_t* local, int64_t N, int64_t V_local,
                      CUstream_st* s);

// dh [N, C] fp32 = q W: each row scaled by a, plus c times W's row of the local target (W
// [V_local, C] of type t).
void shard_dh_finish(float* dh, const float* a, const float* c, const int32_t* local, const void* W,
                     DType t, int64_t N, int64_t C, int64_t V_local, CUstream_st* s);

// out [N, C] = a_i h_i, in h's type (the dW GEMM's right operand).
void shard_scale_rows(void* out, const void* h, const float* a, DType t, int64_t N, int64_t C,
                      CUstream_st* s);

// dW [V_local, C] fp32 += c_i h_i into row local_i, for each row with a local target. The rows
// are sorted by target (stable) and each target row's sum is taken in row order by one thread
// per column: deterministic, no atomics.
size_t shard_dw_target_scratch_bytes(int64_t N);
void shard_dw_target_rows(float* dW, const float* c, const int32_t* local, const void* h, DType t,
                          int64_t N, int64_t C, int64_t V_local, void* scratch,
                          size_t scratch_bytes, CUstream_st* s);

}  // namespace zgpt::cuda

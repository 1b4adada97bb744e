// What the loss head's files share on the host side (not part of the public interface,
// kernels/loss_head/cross_entropy.h): argument checks, the workspace layout, and each variant's
// run(), which launch.cu registers. Each .cu launches only its own kernels (they are private to
// it); the shared steps go through the public building blocks (ce_count_valid, ce_finalize, ...).
//
//   launch.cu        the public building blocks' small kernels (count, merge, finalize, reduce),
//                    the workspace, the registry
//   naive_online.cu  naive; online and its building blocks ce_shard_stats / ce_shard_backward
//   fast.cu          fast (pingpong schedule) and fast_lockstep, their launches and trace
//   plan.h / .cpp    the planners (plain C++): block sizes, fast's cluster and helper layout
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/core/workspace.h"
#include "kernels/loss_head/cross_entropy.h"

namespace zgpt::cuda::ce {

// Throws zgpt::Error on bad options or sizes; full_row: the variant needs v0 = 0, V_local = V.
void check_args(const CrossEntropyArgs& a, const CrossEntropyOptions& o, bool full_row);

// Workspace layout shared by the variants: what the caller did not provide lives here.
struct Workspace {
    int* n_valid;
    unsigned* max_key;      // the largest logit of any row (raise_max), for the summary
    float *ce, *lse;        // where the caller gave no rows
    float* row_max;         // naive: each row's largest logit
    RowStatsF* stats;       // naive
    RowGradParams* params;  // naive
    float* probs;           // naive
};

// The layout of every variant's workspace; on a measuring layout (null base) it gives the size.
Workspace carve(WorkspaceLayout& l, int64_t N, int64_t V, bool naive);
Workspace carve(void* w, int64_t N, int64_t V, bool naive);

// The args with the ce and lse rows pointing into the workspace where the caller gave none.
CrossEntropyArgs with_rows(CrossEntropyArgs a, const Workspace& ws);

// The summary from the ce and lse rows and the row maxima (every max_stride-th float).
void reduce_rows(const CrossEntropyArgs& a, const float* row_max, int64_t max_stride,
                 const int* n_valid, const CrossEntropyOptions& o, CUstream_st* s);
// The same with the largest logit in one key (raise_max).
void reduce_rows(const CrossEntropyArgs& a, const unsigned* max_key, const int* n_valid,
                 const CrossEntropyOptions& o, CUstream_st* s);
// ce_count_valid that also sets *max_key to 0 (no row yet) for the rows' raise_max.
void count_valid_and_reset_max(int* n_valid, unsigned* max_key, const int32_t* targets, int64_t N,
                               int64_t ignore_index, CUstream_st* s);

// fast's helper grid of online's whole rows (plan_fast_helper, FastPlan::online_rows): rows
// [row0, a.N) by `blocks` blocks of `threads` with `smem` bytes of (unused) shared memory each,
// launched with programmatic serialization after the main grid. online_helper_blocks_per_sm: how
// many such blocks fit on one SM; it also sets the kernel's shared-memory limit that the launch
// needs, so it is called first.
void launch_online_helper(const CrossEntropyArgs& a, const CrossEntropyOptions& o,
                          const int* n_valid, unsigned* max_key, int64_t row0, int blocks,
                          int threads, size_t smem, CUstream_st* s);
int online_helper_blocks_per_sm(LogitsType t, int threads, size_t smem);

// The variants' run() (CrossEntropyVariant::run).
void run_naive(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w, CUstream_st* s);
void run_online(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w, CUstream_st* s);
void run_fast(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w, CUstream_st* s);
void run_fast_lockstep(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w,
                       CUstream_st* s);

}  // namespace zgpt::cuda::ce

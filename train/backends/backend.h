// What the training loop needs from a model on some device: one micro-batch forward + loss +
// backward, evaluation, the gradient norm, an AdamW step, and the state a checkpoint holds.
// make_backend picks the CPU reference (model/gpt.h, train/optimizer.h) or the GPU
// (model/gpt_cuda.h and AdamW over its device arenas).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/core/gpu_timeline.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/ops/global_norm.h"
#include "model/parameters.h"
#include "train/config.h"
#include "train/dist/comm.h"

namespace zgpt {

// Vocab parallel: the LM head and the token table split by vocabulary rows across `group`
// (train/vocab_parallel/vocab_parallel_head.h, train/vocab_parallel/vocab_sharded_arena.h);
// `peers`: the ranks that hold the same rows (one per group), over which those rows' gradients are
// summed. Null or one rank: the whole model on every rank.
struct VocabParallel {
    Communicator* group = nullptr;
    Communicator* peers = nullptr;
    bool split() const { return group && group->size() > 1; }
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "cpu" | "cuda"
    // The whole model (what checkpoints hold), whatever this rank stores.
    virtual const GptLayout& layout() const = 0;
    virtual int64_t num_parameters() const = 0;
    virtual int64_t padded_vocab() const = 0;
    // Parameters this rank stores (fewer than num_parameters() when the vocabulary is split).
    virtual int64_t stored_parameters() const = 0;

    virtual CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets,
                                                  int64_t B, int64_t T,
                                                  const CrossEntropyOptions& opts,
                                                  double grad_output) = 0;
    virtual CrossEntropySummary evaluate(const int32_t* inputs, const int32_t* targets, int64_t B,
                                         int64_t T, const CrossEntropyOptions& opts) = 0;
    virtual void zero_grad() = 0;
    // Data parallel: the gradient summed over the ranks of `comm` (the world; with a split
    // vocabulary, its rows over VocabParallel::peers). Returns the time of the collectives, in
    // ms, after the backward pass has finished on the device: with overlap, only what the
    // backward pass did not hide.
    virtual double all_reduce_grads(Communicator& comm) = 0;
    // Called before the step's last train_micro_batch: its backward pass may start the sums of
    // all_reduce_grads(comm) in buckets as the gradients become final (the GPU backend over
    // nccl, parallel.grad_bucket_mb > 0); all_reduce_grads(comm) then completes them.
    virtual void begin_grad_sync(Communicator& /*comm*/) {}
    virtual double grad_norm() = 0;
    virtual void optimizer_step(double lr, double grad_scale) = 0;
    // The step's update clipped to a global gradient norm of max_norm (0: no clipping); returns
    // the norm before clipping. The CUDA backend takes the clip factor on the GPU, so the update
    // does not wait for the host to read the norm (the same bits as this default), except with a
    // split vocabulary, whose norm is a host sum over the group.
    virtual double clip_and_step(double lr, double max_norm) {
        const double norm = grad_norm();
        optimizer_step(lr, cpu::clip_scale(norm, max_norm));
        return norm;
    }

    // Checkpoint state, as host fp32 arenas of the whole model in parameter-table order.
    // Collective (every rank calls them): params() with a split vocabulary; adam_m() and adam_v()
    // with a split vocabulary or ZeRO-1. Every rank calls gather_master_weights() before params():
    // ZeRO-1 on the GPU in bf16 gathers only the weights the passes read after a step (see
    // train/backends/zero1_weight_gather.h), and this brings the fp32 master weights whole.
    virtual void gather_master_weights() {}
    virtual std::vector<float> params() const = 0;
    virtual void set_params(const std::vector<float>& p) = 0;
    virtual std::vector<float> adam_m() const = 0;
    virtual std::vector<float> adam_v() const = 0;
    virtual void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                          int64_t steps) = 0;
    virtual int64_t adam_steps() const = 0;
    // The kernels' choices made by timing (kernels.matmul_search: the GEMM algorithm of each
    // shape), as text; saved in checkpoints, in the runs folder and handed to the other ranks, so
    // that a resumed run, the next run and every rank run the same ones. Empty where nothing is
    // chosen by timing; set_timed_choices is false (nothing changed) for another GPU or library.
    virtual std::string timed_choices() const { return ""; }
    virtual bool set_timed_choices(const std::string& /*choices*/) { return false; }

    // Per-op times of the micro-batches run between set_op_profiling(true) and take_op_times()
    // (train.profile_step): op family -> ms (GPU: events after each op, with every op on one
    // stream; CPU: wall time).
    virtual void set_op_profiling(bool on) = 0;
    virtual std::vector<std::pair<std::string, double>> take_op_times() = 0;

    // The device's timeline from start_timeline() to stop_timeline() (train.timeline_step):
    // every kernel, copy and memset with the streams as they ran, summarised
    // (kernels/core/gpu_timeline.h). start_timeline returns why it records nothing ("" when it
    // records); stop_timeline waits for the device. The CPU has no such timeline.
    virtual std::string start_timeline() { return "the CPU backend has no device timeline"; }
    virtual std::optional<TimelineSummary> stop_timeline() { return std::nullopt; }

    // The GPU time of the step's forward and backward passes (zero_grad to the end of the last
    // micro-batch's passes), read once all_reduce_grads has synchronised; -1: not measured (CPU).
    // Beside the step's time it shows what the gradient all-reduce's overlap cost the passes.
    virtual double compute_ms() const { return -1; }
    virtual double device_memory_bytes() const { return 0; }  // 0: not tracked (CPU)
    // What the device reports in use now (all allocations of this process: the model, NCCL's
    // buffers, the CUDA context); 0 on the CPU.
    virtual double device_memory_in_use_bytes() const { return 0; }
    virtual std::string describe() const = 0;  // one line for the log
};

// device: "cpu" or "cuda" (from choose_device). Initialises the weights from train.seed and
// model.init_from (the same on every rank; a split vocabulary keeps its shard's rows).
// zero1: ZeRO-1 over these ranks (the world; null: none). Each rank keeps the AdamW moments of a
// slice of the weights that every rank stores and, with a split vocabulary, of a slice of its
// rows shared with VocabParallel::peers (all of them when it has no peer); it updates its slices
// and gathers the weights (train/backends/zero1_share.h). adam_m() / adam_v() gather the whole
// state.
std::unique_ptr<Backend> make_backend(const std::string& device, const Config& cfg,
                                      VocabParallel vocab = {}, Communicator* zero1 = nullptr);

}  // namespace zgpt

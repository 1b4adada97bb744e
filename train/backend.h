// What the training loop needs from a model on some device: one micro-batch forward + loss +
// backward, evaluation, the gradient norm, an AdamW step, and the state a checkpoint holds.
// make_backend picks the CPU reference (model/gpt.h, train/optimizer.h) or the GPU
// (model/gpt_cuda.h and AdamW over its device arenas).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/rng.h"
#include "model/parameters.h"
#include "model/sample.h"
#include "train/comm.h"
#include "train/config.h"

namespace zgpt {

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "cpu" | "cuda"
    virtual const GptLayout& layout() const = 0;
    virtual int64_t num_parameters() const = 0;
    virtual int64_t padded_vocab() const = 0;

    // Forward, loss (sum reduction, each row scaled by grad_output) and backward of one
    // micro-batch; gradients are added to those of earlier micro-batches since zero_grad().
    virtual CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets,
                                                  int64_t B, int64_t T,
                                                  const CrossEntropyOptions& opts,
                                                  double grad_output) = 0;
    virtual CrossEntropySummary evaluate(const int32_t* inputs, const int32_t* targets, int64_t B,
                                         int64_t T, const CrossEntropyOptions& opts) = 0;
    virtual void zero_grad() = 0;
    // Vocab parallel: the loss head of train_micro_batch / evaluate runs split by vocabulary rows
    // across `group` (train/vocab_parallel_head.h). Null or one rank: the whole head here.
    virtual void set_vocab_group(Communicator* group) = 0;
    // Data parallel: the gradient arena summed over the ranks of `comm`. Returns the time of the
    // collective itself, in ms, after the backward pass has finished on the device.
    virtual double all_reduce_grads(Communicator& comm) = 0;
    // ZeRO-1: each rank of `comm` keeps the AdamW moments of one slice of the arena, updates that
    // slice and all-gathers the weights. adam_m() / adam_v() then gather the whole state: they
    // are collective (every rank calls them). Call before set_adam.
    virtual void shard_optimizer(Communicator& comm) = 0;
    virtual double grad_norm() = 0;
    virtual void optimizer_step(double lr, double grad_scale) = 0;

    // Checkpoint state, as host fp32 arenas in parameter-table order.
    virtual std::vector<float> params() const = 0;
    virtual void set_params(const std::vector<float>& p) = 0;
    virtual std::vector<float> adam_m() const = 0;
    virtual std::vector<float> adam_v() const = 0;
    virtual void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                          int64_t steps) = 0;
    virtual int64_t adam_steps() const = 0;

    virtual std::vector<int32_t> generate(const std::vector<int32_t>& prompt,
                                          const SampleOptions& opts, Rng& rng) = 0;
    virtual double device_memory_bytes() const { return 0; }  // 0: not tracked (CPU)
    // What the device reports in use now (all allocations of this process: the model, NCCL's
    // buffers, the CUDA context); 0 on the CPU.
    virtual double device_memory_in_use_bytes() const { return 0; }
    virtual std::string describe() const = 0;  // one line for the log
};

// device: "cpu" or "cuda" (from choose_device). Initialises the weights from train.seed and
// model.init_from.
std::unique_ptr<Backend> make_backend(const std::string& device, const Config& cfg);

}  // namespace zgpt

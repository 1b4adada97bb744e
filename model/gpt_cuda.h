// The GPT of model/gpt.h on one GPU: the same parameter table, forward, loss head and backward,
// built from the registered CUDA kernels (kernels/*/*.cu). Plain C++ header; the implementation
// is model/gpt_cuda.cu (with gpt_cuda_head.cu, gpt_cuda_profile.cu; Impl in gpt_cuda_impl.h)
// and exists only in CUDA builds.
//
// Memory: fp32 master weights and fp32 gradients in one arena each (the table's offsets), a bf16
// working copy of the weights in bf16 precision, activations allocated once per (B, T). Every
// kernel is atomic-free and sums in a fixed order, so two runs are bit-identical.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/ops/adamw.h"
#include "model/gpt_config.h"
#include "model/parameters.h"

namespace zgpt {

// Throws zgpt::Error naming the family and the known variants when a name is unknown, or when
// a choice cannot run at this precision (fused_linear needs bf16).
void validate_kernels(const KernelChoice& k, DType precision);

struct CudaModelOptions {
    DType precision = DType::bf16;
    KernelChoice kernels;
    bool recompute_gelu = false;  // keep only the MLP's pre-activation; recompute GELU/SwiGLU
    // Keep only each block's input (the residual stream) and run the block's forward again in
    // backward, into one block's buffers shared by all: the activations of one block, not L
    bool recompute_block = false;
    // bf16: keep the residual stream, its gradient, the norms' inputs (their backward's weights
    // too) and the embeddings' outputs in fp32 (as PyTorch autocast does); the matmuls still read
    // bf16. The norms' forward passes read fp32 weights either way.
    bool fp32_residual = false;
    // > 1: the vocabulary tables (wte, an untied lm_head) hold one vocab-parallel shard
    // (make_gpt_layout); set_vocab_group must then give a group of that size.
    int vocab_parts = 1;
    // SMs the split head's GEMMs leave to the collectives its chunks run beside them
    // (parallel.collective_sms; kernels/core/cuda_device.h)
    int collective_sms = 0;
};

// The collectives of a vocab-parallel loss head, supplied by train/ (model/ knows no
// communicator). Device pointers. Each call is ordered on the CUDA stream it is given (a
// cudaStream_t): it starts after the work queued there, and work queued there after it sees its
// results. It may block the host until it is done (a host communicator stages through memory, a
// device one with a timeout waits unless told not to: then settle() bounds the wait).
struct VocabGroup {
    int size = 1, rank = 0;
    std::function<void(const void* send, void* recv, int64_t bytes, void* stream)> all_gather;
    std::function<void(const float* send, float* recv, int64_t n, void* stream)> reduce_scatter_sum;
    // recv[0, bytes) = the ranks' send[rank * bytes, (rank + 1) * bytes) summed as 64-bit
    // integers: where one rank sends a value and the others zero bits, that value bit for bit,
    // in any element type (a vocab-split table's rows: each token's row is in one shard).
    // bytes is a multiple of 8, send and recv 8-byte aligned.
    std::function<void(const void* send, void* recv, int64_t bytes, void* stream)>
        reduce_scatter_owned;
    // Waits, bounded by the group's timeout, until every collective queued so far is done: the
    // model calls it before the host waits for the GPU after them (the default does nothing:
    // each call above returned once its collective was done, or the group has no bound).
    std::function<void()> settle = [] {};
};

class GptCuda {
  public:
    GptCuda(const ModelConfig& config, const CudaModelOptions& options);
    ~GptCuda();
    GptCuda(const GptCuda&) = delete;
    GptCuda& operator=(const GptCuda&) = delete;

    const ModelConfig& config() const;
    const GptLayout& layout() const;
    const CudaModelOptions& options() const;
    int64_t padded_vocab() const;
    int64_t num_parameters() const;

    // Host <-> device copies of whole fp32 arenas (table order); set_params refreshes bf16 copy.
    void set_params(const float* host);
    void get_params(float* host) const;
    void get_grads(float* host) const;

    // Forward B x Tn host tokens up to the final LayerNorm; the LM-head GEMM is left to loss()
    // (or logits()), which runs it in row chunks beside the cross-entropy.
    void forward(const int32_t* tokens, int64_t B, int64_t Tn);
    // The loss head on the last forward. grad_output multiplies each row's gradient (1 / tokens
    // of the step). With compute_grad, dlogits replace the logits, ready for backward(). With
    // the sum reduction and kernels.head_chunks > 1 the head is pipelined in row chunks: logits
    // GEMM, cross-entropy (on a second stream) and, with compute_grad, the dlnf GEMM of each chunk.
    CrossEntropySummary loss(const int32_t* targets, const CrossEntropyOptions& opts,
                             double grad_output, bool compute_grad);
    void backward();  // adds into the gradient arena
    // forward(), loss(..., compute_grad=true) and backward() of one micro-batch, as the trainer
    // runs them, with the same bits; but the host queues the backward pass before it waits for
    // the loss summary, so the GPU does not sit idle between the head and the backward pass while
    // the host reads the loss and launches again (0.1-0.25 ms a GPT-2 step, bench_train
    // --timeline). The vocab-parallel head waits inside loss() as before (its collectives).
    CrossEntropySummary forward_loss_backward(const int32_t* tokens, const int32_t* targets,
                                              int64_t B, int64_t Tn,
                                              const CrossEntropyOptions& opts, double grad_output);
    // Vocab parallel (size > 1, options.vocab_parts): the vocabulary tables hold this rank's
    // rows [v0, v0 + V / size) of the ids the model is given only (uneven when V does not
    // divide; the trainer hands it ids in shard order, train/vocab_parallel/
    // vocab_parallel_head.h, where those are rows dealt out in turn). forward() takes the token
    // rows from the group's shards (all-gather of the tokens, a masked lookup, a reduce-scatter)
    // and backward() adds the group's row gradients into this shard's rows of wte.
    // loss() splits the LM head by vocabulary rows across the group: the group's hidden
    // states and targets all-gathered, this shard's logits (or, with fused_linear, tiles of them)
    // and statistics, one all-gather of the statistics merged in rank order, dlogits in place,
    // this shard's dW rows, and dh reduce-scattered back. Reduction sum only (the trainer's).
    // Set before the first forward(); the full [B T, V] logits are then never allocated.
    void set_vocab_group(VocabGroup group);
    // The group's queued collectives done (VocabGroup::settle): before a host wait for the GPU
    // outside the model.
    void settle_collectives() const;
    // For a gradient all-reduce overlapped with backward(): as each transformer block's backward
    // is enqueued, `consumer_stream` (a cudaStream_t) is made to wait for the kernels that wrote
    // its gradients, then hook(lo, hi) hears the arena elements [lo, hi) that are final for
    // this pass (block L - 1's span includes the final LayerNorm). The blocks come from the last
    // to the first, so the spans are contiguous, descending. wte, wpe and an untied lm_head are
    // never announced: their gradients are final only when backward() returns. An empty hook
    // turns it off.
    void set_grad_ready_hook(void* consumer_stream,
                             std::function<void(int64_t lo, int64_t hi)> hook);
    void* stream() const;  // the model's main stream (cudaStream_t)
    void zero_grad();
    double grad_norm();                                  // global L2 norm of the gradient arena
    double grad_sum_of_squares(int64_t lo, int64_t hi);  // of the arena elements [lo, hi)
    // AdamW over the arena (decay where the table says), fp32 master weights, bf16 copy updated.
    void adamw_step(double lr, double beta1, double beta2, double eps, double weight_decay,
                    int64_t t, double grad_scale, float* m, float* v);
    // The same over the arena elements [lo, hi) only (a ZeRO-1 shard); m and v hold hi - lo
    // elements. The bf16 copy is updated for those elements only: after the fp32 weights of the
    // other shards arrive, refresh_bf16_copy() brings the rest.
    void adamw_step_range(double lr, double beta1, double beta2, double eps, double weight_decay,
                          int64_t t, double grad_scale, float* m, float* v, int64_t lo, int64_t hi);
    // Global-norm clipping and the same update with no host round trip between them: the whole
    // arena's sum of squares, then AdamW over [lo, hi) scaled on the GPU by
    // cpu::clip_scale(norm, max_norm), the bits of grad_norm() then adamw_step_range() with the
    // host's scale. Returns the norm, which the host reads while the update runs (it waits for the
    // norm's copy only). Not for a vocab-parallel model, whose norm sums over its group.
    double clip_and_adamw_step_range(double lr, double beta1, double beta2, double eps,
                                     double weight_decay, int64_t t, double max_norm, float* m,
                                     float* v, int64_t lo, int64_t hi);
    // The same with the sum of squares taken slice by slice, as several ranks hold the arena:
    // slices[r]'s sum into part r, the parts added on the device in one fixed order. own < 0:
    // this rank holds every slice's summed gradient (data parallel) and sums them all. own >= 0
    // (ZeRO-1 after a reduce-scatter): it sums its own slice only, and gather_parts(parts,
    // stream), ordered on the stream, brings the other ranks' parts. Either way the same bits.
    static constexpr int kMaxNormParts = 256;
    double clip_and_adamw_step_sliced(
        double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
        double max_norm, float* m, float* v, int64_t lo, int64_t hi,
        const std::vector<std::pair<int64_t, int64_t>>& slices, int own,
        const std::function<void(double* parts, void* stream)>& gather_parts);
    void refresh_bf16_copy();  // the bf16 working weights from the fp32 master (stream-ordered)

    // [B * Tn, padded_vocab] of the last forward (not with fused_linear)
    std::vector<float> logits() const;
    // Device pointers (tests, the optimizer): fp32 master weights and gradients.
    float* params_device();
    float* grads_device();
    // The same pointer, for a caller that reads or adds into [lo, hi) of it only (a gradient
    // bucket during the backward pass): zeroes only what is still unwritten there.
    float* grads_device(int64_t lo, int64_t hi);
    void* params_bf16_device();  // the bf16 working copy (null in fp32 precision)
    // The arena's spans [lo, hi) that the passes read from the fp32 master weights in bf16
    // precision (Impl::wm and wr): the norms' weights, and the embeddings with an fp32 residual
    // stream. Every other weight is read from the bf16 copy alone.
    std::vector<std::pair<int64_t, int64_t>> master_read_spans() const;
    // The weight and gradient arenas' elements, num_parameters() and a zeroed tail past them:
    // room for a reduce-scatter of the gradient and an all-gather of the weights in equal
    // chunks (ceil(n / ranks) each) over up to kArenaTail + 1 ranks.
    static constexpr int64_t kArenaTail = 255;
    int64_t arena_capacity() const { return num_parameters() + kArenaTail; }
    // Whether `ranks` chunks of `chunk` elements fit those arenas, each starting inside the
    // weights (the same answer on every rank of a collective).
    bool holds_equal_chunks(int64_t chunk, int ranks) const {
        return chunk * ranks <= arena_capacity() && chunk * (ranks - 1) <= num_parameters();
    }

    size_t allocated_bytes() const;  // everything this model holds on the device now
    // What a model of this config allocates on the device for micro-batches of B x T, without
    // allocating it: weights, gradients, activations, workspaces and a cuBLASLt workspace per
    // stream (allocated_bytes() after a step). With options.vocab_parts = P, of group rank 0 (the
    // largest shard) of a vocab-parallel group of P ranks, its head's chunk buffers included.
    static size_t device_bytes_needed(const ModelConfig& config, const CudaModelOptions& options,
                                      int64_t B, int64_t T);

    // With profiling on, the loss head (LM-head matmuls + cross-entropy, forward and backward)
    // is bracketed by CUDA events; head_ms() is its time in the last step (after a sync). When
    // pipelined, that is the main stream's time from the first logits GEMM to the last dlnf
    // GEMM (the cross-entropy overlaps it), plus the head's dW GEMM.
    void set_profiling(bool on);
    double head_ms() const;
    // Per-op-family GPU times (ms) since set_op_profiling(true) or the last take (bench_train).
    void set_op_profiling(bool on);
    std::vector<std::pair<std::string, double>> take_op_times();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    // The gradient's sum of squares over [lo, hi), queued with its copy to the host
    // (queue_norm_copy: norm_out into the pinned h_norm, norm_ev recorded after it).
    void queue_sum_of_squares(int64_t lo, int64_t hi);
    void queue_norm_copy();
    void queue_adamw(double lr, double beta1, double beta2, double eps, double weight_decay,
                     int64_t t, double grad_scale, const cuda::AdamWClip& clip, float* m, float* v,
                     int64_t lo, int64_t hi);
};

}  // namespace zgpt

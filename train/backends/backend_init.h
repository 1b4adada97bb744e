// Shared by the backends (not part of the trainer's interface).
#pragma once
#include <memory>
#include <vector>

#include "model/gpt.h"
#include "train/backends/backend.h"

namespace zgpt {

// The initial weights of a run: GPT-2 init from train.seed, then model.init_from if set. With
// `normals` (init_gpt_weights' filler of the stream of train.seed) the GPT-2 init draws through it.
std::vector<float> initial_params(const Config& cfg, const NormalFill& normals = {});
// CUDA builds only: initial_params with the normal values drawn on the GPU (kernels/ops/
// normal_fill.h: seconds less at GPT-2 1558M; a value in about 10^8 may differ from the host's
// draw in its last bit).
std::vector<float> initial_params_on_gpu(const Config& cfg);

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg, VocabParallel vocab,
                                          Communicator* zero1);
// CUDA builds only
std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, VocabParallel vocab,
                                           Communicator* zero1);
// CUDA builds only: the GPU model's options a config asks for (the trainer's and bench_train's),
// its vocabulary tables in vocab_parts shards
struct CudaModelOptions;  // model/gpt_cuda.h
CudaModelOptions cuda_model_options(const Config& cfg, int vocab_parts);
// CUDA builds only: the device memory one rank of a config takes, by the model's own count of its
// buffers (GptCuda::device_bytes_needed) plus the AdamW moments it keeps: all of its stored
// arena's, or with ZeRO-1 over zero1_ranks ranks its share (Zero1Share::largest_share); with the
// vocabulary split over vocab_parts ranks, of the rank holding the largest shard. Counting
// allocates nothing.
double cuda_rank_bytes(const Config& cfg, int vocab_parts, int zero1_ranks = 1);

}  // namespace zgpt

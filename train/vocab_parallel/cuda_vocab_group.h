// The GPU model's vocab-parallel collectives (model/gpt_cuda.h's VocabGroup) over a communicator:
// device buffers straight to a device communicator (nccl, on the stream each call is given), or
// through host memory for a host one (local ranks sharing one GPU). CUDA builds only
// (train/backends/backend_cuda.cpp).
#pragma once
#include "model/gpt_cuda.h"
#include "train/dist/comm.h"

namespace zgpt {

VocabGroup cuda_vocab_group(Communicator& group);

}  // namespace zgpt

// The `nccl` communicator: one process per GPU (train/dist/launch.h joins them; rank 0 hands out
// the unique id). Collectives run on the stream given by set_stream (by default one it creates) and
// return once enqueued, or, with a timeout, once complete. Host buffers (pageable or pinned) are
// staged through a device buffer and the stream is synchronized before returning, so the trainer
// can sum a few host doubles through the same interface. NCCL's sums are not in rank order: results
// may differ from `local` and `tcp` in the last bits. Compiled only with CUDA and NCCL
// (ZGPT_HAVE_NCCL).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "train/dist/comm.h"

namespace zgpt {

// A new NCCL unique id (ncclGetUniqueId) as bytes, for rank 0 to hand out.
std::string nccl_unique_id();

// Makes GPU `device` (a rank's LOCAL_RANK) current, with a clear error where the host has fewer.
void select_cuda_device(int device, int rank);

// Rank `rank` of `world_size` on `cuda_device`, which it makes current (select_cuda_device).
// Blocks until every rank has joined (the rendezvous' watchdog bounds that wait). With
// timeout_s > 0 each collective waits for its completion at most that long, then aborts the
// communicator and throws naming the collective (0: enqueue and return, no bound). max_ctas > 0
// bounds the CTAs (so the SMs) NCCL's kernels take, for this communicator and those split from it.
std::unique_ptr<Communicator> make_nccl_comm(const std::string& unique_id_bytes, int rank,
                                             int world_size, int cuda_device, double timeout_s = 0,
                                             int max_ctas = 0);

}  // namespace zgpt

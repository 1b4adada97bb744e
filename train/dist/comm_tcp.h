// The `tcp` communicator: ranks in separate processes, on host memory, over TCP. A star through
// the group's rank 0: it receives every rank's input, computes in rank order (((r0 + r1) + r2)...)
// and sends each rank its result, so results match the `local` communicator bit for bit. What
// `train --nproc N` uses without GPUs (and CI for multi-process runs). Every wait for a peer is
// bounded by timeout_s (rank 0 of a group waits for its members that long; the members wait twice
// that for rank 0, so that rank 0's diagnosis, which names the rank at fault, reaches them first).
// A failure makes every later call on the communicator throw the same zgpt::Error.
#pragma once
#include <memory>
#include <vector>

#include "train/dist/comm.h"

namespace zgpt {

class Rendezvous;

// The world communicator of a joined run: its own connections to rank 0 through the master port
// (the rendezvous keeps the control connections). Collective over the rendezvous' ranks.
std::unique_ptr<Communicator> make_tcp_comm(Rendezvous& rv, double timeout_s);

}  // namespace zgpt

// Joining a multi-process run: one process per rank, started by `train --nproc N` (launch_local),
// torchrun, mpirun or srun. A process reads its rank from the environment (train/dist/rank_env.h),
// meets the others and keeps a control channel to them (train/dist/rendezvous.h), then gets its
// world communicator from join_run.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "train/dist/comm.h"

namespace zgpt {

class Rendezvous;

// The communicator of a run that joined through a Rendezvous: the collectives of `inner` (tcp or
// nccl), and the rendezvous kept alive as long as the communicator.
std::unique_ptr<Communicator> make_joined_comm(std::unique_ptr<Rendezvous> rv,
                                               std::unique_ptr<Communicator> inner);

// What main() calls: reads the environment; nullptr for a plain run (no RANK / SLURM variables).
// Otherwise joins the run and returns its world communicator: nccl for device "cuda" (on GPU
// LOCAL_RANK, after cudaSetDevice; rank 0 hands out the NCCL id), tcp between the processes for
// "cpu" (nccl_max_ctas > 0: NCCL's kernels take at most that many CTAs). Keep it alive until the
// end of the run, then call finish_run.
std::unique_ptr<Communicator> join_run(const std::string& device, double timeout_s,
                                       int nccl_max_ctas = 0);
// Before leaving on an exception: the other ranks stop with "rank r failed: reason" instead of
// waiting for this rank. A no-op for communicators that did not come from join_run.
void report_rank_failure(Communicator& world, const std::string& reason);
// The orderly end of a joined run (every rank); a no-op for other communicators.
void finish_run(Communicator& world);

// Where one launcher's ranks sit in a run over several nodes (machines), as torchrun's --nnodes,
// --node_rank, --master_addr and --master_port: with N ranks a node, node k runs the ranks
// k N .. k N + N - 1 of nnodes N, and every node names the same master (node 0's address and a
// port that is free there). One node needs neither: it takes 127.0.0.1 and a free port.
struct NodeSpec {
    int nnodes = 1, node_rank = 0;
    std::string master_addr;
    int master_port = 0;
};
// Throws zgpt::Error naming the option when the spec cannot describe a run.
void check_node_spec(const NodeSpec& node);

// `train --nproc N`: starts `program` N times with argv (argv[0] included) and RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node), MASTER_ADDR, MASTER_PORT and, unless set,
// NCCL_NVLS_ENABLE=0 in each one's environment, then waits for them. When one rank exits non-zero
// or by a signal, the others get SIGTERM, and SIGKILL grace_s seconds later. SIGINT and SIGTERM
// sent to the launcher go to the ranks. Returns 0 when every rank exited 0, else the first failed
// rank's exit status (128 + signal for a signal). With several nodes it prints one line saying
// which ranks it starts and where they meet, and names ranks by their global number.
int launch_local(int nproc, const std::string& program, const std::vector<std::string>& argv,
                 double grace_s = 5, const NodeSpec& node = {});

}  // namespace zgpt

// Which rank a process of a multi-process run is, and where the ranks meet: read from the
// environment that `train --nproc N` (train/dist/launch.h), torchrun, mpirun or srun set.
#pragma once
#include <functional>
#include <string>

namespace zgpt {

struct RankEnv {
    int rank = 0, world_size = 1, local_rank = 0;
    std::string master_addr;
    int master_port = 0;
    std::string source = "none";  // "torchrun" (RANK, WORLD_SIZE, ...) | "slurm" | "none"
    // Machines the ranks run on: WORLD_SIZE over LOCAL_WORLD_SIZE (torchrun, `train --nproc`)
    // or over OMPI_COMM_WORLD_LOCAL_SIZE (mpirun); SLURM_NNODES (srun); 1 where none is set.
    int nodes = 1;
};

// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun, mpirun -x); where RANK and
// WORLD_SIZE are unset, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun). LOCAL_RANK defaults to
// the rank (right on one node). MASTER_ADDR and MASTER_PORT are required when the world has more
// than one rank. Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True), whose agent serves its own
// store on MASTER_PORT, the ranks meet on MASTER_PORT + 1. A bad or missing value throws
// zgpt::Error naming the variable.
// `getenv` returns nullptr for an unset variable.
RankEnv parse_rank_env(const std::function<const char*(const char*)>& getenv);
RankEnv rank_env_from_environment();

}  // namespace zgpt

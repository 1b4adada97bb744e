// Joining a multi-process run: one process per rank, started by `train --nproc N` (launch_local),
// torchrun, mpirun or srun. A process reads its rank from the environment (rank_env_from_*), meets
// the others over TCP at MASTER_ADDR:MASTER_PORT (Rendezvous: rank 0 hands out a payload, e.g. the
// NCCL unique id), and keeps those connections as a control channel whose watchdog stops every
// rank, with a message naming the rank and the reason, when one fails or dies: never a silent hang.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/dist/comm.h"
#include "train/dist/net.h"

namespace zgpt {

struct RankEnv {
    int rank = 0, world_size = 1, local_rank = 0;
    std::string master_addr;
    int master_port = 0;
    std::string source = "none";  // "torchrun" (RANK, WORLD_SIZE, ...) | "slurm" | "none"
};

// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun, mpirun -x); where RANK and
// WORLD_SIZE are unset, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun). LOCAL_RANK defaults to
// the rank (right on one node). MASTER_ADDR and MASTER_PORT are required when the world has more
// than one rank. A bad or missing value throws zgpt::Error naming the variable.
// `getenv` returns nullptr for an unset variable.
RankEnv parse_rank_env(const std::function<const char*(const char*)>& getenv);
RankEnv rank_env_from_environment();

// The rendezvous and control channel of one run. The constructor blocks until every rank has
// joined (or throws zgpt::Error within timeout_s, naming the missing ranks); a watchdog thread then
// watches the connections (rank 0 to each other rank) until finish():
//   - report_failure(reason) on rank r reaches every other rank as "rank r failed: reason";
//   - a rank whose connection drops (its process died) reaches the others as "rank r exited";
//   - a rank silent for timeout_s (heartbeats stopped: host or network down) likewise.
// Each such message goes to on_failure once, on the watchdog thread; the default prints
// "error: <message>" to stderr and ends the process with _exit(1), which also stops a thread
// blocked in a collective that will never complete (NCCL).
class Rendezvous {
  public:
    using FailureHandler = std::function<void(const std::string& message)>;

    // payload: what rank 0 hands to every rank (other ranks' argument is ignored).
    Rendezvous(const RankEnv& env, double timeout_s, const std::string& payload = "",
               FailureHandler on_failure = nullptr);
    // Without finish(): the connections drop, and the other ranks learn that this rank exited.
    ~Rendezvous();
    Rendezvous(const Rendezvous&) = delete;
    Rendezvous& operator=(const Rendezvous&) = delete;

    int rank() const { return env_.rank; }
    int size() const { return env_.world_size; }
    const RankEnv& env() const { return env_; }
    double timeout_s() const { return timeout_s_; }
    const std::string& payload() const { return payload_; }
    // Each rank's IPv4 address as rank 0 saw it (for more connections between the ranks).
    const std::vector<std::string>& hosts() const { return hosts_; }

    // Tells the other ranks that this one fails (and why); this rank's watchdog then stays quiet,
    // since this rank reports its own error. Call it before leaving on an exception.
    void report_failure(const std::string& reason);
    // The orderly end of a run, on every rank: rank 0 waits (at most timeout_s) for the others to
    // finish, then everyone closes without alarms. Throws if a rank did not finish in time.
    void finish();

    // One more connection from each rank to rank 0 through the master port (collective; before
    // finish). Rank 0 gets size() sockets indexed by rank (index 0 empty), the others one socket.
    std::vector<net::Socket> connect_star(uint32_t tag);

  private:
    void join_as_root(const std::string& payload);
    void join_as_worker();
    void watch();
    void alarm(const std::string& message, int source_rank);
    void stop_watchdog();
    net::StarSpec spec(const std::string& what, uint32_t tag) const;

    RankEnv env_;
    double timeout_s_;
    std::string payload_;
    std::vector<std::string> hosts_;
    net::Socket listener_;            // rank 0: the master port
    std::vector<net::Socket> links_;  // rank 0: one per rank (0 empty); others: [0] to rank 0
    FailureHandler on_failure_;

    std::thread watchdog_;
    int wake_[2] = {-1, -1};  // a pipe that interrupts the watchdog's poll
    std::mutex mu_;           // guards the flags below and bye_
    std::condition_variable cv_;
    std::mutex send_mu_;     // one writer at a time on the control sockets
    std::vector<char> bye_;  // rank 0: rank r finished
    bool stop_ = false, quiet_ = false, alarmed_ = false, finished_ = false;
};

// The communicator of a run that joined through a Rendezvous: the collectives of `inner` (tcp or
// nccl), and the rendezvous kept alive as long as the communicator.
std::unique_ptr<Communicator> make_joined_comm(std::unique_ptr<Rendezvous> rv,
                                               std::unique_ptr<Communicator> inner);

// What main() calls: reads the environment; nullptr for a plain run (no RANK / SLURM variables).
// Otherwise joins the run and returns its world communicator: nccl for device "cuda" (on GPU
// LOCAL_RANK, after cudaSetDevice; rank 0 hands out the NCCL id), tcp between the processes for
// "cpu". Keep it alive until the end of the run, then call finish_run.
std::unique_ptr<Communicator> join_run(const std::string& device, double timeout_s);
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

// The rendezvous of a multi-process run: the ranks meet over TCP at MASTER_ADDR:MASTER_PORT (rank 0
// hands out a payload, e.g. the NCCL unique id) and keep those connections as a control channel
// whose watchdog stops every rank, with a message naming the rank and the reason, when one fails
// or dies: never a silent hang.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/dist/net.h"
#include "train/dist/rank_env.h"

namespace zgpt {

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

}  // namespace zgpt

// Joining a run (train/dist/launch.h): join_run and `train --nproc N`.
#include "train/dist/launch.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "kernels/core/check.h"
#include "train/dist/comm_tcp.h"
#include "train/dist/rendezvous.h"
#ifdef ZGPT_HAVE_NCCL
#include "train/dist/comm_nccl.h"
#endif

extern char** environ;

namespace zgpt {

// ---- the joined communicator ----

namespace {

// Forwards every collective to the inner communicator; owns the rendezvous whose watchdog guards
// the run (declared first: destroyed after the collectives' connections).
class JoinedComm final : public Communicator {
  public:
    JoinedComm(std::unique_ptr<Rendezvous> rv, std::unique_ptr<Communicator> inner)
        : rv_(std::move(rv)), inner_(std::move(inner)) {}
    Rendezvous& rendezvous() { return *rv_; }
    Communicator& inner() { return *inner_; }

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string name() const override { return inner_->name(); }
    void all_reduce_sum(void* buf, int64_t n, CommType t) override {
        inner_->all_reduce_sum(buf, n, t);
    }
    void all_gather(const void* send, void* recv, int64_t n, CommType t) override {
        inner_->all_gather(send, recv, n, t);
    }
    void reduce_scatter_sum(const void* send, void* recv, int64_t n, CommType t) override {
        inner_->reduce_scatter_sum(send, recv, n, t);
    }
    // Passed on, not left to the base class: its fallback would sum at once and block.
    void start_all_reduce_sum(void* buf, int64_t n, CommType t) override {
        inner_->start_all_reduce_sum(buf, n, t);
    }
    void wait() override { inner_->wait(); }
    void broadcast(void* buf, int64_t n, CommType t, int root) override {
        inner_->broadcast(buf, n, t, root);
    }
    void barrier() override { inner_->barrier(); }
    // The sub-group must not outlive this communicator (it needs no rendezvous of its own).
    std::unique_ptr<Communicator> split(int color, int key) override {
        return inner_->split(color, key);
    }
    void set_stream(void* s) override { inner_->set_stream(s); }
    bool device_buffers() const override { return inner_->device_buffers(); }
    void set_wait_each(bool each) override { inner_->set_wait_each(each); }
    void settle() override { inner_->settle(); }

  private:
    std::unique_ptr<Rendezvous> rv_;
    std::unique_ptr<Communicator> inner_;
};

}  // namespace

std::unique_ptr<Communicator> make_joined_comm(std::unique_ptr<Rendezvous> rv,
                                               std::unique_ptr<Communicator> inner) {
    ZG_CHECK(rv && inner, "make_joined_comm: null argument");
    return std::make_unique<JoinedComm>(std::move(rv), std::move(inner));
}

std::unique_ptr<Communicator> join_run(const std::string& device, double timeout_s,
                                       [[maybe_unused]] int nccl_max_ctas) {
    const RankEnv env = rank_env_from_environment();
    if (env.source == "none") return nullptr;
    ZG_CHECK(device == "cpu" || device == "cuda",
             "join_run: device must be cpu or cuda, not '" + device + "'");
    std::string payload;
#ifdef ZGPT_HAVE_NCCL
    if (device == "cuda") select_cuda_device(env.local_rank, env.rank);
    if (device == "cuda" && env.rank == 0) payload = nccl_unique_id();
#else
    ZG_CHECK(device != "cuda",
             "join_run: this build has no NCCL, so a multi-process run must use device cpu");
#endif
    auto rv = std::make_unique<Rendezvous>(env, timeout_s, payload);
    std::unique_ptr<Communicator> inner;
    try {
#ifdef ZGPT_HAVE_NCCL
        if (device == "cuda")
            inner = make_nccl_comm(rv->payload(), env.rank, env.world_size, env.local_rank,
                                   timeout_s, nccl_max_ctas);
#endif
        if (device == "cpu") inner = make_tcp_comm(*rv, timeout_s);
    } catch (const std::exception& e) {
        rv->report_failure(e.what());
        throw;
    }
    return make_joined_comm(std::move(rv), std::move(inner));
}

void report_rank_failure(Communicator& world, const std::string& reason) {
    if (auto* j = dynamic_cast<JoinedComm*>(&world)) j->rendezvous().report_failure(reason);
}

void finish_run(Communicator& world) {
    if (auto* j = dynamic_cast<JoinedComm*>(&world)) j->rendezvous().finish();
}

// ---- train --nproc N ----

namespace {

volatile sig_atomic_t g_signal_to_forward = 0;

void remember_signal(int sig) {
    g_signal_to_forward = sig;
}

std::string describe(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status))
        return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
               strsignal(WTERMSIG(status)) + ")";
    return "stopped with wait status " + std::to_string(status);
}

int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

// The environment of this node's rank r: ours, with the rank variables replaced.
std::vector<std::string> rank_environment(int r, int nproc, const NodeSpec& node) {
    const std::map<std::string, std::string> set = {
        {"RANK", std::to_string(node.node_rank * nproc + r)},
        {"WORLD_SIZE", std::to_string(node.nnodes * nproc)},
        {"LOCAL_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
        {"GROUP_RANK", std::to_string(node.node_rank)},
        {"MASTER_ADDR", node.master_addr},
        {"MASTER_PORT", std::to_string(node.master_port)}};
    std::vector<std::string> env;
    for (char** e = environ; *e; e++) {
        const std::string kv = *e;
        if (!set.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    for (const auto& [k, v] : set) env.push_back(k + "=" + v);
    // NVLink multicast off unless asked for (it fails on some lent multi-GPU machines).
    if (!std::getenv("NCCL_NVLS_ENABLE")) env.push_back("NCCL_NVLS_ENABLE=0");
    return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
    std::vector<char*> out;
    for (std::string& s : v) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
}

}  // namespace

void check_node_spec(const NodeSpec& node) {
    ZG_CHECK(node.nnodes >= 1,
             "launch: --nnodes must be at least 1, not " + std::to_string(node.nnodes));
    ZG_CHECK(node.node_rank >= 0 && node.node_rank < node.nnodes,
             "launch: --node-rank " + std::to_string(node.node_rank) + " is not a node of " +
                 std::to_string(node.nnodes) + " (0.." + std::to_string(node.nnodes - 1) + ")");
    ZG_CHECK(node.master_port >= 0 && node.master_port <= 65535,
             "launch: --master-port " + std::to_string(node.master_port) +
                 " is out of range (1..65535)");
    if (node.nnodes > 1) {
        const std::string why = " (with --nnodes " + std::to_string(node.nnodes) +
                                " every node must name node 0's address and a port free there)";
        ZG_CHECK(!node.master_addr.empty(), "launch: no --master-addr or MASTER_ADDR" + why);
        ZG_CHECK(node.master_port > 0, "launch: no --master-port or MASTER_PORT" + why);
    }
}

int launch_local(int nproc, const std::string& program, const std::vector<std::string>& argv,
                 double grace_s, const NodeSpec& node_in) {
    ZG_CHECK(nproc >= 1, "launch: --nproc must be at least 1, not " + std::to_string(nproc));
    ZG_CHECK(!argv.empty(), "launch: empty argv");
    check_node_spec(node_in);
    ZG_CHECK(::access(program.c_str(), X_OK) == 0, "launch: cannot execute " + program);
    NodeSpec node = node_in;
    if (node.master_addr.empty()) node.master_addr = "127.0.0.1";
    if (node.master_port == 0) node.master_port = net::free_tcp_port();
    const int first = node.node_rank * nproc;  // this node's first global rank
    if (node.nnodes > 1) {
        std::printf("launch: node %d of %d starts ranks %d..%d of %d; they meet at %s:%d\n",
                    node.node_rank, node.nnodes, first, first + nproc - 1, node.nnodes * nproc,
                    node.master_addr.c_str(), node.master_port);
        std::fflush(stdout);
    }
    // Everything the children need is built before fork: between fork and exec only
    // async-signal-safe calls are allowed.
    std::vector<std::string> args = argv;
    std::vector<char*> c_args = c_strings(args);
    std::vector<std::vector<std::string>> envs;
    for (int r = 0; r < nproc; r++) envs.push_back(rank_environment(r, nproc, node));
    std::vector<std::vector<char*>> c_envs;
    for (auto& e : envs) c_envs.push_back(c_strings(e));

    struct sigaction forward {
    }, old_int{}, old_term{};
    forward.sa_handler = remember_signal;
    sigemptyset(&forward.sa_mask);
    g_signal_to_forward = 0;
    sigaction(SIGINT, &forward, &old_int);
    sigaction(SIGTERM, &forward, &old_term);
    auto restore = [&] {
        sigaction(SIGINT, &old_int, nullptr);
        sigaction(SIGTERM, &old_term, nullptr);
    };

    const pid_t launcher = getpid();
    std::vector<pid_t> pids(size_t(nproc), -1);
    std::vector<char> alive(size_t(nproc), 0);
    // Blocked while forking: a signal that reaches a child before it drops our handler would
    // otherwise be swallowed by it; pending ones are delivered once unblocked.
    sigset_t stop_signals, old_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop_signals, &old_mask);
    for (int r = 0; r < nproc; r++) {
        const pid_t pid = fork();
        if (pid == 0) {
            // A rank must not outlive a launcher that was killed outright.
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != launcher) _exit(127);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            sigprocmask(SIG_SETMASK, &old_mask, nullptr);
            execve(program.c_str(), c_args.data(), c_envs[size_t(r)].data());
            const char msg[] = "launch: execve failed\n";
            if (::write(2, msg, sizeof msg - 1) < 0) {
            }
            _exit(127);
        }
        if (pid < 0) {
            const std::string why = std::strerror(errno);
            for (int k = 0; k < r; k++) kill(pids[size_t(k)], SIGKILL);
            for (int k = 0; k < r; k++) waitpid(pids[size_t(k)], nullptr, 0);
            sigprocmask(SIG_SETMASK, &old_mask, nullptr);
            restore();
            throw Error("launch: fork failed for rank " + std::to_string(r) + ": " + why);
        }
        pids[size_t(r)] = pid;
        alive[size_t(r)] = 1;
    }
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);

    int result = 0, running = nproc;
    bool stopping = false, killed = false;
    auto kill_at = std::chrono::steady_clock::time_point::max();
    auto signal_alive = [&](int sig) {
        for (int r = 0; r < nproc; r++)
            if (alive[size_t(r)]) kill(pids[size_t(r)], sig);
    };
    auto alive_ranks = [&] {  // as global ranks
        std::vector<int> v;
        for (int r = 0; r < nproc; r++)
            if (alive[size_t(r)]) v.push_back(first + r);
        return v;
    };
    while (running > 0) {
        if (const int sig = g_signal_to_forward) {
            g_signal_to_forward = 0;
            signal_alive(sig);
        }
        for (int r = 0; r < nproc; r++) {
            int status = 0;
            if (!alive[size_t(r)] || waitpid(pids[size_t(r)], &status, WNOHANG) != pids[size_t(r)])
                continue;
            alive[size_t(r)] = 0;
            running--;
            if (exit_code(status) == 0 || stopping) continue;
            // The first failure: the others cannot finish without this rank.
            result = exit_code(status);
            stopping = true;
            const std::vector<int> rest = alive_ranks();
            std::fprintf(stderr, "launch: rank %d %s%s%s\n", first + r, describe(status).c_str(),
                         rest.empty()       ? ""
                         : rest.size() == 1 ? "; stopping rank "
                                            : "; stopping ranks ",
                         net::join_ints(rest).c_str());
            std::fflush(stderr);
            signal_alive(SIGTERM);
            kill_at = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(grace_s));
        }
        if (running > 0 && !killed && std::chrono::steady_clock::now() >= kill_at) {
            std::fprintf(stderr, "launch: killing rank(s) %s (still running %g s after SIGTERM)\n",
                         net::join_ints(alive_ranks()).c_str(), grace_s);
            signal_alive(SIGKILL);
            killed = true;
        }
        if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    restore();
    return result;
}

}  // namespace zgpt

// Multi-process runs without GPUs: the rank environment, the rendezvous and its watchdog, the tcp
// communicator against rank-order sums (bit for bit), failures named within the timeout, and the
// `train --nproc N` launcher with /bin/sh ranks. Ranks are threads of this process where results
// are compared, forked processes where a rank has to die. Every port is a free one (bind port 0),
// so copies of this binary can run side by side.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "kernels/core/check.h"
#include "train/device.h"
#include "train/dist/comm_tcp.h"
#include "train/dist/launch.h"
#include "train/dist/net.h"
#include "train/dist/rank_env.h"
#include "train/dist/rendezvous.h"

using namespace zgpt;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

RankEnv env_of(int rank, int world, int port) {
    RankEnv e;
    e.rank = rank;
    e.world_size = world;
    e.local_rank = rank;
    e.master_addr = "127.0.0.1";
    e.master_port = port;
    e.source = "torchrun";
    return e;
}

// Watchdog messages, collected instead of ending the process.
struct Alarms {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> got;

    Rendezvous::FailureHandler handler() {
        return [this](const std::string& m) {
            std::lock_guard<std::mutex> lock(mu);
            got.push_back(m);
            cv.notify_all();
        };
    }
    // The first message, waiting at most `seconds` for it ("" if none came).
    std::string first(double seconds) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return !got.empty(); });
        return got.empty() ? "" : got[0];
    }
    size_t count() {
        std::lock_guard<std::mutex> lock(mu);
        return got.size();
    }
};

// fn(rank) on one thread per rank; each rank's exception text ("" if none).
std::vector<std::string> run_ranks(int world, const std::function<void(int)>& fn) {
    std::vector<std::string> errors(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; r++)
        threads.emplace_back([&, r] {
            try {
                fn(r);
            } catch (const std::exception& e) {
                errors[size_t(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

fs::path temp_dir(const std::string& name) {
    static int counter = 0;
    const fs::path d = fs::temp_directory_path() / ("zgpt_test_launch_" + std::to_string(getpid()) +
                                                    "_" + std::to_string(counter++) + "_" + name);
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::string read_file(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Waits for a child at most `limit_s` seconds (then kills it); its wait status, -1 if killed.
int wait_child(pid_t pid, double limit_s) {
    const auto start = Clock::now();
    for (;;) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        if (since(start) > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

// fn() in a forked child with stderr into a file; never returns into doctest in the child.
pid_t fork_child(const std::function<int()>& fn, const fs::path& stderr_file) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        const int fd = ::open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        int code = 100;
        try {
            code = fn();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "child exception: %s\n", e.what());
            code = 101;
        }
        std::fflush(stderr);
        _exit(code);
    }
    return pid;
}

struct ChildRun {
    int status = 0;
    std::string err;
    double seconds = 0;
};

ChildRun run_in_child(const std::function<int()>& fn, double limit_s) {
    const fs::path dir = temp_dir("child");
    const auto start = Clock::now();
    const pid_t pid = fork_child(fn, dir / "stderr");
    ChildRun out;
    out.status = wait_child(pid, limit_s);
    out.seconds = since(start);
    out.err = read_file(dir / "stderr");
    fs::remove_all(dir);
    return out;
}

int exit_status(int status) {
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

RankEnv parse(const std::map<std::string, std::string>& vars) {
    return parse_rank_env([&](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    });
}

std::string parse_error(const std::map<std::string, std::string>& vars) {
    try {
        parse(vars);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// Inputs where the order of the sum matters: element 0 is 1, 1e8, -1e8, 0.5 on ranks 0..3, so
// ((1 + 1e8) - 1e8) = 0 in float while 1 + (1e8 - 1e8) = 1; the rest spans 40 binary orders.
std::vector<float> f32_input(int rank, int n, int salt = 0) {
    std::vector<float> v(static_cast<size_t>(n));
    const float first[] = {1.0f, 1e8f, -1e8f, 0.5f};
    for (int i = 0; i < n; i++) {
        const int k = i * 7 + rank * 13 + salt * 3;
        v[size_t(i)] = std::ldexp(float(1 + k % 17) / 17.0f, (i * 5 + rank * 11 + salt) % 40 - 20) *
                       ((i + rank) % 2 ? 1.0f : -1.0f);
    }
    v[0] = first[rank % 4];
    return v;
}

std::vector<double> f64_input(int rank, int n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int i = 0; i < n; i++)
        v[size_t(i)] =
            std::ldexp(double(1 + (i * 3 + rank * 5) % 29) / 29.0, (i + rank * 37) % 120 - 60);
    v[0] = rank == 1 ? 1e20 : rank == 2 ? -1e20 : 3.0;
    return v;
}

std::vector<int64_t> i64_input(int rank, int n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; i++) v[size_t(i)] = (int64_t(rank + 1) << 40) - i * 1000003 + rank;
    return v;
}

// out[i] = in[0][i] + in[1][i] + ... accumulated in rank order, as `local` does.
template <typename T>
std::vector<T> rank_order_sum(const std::vector<std::vector<T>>& in) {
    std::vector<T> out = in[0];
    for (size_t r = 1; r < in.size(); r++)
        for (size_t i = 0; i < out.size(); i++) out[i] += in[r][i];
    return out;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

// ---- the rank environment ----

TEST_CASE("rank environment: torchrun, slurm and none") {
    RankEnv e = parse({{"RANK", "2"},
                       {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "0"},
                       {"MASTER_ADDR", "node7"},
                       {"MASTER_PORT", "29500"}});
    CHECK(e.source == "torchrun");
    CHECK(e.rank == 2);
    CHECK(e.world_size == 4);
    CHECK(e.local_rank == 0);
    CHECK(e.master_addr == "node7");
    CHECK(e.master_port == 29500);

    // torchrun's agent serves its store on MASTER_PORT: the ranks meet on the port above it
    e = parse({{"RANK", "1"},
               {"WORLD_SIZE", "4"},
               {"MASTER_ADDR", "node7"},
               {"MASTER_PORT", "29500"},
               {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    CHECK(e.master_port == 29501);
    CHECK(contains(parse_error({{"RANK", "1"},
                                {"WORLD_SIZE", "4"},
                                {"MASTER_ADDR", "node7"},
                                {"MASTER_PORT", "65535"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"}}),
                   "the ranks meet on the port above it"));
    e = parse({{"SLURM_PROCID", "1"},  // only torchrun's own ranks
               {"SLURM_NTASKS", "2"},
               {"MASTER_ADDR", "n0"},
               {"MASTER_PORT", "29500"},
               {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    CHECK(e.master_port == 29500);

    e = parse({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(e.local_rank == 1);  // defaults to the rank

    e = parse({{"SLURM_PROCID", "5"},
               {"SLURM_NTASKS", "8"},
               {"SLURM_LOCALID", "1"},
               {"MASTER_ADDR", "n0"},
               {"MASTER_PORT", "1234"}});
    CHECK(e.source == "slurm");
    CHECK(e.rank == 5);
    CHECK(e.world_size == 8);
    CHECK(e.local_rank == 1);

    // RANK / WORLD_SIZE win over SLURM_*.
    e = parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}});
    CHECK(e.source == "torchrun");
    CHECK(e.world_size == 1);
    CHECK(e.master_addr.empty());  // not needed for one rank

    e = parse({});
    CHECK(e.source == "none");
    CHECK(e.world_size == 1);
    CHECK(e.rank == 0);
    CHECK(parse({{"SLURM_NTASKS", "4"}}).source == "none");  // salloc without srun
}

TEST_CASE("rank environment: the node count, from each launcher's variables") {
    const std::map<std::string, std::string> base = {
        {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
    auto with = [&](std::map<std::string, std::string> extra) {
        auto m = base;
        for (auto& [k, v] : extra) m[k] = v;
        return m;
    };
    CHECK(parse(base).nodes == 1);                               // nothing says otherwise: one node
    CHECK(parse(with({{"LOCAL_WORLD_SIZE", "2"}})).nodes == 2);  // torchrun, train --nnodes 2
    CHECK(parse(with({{"LOCAL_WORLD_SIZE", "4"}})).nodes == 1);
    CHECK(parse(with({{"LOCAL_WORLD_SIZE", "1"}})).nodes == 4);
    CHECK(parse(with({{"LOCAL_WORLD_SIZE", "3"}})).nodes == 2);            // uneven nodes round up
    CHECK(parse(with({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})).nodes == 2);  // mpirun -x RANK ...
    CHECK(parse(with({{"LOCAL_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}})).nodes ==
          1);  // torchrun's own variable wins
    CHECK(contains(parse_error(with({{"LOCAL_WORLD_SIZE", "8"}})),
                   "LOCAL_WORLD_SIZE=8 is out of range (1..4)"));
    CHECK(contains(parse_error(with({{"LOCAL_WORLD_SIZE", "two"}})),
                   "LOCAL_WORLD_SIZE='two' is not an integer"));
    const std::map<std::string, std::string> srun = {{"SLURM_PROCID", "5"},
                                                     {"SLURM_NTASKS", "8"},
                                                     {"SLURM_NNODES", "2"},
                                                     {"MASTER_ADDR", "n0"},
                                                     {"MASTER_PORT", "1234"}};
    CHECK(parse(srun).nodes == 2);
    auto one = srun;
    one.erase("SLURM_NNODES");
    CHECK(parse(one).nodes == 1);
    one["SLURM_NNODES"] = "9";  // more nodes than tasks: the tasks' own
    CHECK(parse(one).nodes == 8);
    one["SLURM_NNODES"] = "0";
    CHECK(contains(parse_error(one), "SLURM_NNODES=0 is out of range"));
}

TEST_CASE("one-thread draw note: torchrun's OMP_NUM_THREADS=1 at a large model, and only then") {
    // 1558M on one thread beside 31 spare cores a rank: the cost, the machine and the fix
    const std::string note = one_thread_draw_note(1.5576e9, 1, 64, 2);
    CHECK(note.find("1558M initial weights") != std::string::npos);
    CHECK(note.find("about 58 s") != std::string::npos);
    CHECK(note.find("64 cores for 2 rank(s): OMP_NUM_THREADS=32") != std::string::npos);
    CHECK(one_thread_draw_note(1.5576e9, 1, 8, 1).find("OMP_NUM_THREADS=8") != std::string::npos);
    // no line: threads to draw on, a machine with no spare core a rank, or a small model
    CHECK(one_thread_draw_note(1.5576e9, 2, 64, 2).empty());
    CHECK(one_thread_draw_note(1.5576e9, 1, 8, 8).empty());
    CHECK(one_thread_draw_note(1.5576e9, 1, 8, 5).empty());
    CHECK(one_thread_draw_note(355e6, 1, 64, 1).find("355M") != std::string::npos);
    CHECK(one_thread_draw_note(124e6, 1, 64, 1).empty());
    CHECK(one_thread_draw_note(1.5576e9, 1, 64, 0).find("OMP_NUM_THREADS=64") != std::string::npos);
}

TEST_CASE("rank environment: bad or missing values name the variable") {
    const std::map<std::string, std::string> ok = {
        {"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
    auto with = [&](const std::string& k, const std::string& v) {
        auto m = ok;
        if (v == "<unset>")
            m.erase(k);
        else
            m[k] = v;
        return m;
    };
    CHECK(contains(parse_error(with("RANK", "x1")), "RANK='x1' is not an integer"));
    CHECK(contains(parse_error(with("RANK", "1.5")), "RANK='1.5' is not an integer"));
    CHECK(contains(parse_error(with("RANK", "-1")), "RANK=-1 is out of range"));
    CHECK(contains(parse_error(with("RANK", "4")), "RANK=4 is not below WORLD_SIZE=4"));
    CHECK(contains(parse_error(with("WORLD_SIZE", "0")), "WORLD_SIZE=0 is out of range"));
    CHECK(contains(parse_error(with("WORLD_SIZE", "<unset>")), "WORLD_SIZE"));
    CHECK(contains(parse_error(with("RANK", "<unset>")), "RANK is not"));
    CHECK(contains(parse_error(with("LOCAL_RANK", "9")), "LOCAL_RANK=9 is out of range"));
    CHECK(contains(parse_error(with("MASTER_PORT", "70000")), "MASTER_PORT=70000 is out of range"));
    CHECK(contains(parse_error(with("MASTER_PORT", "http")), "MASTER_PORT='http'"));
    CHECK(contains(parse_error(with("MASTER_PORT", "<unset>")), "MASTER_PORT is not set"));
    CHECK(contains(parse_error(with("MASTER_ADDR", "<unset>")), "MASTER_ADDR is not set"));
    CHECK(contains(parse_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "four"}}),
                   "SLURM_NTASKS='four' is not an integer"));
    CHECK(contains(parse_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}),
                   "MASTER_ADDR is not set (needed when SLURM_NTASKS=2 > 1"));
}

// ---- the rendezvous ----

TEST_CASE("rendezvous: three ranks get rank 0's payload, and finish without alarms") {
    const int port = net::free_tcp_port();
    std::string payload(128, '\0');  // like an NCCL unique id: any bytes, zeros included
    for (size_t i = 0; i < payload.size(); i++) payload[i] = char(i * 37 % 256);
    std::vector<Alarms> alarms(3);
    std::vector<std::string> got(3);
    std::vector<std::vector<std::string>> hosts(3);
    const auto errors = run_ranks(3, [&](int r) {
        Rendezvous rv(env_of(r, 3, port), 10, r == 0 ? payload : "ignored",
                      alarms[size_t(r)].handler());
        got[size_t(r)] = rv.payload();
        hosts[size_t(r)] = rv.hosts();
        // Rank 0 finishes last: the others' early finish must not look like an exit.
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        rv.finish();
    });
    for (int r = 0; r < 3; r++) {
        CAPTURE(r);
        CHECK(errors[size_t(r)] == "");
        CHECK(got[size_t(r)] == payload);
        CHECK(hosts[size_t(r)] == std::vector<std::string>(3, "127.0.0.1"));
        CHECK(alarms[size_t(r)].count() == 0);
    }
}

TEST_CASE("rendezvous: rank 0 finishing first waits for the others") {
    const int port = net::free_tcp_port();
    std::vector<Alarms> alarms(2);
    double rank0_finish = 0;
    const auto errors = run_ranks(2, [&](int r) {
        Rendezvous rv(env_of(r, 2, port), 10, "", alarms[size_t(r)].handler());
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
        const auto t = Clock::now();
        rv.finish();
        if (r == 0) rank0_finish = since(t);
    });
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK(rank0_finish > 0.2);
    CHECK(alarms[0].count() == 0);
    CHECK(alarms[1].count() == 0);
}

TEST_CASE("rendezvous: missing ranks are named within the timeout") {
    const int port = net::free_tcp_port();
    const auto start = Clock::now();
    const auto errors = run_ranks(2, [&](int r) { Rendezvous rv(env_of(r, 4, port), 1.5); });
    const double took = since(start);
    const std::string want =
        "rendezvous: ranks 2, 3 of 4 did not connect to 127.0.0.1:" + std::to_string(port) +
        " within 1.5 s";
    CHECK(contains(errors[0], want));
    CHECK(contains(errors[1], want));
    CHECK(contains(errors[1], "reported by rank 0 to rank 1"));
    CHECK(took < 1.5 + 3);
}

TEST_CASE("rendezvous: a rank 0 that never comes is named") {
    const int port = net::free_tcp_port();
    const auto start = Clock::now();
    std::string err;
    try {
        Rendezvous rv(env_of(1, 2, port), 1.0);
    } catch (const Error& e) {
        err = e.what();
    }
    CHECK(contains(err, "rendezvous: rank 1 could not connect to rank 0 at 127.0.0.1:" +
                            std::to_string(port) + " within 1 s"));
    CHECK(since(start) < 1.0 + 2);
}

TEST_CASE("rendezvous: a duplicate rank or a different world size is refused") {
    {
        const int port = net::free_tcp_port();
        // Ranks 0, 1, 1 of 3: rank 0 refuses the second rank 1 and tells everyone connected.
        const auto errors =
            run_ranks(3, [&](int r) { Rendezvous rv(env_of(r == 2 ? 1 : r, 3, port), 5); });
        CHECK(contains(errors[0], "two processes joined as rank 1"));
        CHECK(contains(errors[1], "two processes joined as rank 1"));
        CHECK(contains(errors[2], "two processes joined as rank 1"));
    }
    {
        const int port = net::free_tcp_port();
        const auto errors =
            run_ranks(2, [&](int r) { Rendezvous rv(env_of(r, r == 0 ? 2 : 3, port), 5); });
        CHECK(contains(errors[0], "rank 1 expects 3 ranks, but rank 0 has 2"));
        CHECK(contains(errors[1], "rank 1 expects 3 ranks, but rank 0 has 2"));
    }
}

TEST_CASE("watchdog: report_failure reaches every other rank with the reason") {
    for (const int failing : {2, 0}) {
        CAPTURE(failing);
        const int port = net::free_tcp_port();
        std::vector<Alarms> alarms(3);
        std::vector<std::unique_ptr<Rendezvous>> rvs(3);
        run_ranks(3, [&](int r) {
            rvs[size_t(r)] = std::make_unique<Rendezvous>(env_of(r, 3, port), 10, "",
                                                          alarms[size_t(r)].handler());
        });
        REQUIRE((rvs[0] && rvs[1] && rvs[2]));
        const auto start = Clock::now();
        rvs[size_t(failing)]->report_failure("out of memory");
        const std::string want = "rank " + std::to_string(failing) + " failed: out of memory";
        for (int r = 0; r < 3; r++)
            if (r != failing) CHECK(alarms[size_t(r)].first(5) == want);
        CHECK(since(start) < 3);
        // The reporting rank reports its own error; its watchdog stays quiet.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        CHECK(alarms[size_t(failing)].count() == 0);
    }
}

TEST_CASE("watchdog: a rank whose connection drops is named as exited") {
    for (const int leaving : {2, 0}) {
        CAPTURE(leaving);
        const int port = net::free_tcp_port();
        std::vector<Alarms> alarms(3);
        std::vector<std::unique_ptr<Rendezvous>> rvs(3);
        run_ranks(3, [&](int r) {
            rvs[size_t(r)] = std::make_unique<Rendezvous>(env_of(r, 3, port), 10, "",
                                                          alarms[size_t(r)].handler());
        });
        REQUIRE((rvs[0] && rvs[1] && rvs[2]));
        rvs[size_t(leaving)].reset();  // no finish(): as if the process died
        const std::string want = "rank " + std::to_string(leaving) + " exited unexpectedly";
        for (int r = 0; r < 3; r++)
            if (r != leaving) CHECK(alarms[size_t(r)].first(5) == want);
    }
}

TEST_CASE("watchdog: a rank that never finishes makes rank 0's finish throw, naming it") {
    const int port = net::free_tcp_port();
    std::vector<Alarms> alarms(2);
    std::vector<std::unique_ptr<Rendezvous>> rvs(2);
    run_ranks(2, [&](int r) {
        rvs[size_t(r)] =
            std::make_unique<Rendezvous>(env_of(r, 2, port), 1.0, "", alarms[size_t(r)].handler());
    });
    REQUIRE((rvs[0] && rvs[1]));
    std::string err;
    try {
        rvs[0]->finish();
    } catch (const Error& e) {
        err = e.what();
    }
    CHECK(contains(err, "finish: rank 1 of 2 did not finish within 1 s"));
    CHECK(alarms[1].first(5) == "rank 0 exited unexpectedly");
}

// ---- the tcp communicator ----

namespace {

struct CollectiveResults {
    std::vector<float> ar_f32, ag, ag_in_place, rs;
    std::vector<double> ar_f64;
    std::vector<int64_t> ar_i64;
    std::vector<std::vector<float>> bc;  // per root
    std::string name;
    int rank = -1, size = -1;
};

CollectiveResults run_collectives(Communicator& c, int n) {
    const int r = c.rank(), w = c.size();
    CollectiveResults out;
    out.name = c.name();
    out.rank = r;
    out.size = w;
    out.ar_f32 = f32_input(r, n);
    c.all_reduce_sum(out.ar_f32.data(), n);
    out.ar_f64 = f64_input(r, n);
    c.all_reduce_sum(out.ar_f64.data(), n);
    out.ar_i64 = i64_input(r, n);
    c.all_reduce_sum(out.ar_i64.data(), n);
    const std::vector<float> mine = f32_input(r, n, 1);
    out.ag.resize(size_t(n * w));
    c.all_gather(mine.data(), out.ag.data(), n, CommType::f32);
    out.ag_in_place.assign(size_t(n * w), -7.0f);
    std::copy(mine.begin(), mine.end(), out.ag_in_place.begin() + r * n);
    c.all_gather(out.ag_in_place.data() + r * n, out.ag_in_place.data(), n, CommType::f32);
    const std::vector<float> all = f32_input(r, n * w, 2);
    out.rs.resize(size_t(n));
    c.reduce_scatter_sum(all.data(), out.rs.data(), n, CommType::f32);
    c.barrier();
    for (int root = 0; root < w; root++) {
        std::vector<float> b = f32_input(r, n, 10 + root);
        c.broadcast(b.data(), n, CommType::f32, root);
        out.bc.push_back(b);
    }
    return out;
}

void check_collectives(const std::vector<CollectiveResults>& res, int w, int n) {
    std::vector<std::vector<float>> f32, gathered, scattered;
    std::vector<std::vector<double>> f64;
    std::vector<std::vector<int64_t>> i64;
    for (int r = 0; r < w; r++) {
        f32.push_back(f32_input(r, n));
        f64.push_back(f64_input(r, n));
        i64.push_back(i64_input(r, n));
        scattered.push_back(f32_input(r, n * w, 2));
    }
    const std::vector<float> sum32 = rank_order_sum(f32);
    const std::vector<float> sum_all = rank_order_sum(scattered);
    std::vector<float> ag;
    for (int r = 0; r < w; r++) {
        const auto v = f32_input(r, n, 1);
        ag.insert(ag.end(), v.begin(), v.end());
    }
    if (w >= 3) {  // the inputs really are order-sensitive
        CHECK(sum32[0] == 0.0f);
        CHECK(f32[0][0] + (f32[1][0] + f32[2][0]) == 1.0f);
    }
    for (int r = 0; r < w; r++) {
        CAPTURE(r);
        const CollectiveResults& x = res[size_t(r)];
        CHECK(x.name == "tcp");
        CHECK(x.rank == r);
        CHECK(x.size == w);
        CHECK(bitwise_equal(x.ar_f32, sum32));
        CHECK(bitwise_equal(x.ar_f64, rank_order_sum(f64)));
        CHECK(bitwise_equal(x.ar_i64, rank_order_sum(i64)));
        CHECK(bitwise_equal(x.ag, ag));
        CHECK(bitwise_equal(x.ag_in_place, ag));
        CHECK(bitwise_equal(
            x.rs, std::vector<float>(sum_all.begin() + r * n, sum_all.begin() + (r + 1) * n)));
        REQUIRE(int(x.bc.size()) == w);
        for (int root = 0; root < w; root++) {
            CAPTURE(root);
            CHECK(bitwise_equal(x.bc[size_t(root)], f32_input(root, n, 10 + root)));
        }
    }
}

}  // namespace

TEST_CASE("tcp communicator: every collective equals the rank-order result, bit for bit") {
    for (const int w : {2, 3}) {
        CAPTURE(w);
        const int n = 1000;
        const int port = net::free_tcp_port();
        std::vector<CollectiveResults> res(static_cast<size_t>(w));
        std::vector<Alarms> alarms(static_cast<size_t>(w));
        const auto errors = run_ranks(w, [&](int r) {
            Rendezvous rv(env_of(r, w, port), 10, "", alarms[size_t(r)].handler());
            auto comm = make_tcp_comm(rv, 10);
            res[size_t(r)] = run_collectives(*comm, n);
            rv.finish();
        });
        CHECK(errors == std::vector<std::string>(size_t(w), ""));
        check_collectives(res, w, n);
        for (auto& a : alarms) CHECK(a.count() == 0);
    }
}

TEST_CASE("tcp communicator: large buffers (several socket buffers' worth)") {
    const int w = 3, n = 3 << 20;  // 12 MiB of floats per rank
    const int port = net::free_tcp_port();
    std::vector<std::vector<float>> out(w);
    const auto errors = run_ranks(w, [&](int r) {
        Rendezvous rv(env_of(r, w, port), 20);
        auto comm = make_tcp_comm(rv, 20);
        out[size_t(r)] = f32_input(r, n);
        comm->all_reduce_sum(out[size_t(r)].data(), n);
        rv.finish();
    });
    CHECK(errors == std::vector<std::string>(w, ""));
    const std::vector<float> want = rank_order_sum(
        std::vector<std::vector<float>>{f32_input(0, n), f32_input(1, n), f32_input(2, n)});
    for (int r = 0; r < w; r++) CHECK(bitwise_equal(out[size_t(r)], want));
}

TEST_CASE("tcp communicator: split orders each group by (key, rank)") {
    const int w = 4, n = 5;
    const int port = net::free_tcp_port();
    struct Out {
        int rank = -1, size = -1;
        std::vector<float> sum, gathered;
        int rank_b = -1, size_b = -1;
        std::vector<float> sum_b;
    };
    std::vector<Out> out(w);
    const auto errors = run_ranks(w, [&](int r) {
        Rendezvous rv(env_of(r, w, port), 10);
        auto world = make_tcp_comm(rv, 10);
        // Even and odd ranks, each group in reverse order of world rank.
        auto g = world->split(r % 2, -r);
        Out& o = out[size_t(r)];
        o.rank = g->rank();
        o.size = g->size();
        o.sum = f32_input(r, n);
        g->all_reduce_sum(o.sum.data(), n);
        const std::vector<float> mine = f32_input(r, n, 1);
        o.gathered.resize(size_t(n * g->size()));
        g->all_gather(mine.data(), o.gathered.data(), n, CommType::f32);
        // {3} alone and {0, 1, 2}: a group of one, and a split of a split's parent again.
        auto h = world->split(r == 3 ? 7 : 0, 0);
        o.rank_b = h->rank();
        o.size_b = h->size();
        o.sum_b = f32_input(r, n);
        h->all_reduce_sum(o.sum_b.data(), n);
        world->barrier();
        rv.finish();
    });
    CHECK(errors == std::vector<std::string>(w, ""));
    // Group {2, 0} (keys -2, 0) and group {3, 1}.
    const int want_rank[] = {1, 1, 0, 0};
    const std::vector<std::vector<int>> members = {{2, 0}, {3, 1}};
    for (int r = 0; r < w; r++) {
        CAPTURE(r);
        const Out& o = out[size_t(r)];
        CHECK(o.rank == want_rank[r]);
        CHECK(o.size == 2);
        const auto& m = members[size_t(r % 2)];
        CHECK(bitwise_equal(o.sum, rank_order_sum(std::vector<std::vector<float>>{
                                       f32_input(m[0], n), f32_input(m[1], n)})));
        std::vector<float> g = f32_input(m[0], n, 1), g1 = f32_input(m[1], n, 1);
        g.insert(g.end(), g1.begin(), g1.end());
        CHECK(bitwise_equal(o.gathered, g));
        CHECK(o.size_b == (r == 3 ? 1 : 3));
        CHECK(o.rank_b == (r == 3 ? 0 : r));
        CHECK(bitwise_equal(o.sum_b,
                            r == 3 ? f32_input(3, n)
                                   : rank_order_sum(std::vector<std::vector<float>>{
                                         f32_input(0, n), f32_input(1, n), f32_input(2, n)})));
    }
}

TEST_CASE("tcp communicator: ranks that make different calls are named") {
    const int port = net::free_tcp_port();
    const auto start = Clock::now();
    const auto errors = run_ranks(3, [&](int r) {
        Rendezvous rv(env_of(r, 3, port), 5, "", [](const std::string&) {});
        auto comm = make_tcp_comm(rv, 5);
        std::vector<float> x(4, 1.0f);
        if (r == 1)
            comm->broadcast(x.data(), 4, CommType::f32, 0);
        else
            comm->all_reduce_sum(x.data(), 4);
    });
    const std::string want =
        "rank 1 called broadcast(n=4, f32, root 0) while rank 0 called all_reduce(n=4, f32)";
    CHECK(contains(errors[0], want));
    CHECK(contains(errors[1], want));
    CHECK(contains(errors[2], want));
    CHECK(contains(errors[2], "reported by rank 0 to rank 2"));
    CHECK(since(start) < 4);
}

TEST_CASE("tcp communicator: a rank that dies mid-run is named within the timeout") {
    const int port = net::free_tcp_port();
    const double timeout = 10;
    const fs::path dir = temp_dir("dies");
    // Rank 2 is a process that joins, takes part in one all-reduce, then dies.
    const pid_t child = fork_child(
        [&] {
            Rendezvous rv(env_of(2, 3, port), timeout, "", [](const std::string&) {});
            auto comm = make_tcp_comm(rv, timeout);
            std::vector<float> x = f32_input(2, 8);
            comm->all_reduce_sum(x.data(), 8);
            _exit(1);  // no finish, no destructors: as if it crashed
            return 0;
        },
        dir / "stderr");
    std::vector<Alarms> alarms(2);
    std::vector<double> took(2);
    std::vector<std::string> alarm_text(2);
    const auto errors = run_ranks(2, [&](int r) {
        Rendezvous rv(env_of(r, 3, port), timeout, "", alarms[size_t(r)].handler());
        auto comm = make_tcp_comm(rv, timeout);
        std::vector<float> x = f32_input(r, 8);
        comm->all_reduce_sum(x.data(), 8);
        const auto start = Clock::now();
        std::string err;
        try {
            comm->all_reduce_sum(x.data(), 8);
        } catch (const Error& e) {
            err = e.what();
        }
        took[size_t(r)] = since(start);
        // Keep the rendezvous until its watchdog has spoken.
        alarm_text[size_t(r)] = alarms[size_t(r)].first(5);
        if (!err.empty()) throw Error(err);
    });
    CHECK(contains(errors[0],
                   "rank 2 closed its connection (did the process exit?) during "
                   "all_reduce(n=8, f32)"));
    CHECK(contains(errors[1], "rank 2 closed its connection"));
    CHECK(contains(errors[1], "reported by rank 0 to rank 1"));
    CHECK(took[0] < timeout);
    CHECK(took[1] < timeout);
    CHECK(alarm_text[0] == "rank 2 exited unexpectedly");
    CHECK(alarm_text[1] == "rank 2 exited unexpectedly");
    CHECK(exit_status(wait_child(child, 10)) == 1);
    fs::remove_all(dir);
}

// ---- join_run, report_rank_failure (processes with their own environment) ----

namespace {

void set_rank_env(int r, int w, int port) {
    setenv("RANK", std::to_string(r).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(w).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

}  // namespace

TEST_CASE("join_run: no rank variables is a plain run") {
    const ChildRun c = run_in_child(
        [] {
            for (const char* v : {"RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"})
                unsetenv(v);
            return join_run("cpu", 5) == nullptr ? 0 : 1;
        },
        10);
    CHECK(exit_status(c.status) == 0);
}

TEST_CASE("join_run: a world of one (torchrun --nproc-per-node 1) needs no master") {
    const ChildRun c = run_in_child(
        [] {
            for (const char* v : {"MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) unsetenv(v);
            setenv("RANK", "0", 1);
            setenv("WORLD_SIZE", "1", 1);
            auto comm = join_run("cpu", 5);
            if (!comm || comm->size() != 1 || comm->sum(2.5) != 2.5) return 1;
            float x[3] = {1, 2, 3}, y[3] = {};
            comm->reduce_scatter_sum(x, y, 3, CommType::f32);
            comm->broadcast(x, 3, CommType::f32, 0);
            if (y[2] != 3 || comm->split(0, 0)->size() != 1) return 2;
            finish_run(*comm);
            return 0;
        },
        10);
    CHECK(exit_status(c.status) == 0);
    CHECK(c.err == "");
}

// Records the name of each call that reaches it.
class SpyComm final : public Communicator {
  public:
    explicit SpyComm(std::vector<std::string>& calls) : calls_(calls) {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "spy"; }
    void all_reduce_sum(void*, int64_t, CommType) override { calls_.push_back("all_reduce_sum"); }
    void all_gather(const void*, void*, int64_t, CommType) override {
        calls_.push_back("all_gather");
    }
    void reduce_scatter_sum(const void*, void*, int64_t, CommType) override {
        calls_.push_back("reduce_scatter_sum");
    }
    void start_all_reduce_sum(void*, int64_t, CommType) override {
        calls_.push_back("start_all_reduce_sum");
    }
    void wait() override { calls_.push_back("wait"); }
    void broadcast(void*, int64_t, CommType, int) override { calls_.push_back("broadcast"); }
    void barrier() override { calls_.push_back("barrier"); }
    std::unique_ptr<Communicator> split(int, int) override {
        calls_.push_back("split");
        return nullptr;
    }
    void set_stream(void*) override { calls_.push_back("set_stream"); }
    bool device_buffers() const override {
        calls_.push_back("device_buffers");
        return true;
    }
    void set_wait_each(bool) override { calls_.push_back("set_wait_each"); }
    void settle() override { calls_.push_back("settle"); }

  private:
    std::vector<std::string>& calls_;
};

// A call the joined communicator left to the base class would run the base's fallback (a started
// sum, for one, would block until done) instead of the inner communicator's own.
TEST_CASE("join_run: the joined communicator passes every call to its inner one") {
    std::vector<std::string> calls;
    auto rv = std::make_unique<Rendezvous>(env_of(0, 1, net::free_tcp_port()), 5);
    auto joined = make_joined_comm(std::move(rv), std::make_unique<SpyComm>(calls));
    float x[2] = {};
    joined->all_reduce_sum(x, 2, CommType::f32);
    joined->all_gather(x, x, 1, CommType::f32);
    joined->reduce_scatter_sum(x, x, 1, CommType::f32);
    joined->start_all_reduce_sum(x, 2, CommType::f32);
    joined->wait();
    joined->broadcast(x, 2, CommType::f32, 0);
    joined->barrier();
    joined->split(0, 0);
    joined->set_stream(nullptr);
    CHECK(joined->device_buffers());
    joined->set_wait_each(false);
    joined->settle();
    CHECK(joined->name() == "spy");
    CHECK(calls == std::vector<std::string>{"all_reduce_sum", "all_gather", "reduce_scatter_sum",
                                            "start_all_reduce_sum", "wait", "broadcast", "barrier",
                                            "split", "set_stream", "device_buffers",
                                            "set_wait_each", "settle"});
    finish_run(*joined);
}

TEST_CASE("join_run: two processes sum over tcp and finish in order") {
    const int port = net::free_tcp_port();
    const fs::path dir = temp_dir("join");
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; r++)
        pids.push_back(fork_child(
            [&, r] {
                set_rank_env(r, 2, port);
                auto comm = join_run("cpu", 5);
                if (!comm || comm->name() != "tcp" || comm->size() != 2 || comm->rank() != r)
                    return 2;
                if (comm->sum(double(r + 1)) != 3.0) return 3;
                auto half = comm->split(0, -r);  // the rendezvous outlives the sub-group
                if (half->rank() != 1 - r || half->sum(int64_t(r + 5)) != 11) return 4;
                half.reset();
                finish_run(*comm);
                return 0;
            },
            dir / ("rank" + std::to_string(r))));
    for (int r = 0; r < 2; r++) {
        CAPTURE(r);
        CHECK(exit_status(wait_child(pids[size_t(r)], 20)) == 0);
        CHECK(read_file(dir / ("rank" + std::to_string(r))) == "");
    }
    fs::remove_all(dir);
}

TEST_CASE("join_run: a rank's reported failure stops a rank blocked elsewhere, with the reason") {
    const int port = net::free_tcp_port();
    const fs::path dir = temp_dir("report");
    const auto start = Clock::now();
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; r++)
        pids.push_back(fork_child(
            [&, r] {
                set_rank_env(r, 2, port);
                auto comm = join_run("cpu", 5);
                comm->barrier();
                if (r == 1) {
                    report_rank_failure(*comm, "disk full");
                    return 3;
                }
                // Rank 0 is stuck (as in an NCCL collective): the default watchdog ends it.
                std::this_thread::sleep_for(std::chrono::seconds(30));
                return 0;
            },
            dir / ("rank" + std::to_string(r))));
    const int s1 = wait_child(pids[1], 20), s0 = wait_child(pids[0], 20);
    CHECK(exit_status(s1) == 3);
    CHECK(exit_status(s0) == 1);
    CHECK(since(start) < 10);
    CHECK(contains(read_file(dir / "rank0"), "error: rank 1 failed: disk full"));
    fs::remove_all(dir);
}

// ---- train --nproc N ----

TEST_CASE("launch_local: each rank gets its environment") {
    const fs::path dir = temp_dir("launch_env");
    const std::string script =
        "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && "
        "test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0 && "
        "test \"$NCCL_NVLS_ENABLE\" = 0 && touch \"$0/rank$RANK\"";
    const ChildRun c = run_in_child(
        [&] {
            unsetenv("NCCL_NVLS_ENABLE");
            return launch_local(3, "/bin/sh", {"sh", "-c", script, dir.string()}, 2);
        },
        20);
    CHECK(exit_status(c.status) == 0);
    CHECK(c.err == "");
    for (int r = 0; r < 3; r++) CHECK(fs::exists(dir / ("rank" + std::to_string(r))));
    fs::remove_all(dir);
}

TEST_CASE("launch_local: node 1 of 2 starts the ranks N..2N-1 of 2N at the given master") {
    const fs::path dir = temp_dir("launch_node");
    const std::string script =
        "test \"$WORLD_SIZE\" = 4 && test \"$LOCAL_WORLD_SIZE\" = 2 && "
        "test \"$GROUP_RANK\" = 1 && test \"$RANK\" = $((LOCAL_RANK + 2)) && "
        "test \"$MASTER_ADDR\" = 10.1.2.3 && test \"$MASTER_PORT\" = 29555 && "
        "touch \"$0/rank$RANK\"";
    NodeSpec node;
    node.nnodes = 2;
    node.node_rank = 1;
    node.master_addr = "10.1.2.3";
    node.master_port = 29555;
    const ChildRun c = run_in_child(
        [&] {
            return launch_local(2, "/bin/sh", {"sh", "-c", script, dir.string()}, 2, node);
        },
        20);
    CHECK(exit_status(c.status) == 0);
    CHECK(c.err == "");
    CHECK(fs::exists(dir / "rank2"));
    CHECK(fs::exists(dir / "rank3"));
    fs::remove_all(dir);
}

TEST_CASE("launch_local: a failing rank of node 1 is named by its global rank") {
    NodeSpec node;
    node.nnodes = 2;
    node.node_rank = 1;
    node.master_addr = "127.0.0.1";
    node.master_port = 29556;
    const ChildRun c = run_in_child(
        [&] {
            return launch_local(
                2, "/bin/sh", {"sh", "-c", "if [ \"$RANK\" = 3 ]; then exit 3; fi; exec sleep 30"},
                5, node);
        },
        20);
    CHECK(exit_status(c.status) == 3);
    CHECK(contains(c.err, "launch: rank 3 exited with status 3; stopping rank 2"));
}

TEST_CASE("launch_local: a node spec that cannot describe a run names the option") {
    auto error = [](int nnodes, int node_rank, const std::string& addr, int port) {
        NodeSpec n;
        n.nnodes = nnodes;
        n.node_rank = node_rank;
        n.master_addr = addr;
        n.master_port = port;
        try {
            check_node_spec(n);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(error(1, 0, "", 0) == "");
    CHECK(error(2, 1, "node0", 29500) == "");
    CHECK(contains(error(0, 0, "", 0), "--nnodes must be at least 1, not 0"));
    CHECK(contains(error(2, 2, "node0", 29500), "--node-rank 2 is not a node of 2 (0..1)"));
    CHECK(contains(error(2, -1, "node0", 29500), "--node-rank -1 is not a node of 2"));
    CHECK(contains(error(2, 0, "", 29500), "no --master-addr or MASTER_ADDR"));
    CHECK(contains(error(2, 0, "node0", 0), "no --master-port or MASTER_PORT"));
    CHECK(contains(error(1, 0, "", 70000), "--master-port 70000 is out of range"));
}

TEST_CASE("launch_local: a failing rank stops the others") {
    const ChildRun c = run_in_child(
        [] {
            return launch_local(
                3, "/bin/sh", {"sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 30"},
                5);
        },
        20);
    CHECK(exit_status(c.status) == 3);
    CHECK(contains(c.err, "launch: rank 1 exited with status 3; stopping ranks 0, 2"));
    // SIGTERM did it, not the SIGKILL after the 5 s grace.
    CHECK(!contains(c.err, "killing"));
    CHECK(c.seconds < 4);
}

TEST_CASE("launch_local: a rank that ignores SIGTERM is killed after the grace period") {
    const ChildRun c = run_in_child(
        [] {
            return launch_local(2, "/bin/sh",
                                {"sh", "-c",
                                 "if [ \"$RANK\" = 0 ]; then sleep 1; exit 4; fi; "
                                 "trap '' TERM; exec sleep 30"},
                                1);
        },
        20);
    CHECK(exit_status(c.status) == 4);
    CHECK(contains(c.err, "launch: rank 0 exited with status 4; stopping rank 1"));
    CHECK(contains(c.err, "launch: killing rank(s) 1"));
    CHECK(c.seconds < 10);
}

TEST_CASE("launch_local: SIGTERM to the launcher reaches the ranks") {
    const fs::path dir = temp_dir("launch_sig");
    const auto start = Clock::now();
    const pid_t launcher = fork_child(
        [&] {
            return launch_local(
                2, "/bin/sh", {"sh", "-c", "touch \"$0/up$RANK\"; exec sleep 30", dir.string()}, 2);
        },
        dir / "stderr");
    // Both ranks running means the launcher's handlers are in place.
    while (!(fs::exists(dir / "up0") && fs::exists(dir / "up1")) && since(start) < 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kill(launcher, SIGTERM);
    const int status = wait_child(launcher, 10);
    CHECK(exit_status(status) == 128 + SIGTERM);
    CHECK(contains(read_file(dir / "stderr"), "was killed by signal 15"));
    CHECK(since(start) < 10);
    fs::remove_all(dir);
}

TEST_CASE("launch_local: a program that cannot run is an error") {
    CHECK_THROWS_WITH_AS(launch_local(2, "/nonexistent/train", {"train"}),
                         doctest::Contains("launch: cannot execute /nonexistent/train"), Error);
}

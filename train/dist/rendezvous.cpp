// Rendezvous (train/dist/rendezvous.h): the join at MASTER_ADDR:MASTER_PORT and the watchdog that
// keeps the control connections (rank 0 to each other rank) until the orderly end of the run.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kernels/core/check.h"
#include "train/dist/rendezvous.h"

namespace zgpt {

namespace {

constexpr uint32_t kControlTag = 1;
constexpr double kSendWait = 2.0;  // control frames are tiny: a peer that takes longer is gone

void print_and_exit(const std::string& message) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    _exit(1);
}

// Strings as (u32 length, bytes)...: the host table and the payload in one frame.
std::string pack(const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& p : parts) {
        const uint32_t n = uint32_t(p.size());
        out.append(reinterpret_cast<const char*>(&n), 4);
        out += p;
    }
    return out;
}

std::vector<std::string> unpack(const std::string& s) {
    std::vector<std::string> parts;
    size_t at = 0;
    while (at + 4 <= s.size()) {
        uint32_t n;
        std::memcpy(&n, s.data() + at, 4);
        ZG_CHECK(at + 4 + n <= s.size(), "rendezvous: rank 0 sent a truncated payload");
        parts.push_back(s.substr(at + 4, n));
        at += 4 + n;
    }
    ZG_CHECK(at == s.size(), "rendezvous: rank 0 sent a truncated payload");
    return parts;
}

}  // namespace

Rendezvous::Rendezvous(const RankEnv& env, double timeout_s, const std::string& payload,
                       FailureHandler on_failure)
    : env_(env), timeout_s_(timeout_s), on_failure_(on_failure ? on_failure : print_and_exit) {
    ZG_CHECK(timeout_s > 0, "rendezvous: the timeout must be > 0 s");
    ZG_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
             "rendezvous: rank " + std::to_string(env.rank) + " is not a rank of a world of " +
                 std::to_string(env.world_size));
    if (env.world_size == 1) {
        payload_ = payload;
        hosts_ = {"127.0.0.1"};
        return;
    }
    ZG_CHECK(!env.master_addr.empty(), "rendezvous: no MASTER_ADDR");
    ZG_CHECK(env.master_port > 0 && env.master_port <= 65535,
             "rendezvous: MASTER_PORT " + std::to_string(env.master_port) + " is out of range");
    if (env.rank == 0)
        join_as_root(payload);
    else
        join_as_worker();
    bye_.assign(size_t(env.world_size), 0);
    ZG_CHECK(pipe2(wake_, O_CLOEXEC | O_NONBLOCK) == 0, "rendezvous: pipe2() failed");
    watchdog_ = std::thread([this] { watch(); });
}

Rendezvous::~Rendezvous() {
    stop_watchdog();
    // Graceful: a failure report sent just before still arrives ahead of the end-of-file.
    for (net::Socket& s : links_) s.close_gracefully();
    for (int fd : wake_)
        if (fd >= 0) ::close(fd);
}

net::StarSpec Rendezvous::spec(const std::string& what, uint32_t tag) const {
    net::StarSpec s;
    s.what = what;
    s.where = env_.master_addr + ":" + std::to_string(env_.master_port);
    s.tag = tag;
    s.size = env_.world_size;
    s.timeout_s = timeout_s_;
    return s;
}

void Rendezvous::join_as_root(const std::string& payload) {
    listener_ = net::listen_tcp(env_.master_port);
    const net::StarSpec sp = spec("rendezvous", kControlTag);
    links_ = net::accept_star(listener_, sp);
    hosts_.assign(size_t(size()), "");
    hosts_[0] = net::local_address(links_[1]);
    for (int r = 1; r < size(); r++) hosts_[size_t(r)] = net::peer_address(links_[size_t(r)]);
    payload_ = payload;
    std::vector<std::string> parts = hosts_;
    parts.push_back(payload);
    net::send_star_ack(links_, pack(parts), sp);
}

void Rendezvous::join_as_worker() {
    const net::StarSpec sp = spec("rendezvous", kControlTag);
    links_.resize(1);
    links_[0] = net::join_star(env_.master_addr, env_.master_port, rank(), sp);
    std::vector<std::string> parts = unpack(net::recv_star_ack(links_[0], rank(), sp));
    ZG_CHECK(int(parts.size()) == size() + 1, "rendezvous: rank 0 sent a malformed payload");
    payload_ = parts.back();
    parts.pop_back();
    hosts_ = std::move(parts);
    hosts_[0] = net::peer_address(links_[0]);  // where we reached rank 0
}

std::vector<net::Socket> Rendezvous::connect_star(uint32_t tag) {
    ZG_CHECK(tag != kControlTag, "connect_star: tag 1 is the control channel's");
    {
        std::lock_guard<std::mutex> lock(mu_);
        ZG_CHECK(!finished_, "connect_star after finish()");
    }
    std::vector<net::Socket> out(size_t(rank() == 0 ? size() : 1));
    if (size() == 1) return out;
    const net::StarSpec sp = spec("tcp communicator", tag);
    if (rank() == 0) {
        out = net::accept_star(listener_, sp);
        net::send_star_ack(out, "", sp);
    } else {
        out[0] = net::join_star(env_.master_addr, env_.master_port, rank(), sp);
        net::recv_star_ack(out[0], rank(), sp);
    }
    return out;
}

void Rendezvous::watch() {
    using net::Clock;
    // Heartbeats let a rank whose host died (no end-of-file ever arrives) be noticed.
    const auto interval = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::clamp(timeout_s_ / 4, 0.05, 5.0)));
    const auto silence = std::chrono::duration<double>(timeout_s_);
    std::vector<char> live(links_.size(), 0);
    for (size_t r = 0; r < links_.size(); r++) live[r] = links_[r].valid();
    std::vector<Clock::time_point> heard(links_.size(), Clock::now());
    auto name = [&](size_t i) { return "rank " + std::to_string(rank() == 0 ? int(i) : 0); };
    Clock::time_point next_ping = Clock::now();
    for (;;) {
        if (Clock::now() >= next_ping) {
            std::lock_guard<std::mutex> lock(send_mu_);
            // A failed send shows up on the reading side (end-of-file or silence).
            for (size_t r = 0; r < links_.size(); r++)
                if (live[r]) net::send_frame(links_[r].fd(), net::kPing, "", kSendWait);
            next_ping = Clock::now() + interval;
        }
        std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
        std::vector<size_t> who{0};
        for (size_t r = 0; r < links_.size(); r++)
            if (live[r]) {
                fds.push_back({links_[r].fd(), POLLIN, 0});
                who.push_back(r);
            }
        const auto wait =
            std::chrono::duration_cast<std::chrono::milliseconds>(next_ping - Clock::now());
        ::poll(fds.data(), fds.size(), int(std::max<int64_t>(0, wait.count()) + 1));
        if (fds[0].revents) {
            char buf[64];
            while (::read(wake_[0], buf, sizeof buf) > 0) {
            }
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_) return;
        }
        for (size_t i = 1; i < fds.size(); i++) {
            if (!fds[i].revents) continue;
            const size_t r = who[i];
            net::FrameHeader h;
            std::string body;
            const net::Io io = net::recv_frame(links_[r].fd(), h, body, timeout_s_);
            if (io == net::Io::closed) return alarm(name(r) + " exited unexpectedly", int(r));
            if (io != net::Io::ok) return alarm(name(r) + " sent a broken control message", int(r));
            heard[r] = Clock::now();
            if (h.kind == net::kBye) {
                live[r] = 0;
                std::lock_guard<std::mutex> lock(mu_);
                bye_[r] = 1;
                cv_.notify_all();
            } else if (h.kind == net::kFailure && rank() == 0) {
                return alarm(name(r) + " failed: " + body, int(r));
            } else if (h.kind == net::kAlarm && rank() != 0) {
                return alarm(body, 0);
            }
        }
        for (size_t r = 0; r < links_.size(); r++)
            if (live[r] && Clock::now() - heard[r] > silence)
                return alarm(name(r) + " sent nothing for " + net::seconds_text(timeout_s_) +
                                 " (hung, or its host or the network is down)",
                             int(r));
    }
}

void Rendezvous::alarm(const std::string& message, int source_rank) {
    if (rank() == 0) {
        std::lock_guard<std::mutex> lock(send_mu_);
        for (size_t r = 1; r < links_.size(); r++)
            if (int(r) != source_rank)
                net::send_frame(links_[r].fd(), net::kAlarm, message, kSendWait);
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (quiet_ || stop_) return;
        alarmed_ = true;
        cv_.notify_all();
    }
    on_failure_(message);
}

void Rendezvous::report_failure(const std::string& reason) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (finished_ || quiet_) return;
        quiet_ = true;
    }
    if (size() == 1) return;
    std::lock_guard<std::mutex> lock(send_mu_);
    if (rank() == 0) {
        for (size_t r = 1; r < links_.size(); r++)
            net::send_frame(links_[r].fd(), net::kAlarm, "rank 0 failed: " + reason, kSendWait);
    } else {
        net::send_frame(links_[0].fd(), net::kFailure, reason, kSendWait);
    }
}

void Rendezvous::stop_watchdog() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    if (!watchdog_.joinable()) return;
    if (watchdog_.get_id() == std::this_thread::get_id()) {  // called from on_failure
        watchdog_.detach();
        return;
    }
    const char c = 1;
    if (::write(wake_[1], &c, 1) < 0) {
    }  // a full pipe already wakes it
    watchdog_.join();
}

void Rendezvous::finish() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (finished_) return;
        finished_ = true;
    }
    if (size() == 1) return;
    std::vector<int> missing;
    if (rank() == 0) {
        // The others may still be at work (rank 0 closing now would alarm them): wait for their
        // bye.
        std::unique_lock<std::mutex> lock(mu_);
        auto all_done = [&] {
            return alarmed_ || std::all_of(bye_.begin() + 1, bye_.end(), [](char b) { return b; });
        };
        cv_.wait_until(lock, net::deadline_after(timeout_s_), all_done);
        for (int r = 1; r < size(); r++)
            if (!bye_[size_t(r)]) missing.push_back(r);
        if (alarmed_) missing.clear();  // already reported
    }
    stop_watchdog();
    if (rank() != 0) {
        std::lock_guard<std::mutex> lock(send_mu_);
        net::send_frame(links_[0].fd(), net::kBye, "", kSendWait);
    }
    for (net::Socket& s : links_) s.close_gracefully();
    listener_.close();
    ZG_CHECK(missing.empty(), "finish: " + std::string(missing.size() == 1 ? "rank " : "ranks ") +
                                  net::join_ints(missing) + " of " + std::to_string(size()) +
                                  " did not finish within " + net::seconds_text(timeout_s_) +
                                  " of rank 0");
}

}  // namespace zgpt

// The `tcp` communicator (train/dist/comm_tcp.h). Each collective is one round trip per member: the
// member sends a frame (the call's description, its input), rank 0 of the group checks that every
// member made the same call, computes, and answers each member. A failure seen by rank 0 goes to
// every member as an error frame, so they throw the reason (naming the rank at fault) instead of
// timing out.
#include "train/dist/comm_tcp.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kernels/core/check.h"
#include "train/dist/net.h"
#include "train/dist/rendezvous.h"

namespace zgpt {

namespace {

constexpr uint32_t kWorldTag = 2;        // the world's data star on the master port
constexpr uint32_t kSplitTagBase = 256;  // + the parent's split count

enum Op : uint32_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };

const char* type_name(CommType t) {
    return t == CommType::f32   ? "f32"
           : t == CommType::f64 ? "f64"
           : t == CommType::i64 ? "i64"
                                : "b16";
}

struct Call {
    uint32_t op;
    CommType type;
    int64_t n;
    int root;
    bool operator==(const Call&) const = default;
};

std::string describe(const Call& c) {
    static const char* names[] = {"?",         "all_reduce", "all_gather", "reduce_scatter",
                                  "broadcast", "barrier"};
    const std::string op = names[c.op <= kBarrier ? c.op : 0];
    if (c.op == kBarrier) return op + "()";
    std::string s = op + "(n=" + std::to_string(c.n) + ", " + type_name(c.type);
    if (c.op == kBroadcast) s += ", root " + std::to_string(c.root);
    return s + ")";
}

net::FrameHeader header(const Call& c, size_t bytes) {
    net::FrameHeader h;
    h.kind = net::kData;
    h.aux = c.op | uint32_t(c.type) << 8;
    h.aux2 = uint32_t(c.root);
    h.arg = c.n;
    h.len = bytes;
    return h;
}

Call call_of(const net::FrameHeader& h) {
    return Call{h.aux & 0xff, CommType((h.aux >> 8) & 0xff), h.arg, int(h.aux2)};
}

const char* io_text(net::Io io) {
    switch (io) {
        case net::Io::closed:
            return " closed its connection (did the process exit?)";
        case net::Io::timeout:
            return " sent nothing for ";
        default:
            return " sent a malformed message";
    }
}

class TcpComm final : public Communicator {
  public:
    // links: at rank 0 one per member (index 0 empty); at a member, [0] to rank 0.
    TcpComm(int rank, std::vector<int> world_ranks, std::vector<std::string> hosts,
            std::vector<net::Socket> links, double timeout_s)
        : rank_(rank),
          world_ranks_(std::move(world_ranks)),
          hosts_(std::move(hosts)),
          links_(std::move(links)),
          timeout_s_(timeout_s) {}

    int rank() const override { return rank_; }
    int size() const override { return int(world_ranks_.size()); }
    std::string name() const override { return "tcp"; }

    void all_reduce_sum(void* buf, int64_t n, CommType t) override {
        const Call c{kAllReduce, t, n, 0};
        const size_t bytes = size_t(n) * comm_type_size(t);
        check_usable(c);
        if (size() == 1) return;
        if (rank_ != 0) {
            member_send(c, buf, bytes);
            return member_recv(c, buf, bytes);
        }
        scratch_.resize(bytes);
        for (int r = 1; r < size(); r++) {
            leader_recv(r, c, scratch_.data(), bytes);
            comm_add(buf, scratch_.data(), n, t);  // ((r0 + r1) + r2) ...
        }
        for (int r = 1; r < size(); r++) leader_send(r, c, buf, bytes);
    }

    void all_gather(const void* send, void* recv, int64_t n, CommType t) override {
        const Call c{kAllGather, t, n, 0};
        const size_t bytes = size_t(n) * comm_type_size(t), total = bytes * size_t(size());
        check_usable(c);
        if (rank_ != 0) {
            member_send(c, send, bytes);
            return member_recv(c, recv, total);
        }
        // recv may hold send at rank 0's slot only, so the others' slots are free to fill.
        if (send != recv) std::memmove(recv, send, bytes);
        char* out = static_cast<char*>(recv);
        for (int r = 1; r < size(); r++) leader_recv(r, c, out + size_t(r) * bytes, bytes);
        for (int r = 1; r < size(); r++) leader_send(r, c, recv, total);
    }

    void reduce_scatter_sum(const void* send, void* recv, int64_t n, CommType t) override {
        const Call c{kReduceScatter, t, n, 0};
        const size_t bytes = size_t(n) * comm_type_size(t), total = bytes * size_t(size());
        check_usable(c);
        if (rank_ != 0) {
            member_send(c, send, total);
            return member_recv(c, recv, bytes);
        }
        sum_.assign(static_cast<const char*>(send), static_cast<const char*>(send) + total);
        scratch_.resize(total);
        for (int r = 1; r < size(); r++) {
            leader_recv(r, c, scratch_.data(), total);
            comm_add(sum_.data(), scratch_.data(), n * size(), t);
        }
        for (int r = 1; r < size(); r++) leader_send(r, c, sum_.data() + size_t(r) * bytes, bytes);
        std::memcpy(recv, sum_.data(), bytes);
    }

    void broadcast(void* buf, int64_t n, CommType t, int root) override {
        ZG_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) +
                                                 " is not a rank of " + std::to_string(size()));
        const Call c{kBroadcast, t, n, root};
        const size_t bytes = size_t(n) * comm_type_size(t);
        check_usable(c);
        if (rank_ != 0) {
            // Every member reports the call, so that rank 0 can check it; the root sends the data.
            member_send(c, buf, rank_ == root ? bytes : 0);
            if (rank_ != root) member_recv(c, buf, bytes);
            return;
        }
        for (int r = 1; r < size(); r++)
            leader_recv(r, c, r == root ? buf : nullptr, r == root ? bytes : 0);
        for (int r = 1; r < size(); r++)
            if (r != root) leader_send(r, c, buf, bytes);
    }

    void barrier() override {
        const Call c{kBarrier, CommType::f32, 0, 0};
        check_usable(c);
        if (rank_ != 0) {
            member_send(c, nullptr, 0);
            return member_recv(c, nullptr, 0);
        }
        for (int r = 1; r < size(); r++) leader_recv(r, c, nullptr, 0);
        for (int r = 1; r < size(); r++) leader_send(r, c, nullptr, 0);
    }

    std::unique_ptr<Communicator> split(int color, int key) override {
        // Everyone learns everyone's (color, key); each group's first member by (key, rank)
        // listens on an ephemeral port, and the others connect to it.
        const int64_t mine[2] = {color, key};
        std::vector<int64_t> all(size_t(2 * size()));
        all_gather(mine, all.data(), 2, CommType::i64);
        std::vector<std::pair<int64_t, int>> order;
        for (int r = 0; r < size(); r++)
            if (all[size_t(2 * r)] == color) order.push_back({all[size_t(2 * r + 1)], r});
        std::sort(order.begin(), order.end());
        int me = 0;
        for (size_t i = 0; i < order.size(); i++)
            if (order[i].second == rank_) me = int(i);
        const int leader = order[0].second;
        net::Socket listener;
        int64_t port = 0;
        if (me == 0 && order.size() > 1) {
            listener = net::listen_tcp(0);
            port = net::local_port(listener);
        }
        std::vector<int64_t> ports(static_cast<size_t>(size()));
        all_gather(&port, ports.data(), 1, CommType::i64);

        std::vector<int> world;
        std::vector<std::string> hosts;
        for (const auto& [k, r] : order) {
            world.push_back(world_ranks_[size_t(r)]);
            hosts.push_back(hosts_[size_t(r)]);
        }
        net::StarSpec spec;
        spec.what = "tcp communicator split (color " + std::to_string(color) + ")";
        spec.where = hosts_[size_t(leader)] + ":" + std::to_string(ports[size_t(leader)]);
        spec.tag = kSplitTagBase + uint32_t(splits_++);
        spec.size = int(order.size());
        spec.timeout_s = timeout_s_;
        spec.rank_names = world;
        std::vector<net::Socket> links(1);
        if (order.size() > 1) {
            if (me == 0) {
                links = net::accept_star(listener, spec);
                net::send_star_ack(links, "", spec);
            } else {
                links[0] =
                    net::join_star(hosts_[size_t(leader)], int(ports[size_t(leader)]), me, spec);
                net::recv_star_ack(links[0], me, spec);
            }
        }
        return std::make_unique<TcpComm>(me, std::move(world), std::move(hosts), std::move(links),
                                         timeout_s_);
    }

  private:
    std::string peer(int r) const { return "rank " + std::to_string(world_ranks_[size_t(r)]); }
    // Members wait longer for rank 0 than rank 0 waits for them: its diagnosis arrives first.
    double member_wait() const { return 2 * timeout_s_; }

    void check_usable(const Call& c) {
        if (!failure_.empty())
            throw Error(failure_ + " (" + describe(c) + " after that failure on " + peer(rank_) +
                        ")");
    }

    [[noreturn]] void fail(const std::string& why) {
        failure_ = "tcp communicator: " + why;
        throw Error(failure_);
    }

    // Rank 0: records the failure, tells every member (but `skip`, whose answer was cut
    // mid-frame) and throws.
    [[noreturn]] void leader_fail(const std::string& why, int skip) {
        failure_ = "tcp communicator: " + why;
        for (int r = 1; r < size(); r++)
            if (r != skip) net::send_frame(links_[size_t(r)].fd(), net::kError, failure_, 1.0);
        throw Error(failure_);
    }

    std::string io_failure(int r, net::Io io, double waited, const Call& c) const {
        std::string s = peer(r) + io_text(io);
        if (io == net::Io::timeout) s += net::seconds_text(waited) + " (hung, or far behind?)";
        return s + " during " + describe(c);
    }

    void leader_recv(int r, const Call& c, void* dst, size_t bytes) {
        const int fd = links_[size_t(r)].fd();
        net::FrameHeader h;
        net::Io io = net::recv_header(fd, h, timeout_s_);
        if (io != net::Io::ok) leader_fail(io_failure(r, io, timeout_s_, c), -1);
        if (h.kind != net::kData) leader_fail(peer(r) + " sent an unexpected message", -1);
        const Call theirs = call_of(h);
        if (!(theirs == c) || h.len != bytes)
            leader_fail(peer(r) + " called " + describe(theirs) + " while " + peer(0) + " called " +
                            describe(c) +
                            " (every rank must make the same collective calls in the same order)",
                        -1);
        if (bytes && (io = net::recv_all(fd, dst, bytes, timeout_s_)) != net::Io::ok)
            leader_fail(io_failure(r, io, timeout_s_, c), -1);
    }

    void leader_send(int r, const Call& c, const void* src, size_t bytes) {
        const net::Io io =
            net::send_frame(links_[size_t(r)].fd(), header(c, bytes), src, timeout_s_);
        if (io != net::Io::ok)
            leader_fail(
                peer(r) +
                    (io == net::Io::timeout ? " took no data for " + net::seconds_text(timeout_s_)
                                            : std::string(io_text(io))) +
                    " during " + describe(c),
                r);
    }

    // A member's input, sent while watching for an error frame from rank 0 (then thrown): rank 0
    // reads the members one after another, so it may fail while we still wait to send.
    void member_send(const Call& c, const void* body, size_t bytes) {
        const net::FrameHeader h = header(c, bytes);
        const int fd = links_[0].fd();
        const char* parts[2] = {reinterpret_cast<const char*>(&h), static_cast<const char*>(body)};
        size_t left[2] = {sizeof h, bytes};
        for (int i = 0; i < 2; i++) {
            const char* p = parts[i];
            while (left[i] > 0) {
                const ssize_t k = ::send(fd, p, left[i], MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k > 0) {
                    p += k;
                    left[i] -= size_t(k);
                    continue;
                }
                if (k < 0 && errno == EINTR) continue;
                if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                    read_error_frame(c, 0.5);  // throws rank 0's reason if it sent one
                    fail(io_failure(0, net::Io::closed, 0, c));
                }
                pollfd pf{fd, POLLOUT | POLLIN, 0};
                if (::poll(&pf, 1, int(std::min(member_wait() * 1000, 2e9))) == 0)
                    fail(peer(0) + " took no data for " + net::seconds_text(member_wait()) +
                         " during " + describe(c));
                if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
                    read_error_frame(c, member_wait());
                    fail(io_failure(0, net::Io::closed, 0, c));
                }
            }
        }
    }

    // Rank 0 spoke while we were sending: it can only be an error frame (thrown) or the end.
    void read_error_frame(const Call& c, double wait) {
        net::FrameHeader h;
        std::string body;
        if (net::recv_frame(links_[0].fd(), h, body, wait) == net::Io::ok &&
            h.kind == net::kError) {
            failure_ = body + " (reported by " + peer(0) + " to " + peer(rank_) + ")";
            throw Error(failure_);
        }
        (void)c;
    }

    void member_recv(const Call& c, void* dst, size_t bytes) {
        const int fd = links_[0].fd();
        net::FrameHeader h;
        net::Io io = net::recv_header(fd, h, member_wait());
        if (io != net::Io::ok) fail(io_failure(0, io, member_wait(), c));
        if (h.kind == net::kError) {
            std::string body(std::min<uint64_t>(h.len, 1 << 20), '\0');
            net::recv_all(fd, body.data(), body.size(), 1.0);
            failure_ = body + " (reported by " + peer(0) + " to " + peer(rank_) + ")";
            throw Error(failure_);
        }
        if (h.kind != net::kData || !(call_of(h) == c) || h.len != bytes)
            fail(peer(0) + " answered " + describe(call_of(h)) + " to " + describe(c));
        if (bytes && (io = net::recv_all(fd, dst, bytes, member_wait())) != net::Io::ok)
            fail(io_failure(0, io, member_wait(), c));
    }

    int rank_;
    std::vector<int> world_ranks_;    // group rank -> world rank (for messages)
    std::vector<std::string> hosts_;  // group rank -> IPv4 address (for split)
    std::vector<net::Socket> links_;
    double timeout_s_;
    int splits_ = 0;
    std::string failure_;  // non-empty: the group is dead, every call throws this
    std::vector<char> scratch_, sum_;
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_comm(Rendezvous& rv, double timeout_s) {
    ZG_CHECK(timeout_s > 0, "tcp communicator: the timeout must be > 0 s");
    std::vector<int> world(size_t(rv.size()));
    for (int r = 0; r < rv.size(); r++) world[size_t(r)] = r;
    return std::make_unique<TcpComm>(rv.rank(), std::move(world), rv.hosts(),
                                     rv.connect_star(kWorldTag), timeout_s);
}

}  // namespace zgpt

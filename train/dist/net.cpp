#include "train/dist/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "kernels/core/check.h"

namespace zgpt::net {

Clock::time_point deadline_after(double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double seconds_left(Clock::time_point deadline) {
    return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
}

namespace {

std::string errno_text(int e) {
    return std::strerror(e);
}

// poll() for one fd, at most `seconds`; false on timeout. EINTR only shortens the wait.
bool wait_fd(int fd, short events, double seconds) {
    pollfd p{fd, events, 0};
    const int ms = int(std::min(seconds * 1000.0 + 0.999, 2.0e9));
    const int n = ::poll(&p, 1, ms);
    return n > 0 || (n < 0 && errno == EINTR);
}

void tune(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small collectives: no Nagle
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);  // not inherited by launched ranks
}

std::string dotted(const sockaddr_in& a) {
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
    return buf;
}

bool is_closed_errno(int e) {
    return e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ECONNABORTED;
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
    if (this != &o) {
        close();
        fd_ = o.fd_;
        o.fd_ = -1;
    }
    return *this;
}

void Socket::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

void Socket::close_gracefully() {
    if (fd_ < 0) return;
    ::shutdown(fd_, SHUT_WR);
    // Linux resets a connection closed with unread input, which can drop what we sent last.
    char buf[4096];
    while (::recv(fd_, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
    close();
}

Socket listen_tcp(int port) {
    ZG_CHECK(port >= 0 && port <= 65535, "port " + std::to_string(port) + " is out of range");
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    ZG_CHECK(s.valid(), "socket(): " + errno_text(errno));
    const int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(port));
    ZG_CHECK(
        ::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0,
        "cannot listen on TCP port " + std::to_string(port) + ": " + errno_text(errno) +
            (errno == EADDRINUSE ? " (another run on this port? pick another MASTER_PORT)" : ""));
    ZG_CHECK(::listen(s.fd(), 256) == 0, "listen(): " + errno_text(errno));
    return s;
}

int local_port(const Socket& s) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ZG_CHECK(getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) == 0,
             "getsockname(): " + errno_text(errno));
    return ntohs(a.sin_port);
}

std::string peer_address(const Socket& s) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (getpeername(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
    return dotted(a);
}

std::string local_address(const Socket& s) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
    return dotted(a);
}

int free_tcp_port() {
    return local_port(listen_tcp(0));
}

Socket accept_until(const Socket& listener, Clock::time_point deadline) {
    for (;;) {
        const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            tune(fd);
            return Socket(fd);
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            throw Error("accept(): " + errno_text(errno));
        const double left = seconds_left(deadline);
        if (left <= 0) return Socket();
        wait_fd(listener.fd(), POLLIN, left);
    }
}

Socket connect_until(const std::string& host, int port, Clock::time_point deadline,
                     std::string* why) {
    double backoff = 0.02;
    for (;;) {
        addrinfo hints{};
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        const int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
        if (gai != 0) {
            *why = "cannot resolve " + host + ": " + gai_strerror(gai);
        } else {
            for (addrinfo* ai = res; ai; ai = ai->ai_next) {
                Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
                if (!s.valid()) {
                    *why = "socket(): " + errno_text(errno);
                    continue;
                }
                int err = 0;
                if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
                    err = errno;
                    if (err == EINPROGRESS) {
                        // An unanswered SYN (host down, packets dropped) must not outlast us.
                        if (!wait_fd(s.fd(), POLLOUT, std::min(seconds_left(deadline), 5.0))) {
                            err = ETIMEDOUT;
                        } else {
                            socklen_t len = sizeof err;
                            getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
                        }
                    }
                }
                if (err == 0) {
                    freeaddrinfo(res);
                    tune(s.fd());
                    return s;
                }
                *why = errno_text(err);
            }
            freeaddrinfo(res);
        }
        const double left = seconds_left(deadline);
        if (left <= 0) return Socket();
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(backoff, left)));
        backoff = std::min(backoff * 2, 0.5);
    }
}

Io send_all(int fd, const void* p, size_t n, double idle_s) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
        if (k > 0) {
            c += k;
            n -= size_t(k);
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(fd, POLLOUT, idle_s)) return Io::timeout;
            continue;
        }
        return k < 0 && !is_closed_errno(errno) ? Io::bad : Io::closed;
    }
    return Io::ok;
}

Io recv_all(int fd, void* p, size_t n, double idle_s) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t k = ::recv(fd, c, n, 0);
        if (k > 0) {
            c += k;
            n -= size_t(k);
            continue;
        }
        if (k == 0) return Io::closed;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!wait_fd(fd, POLLIN, idle_s)) return Io::timeout;
            continue;
        }
        return is_closed_errno(errno) ? Io::closed : Io::bad;
    }
    return Io::ok;
}

Io send_frame(int fd, const FrameHeader& h, const void* body, double idle_s) {
    // Small frames go out as one segment.
    if (h.len <= 4096) {
        char buf[sizeof(FrameHeader) + 4096];
        std::memcpy(buf, &h, sizeof h);
        if (h.len) std::memcpy(buf + sizeof h, body, h.len);
        return send_all(fd, buf, sizeof h + h.len, idle_s);
    }
    const Io io = send_all(fd, &h, sizeof h, idle_s);
    return io != Io::ok ? io : send_all(fd, body, h.len, idle_s);
}

Io send_frame(int fd, uint32_t kind, const std::string& body, double idle_s) {
    FrameHeader h;
    h.kind = kind;
    h.len = body.size();
    return send_frame(fd, h, body.data(), idle_s);
}

Io recv_header(int fd, FrameHeader& h, double idle_s) {
    const Io io = recv_all(fd, &h, sizeof h, idle_s);
    if (io != Io::ok) return io;
    return h.magic == FrameHeader{}.magic ? Io::ok : Io::bad;
}

Io recv_frame(int fd, FrameHeader& h, std::string& body, double idle_s, size_t max_len) {
    Io io = recv_header(fd, h, idle_s);
    if (io != Io::ok) return io;
    if (h.len > max_len) return Io::bad;
    body.resize(h.len);
    return h.len ? recv_all(fd, body.data(), h.len, idle_s) : Io::ok;
}

std::string join_ints(const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
}

std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
}

std::string member_name(const StarSpec& spec, int member) {
    const int r = spec.rank_names.empty() ? member : spec.rank_names.at(size_t(member));
    return "rank " + std::to_string(r);
}

void send_error_to_all(std::vector<Socket>& links, const std::string& message) {
    for (Socket& s : links)
        if (s.valid()) send_frame(s.fd(), kError, message, 1.0);
}

std::vector<Socket> accept_star(const Socket& listener, const StarSpec& spec) {
    std::vector<Socket> links(size_t(spec.size));
    auto fail = [&](const std::string& why, Socket* extra) {
        const std::string msg = spec.what + ": " + why;
        if (extra && extra->valid()) send_frame(extra->fd(), kError, msg, 1.0);
        send_error_to_all(links, msg);
        throw Error(msg);
    };
    const auto deadline = deadline_after(spec.timeout_s);
    int joined = 1;
    while (joined < spec.size) {
        Socket s = accept_until(listener, deadline);
        if (!s.valid()) break;
        FrameHeader h;
        // A connection that is not one of ours (wrong magic, kind or tag) is dropped.
        if (recv_header(s.fd(), h, std::max(seconds_left(deadline), 0.5)) != Io::ok ||
            h.kind != kHello || h.aux != spec.tag || h.len != 0)
            continue;
        const int member = int(h.arg), size = int(h.aux2);
        if (size != spec.size)
            fail("a process that says it is rank " + std::to_string(member) + " expects " +
                     std::to_string(size) + " ranks, but rank 0 has " + std::to_string(spec.size) +
                     " (WORLD_SIZE differs between the processes?)",
                 &s);
        if (member <= 0 || member >= spec.size)
            fail("a process joined as rank " + std::to_string(member) + ", outside 1.." +
                     std::to_string(spec.size - 1),
                 &s);
        if (links[size_t(member)].valid())
            fail("two processes joined as " + member_name(spec, member) +
                     " (is RANK set the same for both?)",
                 &s);
        links[size_t(member)] = std::move(s);
        joined++;
    }
    if (joined < spec.size) {
        std::vector<int> missing;
        for (int m = 1; m < spec.size; m++)
            if (!links[size_t(m)].valid())
                missing.push_back(spec.rank_names.empty() ? m : spec.rank_names[size_t(m)]);
        fail(std::string(missing.size() == 1 ? "rank " : "ranks ") + join_ints(missing) + " of " +
                 std::to_string(spec.size) + " did not connect to " + spec.where + " within " +
                 seconds_text(spec.timeout_s),
             nullptr);
    }
    return links;
}

Socket join_star(const std::string& host, int port, int member, const StarSpec& spec) {
    std::string why;
    Socket s = connect_until(host, port, deadline_after(spec.timeout_s), &why);
    if (!s.valid())
        throw Error(spec.what + ": " + member_name(spec, member) + " could not connect to " +
                    member_name(spec, 0) + " at " + host + ":" + std::to_string(port) + " within " +
                    seconds_text(spec.timeout_s) + " (" + why + ")");
    FrameHeader h;
    h.kind = kHello;
    h.aux = spec.tag;
    h.aux2 = uint32_t(spec.size);
    h.arg = member;
    if (send_frame(s.fd(), h, nullptr, spec.timeout_s) != Io::ok)
        throw Error(spec.what + ": " + member_name(spec, member) + " lost its connection to " +
                    member_name(spec, 0) + " at " + host + ":" + std::to_string(port));
    return s;
}

void send_star_ack(std::vector<Socket>& links, const std::string& payload, const StarSpec& spec) {
    for (size_t m = 1; m < links.size(); m++) {
        const Io io = send_frame(links[m].fd(), kAck, payload, spec.timeout_s);
        if (io != Io::ok) {
            const std::string msg = spec.what + ": " + member_name(spec, int(m)) +
                                    (io == Io::timeout ? " stopped reading" : " went away") +
                                    " right after connecting";
            send_error_to_all(links, msg);
            throw Error(msg);
        }
    }
}

std::string recv_star_ack(Socket& link, int member, const StarSpec& spec) {
    // The leader's own deadline ends at most timeout_s after we connected: waiting longer lets its
    // diagnosis (which ranks are missing) arrive instead of a bare timeout.
    const double wait = spec.timeout_s + std::min(spec.timeout_s, 10.0);
    FrameHeader h;
    std::string body;
    const Io io = recv_frame(link.fd(), h, body, wait);
    const std::string me = member_name(spec, member), leader = member_name(spec, 0);
    if (io == Io::ok && h.kind == kAck) return body;
    if (io == Io::ok && h.kind == kError)
        throw Error(body + " (reported by " + leader + " to " + me + ")");
    if (io == Io::timeout)
        throw Error(spec.what + ": " + me + " connected to " + leader + " at " + spec.where +
                    " but heard nothing back within " + seconds_text(wait));
    throw Error(spec.what + ": " + leader + " at " + spec.where +
                " closed the connection before the group was complete (did it exit?)");
}

}  // namespace zgpt::net

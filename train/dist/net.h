// TCP plumbing for multi-process runs, shared by the rendezvous (train/dist/rendezvous.h) and the
// tcp communicator (train/dist/comm_tcp.h): IPv4 sockets, every wait bounded by poll, framed
// messages, and the "star" (rank 0 of a group accepts one connection from each other member). Peers
// are assumed to share the byte order (every supported host is little-endian).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace zgpt::net {

using Clock = std::chrono::steady_clock;
Clock::time_point deadline_after(double seconds);
double seconds_left(Clock::time_point deadline);  // 0 once past

// An owned, non-blocking, close-on-exec socket (closed on destruction).
class Socket {
  public:
    Socket() = default;
    explicit Socket(int fd) : fd_(fd) {}
    Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Socket& operator=(Socket&& o) noexcept;
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;
    ~Socket() { close(); }
    int fd() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    void close();
    // An orderly close: what we sent is still delivered (no reset for unread input).
    void close_gracefully();

  private:
    int fd_ = -1;
};

// Listens on every IPv4 interface (SO_REUSEADDR); port 0 picks an ephemeral port.
Socket listen_tcp(int port);
int local_port(const Socket& s);
std::string peer_address(const Socket& s);   // dotted IPv4 of the other end
std::string local_address(const Socket& s);  // dotted IPv4 of our end
// A port that was free a moment ago (bind port 0, read it back, close).
int free_tcp_port();

// One connection, or an invalid socket once the deadline passes.
Socket accept_until(const Socket& listener, Clock::time_point deadline);
// Connects to host:port, retrying while nobody listens yet (the peer may start later); an invalid
// socket once the deadline passes, with the last error in *why.
Socket connect_until(const std::string& host, int port, Clock::time_point deadline,
                     std::string* why);

enum class Io { ok, closed, timeout, bad };
// Exactly n bytes; each waits at most idle_s seconds for the next bit of progress.
Io send_all(int fd, const void* p, size_t n, double idle_s);
Io recv_all(int fd, void* p, size_t n, double idle_s);

enum FrameKind : uint32_t {
    kHello = 1,  // aux: star tag, aux2: group size, arg: rank
    kAck,        // body: the leader's payload
    kError,      // body: why the group failed
    kPing,       // watchdog heartbeat
    kBye,        // the sender finished in order
    kFailure,    // a worker's report_failure; body: reason
    kAlarm,      // rank 0 to the others; body: the whole message
    kData,       // a collective's input or result (train/dist/comm_tcp.cpp)
};

struct FrameHeader {
    uint32_t magic = 0x5a475054;  // "ZGPT": a stray connection is recognized and dropped
    uint32_t kind = 0;
    uint32_t aux = 0, aux2 = 0;
    int64_t arg = 0;
    uint64_t len = 0;  // body bytes that follow
};
static_assert(sizeof(FrameHeader) == 32);

Io send_frame(int fd, const FrameHeader& h, const void* body, double idle_s);
Io send_frame(int fd, uint32_t kind, const std::string& body, double idle_s);
// A header with the right magic (Io::bad otherwise).
Io recv_header(int fd, FrameHeader& h, double idle_s);
// A whole frame whose body is at most max_len bytes.
Io recv_frame(int fd, FrameHeader& h, std::string& body, double idle_s, size_t max_len = 1 << 20);

// A group of `size` members joined to its leader (member 0).
struct StarSpec {
    std::string what;             // the error prefix: "rendezvous"
    std::string where;            // host:port, for messages
    uint32_t tag = 0;             // which star: a connection for another one is dropped
    int size = 1;                 // members, leader included
    double timeout_s = 60;        // bounds the whole join
    std::vector<int> rank_names;  // member -> the rank that messages name (empty: the same)
};
std::string member_name(const StarSpec& spec, int member);  // "rank 3"
// The leader: one connection per member 1..size-1 (index 0 stays empty). A member that does not
// arrive, a duplicate or a wrong group size throws zgpt::Error, after telling those connected.
std::vector<Socket> accept_star(const Socket& listener, const StarSpec& spec);
// A member: connected to the leader at host:port, hello sent.
Socket join_star(const std::string& host, int port, int member, const StarSpec& spec);
// The leader tells every member that the group is complete, with a payload.
void send_star_ack(std::vector<Socket>& links, const std::string& payload, const StarSpec& spec);
// A member: the leader's payload, or zgpt::Error with the leader's reason.
std::string recv_star_ack(Socket& link, int member, const StarSpec& spec);
// Best effort: tells each connected member why the group failed.
void send_error_to_all(std::vector<Socket>& links, const std::string& message);

// "2, 3" for {2, 3}.
std::string join_ints(const std::vector<int>& v);
// "5 s", "1.5 s".
std::string seconds_text(double s);

}  // namespace zgpt::net

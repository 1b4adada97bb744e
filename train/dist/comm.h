// Collectives between the ranks of a run: one interface, two implementations.
//   local: N ranks as threads of one process (make_local_group). Sums run in rank order, so the
//          result is the same on every rank and from run to run. It is how CI runs every parallel
//          code path without GPUs.
//   nccl:  one process per GPU (train/dist/comm_nccl.h), NCCL from the CUDA toolkit.
// Every call is collective: all ranks of the communicator make the same calls in the same order.
// A rank that fails, or a peer that does not arrive within the timeout, makes the others throw
// zgpt::Error naming the rank and the reason: never a silent hang.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace zgpt {

// b16: 16-bit words (bf16 weights), which gathers and broadcasts move but no sum takes.
enum class CommType { f32, f64, i64, b16 };
size_t comm_type_size(CommType t);
// The CommType of a float or double buffer (the reference ops' two element types).
template <typename T>
constexpr CommType comm_type_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
    return std::is_same_v<T, float> ? CommType::f32 : CommType::f64;
}
// acc[i] += x[i] for n elements of type t: one more rank's term of a rank-order sum (the local and
// tcp communicators add this way, so their results agree bit for bit).
void comm_add(void* acc, const void* x, int64_t n, CommType t);

class Communicator {
  public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string name() const = 0;  // "local" | "nccl"

    // buf[0, n) summed over the ranks, in place.
    virtual void all_reduce_sum(void* buf, int64_t n, CommType t) = 0;
    // recv[r * n, (r + 1) * n) = rank r's send[0, n). recv may hold send at rank() * n.
    virtual void all_gather(const void* send, void* recv, int64_t n, CommType t) = 0;
    // recv[0, n) = sum over ranks of their send[rank() * n, (rank() + 1) * n).
    virtual void reduce_scatter_sum(const void* send, void* recv, int64_t n, CommType t) = 0;
    // The same sum, started and not waited for: a device communicator (nccl) enqueues it on its
    // stream and returns, so the caller can go on queueing work; wait() completes every sum
    // started since the last wait(). Host communicators sum at once. buf must stay untouched
    // until wait() returns.
    virtual void start_all_reduce_sum(void* buf, int64_t n, CommType t) {
        all_reduce_sum(buf, n, t);
    }
    virtual void wait() {}
    // buf[0, n) of rank `root` copied to every rank.
    virtual void broadcast(void* buf, int64_t n, CommType t, int root) = 0;
    virtual void barrier() = 0;
    // A sub-group of the ranks that pass the same color, ordered by (key, rank). Collective.
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
    // The CUDA stream (cudaStream_t) that device-buffer collectives are ordered on (nccl); host
    // communicators ignore it.
    virtual void set_stream(void* /*cuda_stream*/) {}
    // Whether collectives take device (CUDA) pointers; false: host memory only (local, tcp).
    virtual bool device_buffers() const { return false; }
    // A device communicator with a timeout (nccl) returns from each collective on device buffers
    // once it is done, so a hang is named at its collective. With wait_each false such a call
    // returns once queued, and settle() waits, bounded the same, for everything queued so far:
    // the host goes on queueing work behind the collectives, and must settle() before it reads
    // their results or waits for them any other way. Host communicators finish every call.
    virtual void set_wait_each(bool /*each*/) {}
    virtual void settle() {}

    // Typed conveniences.
    void all_reduce_sum(float* p, int64_t n) { all_reduce_sum(p, n, CommType::f32); }
    void all_reduce_sum(double* p, int64_t n) { all_reduce_sum(p, n, CommType::f64); }
    void all_reduce_sum(int64_t* p, int64_t n) { all_reduce_sum(p, n, CommType::i64); }
    double sum(double x) {
        all_reduce_sum(&x, 1);
        return x;
    }
    int64_t sum(int64_t x) {
        all_reduce_sum(&x, 1);
        return x;
    }
};

// Rank `rank`'s slice [lo, hi) of an arena of n elements cut into `ranks` slices of ceil(n / ranks)
// (the last ones shorter, possibly empty): what each rank owns under ZeRO-1.
struct ArenaSlice {
    int64_t lo = 0, hi = 0;
};
ArenaSlice arena_slice(int64_t n, int ranks, int rank);
// The n elements from every rank's arena_slice, `mine` being this rank's (host memory). Collective.
std::vector<float> all_gather_slices(Communicator& c, const float* mine, int64_t n);

// Rank `root`'s text on every rank. Collective.
std::string broadcast_text(Communicator& c, const std::string& text, int root = 0);
// Every rank's text on rank 0, in rank order; the other ranks get none. Collective.
std::vector<std::string> gather_texts(Communicator& c, const std::string& text);

// One rank of world size 1: every collective is the identity (what a plain run uses).
std::unique_ptr<Communicator> make_single_rank_comm();

// N ranks in one process, on host memory; comms[r] is rank r, to be used by one thread each.
// timeout_s bounds every wait for a peer.
std::vector<std::unique_ptr<Communicator>> make_local_group(int n, double timeout_s = 300);

// Marks a local group as failed: every rank waiting in (or later entering) a collective throws
// `reason`. What a thread that caught an exception calls before it leaves.
void abort_local_group(Communicator& any_rank, const std::string& reason);
// Whether the local group has failed already (a peer's abort or a timeout).
bool local_group_failed(Communicator& any_rank);

}  // namespace zgpt

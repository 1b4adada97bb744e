// The `nccl` communicator (train/dist/comm_nccl.h).
#include "train/dist/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "kernels/core/check.h"
#include "kernels/core/cuda_check.h"

namespace zgpt {

namespace {

[[noreturn]] void nccl_fail(ncclResult_t r, const char* expr, const char* file, int line) {
    std::string msg = std::string("NCCL error: ") + ncclGetErrorString(r);
    // The last error's details (which peer, which transport), where NCCL has them.
    if (const char* last = ncclGetLastError(nullptr); last && *last)
        msg += " (" + std::string(last) + ")";
    fail_check(expr, file, line, msg);
}

#define ZG_NCCL_CHECK(expr)                                                          \
    do {                                                                             \
        const ncclResult_t zg_nccl_ = (expr);                                        \
        if (zg_nccl_ != ncclSuccess) nccl_fail(zg_nccl_, #expr, __FILE__, __LINE__); \
    } while (0)

ncclDataType_t nccl_type(CommType t) {
    switch (t) {
        case CommType::f32:
            return ncclFloat32;
        case CommType::f64:
            return ncclFloat64;
        case CommType::i64:
            return ncclInt64;
        case CommType::b16:
            return ncclBfloat16;
    }
    throw Error("nccl communicator: unknown CommType");
}

// Memory the GPU cannot use directly as an NCCL buffer: pageable or pinned host memory.
bool is_host(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  // clear it: older runtimes report unregistered memory as an error
        return true;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

class NcclComm final : public Communicator {
  public:
    NcclComm(ncclComm_t comm, int device, double timeout_s)
        : comm_(comm), device_(device), timeout_s_(timeout_s) {
        ZG_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
        ZG_NCCL_CHECK(ncclCommCount(comm_, &size_));
        ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
        stream_ = own_stream_;
    }
    ~NcclComm() override {
        if (scratch_) cudaFree(scratch_);
        if (queued_ev_) cudaEventDestroy(queued_ev_);
        if (!aborted_) ncclCommDestroy(comm_);
        cudaStreamDestroy(own_stream_);
    }
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return "nccl"; }
    // null: back to the communicator's own stream (the caller's stream is going away)
    void set_stream(void* s) override { stream_ = s ? static_cast<cudaStream_t>(s) : own_stream_; }
    bool device_buffers() const override { return true; }
    void set_wait_each(bool each) override {
        if (each) settle();
        wait_each_ = each;
    }
    // The last collective queued without a wait done, bounded by the timeout. Every earlier one
    // is then done too: NCCL needs one order of a communicator's collectives, and its user
    // keeps them in it across streams (the split head's `collective` chain of events in
    // model/gpt_cuda_head.cu; the embedding's exchanges all on the model's stream).
    void settle() override {
        if (queued_op_ == nullptr) return;
        const char* op = std::exchange(queued_op_, nullptr);
        wait_done(op, [&] { return cudaEventQuery(queued_ev_); });
    }

    void all_reduce_sum(void* buf, int64_t n, CommType t) override {
        const size_t bytes = size_t(n) * comm_type_size(t);
        Staged s = stage(buf, bytes, buf, bytes);
        ZG_NCCL_CHECK(
            ncclAllReduce(s.send, s.recv, size_t(n), nccl_type(t), ncclSum, comm_, stream_));
        finish("all_reduce", s.any_staged);
        unstage(s, buf, bytes);
    }

    void start_all_reduce_sum(void* buf, int64_t n, CommType t) override {
        if (is_host(buf)) return all_reduce_sum(buf, n, t);  // staged: no overlap to win
        ZG_NCCL_CHECK(ncclAllReduce(buf, buf, size_t(n), nccl_type(t), ncclSum, comm_, stream_));
        started_ = true;
    }
    void wait() override {
        if (!started_) return;
        started_ = false;
        finish_now("all_reduce (started earlier)");
    }
    void all_gather(const void* send, void* recv, int64_t n, CommType t) override {
        const size_t bytes = size_t(n) * comm_type_size(t);
        Staged s = stage(send, bytes, recv, bytes * size_t(size_));
        ZG_NCCL_CHECK(ncclAllGather(s.send, s.recv, size_t(n), nccl_type(t), comm_, stream_));
        finish("all_gather", s.any_staged);
        unstage(s, recv, bytes * size_t(size_));
    }

    void reduce_scatter_sum(const void* send, void* recv, int64_t n, CommType t) override {
        const size_t bytes = size_t(n) * comm_type_size(t);
        Staged s = stage(send, bytes * size_t(size_), recv, bytes);
        ZG_NCCL_CHECK(
            ncclReduceScatter(s.send, s.recv, size_t(n), nccl_type(t), ncclSum, comm_, stream_));
        finish("reduce_scatter", s.any_staged);
        unstage(s, recv, bytes);
    }

    void broadcast(void* buf, int64_t n, CommType t, int root) override {
        ZG_CHECK(root >= 0 && root < size_, "broadcast: root " + std::to_string(root) +
                                                " is not a rank of " + std::to_string(size_));
        const size_t bytes = size_t(n) * comm_type_size(t);
        Staged s = stage(buf, bytes, buf, bytes);
        ZG_NCCL_CHECK(ncclBroadcast(s.send, s.recv, size_t(n), nccl_type(t), root, comm_, stream_));
        finish("broadcast", s.any_staged);
        unstage(s, buf, bytes);
    }

    void barrier() override {
        // One element summed over the ranks completes only when every rank has called it.
        ensure_scratch(sizeof(float));
        ZG_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
        finish_now("barrier");
    }

    std::unique_ptr<Communicator> split(int color, int key) override {
        ZG_CHECK(color >= 0,
                 "nccl communicator: split color must be >= 0, not " + std::to_string(color));
        ncclComm_t sub = nullptr;
        ZG_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
        return std::make_unique<NcclComm>(sub, device_, timeout_s_);
    }

  private:
    // Waits for the collective just enqueued (staged: its host buffers are read next), at most
    // timeout_s; with wait_each_ false, a collective on device buffers is only marked queued, for
    // settle().
    void finish(const char* op, bool staged = false) {
        if (timeout_s_ <= 0) return;
        if (!wait_each_ && !staged) {
            if (queued_ev_ == nullptr)
                ZG_CUDA_CHECK(cudaEventCreateWithFlags(&queued_ev_, cudaEventDisableTiming));
            ZG_CUDA_CHECK(cudaEventRecord(queued_ev_, stream_));
            queued_op_ = op;
            return;
        }
        finish_now(op);
    }
    // Every collective queued so far done, then the stream: what barrier() and wait() promise.
    void finish_now(const char* op) {
        if (timeout_s_ <= 0) return;
        settle();
        wait_done(op, [&] { return cudaStreamQuery(stream_); });
    }

    // Waits until done() stops answering cudaErrorNotReady, at most timeout_s: a peer that is
    // alive but never makes the matching call (hung, or in another collective) would otherwise
    // block this rank forever inside NCCL. On timeout or an asynchronous NCCL error the
    // communicator is aborted and the error names the collective. (Dead peers and silent hosts
    // are also caught by the rendezvous' watchdog, train/dist/rendezvous.h.)
    template <typename Done>
    void wait_done(const char* op, Done done) {
        using Clock = std::chrono::steady_clock;
        const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
        for (int spin = 0;; spin++) {
            const cudaError_t q = done();
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) ZG_CUDA_CHECK(q);
            ncclResult_t async = ncclSuccess;
            ZG_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
            if (async != ncclSuccess) {
                ncclCommAbort(comm_);
                aborted_ = true;
                throw Error(std::string("nccl communicator: ") + op + " failed on rank " +
                            std::to_string(rank_) + ": " + ncclGetErrorString(async));
            }
            if (Clock::now() > deadline) {
                ncclCommAbort(comm_);
                aborted_ = true;
                throw Error(std::string("nccl communicator: ") + op + " did not complete within " +
                            std::to_string(int(timeout_s_)) + " s on rank " +
                            std::to_string(rank_) + " of " + std::to_string(size_) +
                            ": a peer is hung, or made another call");
            }
            // The GPU idles from the collective's end until this thread wakes and enqueues the
            // next kernels, so sleep in short steps (a vocab-parallel step waits on 8 collectives).
            if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    // Device pointers for one collective; host buffers replaced by parts of the scratch buffer.
    struct Staged {
        const void* send;
        void* recv;
        bool recv_staged = false, any_staged = false;
    };

    Staged stage(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
        const bool host_send = send_bytes && is_host(send);
        const bool host_recv = recv_bytes && is_host(recv);
        Staged s{send, recv, host_recv, host_send || host_recv};
        if (!s.any_staged) return s;
        const char* sp = static_cast<const char*>(send);
        const char* rp = static_cast<const char*>(recv);
        // In place (send inside recv, both on the host): send keeps its offset inside recv.
        const bool inside =
            host_send && host_recv && sp >= rp && sp + send_bytes <= rp + recv_bytes;
        const size_t recv_off = 0, send_off = (recv_bytes + 255) / 256 * 256;
        ensure_scratch(send_off + (inside ? 0 : send_bytes));
        char* base = static_cast<char*>(scratch_);
        if (host_recv) s.recv = base + recv_off;
        if (host_send) {
            char* dst = inside ? base + recv_off + (sp - rp) : base + send_off;
            ZG_CUDA_CHECK(cudaMemcpyAsync(dst, send, send_bytes, cudaMemcpyHostToDevice, stream_));
            s.send = dst;
        }
        return s;
    }

    void unstage(const Staged& s, void* recv, size_t recv_bytes) {
        if (s.recv_staged)
            ZG_CUDA_CHECK(
                cudaMemcpyAsync(recv, s.recv, recv_bytes, cudaMemcpyDeviceToHost, stream_));
        if (s.any_staged) ZG_CUDA_CHECK(cudaStreamSynchronize(stream_));
        // A large one (a checkpoint's gather of the AdamW moments: GBs at GPT-2 1558M) does not
        // keep its device copy for the rest of the run; the memory check does not count it.
        if (s.any_staged && scratch_bytes_ > kKeptScratchBytes) {
            ZG_CUDA_CHECK(cudaFree(scratch_));
            scratch_ = nullptr;
            scratch_bytes_ = 0;
        }
    }

    void ensure_scratch(size_t bytes) {
        if (bytes <= scratch_bytes_) return;
        // The old buffer is idle: every staged collective synchronized its stream.
        if (scratch_) ZG_CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (scratch_) ZG_CUDA_CHECK(cudaFree(scratch_));
        scratch_ = nullptr;
        scratch_bytes_ = 0;
        const size_t want = std::max<size_t>(bytes, 4096);
        ZG_CUDA_CHECK(cudaMalloc(&scratch_, want));
        scratch_bytes_ = want;
    }

    ncclComm_t comm_;
    int device_;
    double timeout_s_ = 0;  // 0: wait for collectives without a bound
    bool aborted_ = false;
    bool started_ = false;  // sums started and not yet waited for (start_all_reduce_sum)
    bool wait_each_ = true;
    cudaEvent_t queued_ev_ = nullptr;  // after the last collective queued without a wait
    const char* queued_op_ = nullptr;  // its name, while settle() has not seen it done
    int rank_ = 0, size_ = 1;
    cudaStream_t own_stream_ = nullptr, stream_ = nullptr;
    void* scratch_ = nullptr;
    size_t scratch_bytes_ = 0;
    static constexpr size_t kKeptScratchBytes = size_t(64) << 20;
};

}  // namespace

void select_cuda_device(int device, int rank) {
    int devices = 0;
    ZG_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ZG_CHECK(device >= 0 && device < devices,
             "rank " + std::to_string(rank) + " wants GPU " + std::to_string(device) +
                 " (its LOCAL_RANK) but this host has " + std::to_string(devices));
    ZG_CUDA_CHECK(cudaSetDevice(device));
}

std::string nccl_unique_id() {
    ncclUniqueId id;
    ZG_NCCL_CHECK(ncclGetUniqueId(&id));
    return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<Communicator> make_nccl_comm(const std::string& unique_id_bytes, int rank,
                                             int world_size, int cuda_device, double timeout_s,
                                             int max_ctas) {
    ncclUniqueId id;
    ZG_CHECK(unique_id_bytes.size() == sizeof id.internal,
             "nccl communicator: the unique id has " + std::to_string(unique_id_bytes.size()) +
                 " bytes, not " + std::to_string(sizeof id.internal));
    ZG_CHECK(rank >= 0 && rank < world_size, "nccl communicator: rank " + std::to_string(rank) +
                                                 " is not a rank of " + std::to_string(world_size));
    select_cuda_device(cuda_device, rank);
    std::memcpy(id.internal, unique_id_bytes.data(), sizeof id.internal);
    ncclComm_t comm = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (max_ctas > 0) {  // the SMs the GEMMs leave free while collectives overlap them
        config.minCTAs = 1;
        config.maxCTAs = max_ctas;
    }
    ZG_NCCL_CHECK(ncclCommInitRankConfig(&comm, world_size, id, rank, &config));
    try {
        return std::make_unique<NcclComm>(comm, cuda_device, timeout_s);
    } catch (...) {
        ncclCommDestroy(comm);
        throw;
    }
}

}  // namespace zgpt

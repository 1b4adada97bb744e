// The `local` communicator: N ranks as threads of one process, on host memory, and the single-rank
// communicator. Each collective is two rendezvous: every rank posts its buffers and waits for the
// others (1); each computes its own result from all ranks' inputs, in rank order, into scratch;
// all wait again (2), since a peer may still be reading our input, then write the result.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/core/check.h"
#include "train/dist/comm.h"

namespace zgpt {

namespace {

// dst[i] = src_0[i] + src_1[i] + ... in rank order.
void sum_in_rank_order(void* dst, const std::vector<const void*>& src, int64_t off, int64_t n,
                       CommType t) {
    const size_t es = comm_type_size(t);
    std::memcpy(dst, static_cast<const char*>(src[0]) + off * es, size_t(n) * es);
    for (size_t r = 1; r < src.size(); r++)
        comm_add(dst, static_cast<const char*>(src[r]) + off * es, n, t);
}

class SingleRank final : public Communicator {
  public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "single"; }
    void all_reduce_sum(void*, int64_t, CommType) override {}
    void all_gather(const void* send, void* recv, int64_t n, CommType t) override {
        if (send != recv) std::memmove(recv, send, size_t(n) * comm_type_size(t));
    }
    void reduce_scatter_sum(const void* send, void* recv, int64_t n, CommType t) override {
        all_gather(send, recv, n, t);
    }
    void broadcast(void*, int64_t, CommType, int) override {}
    void barrier() override {}
    std::unique_ptr<Communicator> split(int, int) override {
        return std::make_unique<SingleRank>();
    }
};

// State shared by the ranks of one local group.
struct LocalGroup {
    explicit LocalGroup(int n, double timeout)
        : n(n), timeout_s(timeout), slots(n), arrived(n, 0) {}

    struct Slot {
        const void* in = nullptr;
        int color = 0, key = 0;
        std::shared_ptr<LocalGroup> made;  // split: the group this rank joins
        std::vector<int> members;          // split: its members' ranks in this group
    };

    // Blocks until every rank has arrived at this rendezvous (or throws on abort / timeout).
    void arrive(int rank, const char* op) {
        std::unique_lock<std::mutex> lock(mu);
        if (!failure.empty()) throw Error(failure);
        const uint64_t gen = generation;
        arrived[rank] = 1;
        if (++count == n) {
            count = 0;
            std::fill(arrived.begin(), arrived.end(), 0);
            generation++;
            cv.notify_all();
            return;
        }
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        while (generation == gen && failure.empty()) {
            if (cv.wait_until(lock, deadline) == std::cv_status::timeout && generation == gen &&
                failure.empty()) {
                std::string missing;
                for (int r = 0; r < n; r++)
                    if (!arrived[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
                failure = "local communicator: rank(s) " + missing + " of " + std::to_string(n) +
                          " did not reach " + op + " within " + std::to_string(int(timeout_s)) +
                          " s (rank " + std::to_string(rank) + " waited)";
                cv.notify_all();
            }
        }
        if (generation == gen) throw Error(failure);
    }

    // Fails this group and every group split from it or from its ancestors: a rank that dies
    // must wake peers waiting in any sub-group too.
    void abort(const std::string& reason) {
        LocalGroup* root = this;
        while (root->parent) root = root->parent.get();
        root->abort_tree(reason);
    }
    // The first reason wins in every group of the tree: a second abort (a peer reporting the
    // first one's failure as its own) passes the root's reason on, not its own, to sub-groups the
    // first abort has not reached yet.
    void abort_tree(const std::string& reason) {
        std::vector<std::shared_ptr<LocalGroup>> kids;
        std::string first;
        {
            std::lock_guard<std::mutex> lock(mu);
            if (failure.empty()) failure = reason;
            first = failure;
            cv.notify_all();
            for (auto& w : children)
                if (auto k = w.lock()) kids.push_back(k);
        }
        for (auto& k : kids) k->abort_tree(first);
    }

    const int n;
    const double timeout_s;
    std::vector<Slot> slots;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> arrived;
    int count = 0;
    uint64_t generation = 0;
    std::string failure;                 // non-empty: the group is dead, every call throws this
    std::shared_ptr<LocalGroup> parent;  // the group this one was split from
    std::vector<std::weak_ptr<LocalGroup>> children;  // groups split from this one
};

class LocalComm final : public Communicator {
  public:
    LocalComm(std::shared_ptr<LocalGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_->n; }
    std::string name() const override { return "local"; }
    LocalGroup& group() { return *g_; }

    void all_reduce_sum(void* buf, int64_t n, CommType t) override {
        const size_t bytes = size_t(n) * comm_type_size(t);
        post(buf, "all_reduce");
        scratch_.resize(bytes);
        sum_in_rank_order(scratch_.data(), inputs(), 0, n, t);
        g_->arrive(rank_, "all_reduce");
        std::memcpy(buf, scratch_.data(), bytes);
    }
    void all_gather(const void* send, void* recv, int64_t n, CommType t) override {
        const size_t bytes = size_t(n) * comm_type_size(t);
        post(send, "all_gather");
        scratch_.resize(bytes * size_t(g_->n));
        const auto in = inputs();
        for (int r = 0; r < g_->n; r++) std::memcpy(scratch_.data() + r * bytes, in[r], bytes);
        g_->arrive(rank_, "all_gather");
        std::memcpy(recv, scratch_.data(), scratch_.size());
    }
    void reduce_scatter_sum(const void* send, void* recv, int64_t n, CommType t) override {
        const size_t bytes = size_t(n) * comm_type_size(t);
        post(send, "reduce_scatter");
        scratch_.resize(bytes);
        sum_in_rank_order(scratch_.data(), inputs(), int64_t(rank_) * n, n, t);
        g_->arrive(rank_, "reduce_scatter");
        std::memcpy(recv, scratch_.data(), bytes);
    }
    void broadcast(void* buf, int64_t n, CommType t, int root) override {
        ZG_CHECK(root >= 0 && root < g_->n, "broadcast: root " + std::to_string(root) +
                                                " is not a rank of " + std::to_string(g_->n));
        const size_t bytes = size_t(n) * comm_type_size(t);
        post(buf, "broadcast");
        scratch_.resize(bytes);
        std::memcpy(scratch_.data(), g_->slots[root].in, bytes);
        g_->arrive(rank_, "broadcast");
        std::memcpy(buf, scratch_.data(), bytes);
    }
    void barrier() override { g_->arrive(rank_, "barrier"); }

    std::unique_ptr<Communicator> split(int color, int key) override {
        LocalGroup::Slot& mine = g_->slots[rank_];
        mine.color = color;
        mine.key = key;
        g_->arrive(rank_, "split");
        // Members of my color ordered by (key, rank); the first one creates the group.
        std::vector<std::pair<int, int>> order;
        for (int r = 0; r < g_->n; r++)
            if (g_->slots[r].color == color) order.push_back({g_->slots[r].key, r});
        std::sort(order.begin(), order.end());
        int my_index = 0;
        for (size_t i = 0; i < order.size(); i++)
            if (order[i].second == rank_) my_index = int(i);
        if (my_index == 0) {
            mine.made = std::make_shared<LocalGroup>(int(order.size()), g_->timeout_s);
            mine.made->parent = g_;
            std::lock_guard<std::mutex> lock(g_->mu);
            g_->children.push_back(mine.made);
        }
        g_->arrive(rank_, "split");
        std::shared_ptr<LocalGroup> made = g_->slots[order[0].second].made;
        g_->arrive(rank_, "split");  // everyone has read the new group before the slots change
        if (my_index == 0) mine.made.reset();
        return std::make_unique<LocalComm>(made, my_index);
    }

  private:
    void post(const void* in, const char* op) {
        g_->slots[rank_].in = in;
        g_->arrive(rank_, op);
    }
    std::vector<const void*> inputs() const {
        std::vector<const void*> v(g_->n);
        for (int r = 0; r < g_->n; r++) v[r] = g_->slots[r].in;
        return v;
    }

    std::shared_ptr<LocalGroup> g_;
    int rank_;
    std::vector<unsigned char> scratch_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_comm() {
    return std::make_unique<SingleRank>();
}

std::vector<std::unique_ptr<Communicator>> make_local_group(int n, double timeout_s) {
    ZG_CHECK(n >= 1, "a local group needs at least one rank");
    ZG_CHECK(timeout_s > 0, "the communicator's timeout must be > 0");
    auto g = std::make_shared<LocalGroup>(n, timeout_s);
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r = 0; r < n; r++) out.push_back(std::make_unique<LocalComm>(g, r));
    return out;
}

bool local_group_failed(Communicator& any_rank) {
    auto* c = dynamic_cast<LocalComm*>(&any_rank);
    if (!c) return false;
    std::lock_guard<std::mutex> lock(c->group().mu);
    return !c->group().failure.empty();
}

void abort_local_group(Communicator& any_rank, const std::string& reason) {
    if (auto* c = dynamic_cast<LocalComm*>(&any_rank)) c->group().abort(reason);
}

}  // namespace zgpt

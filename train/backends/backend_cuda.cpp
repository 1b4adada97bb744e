// The GPU backend: model/gpt_cuda.h plus AdamW state (fp32 m and v) on the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/matmul.h"
#include "kernels/ops/normal_fill.h"
#include "model/device_buffer.h"
#include "model/gpt_cuda.h"
#include "train/backends/backend.h"
#include "train/backends/backend_init.h"
#include "train/backends/device_copies.h"
#include "train/backends/zero1_share.h"
#include "train/backends/zero1_weight_gather.h"
#include "train/vocab_parallel/cuda_vocab_group.h"
#include "train/vocab_parallel/vocab_sharded_arena.h"

namespace zgpt {

namespace {

// n floats on the device, zeroed (a DeviceBuffer), with host copies of the whole.
class DeviceFloats {
  public:
    explicit DeviceFloats(int64_t n) : buf_(size_t(std::max<int64_t>(n, 1)) * 4), n_(n) {}
    float* get() const { return buf_.as<float>(); }
    std::vector<float> download() const {
        std::vector<float> h(n_);
        ZG_CUDA_CHECK(cudaDeviceSynchronize());
        ZG_CUDA_CHECK(cudaMemcpy(h.data(), get(), size_t(n_) * 4, cudaMemcpyDeviceToHost));
        return h;
    }
    void upload(const std::vector<float>& h) {
        ZG_CHECK(int64_t(h.size()) == n_, "optimizer state has the wrong size");
        ZG_CUDA_CHECK(cudaMemcpy(get(), h.data(), size_t(n_) * 4, cudaMemcpyHostToDevice));
        ZG_CUDA_CHECK(cudaDeviceSynchronize());  // the DMA from pageable memory has landed
    }

  private:
    DeviceBuffer buf_;
    int64_t n_;
};

// A collective on device buffers: a device communicator (nccl) runs `op` on them on `stream`; a
// host one (local ranks sharing this GPU) runs it on 8-byte aligned host copies (send_bytes in,
// recv_bytes out).
template <typename Op>
void collective_on_device(Communicator& g, const void* send, int64_t send_bytes, void* recv,
                          int64_t recv_bytes, void* stream, Op op) {
    if (g.device_buffers()) {
        g.set_stream(stream);
        op(send, recv);
        return;
    }
    std::vector<int64_t> hs((send_bytes + 7) / 8), hr((recv_bytes + 7) / 8);
    to_host(hs.data(), send, send_bytes, stream);
    op(hs.data(), hr.data());
    to_device(recv, hr.data(), recv_bytes, stream);
}

class CudaBackend final : public Backend {
  public:
    CudaBackend(const Config& cfg, VocabParallel vocab, Communicator* zero1)
        : cfg_(cfg),
          vocab_(vocab),
          arena_(cfg.model, vocab.split() ? vocab.group->size() : 1,
                 vocab.split() ? vocab.group->rank() : 0),
          model_(cfg.model, cuda_model_options(cfg, arena_.parts())),
          share_(arena_, zero1, vocab.peers),
          m_(share_.size()),
          v_(share_.size()) {
        if (vocab_.split()) {
            vocab_.group->set_wait_each(cfg.parallel.vocab_collective_wait == "each");
            model_.set_vocab_group(cuda_vocab_group(*vocab_.group));
            streamed_.push_back(vocab_.group);
        }
        set_params(initial_params_on_gpu(cfg));
        for (cudaEvent_t& e : compute_ev_) ZG_CUDA_CHECK(cudaEventCreate(&e));
    }
    ~CudaBackend() override {  // communicators must not keep ordering work on our streams
        for (Communicator* c : streamed_) c->set_stream(nullptr);
        if (sync_stream_) cudaStreamDestroy(sync_stream_);
        for (cudaEvent_t e : compute_ev_) cudaEventDestroy(e);
    }
    std::string name() const override { return "cuda"; }
    const GptLayout& layout() const override { return arena_.whole(); }
    int64_t num_parameters() const override { return arena_.whole().table.total(); }
    int64_t stored_parameters() const override { return model_.num_parameters(); }
    int64_t padded_vocab() const override { return padded_vocab_size(cfg_.model.vocab_size); }

    CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets, int64_t B,
                                          int64_t T, const CrossEntropyOptions& opts,
                                          double grad_output) override {
        // (a split model takes its ids in shard order; one part: these ids)
        const CrossEntropySummary s =
            model_.forward_loss_backward(arena_.in_shard_order(inputs, B * T, ids_[0]),
                                         arena_.in_shard_order(targets, B * T, ids_[1]), B, T,
                                         arena_.in_shard_order(opts), grad_output);
        // the main stream goes on once the passes' streams joined it: their end
        ZG_CUDA_CHECK(cudaEventRecord(compute_ev_[1], static_cast<cudaStream_t>(model_.stream())));
        return s;
    }
    CrossEntropySummary evaluate(const int32_t* inputs, const int32_t* targets, int64_t B,
                                 int64_t T, const CrossEntropyOptions& opts) override {
        model_.forward(arena_.in_shard_order(inputs, B * T, ids_[0]), B, T);
        return model_.loss(arena_.in_shard_order(targets, B * T, ids_[1]),
                           arena_.in_shard_order(opts), 1.0, false);
    }
    void zero_grad() override {
        ZG_CUDA_CHECK(cudaEventRecord(compute_ev_[0], static_cast<cudaStream_t>(model_.stream())));
        model_.zero_grad();
    }
    double compute_ms() const override {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, compute_ev_[0], compute_ev_[1]) == cudaSuccess) return ms;
        cudaGetLastError();  // not complete yet: not an error for the next launch to report
        return -1;
    }
    void begin_grad_sync(Communicator& comm) override {
        const double mb = cfg_.parallel.grad_bucket_mb;
        if (mb <= 0 || comm.size() < 2 || !comm.device_buffers()) return;
        if (!sync_stream_)
            ZG_CUDA_CHECK(cudaStreamCreateWithFlags(&sync_stream_, cudaStreamNonBlocking));
        give_stream(comm, sync_stream_);
        syncing_ = &comm;
        bucket_ = started_ = {0, 0};
        const int64_t bucket_elems = std::max<int64_t>(1, int64_t(mb * 1e6 / 4));
        // The blocks arrive last to first, each span ending where the previous one began.
        model_.set_grad_ready_hook(sync_stream_, [this, bucket_elems](int64_t lo, int64_t hi) {
            bucket_ = bucket_.hi > bucket_.lo ? ArenaSlice{lo, bucket_.hi} : ArenaSlice{lo, hi};
            if (bucket_.hi - bucket_.lo >= bucket_elems) start_bucket();
        });
    }
    double all_reduce_grads(Communicator& comm) override {
        cuda::set_collective_sms(0);  // the buckets' reserve (start_bucket): no GEMM runs here
        model_.settle_collectives();  // the split's last ones, bounded by the timeout
        ZG_CUDA_CHECK(cudaDeviceSynchronize());  // the backward pass is done on its streams
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t n = model_.num_parameters();
        const std::vector<ArenaSlice> world_spans =
            vocab_.split() ? arena_.replicated_spans() : std::vector<ArenaSlice>{{0, n}};
        world_ = &comm;
        const int64_t chunk = syncing_ != &comm ? equal_chunk(comm) : 0;
        scattered_ = chunk > 0;
        if (scattered_) {
            reduce_scatter_grads(comm, chunk);
        } else if (syncing_ == &comm) {
            // the rest of the buckets' way, then what they did not cover
            model_.set_grad_ready_hook(nullptr, {});
            start_bucket();
            for (const ArenaSlice& s : world_spans)
                for (const ArenaSlice& part : outside(s, started_)) {
                    bucket_ = part;
                    start_bucket();
                }
            comm.wait();
            syncing_ = nullptr;
        } else {
            all_reduce_spans(comm, world_spans);
        }
        // with a split vocabulary, the shards' rows over the peers
        if (vocab_.split() && vocab_.peers && vocab_.peers->size() > 1)
            all_reduce_spans(*vocab_.peers, arena_.vocab_spans());
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
            .count();
    }
    double grad_norm() override {
        if (scattered_) {  // this rank holds the summed gradient of its slice only
            const ArenaSlice mine = share_.pieces()[0].mine;
            return std::sqrt(world_->sum(model_.grad_sum_of_squares(mine.lo, mine.hi)));
        }
        if (!vocab_.split()) return model_.grad_norm();
        // The replicated part is the same on every rank; the shards' parts add over the group.
        double replicated = 0, mine = 0;
        for (const ArenaSlice& s : arena_.replicated_spans())
            replicated += model_.grad_sum_of_squares(s.lo, s.hi);
        for (const ArenaSlice& s : arena_.vocab_spans())
            mine += model_.grad_sum_of_squares(s.lo, s.hi);
        return std::sqrt(replicated + vocab_.group->sum(mine));
    }
    void optimizer_step(double lr, double grad_scale) override {
        steps_++;
        const OptimConfig& o = cfg_.optim;
        for (const Zero1Piece& p : share_.pieces())
            model_.adamw_step_range(lr, o.beta1, o.beta2, o.eps, decoupled_weight_decay(o), steps_,
                                    grad_scale, m_.get() + p.offset, v_.get() + p.offset, p.mine.lo,
                                    p.mine.hi);
        gather_optimizer_slices();
    }
    double clip_and_step(double lr, double max_norm) override {
        // a split vocabulary's norm adds the shards' parts over the group on the host (and only a
        // split cuts the arena into several pieces)
        if (vocab_.split()) return Backend::clip_and_step(lr, max_norm);
        ZG_CHECK(share_.pieces().size() == 1, "clip_and_step: one piece of the arena expected");
        const Zero1Piece& p = share_.pieces()[0];
        steps_++;
        const OptimConfig& o = cfg_.optim;
        const double wd = decoupled_weight_decay(o);
        double norm = 0;
        if (world_ && world_->size() > 1) {
            // Several ranks: the norm slice by slice as ZeRO-1 cuts the arena, so that data
            // parallel, ZeRO-1 and a reduce-scatter all give the same bits.
            Communicator& w = *world_;
            std::vector<std::pair<int64_t, int64_t>> slices;
            for (int r = 0; r < w.size(); r++) {
                const ArenaSlice s = arena_slice(model_.num_parameters(), w.size(), r);
                slices.push_back({s.lo, s.hi});
            }
            norm = model_.clip_and_adamw_step_sliced(
                lr, o.beta1, o.beta2, o.eps, wd, steps_, max_norm, m_.get(), v_.get(), p.mine.lo,
                p.mine.hi, slices, scattered_ ? w.rank() : -1,
                [this, &w](double* parts, void* stream) { gather_norm_parts(w, parts, stream); });
        } else {
            norm =
                model_.clip_and_adamw_step_range(lr, o.beta1, o.beta2, o.eps, wd, steps_, max_norm,
                                                 m_.get(), v_.get(), p.mine.lo, p.mine.hi);
        }
        gather_optimizer_slices();
        return norm;
    }
    void gather_master_weights() override {
        if (!weight_gather_ || !weight_gather_->masters_stale()) return;
        give_stream(*share_.pieces()[0].comm);
        weight_gather_->gather_masters();
    }
    std::vector<float> params() const override {
        ZG_CHECK(!weight_gather_ || !weight_gather_->masters_stale(),
                 "params(): the fp32 weights of the other ZeRO-1 slices are not gathered "
                 "(gather_master_weights first, on every rank)");
        std::vector<float> p(model_.num_parameters());
        model_.get_params(p.data());
        return whole(p);
    }
    void set_params(const std::vector<float>& p) override {
        std::vector<float> scratch;  // used only where the shard is not `p` itself
        model_.set_params(arena_.shard_of(p, scratch));  // it checks the size
        if (weight_gather_) weight_gather_->masters_loaded();
    }
    std::vector<float> adam_m() const override { return whole(stored(m_)); }
    std::vector<float> adam_v() const override { return whole(stored(v_)); }
    void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                  int64_t steps) override {
        const int64_t n = num_parameters();
        ZG_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n,
                 "optimizer state has the wrong size");
        m_.upload(share_.take(arena_.take_shard(m)));
        v_.upload(share_.take(arena_.take_shard(v)));
        steps_ = steps;
    }
    void set_op_profiling(bool on) override { model_.set_op_profiling(on); }
    std::vector<std::pair<std::string, double>> take_op_times() override {
        return model_.take_op_times();
    }
    std::string start_timeline() override {
        if (!timeline_) timeline_ = std::make_unique<GpuTimeline>();
        if (!timeline_->unavailable().empty()) return timeline_->unavailable();
        model_.settle_collectives();
        ZG_CUDA_CHECK(cudaDeviceSynchronize());  // what ran before is not this step's
        timeline_->start();
        timeline_->mark();                // the step from here: start()'s own probe is not in it
        return timeline_->unavailable();  // (start can fail: another profiler attached)
    }
    std::optional<TimelineSummary> stop_timeline() override {
        if (!timeline_ || !timeline_->unavailable().empty()) return std::nullopt;
        model_.settle_collectives();
        ZG_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<TimelineSummary> s = timeline_->stop(8, 12);
        if (s.empty()) return std::nullopt;
        return s.front();
    }
    int64_t adam_steps() const override { return steps_; }
    std::string timed_choices() const override { return cuda::gemm_choices(); }
    bool set_timed_choices(const std::string& choices) override {
        return cuda::set_gemm_choices(choices);
    }
    double device_memory_bytes() const override {
        return double(model_.allocated_bytes()) + 2.0 * 4.0 * double(share_.size());  // + m, v
    }
    double device_memory_in_use_bytes() const override {
        size_t free = 0, total = 0;
        ZG_CUDA_CHECK(cudaMemGetInfo(&free, &total));
        return double(total - free);
    }
    std::string describe() const override {
        const KernelChoice& k = cfg_.kernels;
        return std::string("CUDA, ") + cfg_.train.precision +
               ", kernels: attention=" + k.attention + " cross_entropy=" + k.cross_entropy +
               " layernorm=" + k.layernorm + " matmul=" + k.matmul +
               (cfg_.train.recompute_gelu ? ", GELU recomputed" : "") +
               (cfg_.train.recompute_block ? ", blocks recomputed" : "") +
               (cfg_.train.fp32_residual && cfg_.train.precision == "bf16" ? ", fp32 residual"
                                                                           : "");
    }

  private:
    // ZeRO-1: every rank updated its slices of the fp32 weights; gather the others' slices, piece
    // by piece (each over its own ranks).
    void gather_optimizer_slices() {
        if (!share_.sharded()) return;
        float* w = model_.params_device();
        for (const Zero1Piece& p : share_.pieces()) {
            if (!p.comm) continue;
            Communicator& c = *p.comm;
            const int64_t len = p.span.hi - p.span.lo;
            if (c.device_buffers()) {
                give_stream(c);
                if (const int64_t chunk = equal_chunk(c)) {  // (a split's pieces have none)
                    if (!weight_gather_)
                        weight_gather_ = std::make_unique<Zero1WeightGather>(model_, c, chunk);
                    weight_gather_->after_step();
                    return;
                }
                // Else one broadcast per rank, from its slice: a split's pieces have slices of
                // different sizes, which one all-gather cannot express.
                for (int r = 0; r < c.size(); r++) {
                    const ArenaSlice s = arena_slice(len, c.size(), r);
                    if (s.hi > s.lo)
                        c.broadcast(w + p.span.lo + s.lo, s.hi - s.lo, CommType::f32, r);
                }
                continue;
            }
            std::vector<float> mine(p.mine.hi - p.mine.lo);
            to_host(mine.data(), w + p.mine.lo, mine.size() * 4, model_.stream());
            const std::vector<float> all = all_gather_slices(c, mine.data(), len);
            to_device(w + p.span.lo, all.data(), all.size() * 4, model_.stream());
        }
        model_.refresh_bf16_copy();
    }
    // A device communicator orders its collectives on the model's stream (or on `stream`: the
    // overlapped gradient all-reduce's side stream).
    void give_stream(Communicator& comm, void* stream = nullptr) {
        comm.set_stream(stream ? stream : model_.stream());
        if (std::find(streamed_.begin(), streamed_.end(), &comm) == streamed_.end())
            streamed_.push_back(&comm);
    }
    // A moment as this rank's stored arena from its ZeRO-1 share, through host memory
    // (collective under ZeRO-1).
    std::vector<float> stored(const DeviceFloats& d) const {
        return share_.gather(d.download().data(), model_.num_parameters());
    }
    // A whole-model arena from a stored one (collective over the vocab group when split).
    std::vector<float> whole(const std::vector<float>& stored) const {
        return arena_.gather(vocab_.group, stored.data());
    }
    // ZeRO-1 without a split over a device communicator: the equal chunk of ceil(n / ranks)
    // that one reduce-scatter or all-gather moves, where the ZeRO-1 slices are those chunks (the
    // arenas' zeroed tails pad the last one); else 0. Then a gradient summed after the backward
    // pass is reduce-scattered (half an all-reduce's bytes: a rank updates only its slice) and
    // the weights all-gathered.
    int64_t equal_chunk(const Communicator& comm) const {
        if (!share_.sharded() || vocab_.split() || !comm.device_buffers() || comm.size() < 2)
            return 0;
        const int64_t n = model_.num_parameters(), chunk = (n + comm.size() - 1) / comm.size();
        // the same answer on every rank, or their collectives would differ
        if (!model_.holds_equal_chunks(chunk, comm.size())) return 0;
        const ArenaSlice mine = share_.pieces()[0].mine;
        ZG_CHECK(mine.lo == comm.rank() * chunk && mine.hi == std::min(n, mine.lo + chunk),
                 "ZeRO-1: this rank's slice is not its equal chunk of the arena");
        return chunk;
    }
    void reduce_scatter_grads(Communicator& comm, int64_t chunk) {
        float* g = model_.grads_device();
        give_stream(comm);
        comm.reduce_scatter_sum(g, g + comm.rank() * chunk, chunk, CommType::f32);  // in place
        ZG_CUDA_CHECK(cudaDeviceSynchronize());
    }
    // The other ranks' parts of a sliced sum of squares (parts[r], device doubles) on `stream`.
    void gather_norm_parts(Communicator& w, double* parts, void* stream) {
        give_stream(w, stream);
        collective_on_device(w, parts + w.rank(), 8, parts, 8 * w.size(), stream,
                             [&](const void* s, void* r) { w.all_gather(s, r, 1, CommType::f64); });
    }
    // Starts the sum of the pending bucket over the syncing communicator, on sync_stream_.
    void start_bucket() {
        if (bucket_.hi <= bucket_.lo) return;
        // from here to the end of the pass NCCL's kernels run beside the backward's GEMMs
        cuda::set_collective_sms(cfg_.parallel.collective_sms);
        // (the bucket's gradients are written: its range of the arena has nothing left to zero)
        syncing_->start_all_reduce_sum(model_.grads_device(bucket_.lo, bucket_.hi) + bucket_.lo,
                                       bucket_.hi - bucket_.lo, CommType::f32);
        started_ = started_.hi > started_.lo ? ArenaSlice{std::min(started_.lo, bucket_.lo),
                                                          std::max(started_.hi, bucket_.hi)}
                                             : bucket_;
        bucket_ = {0, 0};
    }
    // The parts of span s outside the contiguous range done (at most two).
    static std::vector<ArenaSlice> outside(ArenaSlice s, ArenaSlice done) {
        if (done.hi <= done.lo || done.hi <= s.lo || done.lo >= s.hi) return {s};
        std::vector<ArenaSlice> parts;
        if (s.lo < done.lo) parts.push_back({s.lo, done.lo});
        if (done.hi < s.hi) parts.push_back({done.hi, s.hi});
        return parts;
    }
    // The gradient spans summed over `comm`: on the device for a device communicator, else
    // through host memory (local ranks sharing this GPU).
    void all_reduce_spans(Communicator& comm, const std::vector<ArenaSlice>& spans) {
        float* g = model_.grads_device();
        if (comm.device_buffers()) {
            give_stream(comm);
            for (const ArenaSlice& s : spans) comm.all_reduce_sum(g + s.lo, s.hi - s.lo);
            ZG_CUDA_CHECK(cudaDeviceSynchronize());
            return;
        }
        for (const ArenaSlice& s : spans) {
            std::vector<float> h(s.hi - s.lo);
            to_host(h.data(), g + s.lo, h.size() * 4, model_.stream());
            comm.all_reduce_sum(h.data(), int64_t(h.size()));
            to_device(g + s.lo, h.data(), h.size() * 4, model_.stream());
        }
    }

    Config cfg_;
    VocabParallel vocab_;
    VocabShardedArena arena_;
    GptCuda model_;
    Zero1Share share_;    // the AdamW moments this rank keeps (all of them without ZeRO-1)
    DeviceFloats m_, v_;  // share_.size() elements each, piece after piece
    std::vector<Communicator*> streamed_;  // communicators given one of our streams
    std::vector<int32_t> ids_[2];          // a split's inputs and targets in shard order
    // The overlapped gradient all-reduce (begin_grad_sync): its stream, its communicator while a
    // step's sums are in flight, the bucket being filled and the range started so far.
    cudaStream_t sync_stream_ = nullptr;
    Communicator* syncing_ = nullptr;
    // The world of the last all_reduce_grads, and whether it left each rank only its ZeRO-1
    // slice of the summed gradient (equal_chunk)
    Communicator* world_ = nullptr;
    bool scattered_ = false;
    ArenaSlice bucket_, started_;
    int64_t steps_ = 0;
    // a step's start (zero_grad) and the end of its last micro-batch's passes, on the main stream
    cudaEvent_t compute_ev_[2] = {nullptr, nullptr};
    std::unique_ptr<GpuTimeline> timeline_;             // made at the first train.timeline_step
    std::unique_ptr<Zero1WeightGather> weight_gather_;  // made at the first equal_chunk gather
};

}  // namespace

CudaModelOptions cuda_model_options(const Config& cfg, int vocab_parts) {
    CudaModelOptions o;
    o.vocab_parts = vocab_parts;
    o.collective_sms = cfg.parallel.collective_sms;
    o.precision = cfg.train.precision == "fp32" ? DType::f32 : DType::bf16;
    o.kernels = cfg.kernels;
    o.recompute_gelu = cfg.train.recompute_gelu;
    o.recompute_block = cfg.train.recompute_block;
    o.fp32_residual = cfg.train.fp32_residual;
    return o;
}

namespace {
// recv[0, n) = the ranks' send[rank * n, (rank + 1) * n) summed as type t
void reduce_scatter_device(Communicator& g, const void* send, void* recv, int64_t n, CommType t,
                           void* stream) {
    const int64_t bytes = n * int64_t(comm_type_size(t));
    collective_on_device(g, send, bytes * g.size(), recv, bytes, stream,
                         [&](const void* s, void* r) { g.reduce_scatter_sum(s, r, n, t); });
}
}  // namespace

VocabGroup cuda_vocab_group(Communicator& group) {
    VocabGroup g;
    g.size = group.size();
    g.rank = group.rank();
    g.all_gather = [g_ = &group](const void* send, void* recv, int64_t bytes, void* stream) {
        ZG_CHECK(bytes % 4 == 0, "vocab group: all_gather of a size not a multiple of 4");
        collective_on_device(
            *g_, send, bytes, recv, bytes * g_->size(), stream,
            [&](const void* s, void* r) { g_->all_gather(s, r, bytes / 4, CommType::f32); });
    };
    g.reduce_scatter_sum = [g_ = &group](const float* send, float* recv, int64_t n, void* stream) {
        reduce_scatter_device(*g_, send, recv, n, CommType::f32, stream);
    };
    g.reduce_scatter_owned = [g_ = &group](const void* send, void* recv, int64_t bytes,
                                           void* stream) {
        ZG_CHECK(bytes % 8 == 0, "vocab group: reduce_scatter_owned of a size not a multiple of 8");
        reduce_scatter_device(*g_, send, recv, bytes / 8, CommType::i64, stream);
    };
    g.settle = [g_ = &group] { g_->settle(); };
    return g;
}

namespace {
// The AdamW moments (m and v, fp32) that a rank keeps: see cuda_rank_bytes.
double moment_bytes(const Config& cfg, int vocab_parts, int zero1_ranks) {
    const VocabShardedArena arena(cfg.model, vocab_parts, 0);  // the largest shard's layout
    return 8.0 * double(Zero1Share::largest_share(arena, zero1_ranks));
}
}  // namespace

double cuda_rank_bytes(const Config& cfg, int vocab_parts, int zero1_ranks) {
    const int64_t T = sequence_length(cfg);
    return double(GptCuda::device_bytes_needed(cfg.model, cuda_model_options(cfg, vocab_parts),
                                               cfg.train.batch_size, T)) +
           moment_bytes(cfg, vocab_parts, zero1_ranks);
}

// The device memory a config takes (cuda_rank_bytes, with the moments ZeRO-1 leaves this rank),
// printed before anything is allocated, and a config that cannot fit refused with it (rather
// than an out-of-memory error part way into the first step).
void check_device_memory(const Config& cfg, int parts, int zero1_ranks) {
    const int64_t B = cfg.train.batch_size;
    const int64_t T = sequence_length(cfg);
    const double params = double(make_gpt_layout(cfg.model, parts).table.total());
    const double need = cuda_rank_bytes(cfg, parts, zero1_ranks);
    // fp32 weights and gradients, their bf16 copy, and the AdamW moments
    const double state = (cfg.train.precision == "fp32" ? 8.0 : 10.0) * params +
                         moment_bytes(cfg, parts, zero1_ranks);
    size_t free_b = 0, total_b = 0;
    ZG_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    char zero[64] = "";
    if (zero1_ranks > 1)
        std::snprintf(zero, sizeof zero, ", the moments sharded over %d ranks (ZeRO-1)",
                      zero1_ranks);
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "this config needs about %.1f GB of GPU memory (weights, gradients and AdamW "
                  "moments %.1f GB%s; activations and workspaces of a %lld x %lld micro-batch "
                  "%.1f GB) and the GPU has %.1f GB free",
                  need / 1e9, state / 1e9, zero, (long long)B, (long long)T, (need - state) / 1e9,
                  double(free_b) / 1e9);
    if (need > double(free_b))
        throw Error(std::string(msg) +
                    ": lower train.batch_size (train.grad_accum keeps the step's tokens) or set "
                    "train.recompute_gelu or train.recompute_block");
    std::printf("%s\n", msg);
    if (parts > 1) {  // the hint: what the split saves against data parallel, by the same count
        const double dp = cuda_rank_bytes(cfg, 1, zero1_ranks);
        const char* both = zero1_ranks > 1 ? " (both with ZeRO-1)" : "";
        if (dp > need)
            std::printf(
                "vocab split over %d ranks: %.2f GB a rank against %.2f GB under data "
                "parallel%s\n",
                parts, need / 1e9, dp / 1e9, both);
        else
            std::printf(
                "vocab split over %d ranks: %.2f GB a rank, not less than data "
                "parallel's %.2f GB here%s; parallel.vocab_parallel=1 holds no more\n",
                parts, need / 1e9, dp / 1e9, both);
        // A head that holds logits: data parallel with the fused linear head, which never
        // does, can hold less than the split (docs/parallel.md, "When the split pays"). That
        // head runs in bf16 only, so an fp32 run gets no such hint.
        if (cfg.kernels.cross_entropy.rfind("fused_linear", 0) != 0 &&
            cfg.train.precision == "bf16") {
            Config fused = cfg;
            fused.kernels.cross_entropy = "fused_linear";
            const double dp_fused = cuda_rank_bytes(fused, 1, zero1_ranks);
            if (dp_fused < need)
                std::printf(
                    "data parallel with kernels.cross_entropy=fused_linear would hold %.2f GB "
                    "a rank, less than this split\n",
                    dp_fused / 1e9);
        }
    }
}

std::vector<float> initial_params_on_gpu(const Config& cfg) {
    const uint64_t seed = uint64_t(cfg.train.seed);
    return initial_params(cfg, [seed](float* out, int64_t n, uint64_t first, double sd) {
        cuda::normal_fill_host(out, n, seed, first, sd);
    });
}

std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, VocabParallel vocab,
                                           Communicator* zero1) {
    check_device_memory(cfg, vocab.split() ? vocab.group->size() : 1, zero1 ? zero1->size() : 1);
    return std::make_unique<CudaBackend>(cfg, vocab, zero1);
}

}  // namespace zgpt

// The GPU backend: model/gpt_cuda.h plus AdamW state (fp32 m and v) on the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "kernels/core/cuda_check.h"
#include "kernels/gemm/matmul.h"
#include "model/device_buffer.h"
#include "model/gpt_cuda.h"
#include "train/backends/backend.h"
#include "train/backends/backend_init.h"
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

// Host <-> device copies ordered on the model's (non-blocking) stream and finished on return.
// A plain cudaMemcpy from pageable memory may return before its DMA lands, and the legacy stream
// does not order it before kernels on a non-blocking stream: a race.
void to_host(void* dst, const void* src, size_t bytes, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    ZG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    ZG_CUDA_CHECK(cudaStreamSynchronize(s));
}
void to_device(void* dst, const void* src, size_t bytes, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    ZG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    ZG_CUDA_CHECK(cudaStreamSynchronize(s));
}

class CudaBackend final : public Backend {
  public:
    CudaBackend(const Config& cfg, VocabParallel vocab)
        : cfg_(cfg),
          vocab_(vocab),
          arena_(cfg.model, vocab.split() ? vocab.group->size() : 1,
                 vocab.split() ? vocab.group->rank() : 0),
          model_(cfg.model, cuda_model_options(cfg, arena_.parts())),
          m_(std::make_unique<DeviceFloats>(model_.num_parameters())),
          v_(std::make_unique<DeviceFloats>(model_.num_parameters())),
          hi_(model_.num_parameters()) {
        if (vocab_.split()) {
            model_.set_vocab_group(cuda_vocab_group(*vocab_.group));
            streamed_.push_back(vocab_.group);
        }
        set_params(initial_params(cfg));
    }
    ~CudaBackend() override {  // communicators must not keep ordering work on our streams
        for (Communicator* c : streamed_) c->set_stream(nullptr);
        if (sync_stream_) cudaStreamDestroy(sync_stream_);
    }
    std::string name() const override { return "cuda"; }
    const GptLayout& layout() const override { return arena_.whole(); }
    int64_t num_parameters() const override { return arena_.whole().table.total(); }
    int64_t stored_parameters() const override { return model_.num_parameters(); }
    int64_t padded_vocab() const override { return padded_vocab_size(cfg_.model.vocab_size); }

    CrossEntropySummary train_micro_batch(const int32_t* inputs, const int32_t* targets, int64_t B,
                                          int64_t T, const CrossEntropyOptions& opts,
                                          double grad_output) override {
        return model_.forward_loss_backward(inputs, targets, B, T, opts, grad_output);
    }
    CrossEntropySummary evaluate(const int32_t* inputs, const int32_t* targets, int64_t B,
                                 int64_t T, const CrossEntropyOptions& opts) override {
        model_.forward(inputs, B, T);
        return model_.loss(targets, opts, 1.0, false);
    }
    void zero_grad() override { model_.zero_grad(); }
    void shard_optimizer(Communicator& comm) override {
        zero_ = &comm;
        const ArenaSlice sl = arena_slice(model_.num_parameters(), comm.size(), comm.rank());
        lo_ = sl.lo;
        hi_ = sl.hi;
        m_ = std::make_unique<DeviceFloats>(hi_ - lo_);
        v_ = std::make_unique<DeviceFloats>(hi_ - lo_);
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
        ZG_CUDA_CHECK(cudaDeviceSynchronize());  // the backward pass is done on its streams
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t n = model_.num_parameters();
        const std::vector<ArenaSlice> world_spans =
            vocab_.split() ? arena_.replicated_spans() : std::vector<ArenaSlice>{{0, n}};
        if (syncing_ == &comm) {  // the rest of the buckets' way, then what they did not cover
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
        model_.adamw_step_range(lr, o.beta1, o.beta2, o.eps, decoupled_weight_decay(o), steps_,
                                grad_scale, m_->get(), v_->get(), lo_, hi_);
        gather_optimizer_slices();
    }
    double clip_and_step(double lr, double max_norm) override {
        // a split vocabulary's norm adds the shards' parts over the group on the host
        if (vocab_.split()) return Backend::clip_and_step(lr, max_norm);
        steps_++;
        const OptimConfig& o = cfg_.optim;
        const double norm =
            model_.clip_and_adamw_step_range(lr, o.beta1, o.beta2, o.eps, decoupled_weight_decay(o),
                                             steps_, max_norm, m_->get(), v_->get(), lo_, hi_);
        gather_optimizer_slices();
        return norm;
    }
    std::vector<float> params() const override {
        std::vector<float> p(model_.num_parameters());
        model_.get_params(p.data());
        return whole(p);
    }
    void set_params(const std::vector<float>& p) override {
        model_.set_params(arena_.take_shard(p).data());  // it checks the size
    }
    std::vector<float> adam_m() const override { return whole(stored(*m_)); }
    std::vector<float> adam_v() const override { return whole(stored(*v_)); }
    void set_adam(const std::vector<float>& m, const std::vector<float>& v,
                  int64_t steps) override {
        const int64_t n = num_parameters();
        ZG_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n,
                 "optimizer state has the wrong size");
        const std::vector<float> ml = arena_.take_shard(m), vl = arena_.take_shard(v);
        m_->upload(std::vector<float>(ml.begin() + lo_, ml.begin() + hi_));
        v_->upload(std::vector<float>(vl.begin() + lo_, vl.begin() + hi_));
        steps_ = steps;
    }
    void set_op_profiling(bool on) override { model_.set_op_profiling(on); }
    std::vector<std::pair<std::string, double>> take_op_times() override {
        return model_.take_op_times();
    }
    int64_t adam_steps() const override { return steps_; }
    std::string timed_choices() const override { return cuda::gemm_choices(); }
    bool set_timed_choices(const std::string& choices) override {
        return cuda::set_gemm_choices(choices);
    }
    double device_memory_bytes() const override {
        return double(model_.allocated_bytes()) + 2.0 * 4.0 * double(hi_ - lo_);  // + m, v
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
    // ZeRO-1: every rank updated its slice of the fp32 weights; gather the others' slices.
    void gather_optimizer_slices() {
        if (!zero_) return;
        if (zero_->device_buffers()) {
            // In place on the device: one broadcast per rank, from its slice (slices differ in
            // size when the ranks do not divide the arena, which one all-gather cannot express).
            give_stream(*zero_);
            const int64_t n = model_.num_parameters();
            for (int r = 0; r < zero_->size(); r++) {
                const ArenaSlice s = arena_slice(n, zero_->size(), r);
                if (s.hi > s.lo)
                    zero_->broadcast(model_.params_device() + s.lo, s.hi - s.lo, CommType::f32, r);
            }
            model_.refresh_bf16_copy();
            return;
        }
        std::vector<float> mine(hi_ - lo_);
        to_host(mine.data(), model_.params_device() + lo_, mine.size() * 4, model_.stream());
        const std::vector<float> all = gather(mine);
        to_device(model_.params_device(), all.data(), all.size() * 4, model_.stream());
        model_.refresh_bf16_copy();
    }
    // A device communicator orders its collectives on the model's stream (or on `stream`: the
    // overlapped gradient all-reduce's side stream).
    void give_stream(Communicator& comm, void* stream = nullptr) {
        comm.set_stream(stream ? stream : model_.stream());
        if (std::find(streamed_.begin(), streamed_.end(), &comm) == streamed_.end())
            streamed_.push_back(&comm);
    }
    // The whole arena from every rank's ZeRO-1 slice, through host memory. Collective.
    std::vector<float> gather(const std::vector<float>& mine) const {
        return all_gather_slices(*zero_, mine.data(), model_.num_parameters());
    }
    // A moment as this rank's stored arena (collective under ZeRO-1).
    std::vector<float> stored(const DeviceFloats& d) const {
        const std::vector<float> mine = d.download();
        return zero_ ? gather(mine) : mine;
    }
    // A whole-model arena from a stored one (collective over the vocab group when split).
    std::vector<float> whole(const std::vector<float>& stored) const {
        return arena_.gather(vocab_.group, stored.data());
    }
    // Starts the sum of the pending bucket over the syncing communicator, on sync_stream_.
    void start_bucket() {
        if (bucket_.hi <= bucket_.lo) return;
        syncing_->start_all_reduce_sum(model_.grads_device() + bucket_.lo, bucket_.hi - bucket_.lo,
                                       CommType::f32);
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
    std::unique_ptr<DeviceFloats> m_, v_;
    int64_t lo_ = 0, hi_ = 0;       // this rank's slice of the arena (all of it without ZeRO-1)
    Communicator* zero_ = nullptr;  // ZeRO-1: the ranks that share the optimizer state
    std::vector<Communicator*> streamed_;  // communicators given one of our streams
    // The overlapped gradient all-reduce (begin_grad_sync): its stream, its communicator while a
    // step's sums are in flight, the bucket being filled and the range started so far.
    cudaStream_t sync_stream_ = nullptr;
    Communicator* syncing_ = nullptr;
    ArenaSlice bucket_, started_;
    int64_t steps_ = 0;
};

}  // namespace

CudaModelOptions cuda_model_options(const Config& cfg, int vocab_parts) {
    CudaModelOptions o;
    o.vocab_parts = vocab_parts;
    o.precision = cfg.train.precision == "fp32" ? DType::f32 : DType::bf16;
    o.kernels = cfg.kernels;
    o.recompute_gelu = cfg.train.recompute_gelu;
    o.recompute_block = cfg.train.recompute_block;
    o.fp32_residual = cfg.train.fp32_residual;
    return o;
}

VocabGroup cuda_vocab_group(Communicator& group) {
    VocabGroup g;
    g.size = group.size();
    g.rank = group.rank();
    // Device buffers go to a device communicator (nccl, on the stream given); a host one (local
    // ranks sharing this GPU) gets them through host memory.
    g.all_gather = [g_ = &group](const void* send, void* recv, int64_t bytes, void* stream) {
        ZG_CHECK(bytes % 4 == 0, "vocab group: all_gather of a size not a multiple of 4");
        if (g_->device_buffers()) {
            g_->set_stream(stream);
            g_->all_gather(send, recv, bytes / 4, CommType::f32);
            return;
        }
        std::vector<unsigned char> hs(bytes), hr(size_t(bytes) * g_->size());
        to_host(hs.data(), send, bytes, stream);
        g_->all_gather(hs.data(), hr.data(), bytes / 4, CommType::f32);
        to_device(recv, hr.data(), hr.size(), stream);
    };
    g.reduce_scatter_sum = [g_ = &group](const float* send, float* recv, int64_t n, void* stream) {
        if (g_->device_buffers()) {
            g_->set_stream(stream);
            g_->reduce_scatter_sum(send, recv, n, CommType::f32);
            return;
        }
        std::vector<float> hs(size_t(n) * g_->size()), hr(n);
        to_host(hs.data(), send, hs.size() * 4, stream);
        g_->reduce_scatter_sum(hs.data(), hr.data(), n, CommType::f32);
        to_device(recv, hr.data(), hr.size() * 4, stream);
    };
    return g;
}

double cuda_rank_bytes(const Config& cfg, int vocab_parts) {
    const int64_t T = cfg.train.seq_len > 0 ? cfg.train.seq_len : cfg.model.block_size;
    return double(GptCuda::device_bytes_needed(cfg.model, cuda_model_options(cfg, vocab_parts),
                                               cfg.train.batch_size, T)) +
           8.0 * double(make_gpt_layout(cfg.model, vocab_parts).table.total());  // AdamW moments
}

// The device memory a config takes (cuda_rank_bytes; ZeRO-1 later shards the AdamW moments),
// printed before anything is allocated, and a config that cannot fit refused with it (rather
// than an out-of-memory error part way into the first step).
void check_device_memory(const Config& cfg, int parts) {
    const int64_t B = cfg.train.batch_size;
    const int64_t T = cfg.train.seq_len > 0 ? cfg.train.seq_len : cfg.model.block_size;
    const double params = double(make_gpt_layout(cfg.model, parts).table.total());
    const double need = cuda_rank_bytes(cfg, parts);
    // fp32 weights and gradients, their bf16 copy, two AdamW moments
    const double state = (cfg.train.precision == "fp32" ? 16.0 : 18.0) * params;
    size_t free_b = 0, total_b = 0;
    ZG_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "this config needs about %.1f GB of GPU memory (weights, gradients and AdamW "
                  "moments %.1f GB; activations and workspaces of a %lld x %lld micro-batch "
                  "%.1f GB) and the GPU has %.1f GB free",
                  need / 1e9, state / 1e9, (long long)B, (long long)T, (need - state) / 1e9,
                  double(free_b) / 1e9);
    if (need > double(free_b))
        throw Error(std::string(msg) +
                    ": lower train.batch_size (train.grad_accum keeps the step's tokens) or set "
                    "train.recompute_gelu or train.recompute_block");
    std::printf("%s\n", msg);
    if (parts > 1) {  // the hint: what the split saves against data parallel, by the same count
        const double dp = cuda_rank_bytes(cfg, 1);
        if (dp > need)
            std::printf(
                "vocab split over %d ranks: %.2f GB a rank against %.2f GB under data "
                "parallel\n",
                parts, need / 1e9, dp / 1e9);
        else
            std::printf(
                "vocab split over %d ranks: %.2f GB a rank, not less than data "
                "parallel's %.2f GB here; parallel.vocab_parallel=1 holds no more\n",
                parts, need / 1e9, dp / 1e9);
    }
}

std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, VocabParallel vocab) {
    check_device_memory(cfg, vocab.split() ? vocab.group->size() : 1);
    return std::make_unique<CudaBackend>(cfg, vocab);
}

}  // namespace zgpt

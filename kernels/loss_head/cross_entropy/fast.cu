// The loss head's one-read, one-write variants (kernels/loss_head/cross_entropy/launch.cu lists
// them all):
//
//   fast   one read and one write: persistent thread-block clusters hold each row in shared
//          memory (split across the cluster's CTAs); two or three warp groups per CTA take turns
//          over the rows (fast_pingpong_kernel), exchanging the cluster's statistics through DSMEM
//          and mbarriers; where the clusters leave SMs idle, a helper grid takes the last rows
//          there: 2-CTA clusters of the same kernel with one group, or online's whole rows
//          (plan_fast_helper)
//   fast_lockstep  the same with all of a CTA's warps on one row at a time and the cluster barrier
//          per row (fast_lockstep_kernel), kept for ablations
//
// A slice's statistics take one sweep over shared memory or two (slice_stats); the plans (cluster
// size, stages, warp groups, sweeps, the helper's share) are plan.h's; the sm_90 PTX
// wrappers are in ptx_sm90.cuh (both beside this file). Both fall back to online (run_online) for
// rows the plan cannot hold.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda/atomic>
#include <type_traits>
#include <vector>

#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_common.cuh"
#include "kernels/core/cuda_device.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/cross_entropy/common.cuh"
#include "kernels/loss_head/cross_entropy/internal.h"
#include "kernels/loss_head/cross_entropy/plan.h"
#include "kernels/loss_head/cross_entropy/ptx_sm90.cuh"
#include "kernels/loss_head/cross_entropy/slice_parts.h"

namespace cg = cooperative_groups;

namespace zgpt::cuda {

using namespace ce;

namespace {

// ---------------------------------------------------------------- fast: one read, one write

// Running max of 16-byte chunks: packed bf16x2 max (exact, 4 instructions per 8 values) or fp32.
template <typename T>
struct ChunkMax;
template <>
struct ChunkMax<bf16> {
    __nv_bfloat162 m = __float2bfloat162_rn(-INFINITY);
    __device__ __forceinline__ void add(const int4& raw) {
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
        m = __hmax2(m, __hmax2(__hmax2(h[0], h[1]), __hmax2(h[2], h[3])));
    }
    __device__ __forceinline__ float value() const {
        return fmaxf(__low2float(m), __high2float(m));
    }
};
template <>
struct ChunkMax<float> {
    float m0 = -INFINITY, m1 = -INFINITY;
    __device__ __forceinline__ void add(const int4& raw) {
        m0 = fmaxf(m0, fmaxf(__int_as_float(raw.x), __int_as_float(raw.y)));
        m1 = fmaxf(m1, fmaxf(__int_as_float(raw.z), __int_as_float(raw.w)));
    }
    __device__ __forceinline__ float value() const { return fmaxf(m0, m1); }
};

struct FastArgs {
    const void* logits;
    void* dlogits;
    int64_t ld, N;
    int64_t row0;          // the first row (fast_pingpong_kernel: rows [row0, N))
    int64_t slice;         // columns per CTA (a multiple of the 16-byte chunk)
    int stages;            // row buffers per CTA
    RowFinish fin;         // targets, gradient scale, loss settings, V and the row outputs
    unsigned* max_key;     // the largest logit of any row (raise_max), for the summary
    long long* trace;      // fast_pingpong_kernel<..., kTrace>: N x cluster x kTracePoints clocks
    bool exchange = true;  // FastPlan::exchange (a cluster of more than one CTA exchanges always)
    bool l2_evict_last = true;  // fast_pingpong_kernel: CrossEntropyTuning::l2_evict_last
};

// The per-row outputs of the fused kernel (written once per row).
__device__ __forceinline__ void write_row_outputs(const FastArgs& a, int64_t row,
                                                  const RowResult& r, const RowStatsF& st) {
    write_row(a.fin, row, r);
    raise_max(a.max_key, st.max);
}

struct NoWait {
    __device__ void operator()(int) const {}
};

// One whole chunk's share of a slice's statistics: its exponentials against `base` into s0 and
// s1 (two chains), the target's value kept aside rather than summed, and with label smoothing
// its values into sx. Both sweep variants add chunks so.
template <int K>
__device__ __forceinline__ void add_chunk_exps(const float (&v)[K], int c, int target_chunk,
                                               int y_local, float base, bool smooth, float& s0,
                                               float& s1, float& sx, float& target_logit) {
    if (c == target_chunk) {  // exclude the target from the sum
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (c * K + k == y_local)
                target_logit = v[k];
            else
                s0 += exp_ftz(v[k] - base);
        }
    } else {
#pragma unroll
        for (int k = 0; k < K; k += 2) {
            s0 += exp_ftz(v[k] - base);
            s1 += exp_ftz(v[k + 1] - base);
        }
    }
    if (smooth) {
#pragma unroll
        for (int k = 0; k < K; k++) sx += v[k];
    }
}

// This thread's statistics of a CTA's slice of n values held in shared memory: `nv` whole chunks
// plus a tail of < one chunk (its padding columns are never used). Two sweeps over shared memory:
// a packed max, then branch-free sums against it (no serial rescaling chain). Thread `tid`
// of the kThreads that share the slice takes chunks tid, tid + kThreads, ... The slice may arrive
// in kParts parts of `part_chunks` chunks: wait_part(p) returns once part p has landed, and the
// max pass over part p starts while the later parts are still in flight.
template <typename T, int kThreads, int kParts = 1, typename WaitPart = NoWait>
__device__ __forceinline__ RowStatsF slice_stats_two_sweeps(const T* buf, int nv, int n,
                                                            int y_local, bool smooth, int tid,
                                                            int part_chunks = 0,
                                                            WaitPart wait_part = {}) {
    constexpr int K = kChunk<T>;
    static_assert((kThreads & (kThreads - 1)) == 0, "a power of two");
    ChunkMax<T> cmax;
#pragma unroll
    for (int p = 0; p < kParts; p++) {
        wait_part(p);
        // part p's whole chunks; within it the thread takes the chunks c = tid (mod kThreads),
        // the same ones as in the one sum pass below, so every value it sums lies under its own
        // max. (Starting each part at lo + tid, as slice_grad does, gave threads chunks their
        // max had not seen: wrong sums, and -inf maxima that skipped the sums.)
        const int hi = part_hi(nv, p, kParts, part_chunks);
        const int first = p == 0 ? tid : part_first(part_lo(nv, p, part_chunks), tid, kThreads);
#pragma unroll 4
        for (int c = first; c < hi; c += kThreads)
            cmax.add(*reinterpret_cast<const int4*>(buf + c * K));
    }
    RowStatsF st = {cmax.value(), 0.0f, 0.0f, 0.0f};
    if (st.max != kNegInf) {
        const int target_chunk = y_local >= 0 ? y_local / K : -1;
        float s0 = 0.0f, s1 = 0.0f, sx = 0.0f;
#pragma unroll 4
        for (int c = tid; c < nv; c += kThreads) {
            float v[K];
            load_chunk(buf + c * K, v);
            add_chunk_exps(v, c, target_chunk, y_local, st.max, smooth, s0, s1, sx,
                           st.target_logit);
        }
        st.sum_excl = s0 + s1;
        st.sum_logits = sx;
    }
    for (int j = nv * K + tid; j < n; j += kThreads) stats_add(st, to_f(buf[j]), j == y_local);
    return st;
}

// The same statistics in one sweep: each chunk raises a packed running max and adds its
// exponentials against a reference `ref`, the max of a chunk of part 0, so that the sums need not
// wait for the max of the whole slice, and after the last part lands only that part's work is
// left (two sweeps put a whole second sweep there, on every row's critical path). One factor at
// the end puts the sums against the thread's max. Where that max lies more than kRefAbove above
// the reference or kRefBelow below it (or is NaN), the slice is summed again against it.
// kRefAbove: e^64 times a thread's values stays far below FLT_MAX; near it the rounding of the
// exponents' arguments costs about 1e-5 of the sum (against 1e-7 in two sweeps), and a smaller
// bound would send the slice that holds a peaked row's max to a second attempt more often.
// kRefBelow: a reference borrowed from another thread's chunk may lie far above this thread's
// values; e^40 keeps the final factor finite.
constexpr float kRefAbove = 64.0f;
constexpr float kRefBelow = 40.0f;

template <typename T, int kThreads, int kParts = 1, typename WaitPart = NoWait>
__device__ __forceinline__ RowStatsF slice_stats_one_sweep(const T* buf, int nv, int n, int y_local,
                                                           bool smooth, int tid,
                                                           int part_chunks = 0,
                                                           WaitPart wait_part = {}) {
    constexpr int K = kChunk<T>;
    static_assert((kThreads & (kThreads - 1)) == 0, "a power of two");
    const int target_chunk = y_local >= 0 ? y_local / K : -1;
    RowStatsF st = {kNegInf, 0.0f, 0.0f, 0.0f};
    wait_part(0);
    float ref = kNegInf;
    if (const int hi0 = part_hi(nv, 0, kParts, part_chunks); hi0 > 0) {
        // the thread's first chunk where part 0 holds it, else another of part 0's
        float v[K];
        load_chunk(buf + (tid < hi0 ? tid : tid % hi0) * K, v);
#pragma unroll
        for (int k = 0; k < K; k++) ref = fmaxf(ref, v[k]);
    }
    // at most twice: against part 0's chunk, then (rarely) against the thread's max
    for (int attempt = 0; attempt < 2; attempt++) {
        ChunkMax<T> cmax;
        float s0 = 0.0f, s1 = 0.0f, sx = 0.0f;
#pragma unroll
        for (int p = 0; p < kParts; p++) {
            if (p > 0) wait_part(p);
            // part p's whole chunks, the thread's chunks c = tid (mod kThreads) among them
            const int hi = part_hi(nv, p, kParts, part_chunks);
            const int first = p == 0 ? tid : part_first(part_lo(nv, p, part_chunks), tid, kThreads);
#pragma unroll 4
            for (int c = first; c < hi; c += kThreads) {
                const int4 raw = *reinterpret_cast<const int4*>(buf + c * K);
                cmax.add(raw);
                float v[K];
                unpack_chunk<T>(raw, v);
                add_chunk_exps(v, c, target_chunk, y_local, ref, smooth, s0, s1, sx,
                               st.target_logit);
            }
        }
        st.max = cmax.value();
        st.sum_logits = sx;
        if (st.max == kNegInf) {  // nothing but -inf (or no chunks): no sums, as in two sweeps
            st = {kNegInf, 0.0f, 0.0f, 0.0f};
            break;
        }
        if (ref == st.max) {
            st.sum_excl = s0 + s1;
            break;
        }
        // the difference, not ref + kRefAbove: at |x| ~ 2^30 that sum rounds to ref + 128
        if (const float d = st.max - ref; d <= kRefAbove && d >= -kRefBelow) {
            st.sum_excl = (s0 + s1) * exp_ftz(-d);
            break;
        }
        ref = st.max;  // a reference of -inf or far from the thread's max, or a NaN
        st.sum_excl = s0 + s1;
    }
    for (int j = nv * K + tid; j < n; j += kThreads) stats_add(st, to_f(buf[j]), j == y_local);
    return st;
}

// The statistics of a slice in one sweep or two (FastPlan::stats_sweeps): the same values up to
// the rounding of their sums.
template <typename T, int kThreads, bool kOneSweep, int kParts = 1, typename WaitPart = NoWait>
__device__ __forceinline__ RowStatsF slice_stats(const T* buf, int nv, int n, int y_local,
                                                 bool smooth, int tid, int part_chunks = 0,
                                                 WaitPart wait_part = {}) {
    if constexpr (kOneSweep)
        return slice_stats_one_sweep<T, kThreads, kParts>(buf, nv, n, y_local, smooth, tid,
                                                          part_chunks, wait_part);
    else
        return slice_stats_two_sweeps<T, kThreads, kParts>(buf, nv, n, y_local, smooth, tid,
                                                           part_chunks, wait_part);
}

// dlogits of the whole chunks [lo, hi) of a CTA's slice from its shared-memory copy, and of the
// tail values [nv K, n) when `tail`.
template <typename T, int kThreads>
__device__ __forceinline__ void slice_grad(T* dx, const T* buf, int lo, int hi, int nv, int n,
                                           bool tail, int y_local, bool valid,
                                           const RowGradParams& p, int tid) {
    constexpr int K = kChunk<T>;
#pragma unroll 4
    for (int c = lo + tid; c < hi; c += kThreads) {
        float v[K];
        load_chunk(buf + c * K, v);
        grad_chunk_fast(v, y_local < 0 ? -1 : y_local - c * K, valid, p);
        store_chunk(dx + int64_t(c) * K, v);
    }
    if (tail)
        for (int j = nv * K + tid; j < n; j += kThreads)
            dx[j] = from_f<T>(grad_value(to_f(buf[j]), j == y_local, valid, p));
}

// Persistent clusters; CTA `rank` of a cluster owns the columns [rank * slice, (rank + 1) * slice)
// of every row its cluster takes, and keeps `stages` of them in a ring of shared-memory buffers
// that thread 0 fills with one bulk copy (TMA) per row, so several rows stream in while one is
// worked on. Per row i, each CTA:
//   1. waits for its slice of row i, reduces its statistics, publishes them, arrives on the
//      cluster barrier (release);
//   2. while the other CTAs catch up, writes dlogits of row i - 1 from its buffer, then refills
//      that buffer with row i - 1 + stages;
//   3. waits on the cluster barrier (acquire); warp 0 merges the cluster's statistics over DSMEM
//      and finalises the row into shared memory for the next iteration's step 2.
// One cluster barrier per row, and its latency is hidden behind step 2. The statistics slots are
// double-buffered by row parity: slot i & 1 is rewritten only after every CTA passed barrier i + 1.
//
// (A refill without the block barrier, the last warp done with the buffer starting the copy,
// measured 1-3% slower on the H100 and was removed: docs/cross_entropy.md.)
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads, kThreads <= 256 ? 3 : 1)
    fast_lockstep_kernel(FastArgs a) {
    constexpr int K = kChunk<T>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __shared__ uint64_t full[kMaxStages];
    __shared__ RowStatsF cta_stats[2];
    __shared__ RowGradParams row_params[2];
    __shared__ RowStatsF warp_vals[32];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = int(cluster.block_rank());
    const int csize = int(cluster.num_blocks());
    const int64_t first_row = int64_t(blockIdx.x) / csize;
    const int64_t row_step = int64_t(gridDim.x) / csize;
    const int64_t c0 = int64_t(rank) * a.slice;
    const int64_t rest = a.fin.V - c0;
    const int n = int(rest <= 0 ? 0 : (rest < a.slice ? rest : a.slice));
    const int nv = n / K;  // whole chunks; the last CTA may have a tail of < K values
    // The bulk copy takes the tail's whole chunk too: rows are [N, ld] with ld a multiple of the
    // chunk (plan_fast needs 16-byte aligned rows), so the chunk is inside the buffer. Reading
    // the tail from global memory instead put a load round trip per row on the last CTA's
    // critical path, in both passes (the trainer's V = 50257 has a tail of one value).
    const unsigned bytes = unsigned((n + K - 1) / K) * 16u;
    const T* const logits = static_cast<const T*>(a.logits) + c0;
    T* const dlogits = static_cast<T*>(a.dlogits) + c0;
    const bool smooth = a.fin.eps != 0.0f;
    const int S = a.stages;
    auto buffer = [&](int64_t it) { return reinterpret_cast<T*>(smem_raw) + (it % S) * a.slice; };
    auto load = [&](int64_t it) {  // thread 0 only
        const int64_t row = first_row + it * row_step;
        if (row < a.N && bytes > 0)
            bulk_load(buffer(it), logits + row * a.ld, bytes, &full[it % S]);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int s = 0; s < S; s++) load(s);
    }
    cluster.sync();  // barriers initialised, and every CTA runs before any DSMEM access

    // per-row scalars are read before the previous row's dlogits stores are queued, not after
    const int n_valid = *a.fin.n_valid;
    int prev_y_local = -1;
    bool prev_valid = false;
    int64_t it = 0;
    for (int64_t row = first_row; row < a.N; row += row_step, it++) {
        const int32_t y = a.fin.targets[row];
        const float g = a.fin.grad_output[a.fin.per_row ? row : 0];
        if (bytes > 0) mbar_wait(&full[it % S], unsigned(it / S) & 1u);
        const bool valid = y != a.fin.ignore_index;
        const int y_local = valid && y >= c0 && y < c0 + n ? int(y - c0) : -1;
        RowStatsF st =
            slice_stats<T, kThreads, false>(buffer(it), nv, n, y_local, smooth, threadIdx.x);
        // its barrier publishes row_params of row i - 1; the one after the dlogits pass separates
        // the calls
        st = block_reduce_stats(st, warp_vals);
        if (threadIdx.x == 0) cta_stats[it & 1] = st;
        cluster_arrive();
        if (it > 0) {
            const int64_t prev = row - row_step;
            slice_grad<T, kThreads>(dlogits + prev * a.ld, buffer(it - 1), 0, nv, nv, n, true,
                                    prev_y_local, prev_valid, row_params[(it - 1) & 1],
                                    threadIdx.x);
        }
        __syncthreads();  // every thread is done with buffer(it - 1) and row_params[(it-1) & 1]
        if (threadIdx.x == 0 && it > 0) {
            // the generic-proxy reads of the buffer before the async-proxy (TMA) write into it
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            load(it - 1 + S);
        }
        prev_y_local = y_local;
        prev_valid = valid;
        cluster_wait();
        if (threadIdx.x < 32) {
            // lane l reads CTA l % 8's statistics; the trees within each group of 8 lanes are
            // commutative at every step, so every lane (and every CTA) gets bit-identical results
            const int r = int(threadIdx.x) % kMaxCluster;
            const RowStatsF all = warp_merge_stats<kMaxCluster>(
                r < csize ? *cluster.map_shared_rank(&cta_stats[it & 1], r) : empty_stats());
            const RowResult res =
                finalize_row(row_target_stats(a.fin, all, y, valid), y, valid,
                             grad_scale(g, a.fin.red, n_valid), a.fin.V, a.fin.eps, a.fin.zw);
            if (threadIdx.x == 0) {
                row_params[it & 1] = res.p;
                if (rank == 0) write_row_outputs(a, row, res, all);
            }
        }
    }
    if (it > 0) {
        __syncthreads();  // row_params of the last row
        const int64_t last = first_row + (it - 1) * row_step;
        slice_grad<T, kThreads>(dlogits + last * a.ld, buffer(it - 1), 0, nv, nv, n, true,
                                prev_y_local, prev_valid, row_params[(it - 1) & 1], threadIdx.x);
    }
    cluster.sync();  // no CTA may leave while another may still read its shared memory
}

// ---------------------------------------------------------------- fast, pingpong schedule

// The variant `fast` (measured in docs/cross_entropy.md). fast_lockstep_kernel's CTA works on one
// row at a time, and all its warps go through the same chain: statistics, block reduction,
// cluster barrier, dlogits, refill barrier. While they wait in it, the SM's special-function and
// load/store units idle (the instrumented build: ~2,800 of ~11,300 cycles a row in reductions and
// barriers). Here a CTA's warps form kGroupCount groups (of 256 or 512 threads) that take turns
// over the cluster's rows, each with its whole chain, so one group's waits overlap the others'
// passes (the "ping-pong" of FlashAttention-3). The cluster's statistics cannot go through
// barrier.cluster, which every thread of the cluster must reach: each CTA's group writes its row
// statistics into every CTA's shared memory and arrives on that CTA's mbarrier (release, cluster
// scope), and each CTA's group waits on its own mbarrier (acquire). Every thread then merges the
// cluster's statistics (same order, same bits in every CTA) and finalises the row itself, so no
// barrier hands the row's parameters to the group.
//
// Buffers: row iteration it uses buffer it % S of the ring; the group that finishes it refills
// the buffer with it + S, which another group takes when S is not a multiple of kGroupCount. A
// parity wait alone could then pass one phase early: a group may reach iteration it + S while the
// copy of it is still landing, and parity(it + S) names the phase before that one, long complete.
// So the refilling thread records the iteration it started (release), and a group waits for that
// record (acquire) before its parity wait: the buffer's barrier is then in it + S's phase.
//
// Parts: each buffer is copied in kParts bulk copies on kParts mbarriers. A group refills part p
// as soon as its dlogits pass is done with it (a group barrier per part), so the next copy starts
// while the group still writes the later parts, and the next statistics pass starts on part 0
// while the later parts land.
//
// Statistics slots: iteration it writes slot it % (2 kGroupCount). Another CTA writes iteration
// it + 2 kGroupCount only after it finished it + kGroupCount (the same group's next row), which
// needed this CTA's statistics of it + kGroupCount, which this CTA's group publishes only after it
// finished iteration it (slot read, mbarrier phase observed).
//
// kTrace: thread 0 of each group records clock64() at five points of every row, and the cycles
// its statistics pass spent waiting for the row's later parts (what of that pass is the copy's,
// not the pass's own work); CrossEntropyTuning::trace prints where a row's time goes. The other
// kernels compile none of it.
constexpr int kTraceStamps = 5;
constexpr int kTracePoints = kTraceStamps + 1;  // the five clocks, then the later parts' wait

template <typename T, int kGroupThreads, int kGroupCount, int kParts, bool kTrace, bool kOneSweep>
__global__ void __launch_bounds__(kGroupCount* kGroupThreads, 1) fast_pingpong_kernel(FastArgs a) {
    constexpr int K = kChunk<T>;
    constexpr int kWarps = kGroupThreads / 32;
    constexpr int kStatSlots = 2 * kGroupCount;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __shared__ uint64_t full[kMaxStages][kParts];
    __shared__ int copy_started[kMaxStages][kParts];  // the iteration whose copy last started
    __shared__ uint64_t stats_ready[kStatSlots];
    __shared__ __align__(16) RowStatsF cluster_vals[kStatSlots][kMaxCluster];  // [slot][CTA rank]
    __shared__ RowStatsF warp_vals[kGroupCount][kWarps];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = int(cluster.block_rank());
    const int csize = int(cluster.num_blocks());
    const int group = int(threadIdx.x) / kGroupThreads;
    const int tid = int(threadIdx.x) % kGroupThreads;
    const int warp = tid / 32, lane = tid % 32;
    const int64_t first_row = a.row0 + int64_t(blockIdx.x) / csize;
    const int64_t row_step = int64_t(gridDim.x) / csize;
    const int64_t c0 = int64_t(rank) * a.slice;
    const int64_t rest = a.fin.V - c0;
    const int n = int(rest <= 0 ? 0 : (rest < a.slice ? rest : a.slice));
    const int nv = n / K;
    // the copy takes the tail's whole chunk too (fast_lockstep_kernel), in parts of part_chunks
    const int chunks = (n + K - 1) / K;
    const int part_chunks = part_size(chunks, kParts);
    auto copy_lo = [&](int p) { return min(chunks, p * part_chunks); };  // p <= kParts
    const T* const logits = static_cast<const T*>(a.logits) + c0;
    T* const dlogits = static_cast<T*>(a.dlogits) + c0;
    const bool smooth = a.fin.eps != 0.0f;
    const int S = a.stages;
    auto buffer = [&](int64_t it) { return reinterpret_cast<T*>(smem_raw) + (it % S) * a.slice; };
    // Evict-last keeps a row's lines in L2 until its dlogits are written over them: faster than
    // the normal policy at every measured shape (fast_l2_evict_last in ce_vocab_sweep_h200.json).
    const uint64_t policy = l2_policy(a.l2_evict_last);
    auto load_part = [&](int64_t it, int p) {
        const int64_t row = first_row + it * row_step;
        const int lo = copy_lo(p), hi = copy_lo(p + 1);
        if (row < a.N && hi > lo)
            bulk_load(buffer(it) + lo * K, logits + row * a.ld + lo * K, unsigned(hi - lo) * 16u,
                      &full[it % S][p], policy);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++)
            for (int p = 0; p < kParts; p++) mbar_init(&full[s][p]);
        for (int s = 0; s < kStatSlots; s++) mbar_init_count(&stats_ready[s], unsigned(csize));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int s = 0; s < S; s++)
            for (int p = 0; p < kParts; p++) {
                load_part(s, p);
                copy_started[s][p] = s;
            }
    }
    cluster.sync();  // barriers initialised, and every CTA runs before any DSMEM access
    // Every CTA of this grid is resident now: a helper grid launched after it with programmatic
    // serialization may start, and takes only the SMs this one leaves idle (run_fast_schedule).
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    const int n_valid = *a.fin.n_valid;
    for (int64_t it = group;; it += kGroupCount) {
        const int64_t row = first_row + it * row_step;
        if (row >= a.N) break;
        long long t[kTracePoints] = {};
        if constexpr (kTrace) t[0] = clock64();
        const int32_t y = a.fin.targets[row];
        const float g = a.fin.grad_output[a.fin.per_row ? row : 0];
        const bool valid = y != a.fin.ignore_index;
        const int y_local = valid && y >= c0 && y < c0 + n ? int(y - c0) : -1;
        const T* buf = buffer(it);
        auto wait_part = [&](int p) {
            long long w0 = 0;
            if constexpr (kTrace)
                if (p > 0) w0 = clock64();
            if (copy_lo(p + 1) > copy_lo(p)) {
                ::cuda::atomic_ref<int, ::cuda::thread_scope_block> started(
                    copy_started[it % S][p]);
                while (started.load(::cuda::memory_order_acquire) != int(it)) {
                }
                mbar_wait(&full[it % S][p], unsigned(it / S) & 1u);
            }
            if constexpr (kTrace) {
                if (p == 0)
                    t[1] = clock64();
                else
                    t[kTraceStamps] += clock64() - w0;
            }
        };
        RowStatsF st = slice_stats<T, kGroupThreads, kOneSweep, kParts>(
            buf, nv, n, y_local, smooth, tid, part_chunks, wait_part);
        // the group's statistics in every thread: each warp merges its lanes, then every warp the
        // group's partials, with the same tree (the barrier after the dlogits pass separates the
        // group's writes of warp_vals from its reads of them)
        st = warp_merge_stats(st);
        if (lane == 0) warp_vals[group][warp] = st;
        group_sync(1 + group, kGroupThreads);
        if constexpr (kTrace) t[2] = clock64();
        st = warp_merge_stats<kWarps>(warp_vals[group][lane % kWarps]);
        RowStatsF all = st;  // without the exchange (a cluster of one): the row's statistics
        if (csize > 1 || a.exchange) {
            const int slot = int(it % kStatSlots);
            if (warp == 0 && lane < csize) {  // lane r hands this CTA's statistics to CTA r
                *cluster.map_shared_rank(&cluster_vals[slot][rank], lane) = st;
                mbar_arrive_remote(&stats_ready[slot], unsigned(lane));
            }
            mbar_wait_cluster(&stats_ready[slot], unsigned(it / kStatSlots) & 1u);
            const int r = lane % kMaxCluster;
            all = warp_merge_stats<kMaxCluster>(r < csize ? cluster_vals[slot][r] : empty_stats());
        }
        if constexpr (kTrace) t[3] = clock64();
        const RowResult res =
            finalize_row(row_target_stats(a.fin, all, y, valid), y, valid,
                         grad_scale(g, a.fin.red, n_valid), a.fin.V, a.fin.eps, a.fin.zw);
        if (rank == 0 && tid == 0) write_row_outputs(a, row, res, all);
#pragma unroll
        for (int p = 0; p < kParts; p++) {
            const int lo = part_lo(nv, p, part_chunks);
            const int hi = part_hi(nv, p, kParts, part_chunks);
            // the tail's chunk (index nv) is copied with part nv / part_chunks
            const bool tail = kParts == 1 || nv / part_chunks == p;
            slice_grad<T, kGroupThreads>(dlogits + row * a.ld, buf, lo, hi, nv, n, tail, y_local,
                                         valid, res.p, tid);
            group_sync(1 + group, kGroupThreads);  // the group is done with part p
            if (tid == 0) {
                // the generic-proxy reads of the buffer before the async-proxy (TMA) write into it
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                load_part(it + S, p);
                ::cuda::atomic_ref<int, ::cuda::thread_scope_block> started(
                    copy_started[it % S][p]);
                started.store(int(it + S), ::cuda::memory_order_release);
            }
        }
        if constexpr (kTrace) {
            if (tid == 0) {
                t[4] = clock64();
                long long* out = a.trace + (row * csize + rank) * kTracePoints;
                for (int k = 0; k < kTracePoints; k++) out[k] = t[k];
            }
        }
    }
    cluster.sync();  // no CTA may leave while another may still write its shared memory
    // A helper grid ends only after the grid it overlapped (and that grid's writes are visible),
    // so the kernels after it see both. Without a programmatic dependency this returns at once.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// ---------------------------------------------------------------- host side

int device_attribute(cudaDeviceAttr attr) {
    int dev = 0, v = 0;
    ZG_CUDA_CHECK(cudaGetDevice(&dev));
    ZG_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}
// Read once, like the plan's other device facts (one GPU model per process).
int max_smem_optin() {
    static const int v = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return v;
}

using FastKernel = void (*)(FastArgs);

// The instantiated kernels: the helper's one 512-thread group with 1, 2 or 4 parts; two
// 256-thread groups with 1, 2 or 4; 1 or 2 otherwise (plan_fast never asks for more); each with
// the statistics in one sweep or two.
template <typename T, bool kTrace, bool kOneSweep>
FastKernel pingpong_kernel_of(const FastPlan& p) {
    if (p.groups == 1)  // the helper (plan_fast_helper)
        return p.parts == 1   ? fast_pingpong_kernel<T, 512, 1, 1, false, kOneSweep>
               : p.parts == 2 ? fast_pingpong_kernel<T, 512, 1, 2, false, kOneSweep>
                              : fast_pingpong_kernel<T, 512, 1, 4, false, kOneSweep>;
    if (p.groups == 3)
        return p.parts == 1 ? fast_pingpong_kernel<T, 256, 3, 1, kTrace, kOneSweep>
                            : fast_pingpong_kernel<T, 256, 3, 2, kTrace, kOneSweep>;
    if (p.threads == 1024)
        return p.parts == 1 ? fast_pingpong_kernel<T, 512, 2, 1, kTrace, kOneSweep>
                            : fast_pingpong_kernel<T, 512, 2, 2, kTrace, kOneSweep>;
    return p.parts == 1   ? fast_pingpong_kernel<T, 256, 2, 1, kTrace, kOneSweep>
           : p.parts == 2 ? fast_pingpong_kernel<T, 256, 2, 2, kTrace, kOneSweep>
                          : fast_pingpong_kernel<T, 256, 2, 4, kTrace, kOneSweep>;
}
template <typename T, bool kTrace>
FastKernel pingpong_kernel(const FastPlan& p) {
    return p.stats_sweeps == 1 ? pingpong_kernel_of<T, kTrace, true>(p)
                               : pingpong_kernel_of<T, kTrace, false>(p);
}

// CrossEntropyTuning::trace (bf16 logits, `fast`, outside graph capture): runs the kernel that
// records clock64() at five points of each row, waits for it and prints to stderr where the rows'
// time went, as mean cycles per row and CTA. A diagnostic: it synchronises the stream.
struct FastTrace {
    long long* device = nullptr;
    size_t capacity = 0;
    long long* buffer(size_t count) {
        if (count > capacity) {
            if (device) ZG_CUDA_CHECK(cudaFree(device));
            ZG_CUDA_CHECK(cudaMalloc(&device, count * sizeof(long long)));
            capacity = count;
        }
        return device;
    }
};

void report_fast_trace(const long long* device, int64_t N, int cluster, int64_t row_step,
                       int groups, CUstream_st* s) {
    std::vector<long long> t(size_t(N) * cluster * kTracePoints);
    ZG_CUDA_CHECK(
        cudaMemcpyAsync(t.data(), device, t.size() * sizeof(long long), cudaMemcpyDeviceToHost, s));
    ZG_CUDA_CHECK(cudaStreamSynchronize(s));
    // wait for the copy, statistics, exchange, dlogits, period; then the later parts' wait
    double phase[kTracePoints] = {};
    int64_t rows = 0, periods = 0;
    for (int64_t row = 0; row < N; row++) {
        for (int r = 0; r < cluster; r++) {
            const long long* x = &t[size_t((row * cluster + r) * kTracePoints)];
            for (int k = 0; k + 1 < kTraceStamps; k++) phase[k] += double(x[k + 1] - x[k]);
            phase[kTraceStamps] += double(x[kTraceStamps]);
            rows++;
            const int64_t next = row + groups * row_step;  // the same group's next row
            if (next < N) {
                phase[kTraceStamps - 1] +=
                    double(t[size_t((next * cluster + r) * kTracePoints)] - x[0]);
                periods++;
            }
        }
    }
    std::fprintf(stderr,
                 "fast trace (cycles per row and CTA, %d groups, cluster %d): copy wait %.0f, "
                 "statistics %.0f (of which waiting for the later parts %.0f), cluster exchange "
                 "%.0f, dlogits + refills %.0f; a group's period %.0f (%.0f per row)\n",
                 groups, cluster, phase[0] / rows, phase[1] / rows, phase[kTraceStamps] / rows,
                 phase[2] / rows, phase[3] / rows, periods ? phase[4] / periods : 0.0,
                 periods ? phase[4] / periods / groups : 0.0);
}

// The launch of `clusters` clusters of the plan's shape; attr[0] takes the cluster dimension.
cudaLaunchConfig_t fast_config(const FastPlan& plan, int clusters, cudaLaunchAttribute* attr) {
    cudaLaunchConfig_t cfg{};
    cfg.blockDim = dim3(unsigned(plan.threads));
    cfg.dynamicSmemBytes = plan.smem;
    cfg.gridDim = dim3(unsigned(clusters * plan.cluster));
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim = {unsigned(plan.cluster), 1, 1};
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

// How many clusters of the plan's shape fit on the GPU at once (one wave of a persistent grid).
int max_active_clusters(FastKernel kernel, const FastPlan& plan) {
    ZG_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.smem)));
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = fast_config(plan, 1, attr);
    int clusters = 0;
    ZG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    return std::max(clusters, 1);
}

// Launches `clusters` persistent clusters of the plan. `after_main`: a helper grid, launched with
// programmatic serialization so that it starts as soon as the grid before it is resident
// (griddepcontrol.launch_dependents) and ends after it (griddepcontrol.wait).
void launch_fast(FastKernel kernel, const FastPlan& plan, const FastArgs& f, int clusters,
                 bool after_main, CUstream_st* s) {
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = fast_config(plan, clusters, attr);
    cfg.stream = s;
    if (after_main) {
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 2;
    }
    ZG_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, f));
}

void run_fast_schedule(const CrossEntropyArgs& a0, const CrossEntropyOptions& o, void* w,
                       CUstream_st* s, bool pingpong) {
    check_args(a0, o, true);
    const Workspace ws = carve(w, a0.N, a0.V, false);
    const CrossEntropyArgs a = with_rows(a0, ws);
    const FastPlan plan = plan_fast(a, pingpong, max_smem_optin());
    if (plan.cluster == 0) {  // rows unaligned or too long for the cluster's shared memory
        run_online(a0, o, w, s);
        return;
    }
    // The main grid is a plain launch: it starts after this reset (and the count) is visible; the
    // helper grid starts after the main grid's trigger, so later still.
    count_valid_and_reset_max(ws.n_valid, ws.max_key, a.targets, a.N, o.ignore_index, s);
    FastArgs f{a.logits,   a.dlogits,  a.ld,        a.N,
               0,          plan.slice, plan.stages, row_finish(a, o, ws.n_valid),
               ws.max_key, nullptr};
    f.exchange = plan.exchange;
    f.l2_evict_last = a.tuning.l2_evict_last;
    dispatch(a.type, [&](auto tag) {
        using T = decltype(tag);
        const int threads = plan.threads;
        bool trace = false;
        FastKernel kernel = threads == 1024  ? fast_lockstep_kernel<T, 1024>
                            : threads == 256 ? fast_lockstep_kernel<T, 256>
                                             : fast_lockstep_kernel<T, 512>;
        if (plan.pingpong) {
            kernel = pingpong_kernel<T, false>(plan);
            if constexpr (std::is_same_v<T, bf16>) {
                trace = a.tuning.trace;
                if (trace) {  // the trace synchronises, so never inside a graph capture
                    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
                    ZG_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
                    trace = capture == cudaStreamCaptureStatusNone;
                }
                if (trace) {
                    static FastTrace buffer;
                    f.trace = buffer.buffer(size_t(a.N) * plan.cluster * kTracePoints);
                    kernel = pingpong_kernel<T, true>(plan);
                }
            }
        }
        const int clusters = max_active_clusters(kernel, plan);
        // The SMs the main grid leaves idle take rows [N - helper_rows, N), in proportion to
        // their measured rate per SM against the main grid's (the helper plan's weight).
        const FastPlan help = plan_fast_helper(a, plan, max_smem_optin());
        const int sms = current_device_sm_count();
        FastKernel help_kernel = nullptr;
        int help_grid = 0;  // the helper's clusters (pairs) or blocks (online rows)
        int64_t help_rows = 0;
        if (help.cluster) {
            int help_fit = 0, per_unit = 1;
            if (help.online_rows) {
                help_fit = sms;  // one "cluster" an idle SM, each holding per_unit blocks
                per_unit = online_helper_blocks_per_sm(a.type, help.threads, help.smem);
            } else {
                help_kernel = pingpong_kernel<T, false>(help);
                // (max_active_clusters also sets the helper kernel's shared memory size)
                help_fit = max_active_clusters(help_kernel, help);
            }
            const HelperSplit split =
                split_helper(a.N, sms, clusters, plan, help, help_fit, help.weight);
            help_grid = int(std::min<int64_t>(int64_t(split.clusters) * per_unit, split.rows));
            help_rows = help_grid > 0 ? split.rows : 0;  // no block fits: no helper rows
        }
        f.N = a.N - help_rows;
        const int main_clusters = int(std::min<int64_t>(clusters, f.N));
        launch_fast(kernel, plan, f, main_clusters, false, s);
        if (help_rows > 0 && help.online_rows) {
            launch_online_helper(a, o, ws.n_valid, ws.max_key, f.N, help_grid, help.threads,
                                 help.smem, s);
        } else if (help_rows > 0) {
            FastArgs h = f;
            h.row0 = f.N;
            h.N = a.N;
            h.slice = help.slice;
            h.stages = help.stages;
            h.trace = nullptr;
            h.exchange = help.exchange;
            launch_fast(help_kernel, help, h, help_grid, true, s);
        }
        if (trace) report_fast_trace(f.trace, f.N, plan.cluster, main_clusters, plan.groups, s);
    });
    reduce_rows(a, ws.max_key, ws.n_valid, o, s);
}

}  // namespace

namespace ce {

void run_fast(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w, CUstream_st* s) {
    run_fast_schedule(a, o, w, s, true);
}
void run_fast_lockstep(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w,
                       CUstream_st* s) {
    run_fast_schedule(a, o, w, s, false);
}

}  // namespace ce
}  // namespace zgpt::cuda

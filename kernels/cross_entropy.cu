// CUDA loss head: cross-entropy + z-loss + label smoothing, vocab-shard aware.
// The math is kernels/cross_entropy.h's; docs/loss_head.md explains the variants.
//
//   naive  textbook: row max, row sum, fp32 softmax materialised, loss, gradient (5 kernels)
//   online two passes over the logits in one kernel pair (Liger / TransformerEngine): stats, then
//          re-read and write dlogits
//   fast   one read and one write: persistent thread-block clusters hold each row in shared
//          memory (split across the cluster's CTAs); two or three warp groups per CTA take turns
//          over the rows (fast_pingpong_kernel), exchanging the cluster's statistics through DSMEM
//          and mbarriers; where the clusters leave SMs idle, a helper grid of 2-CTA clusters
//          (the same kernel, one group) takes the last rows there (plan_fast_helper)
//   fast_lockstep  the same with all of a CTA's warps on one row at a time and the cluster barrier
//          per row (fast_lockstep_kernel), kept for ablations
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda/atomic>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_common.cuh"
#include "kernels/slice_parts.h"
#include "kernels/workspace.h"

namespace cg = cooperative_groups;

namespace zgpt::cuda {

namespace {

constexpr float kNegInf = -INFINITY;

// 16-byte chunks: 8 bf16 or 4 fp32 values, loaded and stored with one instruction.
template <typename T>
constexpr int kChunk = 16 / int(sizeof(T));

template <typename T>
__device__ __forceinline__ void load_chunk(const T* p, float (&v)[kChunk<T>]) {
    const int4 raw = *reinterpret_cast<const int4*>(p);
    if constexpr (std::is_same_v<T, bf16>) {
        // a bf16 is the high half of its float: one shift or one mask per value (the per-value
        // conversion compiles to a byte permute plus a multiply for every high half)
        const unsigned w[4] = {unsigned(raw.x), unsigned(raw.y), unsigned(raw.z), unsigned(raw.w)};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else {
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int k = 0; k < kChunk<T>; k++) v[k] = to_f(e[k]);
    }
}

template <typename T>
__device__ __forceinline__ void store_chunk(T* p, const float (&v)[kChunk<T>]) {
    int4 raw;
    if constexpr (std::is_same_v<T, bf16>) {  // one cvt.rn.bf16x2 per pair, same rounding
        __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
        for (int k = 0; k < kChunk<T> / 2; k++)
            e[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    } else {
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int k = 0; k < kChunk<T>; k++) e[k] = from_f<T>(v[k]);
    }
    *reinterpret_cast<int4*>(p) = raw;
}

constexpr float kLog2e = 1.4426950408889634f;

// 2^x on the special-function unit, flushing subnormal results to zero: a probability below
// 1.2e-38 contributes nothing a float sum can hold. The non-ftz form costs extra instructions
// around every MUFU op for denormal scaling.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float exp_ftz(float x) {
    return exp2_ftz(x * kLog2e);
}

// Online (max, sum) pair; merge is exact up to rounding and order-independent in exact arithmetic.
struct MaxSum {
    float m, s;
};
__device__ __forceinline__ MaxSum merge_ms(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == kNegInf) return {kNegInf, 0.0f};
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ RowStatsF merge_stats(const RowStatsF& a, const RowStatsF& b) {
    const MaxSum ms = merge_ms({a.max, a.sum_excl}, {b.max, b.sum_excl});
    return {ms.m, ms.s, a.target_logit + b.target_logit, a.sum_logits + b.sum_logits};
}

__device__ __forceinline__ RowStatsF empty_stats() {
    return {kNegInf, 0.0f, 0.0f, 0.0f};
}

// Merges the statistics of the lanes in each group of `width` (a power of two <= 32), the result
// in every lane of the group: the group's max first (an fmax tree), then each lane rescales its sum
// once and the sums go through a plain tree. A tree of merge_stats would put two exponentials on
// every level of the latency chain; in the fast kernel this reduction is on each row's critical
// path (on the H100 the switch took 5% off the large shape). Fixed trees, every step commutative:
// every lane gets the same bits.
template <int width = 32>
__device__ __forceinline__ RowStatsF warp_merge_stats(const RowStatsF& v) {
    float m = v.max;
    for (int off = width / 2; off > 0; off >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float r[3] = {v.max == kNegInf ? 0.0f : v.sum_excl * exp_ftz(v.max - m), v.target_logit,
                  v.sum_logits};
    for (int off = width / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int k = 0; k < 3; k++) r[k] += __shfl_xor_sync(0xffffffffu, r[k], off);
    }
    return {m, r[0], r[1], r[2]};
}

// Block-wide reduction of RowStatsF through warp_vals (32 slots in shared memory); the result is
// valid in thread 0 only (the per-row epilogue runs there once instead of in every thread). Fixed
// trees: deterministic. Calls that reuse warp_vals need a __syncthreads between them (warp 0
// reads warp_vals after the barrier inside).
__device__ RowStatsF block_reduce_stats(RowStatsF v, RowStatsF* warp_vals) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_merge_stats(v);
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int nwarps = int(blockDim.x + 31) >> 5;
        v = warp_merge_stats(lane < nwarps ? warp_vals[lane] : empty_stats());
    }
    return v;
}
__device__ RowStatsF block_reduce_stats(RowStatsF v) {
    __shared__ RowStatsF warp_vals[32];
    return block_reduce_stats(v, warp_vals);
}

__device__ __forceinline__ void stats_add(RowStatsF& st, float x, bool is_target) {
    st.sum_logits += x;
    if (is_target) {
        st.target_logit = x;
        // the target's own exp is not summed, but it may still set the max
        if (x > st.max) {
            st.sum_excl *= exp_ftz(st.max - x);
            st.max = x;
        }
        return;
    }
    if (x > st.max) {
        st.sum_excl = st.sum_excl * exp_ftz(st.max - x) + 1.0f;
        st.max = x;
    } else if (x != kNegInf) {
        st.sum_excl += exp_ftz(x - st.max);
    }
}

// Raises the running max to the chunk's (rescaling the sum once per chunk, not per value);
// false when every value so far is -inf.
template <int K>
__device__ __forceinline__ bool rescale_to_chunk_max(RowStatsF& st, const float (&v)[K]) {
    float cm = v[0];
#pragma unroll
    for (int k = 1; k < K; k++) cm = fmaxf(cm, v[k]);
    if (cm > st.max) {
        st.sum_excl *= exp_ftz(st.max - cm);
        st.max = cm;
    }
    return st.max != kNegInf;
}

// Adds K values whose first column is j0 to the statistics; the per-value target test only in the
// chunk that holds the target.
template <int K>
__device__ __forceinline__ void stats_chunk_fast(RowStatsF& st, const float (&v)[K], int64_t j0,
                                                 int64_t y_local, bool smooth) {
    if (!rescale_to_chunk_max(st, v)) return;
    const int64_t t = y_local - j0;  // the target's index in this chunk, if it is here
    if (t >= 0 && t < K) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            st.sum_logits += v[k];
            if (k == t)
                st.target_logit = v[k];
            else
                st.sum_excl += exp_ftz(v[k] - st.max);
        }
        return;
    }
    float acc = 0.0f, sx = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        acc += exp_ftz(v[k] - st.max);
        sx += v[k];
    }
    st.sum_excl += acc;
    if (smooth) st.sum_logits += sx;
}

// ---------------------------------------------------------------- shared per-row arithmetic

struct RowResult {
    RowGradParams p;
    float loss, ce, z, lse;
};

// From merged statistics of a whole row: the row's outputs and its gradient parameters.
__device__ RowResult finalize_row(const RowStatsF& st, int32_t y, bool valid, float g, int64_t V,
                                  float eps, float zw) {
    RowResult r;
    const float e_y = valid ? __expf(st.target_logit - st.max) : 0.0f;
    const float d = st.sum_excl + e_y;
    const float log_d = logf(d);
    const float lse = st.max + log_d;
    r.lse = lse;
    r.p.max = st.max;
    r.p.log2_d = log2f(d);
    if (!valid) {
        r.loss = r.ce = r.z = 0.0f;
        r.p.coef = r.p.d_target = r.p.smooth = 0.0f;
        return r;
    }
    // lse - x_y = log(1 + sum_excl / e_y): accurate when the row is peaked on its target
    const float gap = st.max - st.target_logit;
    float ce = gap < 60.0f ? log1pf(st.sum_excl * __expf(gap)) : gap + log_d;
    if (eps != 0.0f) ce = (1.0f - eps) * ce + eps * (lse - st.sum_logits / float(V));
    r.ce = ce;
    r.z = zw * lse * lse;
    r.loss = ce + r.z;
    const float two_z_lse = 2.0f * zw * lse;
    r.p.coef = g * (1.0f + two_z_lse);
    r.p.smooth = g * eps / float(V);
    // d_y = p_y (1 + 2 z lse) - (1 - eps) - eps/V, written with p_y - 1 = -sum_excl / d and the
    // z term kept apart, so nothing cancels when p_y -> 1 or when 2 z lse is tiny
    const float p_y = e_y / d;
    r.p.d_target = g * ((p_y * two_z_lse - st.sum_excl / d) + eps - eps / float(V));
    return r;
}

// The loss gradient a row's dlogits are scaled by: grad_output, over the valid rows for mean.
__device__ __forceinline__ float grad_scale(float g, Reduction red, int n_valid) {
    if (red == Reduction::mean) return n_valid > 0 ? g / float(n_valid) : 0.0f;
    return g;
}
__device__ __forceinline__ float row_grad_scale(const float* grad_output, bool per_row, int64_t row,
                                                Reduction red, int n_valid) {
    return grad_scale(grad_output[per_row ? row : 0], red, n_valid);
}

// p_j = 2^((x_j - max) log2 e - log2 d): the subtraction first (exact-ish, keeps the argument's
// error proportional to |x_j - lse|), then one FFMA into the special-function unit.
__device__ __forceinline__ float grad_of(float x, const RowGradParams& p) {
    return p.coef * exp2_ftz(fmaf(x - p.max, kLog2e, -p.log2_d)) - p.smooth;
}

// One value's dlogit: 0 on ignored rows, the precomputed d_target at the target.
__device__ __forceinline__ float grad_value(float x, bool is_target, bool valid,
                                            const RowGradParams& p) {
    return !valid ? 0.0f : (is_target ? p.d_target : grad_of(x, p));
}

// ---------------------------------------------------------------- small kernels

__global__ void count_valid_kernel(int* n_valid, const int32_t* targets, int64_t N,
                                   int64_t ignore_index) {
    __shared__ int partial[32];
    int c = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) c += targets[i] != ignore_index;
    for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < int(blockDim.x + 31) / 32; w++) t += partial[w];
        *n_valid = t;
    }
}

__global__ void merge_stats_kernel(RowStatsF* acc, const RowStatsF* shard, int64_t N) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < N) acc[i] = merge_stats(acc[i], shard[i]);
}

struct FinalizeArgs {
    const RowStatsF* stats;
    const int32_t* targets;
    const int* n_valid;
    const float* grad_output;
    bool per_row;
    int64_t N, V, ignore_index;
    float eps, zw;
    Reduction red;
    RowGradParams* params;
    float *loss_rows, *ce_rows, *z_rows, *lse_rows;
};

__global__ void finalize_kernel(FinalizeArgs f) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= f.N) return;
    const int32_t y = f.targets[i];
    const bool valid = y != f.ignore_index;
    const float g = row_grad_scale(f.grad_output, f.per_row, i, f.red, *f.n_valid);
    const RowResult r = finalize_row(f.stats[i], y, valid, g, f.V, f.eps, f.zw);
    f.params[i] = r.p;
    if (f.loss_rows) f.loss_rows[i] = r.loss;
    if (f.ce_rows) f.ce_rows[i] = r.ce;
    if (f.z_rows) f.z_rows[i] = r.z;
    if (f.lse_rows) f.lse_rows[i] = r.lse;
}

// One block, fixed order, double accumulation: a deterministic summary.
__global__ void reduce_kernel(LossSummaryF* out, const float* loss_rows, const float* ce_rows,
                              const float* z_rows, const float* lse_rows, const RowStatsF* stats,
                              const int32_t* targets, int64_t N, int64_t ignore_index,
                              const int* n_valid, Reduction red) {
    __shared__ double part[5][32];  // loss, ce, z, lse, lse^2
    __shared__ float part_max[32];
    double a[5] = {0, 0, 0, 0, 0};
    float mx = kNegInf;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        if (targets[i] != ignore_index) {
            a[0] += loss_rows[i];
            a[1] += ce_rows[i];
            a[2] += z_rows[i];
            a[3] += lse_rows[i];
            a[4] += double(lse_rows[i]) * lse_rows[i];
        }
        mx = fmaxf(mx, stats[i].max);
    }
    for (int off = 16; off > 0; off >>= 1) {
        for (int k = 0; k < 5; k++) a[k] += __shfl_xor_sync(0xffffffffu, a[k], off);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        for (int k = 0; k < 5; k++) part[k][warp] = a[k];
        part_max[warp] = mx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t[5] = {0, 0, 0, 0, 0};
        float m = kNegInf;
        for (int w = 0; w < int(blockDim.x + 31) / 32; w++) {
            for (int k = 0; k < 5; k++) t[k] += part[k][w];
            m = fmaxf(m, part_max[w]);
        }
        const int n = *n_valid;
        LossSummaryF s;
        s.sum_loss = float(t[0]);
        s.sum_ce = float(t[1]);
        s.sum_z_loss = float(t[2]);
        s.sum_lse = float(t[3]);
        s.sum_lse_sq = float(t[4]);
        s.max_logit = m;
        s.n_valid = n;
        s.loss = red == Reduction::mean ? (n > 0 ? float(t[0] / n) : 0.0f) : float(t[0]);
        *out = s;
    }
}

// ---------------------------------------------------------------- online: stats, then backward

// kVec: rows start 16-byte aligned, so whole chunks are read with one instruction; the tail
// (V_local not a multiple of the chunk) is read one value at a time.
// dlogits of one 16-byte chunk whose target index is t (outside [0, K): not in this chunk); the
// per-value target test only in the chunk that holds it
template <int K>
__device__ __forceinline__ void grad_chunk_fast(float (&v)[K], int t, bool valid,
                                                const RowGradParams& p) {
    if (!valid) {
#pragma unroll
        for (int k = 0; k < K; k++) v[k] = 0.0f;
    } else if (t >= 0 && t < K) {
#pragma unroll
        for (int k = 0; k < K; k++) v[k] = k == t ? p.d_target : grad_of(v[k], p);
    } else {
#pragma unroll
        for (int k = 0; k < K; k++) v[k] = grad_of(v[k], p);
    }
}

// The per-row bodies shared by the block-per-row and the warp-per-row kernels: this thread takes
// chunks first, first + step, ... of the row (then the same for the tail values).
template <typename T, bool kVec>
__device__ __forceinline__ RowStatsF row_stats_part(const T* x, int64_t V_local, int64_t y_local,
                                                    bool smooth, int first, int step) {
    constexpr int K = kChunk<T>;
    RowStatsF st = empty_stats();
    const int nv = kVec ? int(V_local / K) : 0;  // a row shard is < 2^31 columns
#pragma unroll 2
    for (int c = first; c < nv; c += step) {
        float v[K];
        load_chunk(x + int64_t(c) * K, v);
        stats_chunk_fast(st, v, int64_t(c) * K, y_local, smooth);
    }
    for (int64_t j = int64_t(nv) * K + first; j < V_local; j += step)
        stats_add(st, to_f(x[j]), j == y_local);
    return st;
}

template <typename T, bool kVec>
__device__ __forceinline__ void row_backward_part(T* dx, const T* x, int64_t V_local,
                                                  int64_t y_local, bool valid,
                                                  const RowGradParams& p, int first, int step) {
    constexpr int K = kChunk<T>;
    const int nv = kVec ? int(V_local / K) : 0;
#pragma unroll 2
    for (int c = first; c < nv; c += step) {
        float v[K];
        load_chunk(x + int64_t(c) * K, v);
        const int64_t t = y_local - int64_t(c) * K;  // 64-bit: shard offsets can be large
        grad_chunk_fast(v, t >= 0 && t < K ? int(t) : -1, valid, p);
        store_chunk(dx + int64_t(c) * K, v);
    }
    for (int64_t j = int64_t(nv) * K + first; j < V_local; j += step)
        dx[j] = from_f<T>(grad_value(to_f(x[j]), j == y_local, valid, p));
}

template <typename T, bool kVec>
__global__ void shard_stats_kernel(RowStatsF* stats, const T* logits, int64_t ld,
                                   const int32_t* targets, int64_t V_local, int64_t v0,
                                   int64_t ignore_index, bool smooth, bool accumulate) {
    const int64_t row = blockIdx.x;
    const int64_t y = targets[row];
    const int64_t y_local = (y != ignore_index && y >= v0 && y < v0 + V_local) ? y - v0 : -1;
    RowStatsF st = row_stats_part<T, kVec>(logits + row * ld, V_local, y_local, smooth,
                                           int(threadIdx.x), int(blockDim.x));
    st = block_reduce_stats(st);
    if (threadIdx.x == 0) stats[row] = accumulate ? merge_stats(stats[row], st) : st;
}

template <typename T, bool kVec>
__global__ void shard_backward_kernel(T* dlogits, const T* logits, int64_t ld,
                                      const int32_t* targets, const RowGradParams* params,
                                      int64_t V_local, int64_t v0, int64_t ignore_index) {
    const int64_t row = blockIdx.x;
    const int64_t y = targets[row];
    const bool valid = y != ignore_index;
    row_backward_part<T, kVec>(dlogits + row * ld, logits + row * ld, V_local, valid ? y - v0 : -1,
                               valid, params[row], int(threadIdx.x), int(blockDim.x));
}

// Narrow shards (a fused-linear vocabulary chunk, a small vocabulary): one warp per row, eight
// rows per block, so a 3 KB row does not occupy a whole block.
constexpr int kNarrowMax = 8192;  // V_local up to this uses the warp-per-row kernels
constexpr int kRowsPerBlock = 8;

template <typename T, bool kVec>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    narrow_stats_kernel(RowStatsF* stats, const T* logits, int64_t ld, const int32_t* targets,
                        int64_t N, int64_t V_local, int64_t v0, int64_t ignore_index, bool smooth,
                        bool accumulate) {
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= N) return;  // whole warps leave together
    const int64_t y = targets[row];
    const int64_t y_local = (y != ignore_index && y >= v0 && y < v0 + V_local) ? y - v0 : -1;
    RowStatsF st = row_stats_part<T, kVec>(logits + row * ld, V_local, y_local, smooth, lane, 32);
    st = warp_merge_stats(st);
    if (lane == 0) stats[row] = accumulate ? merge_stats(stats[row], st) : st;
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    narrow_backward_kernel(T* dlogits, const T* logits, int64_t ld, const int32_t* targets,
                           const RowGradParams* params, int64_t N, int64_t V_local, int64_t v0,
                           int64_t ignore_index) {
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= N) return;
    const int64_t y = targets[row];
    const bool valid = y != ignore_index;
    row_backward_part<T, kVec>(dlogits + row * ld, logits + row * ld, V_local, valid ? y - v0 : -1,
                               valid, params[row], lane, 32);
}

// ---------------------------------------------------------------- naive: the textbook pipeline

template <typename T>
__global__ void naive_row_max_kernel(float* row_max, const T* logits, int64_t ld, int64_t V) {
    __shared__ float red[32];
    const T* x = logits + int64_t(blockIdx.x) * ld;
    float m = kNegInf;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_f(x[j]));
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x) / 32; w++) m = fmaxf(m, red[w]);
        row_max[blockIdx.x] = fmaxf(m, red[0]);
    }
}

// probs = exp(x - max) (unnormalised, fp32, materialised); stats from them
template <typename T>
__global__ void naive_exp_kernel(float* probs, RowStatsF* stats, const float* row_max,
                                 const T* logits, int64_t ld, const int32_t* targets, int64_t V,
                                 int64_t ignore_index) {
    const int64_t row = blockIdx.x;
    const T* x = logits + row * ld;
    float* p = probs + row * V;
    const float m = row_max[row];
    const int64_t y = targets[row];
    RowStatsF st = {m, 0.0f, 0.0f, 0.0f};
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = to_f(x[j]);
        const float e = v == kNegInf ? 0.0f : __expf(v - m);
        p[j] = e;
        st.sum_logits += v;
        if (j == y && y != ignore_index)
            st.target_logit = v;
        else
            st.sum_excl += e;
    }
    st = block_reduce_stats(st);  // all partial maxima equal m: a plain sum
    if (threadIdx.x == 0) stats[row] = st;
}

template <typename T>
__global__ void naive_grad_kernel(T* dlogits, const float* probs, int64_t ld,
                                  const int32_t* targets, const RowGradParams* params, int64_t V,
                                  int64_t ignore_index) {
    const int64_t row = blockIdx.x;
    const float* p = probs + row * V;
    T* dx = dlogits + row * ld;
    const int64_t y = targets[row];
    const RowGradParams g = params[row];
    const float inv_d = exp2f(-g.log2_d);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float d = 0.0f;
        if (y != ignore_index) d = j == y ? g.d_target : g.coef * p[j] * inv_d - g.smooth;
        dx[j] = from_f<T>(d);
    }
}

// ---------------------------------------------------------------- fast: one read, one write

constexpr int kFastThreads = 512;
constexpr int kMaxCluster = 8;
constexpr int kMaxStages = 8;
constexpr int kMinStages = 3;

// sm_90 primitives of the fast kernel: bulk (TMA) copies completing on an mbarrier, and the
// cluster barrier split into its arrive and wait halves.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arms `bar` for `bytes` and starts one bulk copy global -> shared that completes it.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}
// The loop that waits for the phase of `parity` (%1) of the mbarrier at %0; `sem` is the wait's
// memory-order qualifier ("": acquire at CTA scope, the default).
#define ZG_MBAR_WAIT_LOOP(sem)           \
    "{\n.reg .pred done;\nWAIT:\n"       \
    "mbarrier.try_wait.parity" sem       \
    ".shared::cta.b64 done, [%0], %1;\n" \
    "@!done bra WAIT;\n}\n"
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    asm volatile(ZG_MBAR_WAIT_LOOP("")::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The pingpong kernel's: an mbarrier that completes after `count` arrivals, arrivals on another
// CTA's mbarrier, waits that see what the arriving CTAs wrote, and the warp groups' own barriers.
__device__ __forceinline__ void mbar_init_count(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
                 : "memory");
}
// Arrives on the mbarrier at `bar`'s place in CTA `rank` of the cluster. Release at cluster scope:
// the caller's earlier stores (into that CTA's shared memory too) are seen by its waiters.
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, unsigned rank) {
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(
            smem_addr(bar)),
        "r"(rank)
        : "memory");
}
// mbar_wait with acquire at cluster scope: the arrivals came from other CTAs.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, unsigned parity) {
    asm volatile(ZG_MBAR_WAIT_LOOP(".acquire.cluster")::"r"(smem_addr(bar)), "r"(parity)
                 : "memory");
}
// A barrier of `threads` threads (whole warps) on hardware barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void group_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

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
    int64_t ld, V, N;
    int64_t row0;   // the first row (fast_pingpong_kernel: rows [row0, N))
    int64_t slice;  // columns per CTA (a multiple of the 16-byte chunk)
    int stages;     // row buffers per CTA
    const int32_t* targets;
    const int* n_valid;
    const float* grad_output;
    bool per_row;
    int64_t ignore_index;
    float eps, zw;
    Reduction red;
    float *loss_rows, *ce_rows, *z_rows, *lse_rows;
    RowStatsF* stats;  // the merged stats, for the summary's max logit
    long long* trace;  // fast_pingpong_kernel<..., kTrace>: N x cluster x kTracePoints clocks
};

// The per-row outputs of the fused kernel (written once per row).
__device__ __forceinline__ void write_row_outputs(const FastArgs& a, int64_t row,
                                                  const RowResult& r, const RowStatsF& st) {
    if (a.loss_rows) a.loss_rows[row] = r.loss;
    if (a.ce_rows) a.ce_rows[row] = r.ce;
    if (a.z_rows) a.z_rows[row] = r.z;
    if (a.lse_rows) a.lse_rows[row] = r.lse;
    a.stats[row] = st;
}

struct NoWait {
    __device__ void operator()(int) const {}
};

// This thread's statistics of a CTA's slice of n values held in shared memory: `nv` whole chunks
// plus a tail of < one chunk (its padding columns are never used). Two cheap passes over shared
// memory: a packed max, then branch-free sums against it (no serial rescaling chain). Thread `tid`
// of the kThreads that share the slice takes chunks tid, tid + kThreads, ... The slice may arrive
// in kParts parts of `part_chunks` chunks: wait_part(p) returns once part p has landed, and the
// max pass over part p starts while the later parts are still in flight.
template <typename T, int kThreads, int kParts = 1, typename WaitPart = NoWait>
__device__ __forceinline__ RowStatsF slice_stats(const T* buf, int nv, int n, int y_local,
                                                 bool smooth, int tid, int part_chunks = 0,
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
            if (c == target_chunk) {  // exclude the target from the sum
#pragma unroll
                for (int k = 0; k < K; k++) {
                    if (c * K + k == y_local)
                        st.target_logit = v[k];
                    else
                        s0 += exp_ftz(v[k] - st.max);
                }
            } else {
#pragma unroll
                for (int k = 0; k < K; k += 2) {
                    s0 += exp_ftz(v[k] - st.max);
                    s1 += exp_ftz(v[k + 1] - st.max);
                }
            }
            if (smooth) {
#pragma unroll
                for (int k = 0; k < K; k++) sx += v[k];
            }
        }
        st.sum_excl = s0 + s1;
        st.sum_logits = sx;
    }
    for (int j = nv * K + tid; j < n; j += kThreads) stats_add(st, to_f(buf[j]), j == y_local);
    return st;
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
    const int64_t rest = a.V - c0;
    const int n = int(rest <= 0 ? 0 : (rest < a.slice ? rest : a.slice));
    const int nv = n / K;  // whole chunks; the last CTA may have a tail of < K values
    // The bulk copy takes the tail's whole chunk too: rows are [N, ld] with ld a multiple of the
    // chunk (plan_fast needs 16-byte aligned rows), so the chunk is inside the buffer. Reading
    // the tail from global memory instead put a load round trip per row on the last CTA's
    // critical path, in both passes (the trainer's V = 50257 has a tail of one value).
    const unsigned bytes = unsigned((n + K - 1) / K) * 16u;
    const T* const logits = static_cast<const T*>(a.logits) + c0;
    T* const dlogits = static_cast<T*>(a.dlogits) + c0;
    const bool smooth = a.eps != 0.0f;
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
    const int n_valid = *a.n_valid;
    int prev_y_local = -1;
    bool prev_valid = false;
    int64_t it = 0;
    for (int64_t row = first_row; row < a.N; row += row_step, it++) {
        const int32_t y = a.targets[row];
        const float g = a.grad_output[a.per_row ? row : 0];
        if (bytes > 0) mbar_wait(&full[it % S], unsigned(it / S) & 1u);
        const bool valid = y != a.ignore_index;
        const int y_local = valid && y >= c0 && y < c0 + n ? int(y - c0) : -1;
        RowStatsF st = slice_stats<T, kThreads>(buffer(it), nv, n, y_local, smooth, threadIdx.x);
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
                finalize_row(all, y, valid, grad_scale(g, a.red, n_valid), a.V, a.eps, a.zw);
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
// kTrace: thread 0 of each group records clock64() at five points of every row
// (ZGPT_CE_FAST_TRACE=1 prints where a row's time goes); the other kernels compile none of it.
constexpr int kTracePoints = 5;

template <typename T, int kGroupThreads, int kGroupCount, int kParts, bool kTrace>
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
    const int64_t rest = a.V - c0;
    const int n = int(rest <= 0 ? 0 : (rest < a.slice ? rest : a.slice));
    const int nv = n / K;
    // the copy takes the tail's whole chunk too (fast_lockstep_kernel), in parts of part_chunks
    const int chunks = (n + K - 1) / K;
    const int part_chunks = part_size(chunks, kParts);
    auto copy_lo = [&](int p) { return min(chunks, p * part_chunks); };  // p <= kParts
    const T* const logits = static_cast<const T*>(a.logits) + c0;
    T* const dlogits = static_cast<T*>(a.dlogits) + c0;
    const bool smooth = a.eps != 0.0f;
    const int S = a.stages;
    auto buffer = [&](int64_t it) { return reinterpret_cast<T*>(smem_raw) + (it % S) * a.slice; };
    auto load_part = [&](int64_t it, int p) {
        const int64_t row = first_row + it * row_step;
        const int lo = copy_lo(p), hi = copy_lo(p + 1);
        if (row < a.N && hi > lo)
            bulk_load(buffer(it) + lo * K, logits + row * a.ld + lo * K, unsigned(hi - lo) * 16u,
                      &full[it % S][p]);
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

    const int n_valid = *a.n_valid;
    for (int64_t it = group;; it += kGroupCount) {
        const int64_t row = first_row + it * row_step;
        if (row >= a.N) break;
        long long t[kTracePoints] = {};
        if constexpr (kTrace) t[0] = clock64();
        const int32_t y = a.targets[row];
        const float g = a.grad_output[a.per_row ? row : 0];
        const bool valid = y != a.ignore_index;
        const int y_local = valid && y >= c0 && y < c0 + n ? int(y - c0) : -1;
        const T* buf = buffer(it);
        auto wait_part = [&](int p) {
            if (copy_lo(p + 1) > copy_lo(p)) {
                ::cuda::atomic_ref<int, ::cuda::thread_scope_block> started(
                    copy_started[it % S][p]);
                while (started.load(::cuda::memory_order_acquire) != int(it)) {
                }
                mbar_wait(&full[it % S][p], unsigned(it / S) & 1u);
            }
            if constexpr (kTrace)
                if (p == 0) t[1] = clock64();
        };
        RowStatsF st = slice_stats<T, kGroupThreads, kParts>(buf, nv, n, y_local, smooth, tid,
                                                             part_chunks, wait_part);
        // the group's statistics in every thread: each warp merges its lanes, then every warp the
        // group's partials, with the same tree (the barrier after the dlogits pass separates the
        // group's writes of warp_vals from its reads of them)
        st = warp_merge_stats(st);
        if (lane == 0) warp_vals[group][warp] = st;
        group_sync(1 + group, kGroupThreads);
        if constexpr (kTrace) t[2] = clock64();
        st = warp_merge_stats<kWarps>(warp_vals[group][lane % kWarps]);
        const int slot = int(it % kStatSlots);
        if (warp == 0 && lane < csize) {  // lane r hands this CTA's statistics to CTA r
            *cluster.map_shared_rank(&cluster_vals[slot][rank], lane) = st;
            mbar_arrive_remote(&stats_ready[slot], unsigned(lane));
        }
        mbar_wait_cluster(&stats_ready[slot], unsigned(it / kStatSlots) & 1u);
        if constexpr (kTrace) t[3] = clock64();
        const int r = lane % kMaxCluster;
        const RowStatsF all =
            warp_merge_stats<kMaxCluster>(r < csize ? cluster_vals[slot][r] : empty_stats());
        const RowResult res =
            finalize_row(all, y, valid, grad_scale(g, a.red, n_valid), a.V, a.eps, a.zw);
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

size_t type_size(LogitsType t) {
    return t == LogitsType::bf16 ? 2 : 4;
}

// Whole 16-byte chunks are possible when every row of both buffers starts 16-byte aligned.
bool rows_aligned(const void* a, const void* b, int64_t ld, LogitsType t) {
    return reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
           (ld * int64_t(type_size(t))) % 16 == 0;
}

int num_threads_for(int64_t V) {
    return V >= 4096 ? 512 : V >= 512 ? 256 : 64;
}

void check_args(const CrossEntropyArgs& a, const CrossEntropyOptions& o, bool full_row) {
    validate(o);
    ZG_CHECK(a.logits && a.targets && a.grad_output,
             "cross_entropy: logits, targets and grad_output are required");
    ZG_CHECK(a.N > 0 && a.V_local > 0 && a.ld >= a.V_local && a.V >= a.v0 + a.V_local && a.v0 >= 0,
             "cross_entropy: inconsistent sizes");
    ZG_CHECK(a.N <= INT32_MAX, "cross_entropy: N must fit a grid dimension");
    if (full_row)
        ZG_CHECK(a.v0 == 0 && a.V_local == a.V,
                 "this variant needs whole rows (v0 = 0, V_local = V); use the shard API");
}

template <typename F>
void dispatch(LogitsType t, F&& f) {
    if (t == LogitsType::bf16)
        f(__nv_bfloat16{});
    else
        f(float{});
}

// Workspace layout shared by the variants: what the caller did not provide lives here.
struct Workspace {
    int* n_valid;
    RowStatsF* stats;
    RowGradParams* params;
    float *loss, *ce, *z, *lse;
    float* row_max;  // naive
    float* probs;    // naive
};

// The layout of every variant's workspace; on a measuring layout (null base) it gives the size.
Workspace carve(WorkspaceLayout& l, int64_t N, int64_t V, bool naive) {
    Workspace ws;
    ws.n_valid = l.take<int>(1);
    ws.stats = l.take<RowStatsF>(N);
    ws.params = l.take<RowGradParams>(N);
    ws.loss = l.take<float>(N);
    ws.ce = l.take<float>(N);
    ws.z = l.take<float>(N);
    ws.lse = l.take<float>(N);
    ws.row_max = l.take<float>(N);
    ws.probs = naive ? l.take<float>(size_t(N) * V) : nullptr;
    return ws;
}

Workspace carve(void* w, int64_t N, int64_t V, bool naive) {
    WorkspaceLayout l(w);
    return carve(l, N, V, naive);
}

// The args with row outputs pointing into the workspace where the caller gave none.
CrossEntropyArgs with_rows(CrossEntropyArgs a, const Workspace& ws) {
    if (!a.loss_rows) a.loss_rows = ws.loss;
    if (!a.ce_rows) a.ce_rows = ws.ce;
    if (!a.z_rows) a.z_rows = ws.z;
    if (!a.lse_rows) a.lse_rows = ws.lse;
    if (!a.dlogits) a.dlogits = const_cast<void*>(a.logits);
    return a;
}

size_t workspace_size(int64_t N, int64_t V, bool naive) {
    WorkspaceLayout l(nullptr);
    carve(l, N, V, naive);
    return l.bytes();
}
size_t ws_online(int64_t N, int64_t V, LogitsType) {
    return workspace_size(N, V, false);
}
size_t ws_naive(int64_t N, int64_t V, LogitsType) {
    return workspace_size(N, V, true);
}

void run_online(const CrossEntropyArgs& a0, const CrossEntropyOptions& o, void* w, CUstream_st* s) {
    check_args(a0, o, true);
    const Workspace ws = carve(w, a0.N, a0.V, false);
    const CrossEntropyArgs a = with_rows(a0, ws);
    ce_count_valid(ws.n_valid, a.targets, a.N, o.ignore_index, s);
    ce_shard_stats(ws.stats, a, o, s);
    ce_finalize(ws.params, ws.stats, ws.n_valid, a, o, s);
    ce_shard_backward(a, ws.params, o, s);
    ce_reduce(a, ws.stats, ws.n_valid, o, s);
}

void run_naive(const CrossEntropyArgs& a0, const CrossEntropyOptions& o, void* w, CUstream_st* s) {
    check_args(a0, o, true);
    const Workspace ws = carve(w, a0.N, a0.V, true);
    const CrossEntropyArgs a = with_rows(a0, ws);
    ce_count_valid(ws.n_valid, a.targets, a.N, o.ignore_index, s);
    const int threads = num_threads_for(a.V);
    dispatch(a.type, [&](auto tag) {
        using T = decltype(tag);
        const T* x = static_cast<const T*>(a.logits);
        naive_row_max_kernel<T><<<unsigned(a.N), threads, 0, s>>>(ws.row_max, x, a.ld, a.V);
        naive_exp_kernel<T><<<unsigned(a.N), threads, 0, s>>>(ws.probs, ws.stats, ws.row_max, x,
                                                              a.ld, a.targets, a.V, o.ignore_index);
        ZG_CUDA_CHECK(cudaGetLastError());
        ce_finalize(ws.params, ws.stats, ws.n_valid, a, o, s);
        naive_grad_kernel<T><<<unsigned(a.N), threads, 0, s>>>(
            static_cast<T*>(a.dlogits), ws.probs, a.ld, a.targets, ws.params, a.V, o.ignore_index);
    });
    ZG_CUDA_CHECK(cudaGetLastError());
    ce_reduce(a, ws.stats, ws.n_valid, o, s);
}

// The fast kernel's shape. Each CTA keeps `stages` slices of rows in shared memory; the plan
// takes the fewest CTAs per cluster (<= 8) whose slices fit the wanted number of stages in the
// budget (else 2), so that rows stream in while one is worked on. As many persistent clusters are
// launched as fit on the GPU at once.
struct FastPlan {
    int cluster = 0;  // 0: not possible (unaligned rows or rows too long): use online
    int threads = kFastThreads;
    bool pingpong = false;  // fast_pingpong_kernel (threads: all of its groups)
    int groups = 1;         // warp groups per CTA
    int parts = 1;          // bulk copies per buffer
    int stages = 0;
    int64_t slice = 0;
    size_t smem = 0;
};

int env_int(const char* name) {
    const char* e = std::getenv(name);
    return e ? std::atoi(e) : 0;
}

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
int sm_count() {
    static const int v = device_attribute(cudaDevAttrMultiProcessorCount);
    return v;
}

FastPlan plan_fast(const CrossEntropyArgs& a, bool pingpong) {
    const int max_smem = max_smem_optin();
    if (!rows_aligned(a.logits, a.dlogits ? a.dlogits : a.logits, a.ld, a.type)) return {};
    const size_t es = type_size(a.type);
    // Measured on an H100 (docs/cross_entropy.md). Warp groups (fast): one CTA per SM with a
    // buffer per group, in the smallest cluster that holds them (more stages with more CTAs per
    // cluster were slower: fewer clusters fit at once); groups of 512 threads for rows of up to
    // 128 KB (0.639 against 0.651 ms at V = 50304), of 256 above. One group
    // (fast_lockstep): rows of up to 128 KB run best as two 256-thread CTAs per SM with two stages
    // each; longer rows as one 512-thread CTA per SM holding three. Static shared memory (barriers,
    // statistics, reductions) takes < 2 KB.
    const bool short_rows = size_t(a.V) * es <= (size_t(128) << 10);
    // fast: each buffer in two copies, so a group refills the first half while its dlogits pass
    // is on the second. Rows of up to 128 KB: two groups of 512 threads (0.634 against 0.642 ms
    // at V = 50304 with one copy); longer rows: three groups of 256 in 4-CTA clusters (6.20
    // against 6.40 ms for two groups at V = 128256). Four copies measured no better.
    int groups = pingpong ? (short_rows ? 2 : 3) : 1;
    int parts = pingpong ? 2 : 1;
    // knobs for bench_ce sweeps and tests: ZGPT_CE_FAST_GROUPS (2 | 3 warp groups),
    // ZGPT_CE_FAST_PARTS (1 | 2 | 4 copies per buffer), ZGPT_CE_FAST_THREADS (256 | 512 | 1024;
    // with two groups, 512 or 1024 in all; three groups have 768), ZGPT_CE_FAST_SMEM_KB (the
    // buffers' budget per CTA), ZGPT_CE_FAST_MIN_STAGES (the stages the cluster size is chosen
    // for), ZGPT_CE_FAST_CLUSTER (a fixed cluster size)
    if (pingpong) {
        if (const int g = env_int("ZGPT_CE_FAST_GROUPS"); g == 2 || g == 3) groups = g;
        if (const int p = env_int("ZGPT_CE_FAST_PARTS"); p == 1 || p == 2 || p == 4) parts = p;
    }
    const bool wide_groups = pingpong && groups == 2 && short_rows;
    int threads = pingpong ? groups * (wide_groups ? 512 : 256) : short_rows ? 256 : kFastThreads;
    size_t budget = pingpong || !short_rows ? size_t(max_smem) - 2048 : size_t(110) << 10;
    int want = pingpong ? groups : short_rows ? 2 : kMinStages;
    if (const int t = env_int("ZGPT_CE_FAST_THREADS"); t == 256 || t == 512 || t == 1024)
        threads = !pingpong ? t : groups == 2 ? std::max(t, 512) : threads;
    if (pingpong && threads != 512) parts = std::min(parts, 2);  // the kernels instantiated
    if (const int kb = env_int("ZGPT_CE_FAST_SMEM_KB"); kb > 0) budget = size_t(kb) << 10;
    budget = std::min(budget, size_t(max_smem) - 2048);
    if (const int m = env_int("ZGPT_CE_FAST_MIN_STAGES"); m > 0) want = m;
    const int forced = std::clamp(env_int("ZGPT_CE_FAST_CLUSTER"), 0, kMaxCluster);
    const int64_t per = 16 / int64_t(es);
    for (const int min_stages : {want, 2}) {
        for (int c = forced ? forced : 1; c <= (forced ? forced : kMaxCluster); c++) {
            int64_t slice = (a.V + c - 1) / c;
            slice = (slice + per - 1) / per * per;
            const int64_t stages =
                std::min<int64_t>(kMaxStages, int64_t(budget) / (slice * int64_t(es)));
            if (stages >= min_stages) {
                return FastPlan{c,     threads,     pingpong, groups,
                                parts, int(stages), slice,    size_t(stages) * size_t(slice) * es};
            }
        }
    }
    return {};
}

// The helper of a `fast` launch whose clusters leave SMs idle. Clusters live inside one GPC, and
// on the H100 (132 SMs) at most 30 clusters of 4 one-CTA-per-SM CTAs fit at once: 120 SMs, while
// 66 clusters of 2 take all 132 (measured, docs/cross_entropy.md). The helper is one warp group
// of 512 threads per CTA in 2-CTA clusters, one buffer of half a row each (so rows of up to two
// CTAs' shared memory), launched after the main grid onto the SMs it left idle.
FastPlan plan_fast_helper(const CrossEntropyArgs& a, const FastPlan& main) {
    const int max_smem = max_smem_optin();
    constexpr int kCluster = 2;
    // only behind a grid of one CTA per SM, whose idle SMs are then whole
    if (!main.pingpong || main.cluster <= kCluster || 2 * main.smem <= size_t(max_smem)) return {};
    const size_t es = type_size(a.type);
    const int64_t per = 16 / int64_t(es);
    const int64_t slice = ((a.V + kCluster - 1) / kCluster + per - 1) / per * per;
    const size_t budget = size_t(max_smem) - 2048;
    const int64_t stages = std::min<int64_t>(kMaxStages, int64_t(budget) / (slice * int64_t(es)));
    if (stages < 1) return {};
    // one copy per buffer: with two or four, the main grid slowed more than the helper gained
    // (V = 128256 on the H100: two copies 7.13-7.48 ms at weights 40-55, one 6.11-6.13)
    int parts = 1;
    if (const int p = env_int("ZGPT_CE_FAST_HELPER_PARTS"); p == 1 || p == 2 || p == 4) parts = p;
    return FastPlan{kCluster, 512,         true,  1,
                    parts,    int(stages), slice, size_t(stages) * size_t(slice) * es};
}

using FastKernel = void (*)(FastArgs);

// The instantiated kernels: the helper's one 512-thread group with 1, 2 or 4 parts; two
// 256-thread groups with 1, 2 or 4; 1 or 2 otherwise (plan_fast never asks for more).
template <typename T, bool kTrace>
FastKernel pingpong_kernel(const FastPlan& p) {
    if (p.groups == 1)  // the helper (plan_fast_helper)
        return p.parts == 1   ? fast_pingpong_kernel<T, 512, 1, 1, false>
               : p.parts == 2 ? fast_pingpong_kernel<T, 512, 1, 2, false>
                              : fast_pingpong_kernel<T, 512, 1, 4, false>;
    if (p.groups == 3)
        return p.parts == 1 ? fast_pingpong_kernel<T, 256, 3, 1, kTrace>
                            : fast_pingpong_kernel<T, 256, 3, 2, kTrace>;
    if (p.threads == 1024)
        return p.parts == 1 ? fast_pingpong_kernel<T, 512, 2, 1, kTrace>
                            : fast_pingpong_kernel<T, 512, 2, 2, kTrace>;
    return p.parts == 1   ? fast_pingpong_kernel<T, 256, 2, 1, kTrace>
           : p.parts == 2 ? fast_pingpong_kernel<T, 256, 2, 2, kTrace>
                          : fast_pingpong_kernel<T, 256, 2, 4, kTrace>;
}

// ZGPT_CE_FAST_TRACE=1 (bf16 logits, `fast`, outside graph capture): runs the kernel that records
// clock64() at five points of each row, waits for it and prints to stderr where the rows' time
// went, as mean cycles per row and CTA. A diagnostic: it synchronises the stream.
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
    double phase[kTracePoints] = {};  // wait for the copy, statistics, exchange, dlogits, period
    int64_t rows = 0, periods = 0;
    for (int64_t row = 0; row < N; row++) {
        for (int r = 0; r < cluster; r++) {
            const long long* x = &t[size_t((row * cluster + r) * kTracePoints)];
            for (int k = 0; k + 1 < kTracePoints; k++) phase[k] += double(x[k + 1] - x[k]);
            rows++;
            const int64_t next = row + groups * row_step;  // the same group's next row
            if (next < N) {
                phase[kTracePoints - 1] +=
                    double(t[size_t((next * cluster + r) * kTracePoints)] - x[0]);
                periods++;
            }
        }
    }
    std::fprintf(stderr,
                 "fast trace (cycles per row and CTA, %d groups, cluster %d): copy wait %.0f, "
                 "statistics %.0f, cluster exchange %.0f, dlogits + refills %.0f; a group's "
                 "period %.0f (%.0f per row)\n",
                 groups, cluster, phase[0] / rows, phase[1] / rows, phase[2] / rows,
                 phase[3] / rows, periods ? phase[4] / periods : 0.0,
                 periods ? phase[4] / periods / groups : 0.0);
}

// The helper's rows per SM against the main grid's, in percent. Swept on the H100 at V = 128256
// (docs/cross_entropy.md): 0 (no helper) 6.18 ms, 50 6.11, 60 6.09, 75 6.06-6.08, 90 6.45 (the
// helper's rows now the tail), 110 7.45. 70 leaves a margin before that cliff.
constexpr int kHelperWeight = 70;

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
    const FastPlan plan = plan_fast(a, pingpong);
    if (plan.cluster == 0) {  // rows unaligned or too long for the cluster's shared memory
        run_online(a0, o, w, s);
        return;
    }
    ce_count_valid(ws.n_valid, a.targets, a.N, o.ignore_index, s);
    FastArgs f{a.logits,
               a.dlogits,
               a.ld,
               a.V,
               a.N,
               0,
               plan.slice,
               plan.stages,
               a.targets,
               ws.n_valid,
               a.grad_output,
               o.reduction == Reduction::none,
               o.ignore_index,
               float(o.label_smoothing),
               float(o.z_loss_weight),
               o.reduction,
               a.loss_rows,
               a.ce_rows,
               a.z_rows,
               a.lse_rows,
               ws.stats,
               nullptr};
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
                trace = env_int("ZGPT_CE_FAST_TRACE") != 0;
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
        // their measured rate per SM against the main grid's (kHelperWeight).
        const FastPlan help = plan_fast_helper(a, plan);
        FastKernel help_kernel = nullptr;
        int help_clusters = 0;
        int64_t help_rows = 0;
        if (help.cluster) {
            help_kernel = pingpong_kernel<T, false>(help);
            const int idle = sm_count() - clusters * plan.cluster;
            help_clusters =
                std::clamp(idle / help.cluster, 0, max_active_clusters(help_kernel, help));
            int weight = kHelperWeight;
            if (const char* e = std::getenv("ZGPT_CE_FAST_HELPER_WEIGHT")) weight = std::atoi(e);
            const double h = double(help_clusters * help.cluster) * std::max(weight, 0) / 100.0;
            help_rows = int64_t(double(a.N) * h / (h + double(clusters * plan.cluster)));
        }
        f.N = a.N - help_rows;
        const int main_clusters = int(std::min<int64_t>(clusters, f.N));
        launch_fast(kernel, plan, f, main_clusters, false, s);
        if (help_rows > 0) {
            FastArgs h = f;
            h.row0 = f.N;
            h.N = a.N;
            h.slice = help.slice;
            h.stages = help.stages;
            h.trace = nullptr;
            launch_fast(help_kernel, help, h, int(std::min<int64_t>(help_clusters, help_rows)),
                        true, s);
        }
        if (trace) report_fast_trace(f.trace, f.N, plan.cluster, main_clusters, plan.groups, s);
    });
    ce_reduce(a, ws.stats, ws.n_valid, o, s);
}

void run_fast(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w, CUstream_st* s) {
    run_fast_schedule(a, o, w, s, true);
}
void run_fast_lockstep(const CrossEntropyArgs& a, const CrossEntropyOptions& o, void* w,
                       CUstream_st* s) {
    run_fast_schedule(a, o, w, s, false);
}

}  // namespace

// ---------------------------------------------------------------- public building blocks

void ce_count_valid(int* n_valid, const int32_t* targets, int64_t N, int64_t ignore_index,
                    CUstream_st* s) {
    count_valid_kernel<<<1, 1024, 0, s>>>(n_valid, targets, N, ignore_index);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_shard_stats(RowStatsF* stats, const CrossEntropyArgs& a, const CrossEntropyOptions& o,
                    CUstream_st* s, bool accumulate) {
    check_args(a, o, false);
    const bool vec = rows_aligned(a.logits, a.logits, a.ld, a.type);
    dispatch(a.type, [&](auto tag) {
        using T = decltype(tag);
        if (a.V_local <= kNarrowMax) {
            auto kernel = vec ? narrow_stats_kernel<T, true> : narrow_stats_kernel<T, false>;
            kernel<<<unsigned((a.N + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0,
                     s>>>(stats, static_cast<const T*>(a.logits), a.ld, a.targets, a.N, a.V_local,
                          a.v0, o.ignore_index, o.label_smoothing != 0.0, accumulate);
            return;
        }
        auto kernel = vec ? shard_stats_kernel<T, true> : shard_stats_kernel<T, false>;
        kernel<<<unsigned(a.N), num_threads_for(a.V_local), 0, s>>>(
            stats, static_cast<const T*>(a.logits), a.ld, a.targets, a.V_local, a.v0,
            o.ignore_index, o.label_smoothing != 0.0, accumulate);
    });
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_merge_stats(RowStatsF* acc, const RowStatsF* shard, int64_t N, CUstream_st* s) {
    merge_stats_kernel<<<unsigned((N + 255) / 256), 256, 0, s>>>(acc, shard, N);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_finalize(RowGradParams* params, const RowStatsF* stats, const int* n_valid,
                 const CrossEntropyArgs& a, const CrossEntropyOptions& o, CUstream_st* s) {
    validate(o);
    FinalizeArgs f{stats,
                   a.targets,
                   n_valid,
                   a.grad_output,
                   o.reduction == Reduction::none,
                   a.N,
                   a.V,
                   o.ignore_index,
                   float(o.label_smoothing),
                   float(o.z_loss_weight),
                   o.reduction,
                   params,
                   a.loss_rows,
                   a.ce_rows,
                   a.z_rows,
                   a.lse_rows};
    finalize_kernel<<<unsigned((a.N + 255) / 256), 256, 0, s>>>(f);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_shard_backward(const CrossEntropyArgs& a, const RowGradParams* params,
                       const CrossEntropyOptions& o, CUstream_st* s) {
    const void* out = a.dlogits ? a.dlogits : a.logits;
    const bool vec = rows_aligned(a.logits, out, a.ld, a.type);
    dispatch(a.type, [&](auto tag) {
        using T = decltype(tag);
        if (a.V_local <= kNarrowMax) {
            auto kernel = vec ? narrow_backward_kernel<T, true> : narrow_backward_kernel<T, false>;
            kernel<<<unsigned((a.N + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0,
                     s>>>(static_cast<T*>(const_cast<void*>(out)), static_cast<const T*>(a.logits),
                          a.ld, a.targets, params, a.N, a.V_local, a.v0, o.ignore_index);
            return;
        }
        auto kernel = vec ? shard_backward_kernel<T, true> : shard_backward_kernel<T, false>;
        kernel<<<unsigned(a.N), num_threads_for(a.V_local), 0, s>>>(
            static_cast<T*>(const_cast<void*>(out)), static_cast<const T*>(a.logits), a.ld,
            a.targets, params, a.V_local, a.v0, o.ignore_index);
    });
    ZG_CUDA_CHECK(cudaGetLastError());
}

void ce_reduce(const CrossEntropyArgs& a, const RowStatsF* stats, const int* n_valid,
               const CrossEntropyOptions& o, CUstream_st* s) {
    ZG_CHECK(a.summary && a.loss_rows && a.ce_rows && a.z_rows && a.lse_rows,
             "ce_reduce needs the per-row outputs and a summary");
    reduce_kernel<<<1, 1024, 0, s>>>(a.summary, a.loss_rows, a.ce_rows, a.z_rows, a.lse_rows, stats,
                                     a.targets, a.N, o.ignore_index, n_valid, o.reduction);
    ZG_CUDA_CHECK(cudaGetLastError());
}

const std::vector<CrossEntropyVariant>& cross_entropy_variants() {
    static const std::vector<CrossEntropyVariant> v = {
        {"naive", "textbook: row max, fp32 softmax materialised, loss, gradient (5 kernels)",
         ws_naive, run_naive},
        {"online", "two passes: online-softmax stats, then re-read and write dlogits", ws_online,
         run_online},
        {"fast",
         "one read, one write: persistent clusters hold rows in shared memory; warp groups per "
         "CTA take turns over the rows, so one's waits overlap the others' passes; a helper grid "
         "takes the last rows on the SMs the clusters leave idle",
         ws_online, run_fast},
        {"fast_lockstep",
         "fast with all of a CTA's warps on one row at a time (the cluster barrier per row)",
         ws_online, run_fast_lockstep},
    };
    return v;
}

const CrossEntropyVariant& find_cross_entropy_variant(const std::string& name) {
    std::string known;
    for (const CrossEntropyVariant& v : cross_entropy_variants()) {
        if (name == v.name) return v;
        known += (known.empty() ? "" : ", ") + std::string(v.name);
    }
    throw Error("unknown cross_entropy variant '" + name + "' (known: " + known + ")");
}

}  // namespace zgpt::cuda

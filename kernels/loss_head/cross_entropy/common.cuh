// Device stages shared by the loss head's kernels (kernels/loss_head/cross_entropy/*.cu): 16-byte
// chunk loads and stores, the online-softmax statistics and their exact merges (lane, warp, block),
// the per-row arithmetic that turns merged statistics into outputs and gradient parameters, and the
// per-value gradient. The math is kernels/loss_head/cross_entropy.h's.
//
// In an anonymous namespace, as they were in the single cross_entropy.cu: each translation unit
// keeps its own internal copies, so the kernels' code (and the names in their PTX) is unchanged.
// The small kernels (count, merge, finalize, reduce) are in launch.cu, not here: nvcc emits every
// kernel a translation unit defines, referenced or not, so a kernel here would be compiled into
// each file that includes this one.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/core/cuda_common.cuh"
#include "kernels/loss_head/cross_entropy.h"

// a translation unit may use only some of these (nvcc warns about unreferenced ones)
#pragma nv_diag_suppress 177

namespace zgpt::cuda {
namespace {

constexpr float kNegInf = -INFINITY;

// 16-byte chunks: 8 bf16 or 4 fp32 values, loaded and stored with one instruction.
template <typename T>
constexpr int kChunk = 16 / int(sizeof(T));

template <typename T>
__device__ __forceinline__ void unpack_chunk(const int4& raw, float (&v)[kChunk<T>]) {
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
__device__ __forceinline__ void load_chunk(const T* p, float (&v)[kChunk<T>]) {
    unpack_chunk<T>(*reinterpret_cast<const int4*>(p), v);
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

// A row's z-loss and loss from its cross-entropy and lse, rounded step by step (no contraction
// into an FMA): the summary recomputes them from the ce and lse rows alone, so the workspace
// need not hold the loss and z-loss rows, and gets the same bits as the rows the caller reads.
__device__ __forceinline__ float row_z_loss(float zw, float lse) {
    return __fmul_rn(__fmul_rn(zw, lse), lse);
}
__device__ __forceinline__ float row_loss(float ce, float z) {
    return __fadd_rn(ce, z);
}

// From merged statistics of a whole row: the row's outputs and its gradient parameters. Every
// product and sum is rounded on its own (the _rn intrinsics are never contracted into an FMA):
// finalize_row is inlined into several kernels, and the compiler contracts a plain a * b + c
// differently in each, which would give the one-kernel variants other bits than the building
// blocks.
__device__ RowResult finalize_row(const RowStatsF& st, int32_t y, bool valid, float g, int64_t V,
                                  float eps, float zw) {
    RowResult r;
    const float e_y = valid ? __expf(__fsub_rn(st.target_logit, st.max)) : 0.0f;
    const float d = __fadd_rn(st.sum_excl, e_y);
    const float log_d = logf(d);
    const float lse = __fadd_rn(st.max, log_d);
    r.lse = lse;
    r.p.max = st.max;
    r.p.log2_d = log2f(d);
    if (!valid) {
        r.loss = r.ce = r.z = 0.0f;
        r.p.coef = r.p.d_target = r.p.smooth = 0.0f;
        return r;
    }
    const float Vf = float(V);
    // lse - x_y = log(1 + sum_excl / e_y): accurate when the row is peaked on its target
    const float gap = __fsub_rn(st.max, st.target_logit);
    float ce = gap < 60.0f ? log1pf(__fmul_rn(st.sum_excl, __expf(gap))) : __fadd_rn(gap, log_d);
    if (eps != 0.0f)
        ce = __fadd_rn(__fmul_rn(__fsub_rn(1.0f, eps), ce),
                       __fmul_rn(eps, __fsub_rn(lse, __fdiv_rn(st.sum_logits, Vf))));
    r.ce = ce;
    r.z = row_z_loss(zw, lse);
    r.loss = row_loss(ce, r.z);
    const float two_z_lse = __fmul_rn(__fmul_rn(2.0f, zw), lse);
    r.p.coef = __fmul_rn(g, __fadd_rn(1.0f, two_z_lse));
    r.p.smooth = __fdiv_rn(__fmul_rn(g, eps), Vf);
    // d_y = p_y (1 + 2 z lse) - (1 - eps) - eps/V, written with p_y - 1 = -sum_excl / d and the
    // z term kept apart, so nothing cancels when p_y -> 1 or when 2 z lse is tiny
    const float p_y = __fdiv_rn(e_y, d);
    r.p.d_target = __fmul_rn(
        g,
        __fsub_rn(__fadd_rn(__fsub_rn(__fmul_rn(p_y, two_z_lse), __fdiv_rn(st.sum_excl, d)), eps),
                  __fdiv_rn(eps, Vf)));
    return r;
}

// The largest logit of a call as one word that atomicMax can raise: a float's bits map to an
// unsigned key in the same order (negative floats' reversed; -0 below +0). Key 0 is below every
// float's: no row yet. NaN rows are skipped, as fmaxf skips them.
__device__ __forceinline__ unsigned max_key_of(float x) {
    const unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of_max_key(unsigned k) {
    if (k == 0) return kNegInf;
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Raises *key to x's key. A row whose max is below the key read skips the atomic, so after the
// first rows few rows take it.
__device__ __forceinline__ void raise_max(unsigned* key, float x) {
    if (isnan(x)) return;
    const unsigned k = max_key_of(x);
    if (k > *reinterpret_cast<volatile unsigned*>(key)) atomicMax(key, k);
}

// The loss gradient a row's dlogits are scaled by: grad_output, over the valid rows for mean.
__device__ __forceinline__ float grad_scale(float g, Reduction red, int n_valid) {
    if (red == Reduction::mean) return n_valid > 0 ? g / float(n_valid) : 0.0f;
    return g;
}
// The summary from its sums over the valid rows (loss, ce, z-loss, lse, lse^2: double, added in
// a fixed order), the largest logit and the valid count, with the loss reduced as asked: over the
// valid rows for mean (0 when there are none), else their sum.
__device__ __forceinline__ LossSummaryF summary_from_sums(const double (&t)[5], float max_logit,
                                                          int n_valid, Reduction red) {
    LossSummaryF s;
    s.sum_loss = float(t[0]);
    s.sum_ce = float(t[1]);
    s.sum_z_loss = float(t[2]);
    s.sum_lse = float(t[3]);
    s.sum_lse_sq = float(t[4]);
    s.max_logit = max_logit;
    s.n_valid = n_valid;
    s.loss = red == Reduction::mean ? (n_valid > 0 ? float(t[0] / n_valid) : 0.0f) : float(t[0]);
    return s;
}
__device__ __forceinline__ float row_grad_scale(const float* grad_output, bool per_row, int64_t row,
                                                Reduction red, int n_valid) {
    return grad_scale(grad_output[per_row ? row : 0], red, n_valid);
}

// What finishing a row takes beyond its merged statistics, and where its outputs go (each row
// array optional): one piece for the building block ce_finalize, online's one kernel a row and
// fast's kernels.
struct RowFinish {
    const int32_t* targets;
    const int* n_valid;
    const float* grad_output;
    bool per_row;
    int64_t V, ignore_index;
    float eps, zw;
    Reduction red;
    float *loss_rows, *ce_rows, *z_rows, *lse_rows, *stat_rows;
    bool absent_targets;  // CrossEntropyArgs::absent_targets
};
inline RowFinish row_finish(const CrossEntropyArgs& a, const CrossEntropyOptions& o,
                            const int* n_valid) {
    return {a.targets,
            n_valid,
            a.grad_output,
            o.reduction == Reduction::none,
            a.V,
            o.ignore_index,
            float(o.label_smoothing),
            float(o.z_loss_weight),
            o.reduction,
            a.loss_rows,
            a.ce_rows,
            a.z_rows,
            a.lse_rows,
            a.stat_rows,
            a.absent_targets};
}

// Row `row`'s outputs, into the row arrays that are there.
__device__ __forceinline__ void write_row(const RowFinish& f, int64_t row, const RowResult& r) {
    if (f.loss_rows) f.loss_rows[row] = r.loss;
    if (f.ce_rows) f.ce_rows[row] = r.ce;
    if (f.z_rows) f.z_rows[row] = r.z;
    if (f.lse_rows) f.lse_rows[row] = r.lse;
    if (f.stat_rows) {
        f.stat_rows[2 * row] = r.p.max;
        f.stat_rows[2 * row + 1] = r.p.log2_d;
    }
}

// A row's merged statistics as finalize_row takes them. Under absent_targets a valid target
// outside [0, V) lies in another shard: its target_logit becomes -inf, so that exp(-inf) = 0 leaves
// d the whole row's sum, where the 0 the statistics carry would add exp(-max). (Its ce and loss
// are then infinite, and nothing reads them.) Every kernel that finalises rows calls it.
__device__ __forceinline__ RowStatsF row_target_stats(const RowFinish& f, RowStatsF st, int32_t y,
                                                      bool valid) {
    if (f.absent_targets && valid && (y < 0 || y >= f.V)) st.target_logit = -INFINITY;
    return st;
}

// Row `row` finished from its statistics (finalize_row with the row's target and gradient
// scale): its outputs written where `write` (by one thread of the row's), its result returned.
__device__ __forceinline__ RowResult finish_row(const RowFinish& f, int64_t row,
                                                const RowStatsF& st, bool write) {
    const int32_t y = f.targets[row];
    const bool valid = y != f.ignore_index;
    const float g = row_grad_scale(f.grad_output, f.per_row, row, f.red, *f.n_valid);
    const RowResult r =
        finalize_row(row_target_stats(f, st, y, valid), y, valid, g, f.V, f.eps, f.zw);
    if (write) write_row(f, row, r);
    return r;
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

// Calls f with a value of the logits' element type (bf16 or float), to pick a template.
template <typename F>
void dispatch(LogitsType t, F&& f) {
    if (t == LogitsType::bf16)
        f(__nv_bfloat16{});
    else
        f(float{});
}

}  // namespace
}  // namespace zgpt::cuda

#pragma nv_diag_default 177

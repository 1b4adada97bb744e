// The one-read shard pass's small kernels (kernels/loss_head/shard_one_read.h says what the pass
// is): local targets, the statistics from the pass's row outputs, the per-row factors, and the
// backward's row fixes. Each is a thin pass over N rows or N x C values; the logits themselves
// are read once, by the whole-row variant.
#include "kernels/loss_head/shard_one_read.h"

#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "kernels/core/check.h"
#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_common.cuh"
#include "kernels/core/workspace.h"
#include "kernels/loss_head/cross_entropy/common.cuh"

namespace zgpt::cuda {
namespace {

constexpr int32_t kAbsentTarget = 1 << 30;  // no row has 2^30 columns (ce_local_targets checks)

template <typename T>
__global__ void local_targets_kernel(int32_t* local, float* target_logit, const int32_t* targets,
                                     const T* logits, int64_t ld, int64_t N, int64_t v0,
                                     int64_t V_local, int64_t ignore_index) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const int64_t y = targets[i];
    float x = 0.0f;
    int32_t t = kAbsentTarget;
    if (y == ignore_index) {
        t = int32_t(y);
    } else if (y >= v0 && y < v0 + V_local) {
        t = int32_t(y - v0);
        x = to_f(logits[i * ld + t]);
    }
    local[i] = t;
    target_logit[i] = x;
}

__device__ __forceinline__ bool is_local(int32_t t, int64_t V_local) {
    return t >= 0 && t < V_local;
}

// stat_rows: each row's largest logit and log2 of sum_j exp(x_j - max) (CrossEntropyArgs).
__global__ void local_stats_kernel(RowStatsF* stats, const float* stat_rows, const float* ce_rows,
                                   const float* target_logit, const int32_t* local, int64_t N,
                                   int64_t V_local) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    RowStatsF st;
    st.max = stat_rows[2 * i];
    const float d = exp2f(stat_rows[2 * i + 1]);  // sum_j exp(x_j - max), target included
    const bool own = is_local(local[i], V_local);
    // without the target: d (1 - p_t), with 1 - p_t = -expm1(-ce) exact as p_t -> 1
    st.sum_excl = own ? d * -expm1f(-ce_rows[i]) : d;
    st.target_logit = own ? target_logit[i] : 0.0f;
    st.sum_logits = 0.0f;
    stats[i] = st;
}

__global__ void local_factors_kernel(float* a, float* c, const RowGradParams* params,
                                     const float* stat_rows, const float* ce_rows,
                                     const int32_t* local, int64_t N, int64_t V_local) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const RowGradParams p = params[i];
    // p_j / p_local_j = 2^((max_local - max) log2 e + log2 d_local - log2 d): exp(lse_local - lse)
    // from the differences, not from two rounded lse values
    const float s = (stat_rows[2 * i] - p.max) * kLog2e + (stat_rows[2 * i + 1] - p.log2_d);
    const float ai = p.coef == 0.0f ? 0.0f : p.coef * exp2f(s);
    a[i] = ai;
    // the pass wrote q_t = p_local_t - 1 = expm1(-ce_local) at the target
    c[i] = is_local(local[i], V_local) ? p.d_target - ai * expm1f(-ce_rows[i]) : 0.0f;
}

// VEC values of type T from p (4: one 8- or 16-byte word, p aligned to it) as floats, and back.
template <int VEC, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[VEC]) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "bf16 or fp32");
    if constexpr (VEC == 1) {
        v[0] = to_f(p[0]);
    } else {
        static_assert(VEC == 4, "one word of 4 values");
        using Word = std::conditional_t<sizeof(T) == 4, float4, uint2>;
        const Word u = *reinterpret_cast<const Word*>(p);
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = to_f(e[k]);
    }
}
template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[VEC]) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "bf16 or fp32");
    if constexpr (VEC == 1) {
        p[0] = from_f<T>(v[0]);
    } else {
        using Word = std::conditional_t<sizeof(T) == 4, float4, uint2>;
        Word u;
        T* e = reinterpret_cast<T*>(&u);
#pragma unroll
        for (int k = 0; k < 4; k++) e[k] = from_f<T>(v[k]);
        *reinterpret_cast<Word*>(p) = u;
    }
}

// The row kernels below take a warp a row, VEC values a lane at a time (4 where every row
// starts on a 4-value word: C a multiple of 4 and the arrays aligned), with no division per
// value.
constexpr int kRowThreads = 256, kRowsPerBlock = kRowThreads / 32;

template <typename T, int VEC>
__global__ void dh_finish_kernel(float* dh, const float* a, const float* c, const int32_t* local,
                                 const T* W, int64_t N, int64_t C, int64_t V_local) {
    const int lane = int(threadIdx.x % 32);
    for (int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; i < N;
         i += int64_t(gridDim.x) * kRowsPerBlock) {
        const float ai = a[i];
        const int32_t t = local[i];
        const bool own = is_local(t, V_local);
        const float ci = own ? c[i] : 0.0f;
        float* d = dh + i * C;
        const T* w = W + (own ? int64_t(t) * C : 0);
        for (int64_t j = int64_t(lane) * VEC; j < C; j += 32 * VEC) {
            float v[VEC], wv[VEC];
            load_vec<VEC>(d + j, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] *= ai;
            if (own) {
                load_vec<VEC>(w + j, wv);
#pragma unroll
                for (int k = 0; k < VEC; k++) v[k] = fmaf(ci, wv[k], v[k]);
            }
            store_vec<VEC>(d + j, v);
        }
    }
}

template <typename T, int VEC>
__global__ void scale_rows_kernel(T* out, const T* h, const float* a, int64_t N, int64_t C) {
    const int lane = int(threadIdx.x % 32);
    for (int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; i < N;
         i += int64_t(gridDim.x) * kRowsPerBlock) {
        const float ai = a[i];
        for (int64_t j = int64_t(lane) * VEC; j < C; j += 32 * VEC) {
            float v[VEC];
            load_vec<VEC>(h + i * C + j, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] *= ai;
            store_vec<VEC>(out + i * C + j, v);
        }
    }
}

// Whether the row kernels can take 4-value words: every row of C values starts on one.
bool rows_of_words(int64_t C, size_t es, std::initializer_list<const void*> ps) {
    if (C % 4 != 0) return false;
    for (const void* p : ps)
        if (!is_aligned(p, 4 * es)) return false;
    return true;
}

__global__ void target_keys_kernel(int32_t* keys, int32_t* rows, const int32_t* local, int64_t N,
                                   int64_t V_local) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= N) return;
    keys[i] = is_local(local[i], V_local) ? local[i] : int32_t(V_local);
    rows[i] = int32_t(i);
}

// Block s: if sorted position s starts a run of one target, that target row's sum over the run,
// in row order, into dW; each thread holds the sums of columns tid, tid + 128, ... (up to
// kTargetCols of them a pass over the run). One block takes a whole run, so a frequent target is a
// long serial loop: fine for random tokens, a tail for text where one token is a tenth of the rows
// (the embedding's backward splits such runs; this does not yet).
constexpr int kTargetThreads = 128, kTargetCols = 16;
template <typename T>
__global__ void target_rows_kernel(float* dW, const float* c, const T* h, const int32_t* keys,
                                   const int32_t* rows, int64_t N, int64_t C, int64_t V_local) {
    const int64_t s = blockIdx.x;
    const int32_t t = keys[s];
    if (t >= V_local || (s > 0 && keys[s - 1] == t)) return;
    int64_t e = s;
    while (e < N && keys[e] == t) e++;
    for (int64_t j0 = 0; j0 < C; j0 += int64_t(kTargetThreads) * kTargetCols) {
        float acc[kTargetCols] = {};
        for (int64_t r = s; r < e; r++) {
            const int64_t i = rows[r];
            const float ci = c[i];
            const T* hi = h + i * C;
#pragma unroll
            for (int k = 0; k < kTargetCols; k++) {
                const int64_t j = j0 + threadIdx.x + int64_t(k) * kTargetThreads;
                if (j < C) acc[k] = fmaf(ci, to_f(hi[j]), acc[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < kTargetCols; k++) {
            const int64_t j = j0 + threadIdx.x + int64_t(k) * kTargetThreads;
            if (j < C) dW[int64_t(t) * C + j] += acc[k];
        }
    }
}

struct SortScratch {
    int32_t *keys_in, *keys_out, *rows_in, *rows_out;
    void* temp;
    size_t temp_bytes;
};
size_t sort_temp_bytes(int64_t N) {
    size_t bytes = 0;
    ZG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int32_t*)nullptr,
                                                  (int32_t*)nullptr, (const int32_t*)nullptr,
                                                  (int32_t*)nullptr, int(N)));
    return bytes;
}
// The sort's scratch in the caller's buffer; on a measuring layout (null base) it gives the size,
// so the size and the layout are one code.
SortScratch carve_sort(WorkspaceLayout& l, int64_t N) {
    SortScratch s;
    s.keys_in = l.take<int32_t>(N);
    s.keys_out = l.take<int32_t>(N);
    s.rows_in = l.take<int32_t>(N);
    s.rows_out = l.take<int32_t>(N);
    s.temp_bytes = sort_temp_bytes(N);
    s.temp = l.take<unsigned char>(s.temp_bytes);
    return s;
}

unsigned blocks_for(int64_t n) {  // a thread a row, no grid-stride loop
    return unsigned((n + 255) / 256);
}

}  // namespace

int32_t ce_absent_target() {
    return kAbsentTarget;
}

OneReadRows one_read_rows(void* base, int64_t N) {
    WorkspaceLayout l(base);
    OneReadRows r;
    r.target_logit = l.take<float>(N);
    r.ce = l.take<float>(N);
    r.stat = l.take<float>(2 * N);
    r.a = l.take<float>(N);
    r.c = l.take<float>(N);
    r.bytes = l.bytes();
    return r;
}

void ce_local_targets(int32_t* local, float* target_logit, const int32_t* targets,
                      const void* logits, DType t, int64_t ld, int64_t N, int64_t v0,
                      int64_t V_local, int64_t ignore_index, CUstream_st* s) {
    ZG_CHECK(V_local < kAbsentTarget, "the one-read shard pass takes shards below 2^30 columns");
    // a local target t - v0 >= 0 must never equal ignore_index
    ZG_CHECK(ignore_index < 0, "the one-read shard pass needs a negative ignore_index");
    if (N == 0) return;
    ZG_DISPATCH(t, T,
                local_targets_kernel<T><<<blocks_for(N), 256, 0, s>>>(
                    local, target_logit, targets, static_cast<const T*>(logits), ld, N, v0, V_local,
                    ignore_index));
    ZG_LAUNCH_CHECK();
}

void ce_local_shard_stats(RowStatsF* stats, const float* stat_rows, const float* ce_rows,
                          const float* target_logit, const int32_t* local, int64_t N,
                          int64_t V_local, CUstream_st* s) {
    if (N == 0) return;
    local_stats_kernel<<<blocks_for(N), 256, 0, s>>>(stats, stat_rows, ce_rows, target_logit, local,
                                                     N, V_local);
    ZG_LAUNCH_CHECK();
}

void ce_local_factors(float* a, float* c, const RowGradParams* params, const float* stat_rows,
                      const float* ce_rows, const int32_t* local, int64_t N, int64_t V_local,
                      CUstream_st* s) {
    if (N == 0) return;
    local_factors_kernel<<<blocks_for(N), 256, 0, s>>>(a, c, params, stat_rows, ce_rows, local, N,
                                                       V_local);
    ZG_LAUNCH_CHECK();
}

void shard_dh_finish(float* dh, const float* a, const float* c, const int32_t* local, const void* W,
                     DType t, int64_t N, int64_t C, int64_t V_local, CUstream_st* s) {
    if (N == 0) return;
    const int blocks = grid_for(N, kRowsPerBlock);
    const bool words = rows_of_words(C, 4, {dh}) && rows_of_words(C, dtype_bytes(t), {W});
    ZG_DISPATCH(t, T, {
        const T* w = static_cast<const T*>(W);
        if (words)
            dh_finish_kernel<T, 4>
                <<<blocks, kRowThreads, 0, s>>>(dh, a, c, local, w, N, C, V_local);
        else
            dh_finish_kernel<T, 1>
                <<<blocks, kRowThreads, 0, s>>>(dh, a, c, local, w, N, C, V_local);
    });
    ZG_LAUNCH_CHECK();
}

void shard_scale_rows(void* out, const void* h, const float* a, DType t, int64_t N, int64_t C,
                      CUstream_st* s) {
    if (N == 0) return;
    const int blocks = grid_for(N, kRowsPerBlock);
    const bool words = rows_of_words(C, dtype_bytes(t), {out, h});
    ZG_DISPATCH(t, T, {
        T* o = static_cast<T*>(out);
        const T* in = static_cast<const T*>(h);
        if (words)
            scale_rows_kernel<T, 4><<<blocks, kRowThreads, 0, s>>>(o, in, a, N, C);
        else
            scale_rows_kernel<T, 1><<<blocks, kRowThreads, 0, s>>>(o, in, a, N, C);
    });
    ZG_LAUNCH_CHECK();
}

size_t shard_dw_target_scratch_bytes(int64_t N) {
    WorkspaceLayout l(nullptr);
    carve_sort(l, N);
    return l.bytes();
}

void shard_dw_target_rows(float* dW, const float* c, const int32_t* local, const void* h, DType t,
                          int64_t N, int64_t C, int64_t V_local, void* scratch,
                          size_t scratch_bytes, CUstream_st* s) {
    if (N == 0) return;
    ZG_CHECK(N <= INT32_MAX, "shard_dw_target_rows: rows must fit an int");
    WorkspaceLayout l(scratch);
    const SortScratch ss = carve_sort(l, N);
    ZG_CHECK(scratch_bytes >= l.bytes(), "shard_dw_target_rows: scratch too small");
    target_keys_kernel<<<blocks_for(N), 256, 0, s>>>(ss.keys_in, ss.rows_in, local, N, V_local);
    ZG_LAUNCH_CHECK();
    int end_bit = 1;  // keys are at most V_local
    while ((int64_t(1) << end_bit) <= V_local) end_bit++;
    size_t temp_bytes = ss.temp_bytes;
    // LSD radix sort: stable, so each target's rows stay in row order
    ZG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ss.temp, temp_bytes, ss.keys_in, ss.keys_out,
                                                  ss.rows_in, ss.rows_out, int(N), 0, end_bit, s));
    ZG_DISPATCH(t, T,
                target_rows_kernel<T><<<unsigned(N), kTargetThreads, 0, s>>>(
                    dW, c, static_cast<const T*>(h), ss.keys_out, ss.rows_out, N, C, V_local));
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

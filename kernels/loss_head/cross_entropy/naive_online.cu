// The loss head's two-pass variants (kernels/loss_head/cross_entropy/launch.cu lists them all):
//
//   naive  textbook: row max, row sum, fp32 softmax materialised, loss, gradient (5 kernels)
//   online two passes over each row in one kernel (Liger's structure): stats, then re-read the
//          row and write its dlogits
//
// The vocab-parallel building blocks ce_shard_stats and ce_shard_backward
// (kernels/loss_head/cross_entropy.h) are defined here too: they share online's per-row bodies.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/core/cuda_check.h"
#include "kernels/core/cuda_common.cuh"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/cross_entropy/common.cuh"
#include "kernels/loss_head/cross_entropy/internal.h"
#include "kernels/loss_head/cross_entropy/plan.h"

namespace zgpt::cuda {

using namespace ce;

namespace {

// ---------------------------------------------------------------- online: stats, then backward

// kVec: rows start 16-byte aligned, so whole chunks are read with one instruction; the tail
// (V_local not a multiple of the chunk) is read one value at a time.
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

// ---------------------------------------------------------------- online: whole rows, one kernel

// Whole rows (online, and fast where its plan refuses a shape), as Liger's kernel runs them: each
// row's statistics, its outputs and gradient parameters, then its dlogits, in one kernel. The row
// is read twice, but the statistics and parameters never leave the chip, so the workspace holds
// only the largest logit's key. The per-row bodies, trees, thread counts and finalize_row are the
// shard kernels', so the bits equal ce_shard_stats -> ce_finalize -> ce_shard_backward's.
struct RowArgs {
    RowFinish fin;
    int64_t N, ld;
    bool smooth;
    unsigned* max_key;
};

// The row's target column for the statistics (-1: none, as the shard kernels take it).
__device__ __forceinline__ int64_t stats_target(int64_t y, const RowArgs& f) {
    return (y != f.fin.ignore_index && y >= 0 && y < f.fin.V) ? y : -1;
}

// The row finished (its outputs written and the largest logit's key raised, by one thread), its
// gradient parameters returned.
__device__ __forceinline__ RowGradParams finish_online_row(const RowArgs& f, int64_t row,
                                                           const RowStatsF& st, bool write) {
    const RowResult r = finish_row(f.fin, row, st, write);
    if (write) raise_max(f.max_key, st.max);
    return r.p;
}

// One row by one block. kVecIn: the logits rows start 16-byte aligned; kVecOut: the dlogits rows
// too (each pass vectorised as the shard kernel for it would be). row_params: the block's shared
// slot for the row's parameters (rewritten only after every thread passed the next row's
// reduction barrier, so a block may take rows one after another).
template <typename T, bool kVecIn, bool kVecOut>
__device__ __forceinline__ void online_row(T* dlogits, const T* logits, const RowArgs& f,
                                           int64_t row, RowGradParams& row_params) {
    const int64_t y = f.fin.targets[row];
    const bool valid = y != f.fin.ignore_index;
    const T* x = logits + row * f.ld;
    RowStatsF st = row_stats_part<T, kVecIn>(x, f.fin.V, stats_target(y, f), f.smooth,
                                             int(threadIdx.x), int(blockDim.x));
    st = block_reduce_stats(st);
    if (threadIdx.x == 0) row_params = finish_online_row(f, row, st, true);
    __syncthreads();
    row_backward_part<T, kVecOut>(dlogits + row * f.ld, x, f.fin.V, valid ? y : -1, valid,
                                  row_params, int(threadIdx.x), int(blockDim.x));
}

template <typename T, bool kVecIn, bool kVecOut>
__global__ void online_row_kernel(T* dlogits, const T* logits, RowArgs f) {
    __shared__ RowGradParams row_params;
    online_row<T, kVecIn, kVecOut>(dlogits, logits, f, blockIdx.x, row_params);
}

// fast's helper grid of whole rows (plan_fast_helper): rows [row0, f.N), block b taking rows
// row0 + b, row0 + b + gridDim.x, ... Its dynamic shared memory goes unused: it is sized so that
// no block fits beside one of the main grid's, so the blocks land on the SMs that grid left idle.
// Launched with programmatic serialization after the main grid, it ends after that grid (and its
// writes are visible), so the kernels after it see both.
template <typename T>
__global__ void online_helper_kernel(T* dlogits, const T* logits, RowArgs f, int64_t row0) {
    __shared__ RowGradParams row_params;
    for (int64_t row = row0 + blockIdx.x; row < f.N; row += gridDim.x)
        online_row<T, true, true>(dlogits, logits, f, row, row_params);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

template <typename T, bool kVecIn, bool kVecOut>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    narrow_online_row_kernel(T* dlogits, const T* logits, RowArgs f) {
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= f.N) return;  // whole warps leave together
    const int64_t y = f.fin.targets[row];
    const bool valid = y != f.fin.ignore_index;
    const T* x = logits + row * f.ld;
    RowStatsF st = row_stats_part<T, kVecIn>(x, f.fin.V, stats_target(y, f), f.smooth, lane, 32);
    st = warp_merge_stats(st);  // the same bits in every lane
    const RowGradParams p = finish_online_row(f, row, st, lane == 0);
    row_backward_part<T, kVecOut>(dlogits + row * f.ld, x, f.fin.V, valid ? y : -1, valid, p, lane,
                                  32);
}

template <typename T, bool kVecIn, bool kVecOut>
void launch_online_rows(const CrossEntropyArgs& a, const RowArgs& f, CUstream_st* s) {
    T* out = static_cast<T*>(a.dlogits);
    const T* x = static_cast<const T*>(a.logits);
    if (a.V <= kNarrowMax) {
        narrow_online_row_kernel<T, kVecIn, kVecOut>
            <<<unsigned((a.N + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
                out, x, f);
    } else {
        online_row_kernel<T, kVecIn, kVecOut>
            <<<unsigned(a.N), num_threads_for(a.V), 0, s>>>(out, x, f);
    }
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

}  // namespace

namespace ce {

void run_online(const CrossEntropyArgs& a0, const CrossEntropyOptions& o, void* w, CUstream_st* s) {
    check_args(a0, o, true);
    const Workspace ws = carve(w, a0.N, a0.V, false);
    const CrossEntropyArgs a = with_rows(a0, ws);
    count_valid_and_reset_max(ws.n_valid, ws.max_key, a.targets, a.N, o.ignore_index, s);
    const RowArgs f{row_finish(a, o, ws.n_valid), a.N, a.ld, o.label_smoothing != 0.0, ws.max_key};
    const bool vec_in = rows_aligned(a.logits, a.logits, a.ld, a.type);
    const bool vec_out = rows_aligned(a.logits, a.dlogits, a.ld, a.type);
    dispatch(a.type, [&](auto tag) {
        using T = decltype(tag);
        if (vec_out)
            launch_online_rows<T, true, true>(a, f, s);  // (both rows aligned)
        else if (vec_in)
            launch_online_rows<T, true, false>(a, f, s);
        else
            launch_online_rows<T, false, false>(a, f, s);
    });
    ZG_CUDA_CHECK(cudaGetLastError());
    reduce_rows(a, ws.max_key, ws.n_valid, o, s);
}

int online_helper_blocks_per_sm(LogitsType t, int threads, size_t smem) {
    int per_sm = 0;
    dispatch(t, [&](auto tag) {
        using T = decltype(tag);
        auto kernel = online_helper_kernel<T>;
        ZG_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        ZG_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    });
    return per_sm;
}

void launch_online_helper(const CrossEntropyArgs& a, const CrossEntropyOptions& o,
                          const int* n_valid, unsigned* max_key, int64_t row0, int blocks,
                          int threads, size_t smem, CUstream_st* s) {
    const RowArgs f{row_finish(a, o, n_valid), a.N, a.ld, o.label_smoothing != 0.0, max_key};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(blocks));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    dispatch(a.type, [&](auto tag) {
        using T = decltype(tag);
        ZG_CUDA_CHECK(cudaLaunchKernelEx(&cfg, online_helper_kernel<T>, static_cast<T*>(a.dlogits),
                                         static_cast<const T*>(a.logits), f, row0));
    });
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

}  // namespace ce

// ---------------------------------------------------------------- public building blocks

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

}  // namespace zgpt::cuda

// Device helpers shared by the tensor-core attention kernels (attention/mma.cu for mma.sync,
// attention/wgmma.cu for Hopper's wgmma): bf16 packing, base-2 exponentials, and the cp.async
// ring of tiles both stream through.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/gemm/mma_sync.cuh"

namespace zgpt::cuda::attention_tc {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}
// What pack(lo, hi) loses, packed the same way: lo - bf16(lo), hi - bf16(hi) (the next 8 bits).
__device__ __forceinline__ uint32_t pack_residual(float lo, float hi) {
    const float2 r = __bfloat1622float2(__floats2bfloat162_rn(lo, hi));
    return pack(lo - r.x, hi - r.y);
}
// 2^x; ex2(-inf) = 0, which is how masked scores vanish.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// A score in the softmax's scaled log2 units, rounded on its own (never fused into the
// subtraction that follows). The row's running max m is this same rounded product of its largest
// score, so the largest score's probability is 2^0 = 1 exactly. Fused, s sl2 - m is the rounding
// residual of m instead: up to half an ulp of the scores' magnitude, 0.03 at 1e6, so the largest
// probability is 2^r, which bf16 rounds before P V while the row sum keeps it, and the backward's
// recomputed P is off by the same factor. Runs without qk_norm reach such scores.
__device__ __forceinline__ float scaled_score(float s, float sl2) {
    return __fmul_rn(s, sl2);
}

// acc plus the dot product of two 16-byte chunks of 8 bf16 values, as one fmaf chain in order.
__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc) {
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* y2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 x = __bfloat1622float2(x2[k]), y = __bfloat1622float2(y2[k]);
        acc = fmaf(x.x, y.x, acc);
        acc = fmaf(x.y, y.y, acc);
    }
    return acc;
}

// Tiles stream through a ring of kStages buffers. Tiles t and t + 1 are in flight when tile t is
// needed: wait_prev() waits for t, one barrier says every warp is done with t - 1, and tile t + 2
// then goes into t - 1's buffer. One barrier per tile instead of two (before the ring, a second
// barrier at the end of each tile guarded the refill).
constexpr int kStages = 3;
__device__ __forceinline__ int ring_next(int i) {
    return i == kStages - 1 ? 0 : i + 1;
}
__device__ __forceinline__ int ring_after_next(int i) {
    return ring_next(ring_next(i));
}
__device__ __forceinline__ void commit() {
    mma_sync::cp_async_commit();
}
// Waits for all but the newest copy group.
__device__ __forceinline__ void wait_prev() {
    mma_sync::cp_async_wait<1>();
}
// n floats from src into shared memory at shared address dst, 4 bytes per copy, zero past
// `valid`; copied by the block's first n threads, so no thread waits on the loads (they join the
// current commit group).
__device__ __forceinline__ void stage_floats(uint32_t dst, const float* src, int n, int valid) {
    const int i = threadIdx.x;
    if (i < n)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * i),
                     "l"(i < valid ? src + i : src), "r"(i < valid ? 4 : 0));
}

// The threads that sum columns together: the whole block, or (warp-specialised kernels) the warps
// that compute, with their index among them (t) and their own barrier (sync).
struct WholeBlock {
    __device__ __forceinline__ unsigned t() const { return threadIdx.x; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

// Column sums of a block's accumulators, times `scale`, into dst[0, kD). cs[n][c] is this lane's
// partial sum of column n * 8 + 2 (lane % 4) + c (the mma.sync and wgmma accumulator layouts
// both put a column there); the partials go across the lanes of a column (xor 4, 8, 16), then the
// kWarps warps in order: a fixed order, so deterministic. Every thread of the group calls it;
// `red` is the group's [kWarps][kD] scratch, free again only after the group's barrier.
template <int kD, int kWarps, typename Group = WholeBlock>
__device__ __forceinline__ void block_column_sums(float* dst, const float (&cs)[kD / 8][2],
                                                  float scale, float (*red)[kD], Group group = {}) {
    const unsigned t = group.t(), warp = t / 32, lane = t % 32;
#pragma unroll
    for (int n = 0; n < kD / 8; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float v = cs[n][c];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (lane < 4) red[warp][n * 8 + 2 * lane + c] = v;
        }
    group.sync();
    if (t < kD) {
        float v = red[0][t];
#pragma unroll
        for (int w = 1; w < kWarps; w++) v += red[w][t];
        dst[t] = v * scale;
    }
}

}  // namespace zgpt::cuda::attention_tc

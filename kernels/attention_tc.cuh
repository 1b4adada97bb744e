// Device helpers shared by the tensor-core attention kernels (attention_mma.cu for mma.sync,
// attention_wgmma.cu for Hopper's wgmma): bf16 packing, base-2 exponentials, and the cp.async
// ring of tiles both stream through.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace zgpt::cuda::attention_tc {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}
// 2^x; ex2(-inf) = 0, which is how masked scores vanish.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
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
    asm volatile("cp.async.commit_group;\n" ::);
}
// Waits for all but the newest copy group.
__device__ __forceinline__ void wait_prev() {
    asm volatile("cp.async.wait_group 1;\n" ::);
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

}  // namespace zgpt::cuda::attention_tc

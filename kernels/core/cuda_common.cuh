// Device helpers shared by the CUDA op files: fp32 <-> storage-type conversion, warp reductions,
// grid sizing, and dispatch from a runtime DType to a template argument.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/core/cuda_check.h"
#include "kernels/core/dtype.h"

namespace zgpt::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) {
    return x;
}
__device__ __forceinline__ float to_f(bf16 x) {
    return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
    return __float2bfloat16_rn(x);
}

// 8 bf16 values in one 16-byte word: the vectorised paths' loads, stores and conversions.
__device__ __forceinline__ void unpack8(const uint4& u, float (&v)[8]) {
    const bf16* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __bfloat162float(e[k]);
}
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
    uint4 u;
    bf16* e = reinterpret_cast<bf16*>(&u);
#pragma unroll
    for (int k = 0; k < 8; k++) e[k] = __float2bfloat16_rn(v[k]);
    return u;
}
__device__ __forceinline__ uint4 ld16(const bf16* p) {
    return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Whether p is `bytes`-aligned: the vectorised paths' 16-byte accesses need 16.
inline bool is_aligned(const void* p, uintptr_t bytes = 16) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
// Whether every pointer is 16-byte aligned (null counts as aligned).
inline bool is_aligned(std::initializer_list<const void*> ps) {
    for (const void* p : ps)
        if (!is_aligned(p)) return false;
    return true;
}

// Blocks for a grid-stride loop over n items.
inline int grid_for(int64_t n, int threads, int64_t max_blocks = 65535) {
    return int(std::clamp<int64_t>((n + threads - 1) / threads, 1, max_blocks));
}

// Blocks of `kernel` (`threads` each, `smem` bytes of dynamic shared memory) resident on the
// current GPU at once: one full wave, the size of a persistent grid.
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem = 0) {
    int dev = 0, sms = 0, per_sm = 0;
    ZG_CUDA_CHECK(cudaGetDevice(&dev));
    ZG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    ZG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    return sms * per_sm;
}

}  // namespace zgpt::cuda

// Runs the statement with T bound to the C++ type of `dtype`.
#define ZG_DISPATCH(dtype, T, ...)           \
    do {                                     \
        if ((dtype) == ::zgpt::DType::f32) { \
            using T = float;                 \
            __VA_ARGS__;                     \
        } else {                             \
            using T = ::zgpt::cuda::bf16;    \
            __VA_ARGS__;                     \
        }                                    \
    } while (0)

#define ZG_LAUNCH_CHECK() ZG_CUDA_CHECK(cudaGetLastError())

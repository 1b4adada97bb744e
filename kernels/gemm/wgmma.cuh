// Hopper's warpgroup MMA (wgmma) basics shared by the sm_90a kernels (kernels/attention/wgmma.cu,
// kernels/loss_head/linear_cross_entropy_wgmma.cu): the shared-memory matrix descriptor of a tile
// in the 128-byte swizzle and the fence / commit / wait of wgmma groups.
//
// In an anonymous namespace, as the kernels' own helpers: each translation unit keeps its copies.
#pragma once
#include <cstdint>

namespace zgpt::cuda {
namespace {

// Shared-memory matrix descriptor of a swizzled tile (rows of 64 bf16 = 128 bytes, 16-byte chunk c
// of row r at chunk c ^ (r % 8), tiles 1024-aligned): start address, 1024 bytes between groups of
// 8 rows, 128-byte swizzle. K-major: step 16 columns by adding 32 bytes to the start. N-major
// (transposed B): step 16 rows by adding 2048 bytes. The leading offset is unused for both
// (one swizzle atom spans all 64 columns), set to 1 as the PTX ISA says it is assumed.
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
    return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
           (uint64_t(1) << 62);
}
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {  // all but the newest N groups are done
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

}  // namespace
}  // namespace zgpt::cuda

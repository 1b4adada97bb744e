// sm_90 primitives of the fast kernels (kernels/loss_head/cross_entropy/fast.cu), as inline PTX:
// bulk (TMA) copies completing on an mbarrier, mbarrier waits, arrivals on another CTA's mbarrier,
// the cluster barrier split into its arrive and wait halves, and named block barriers.
//
// In an anonymous namespace, as they were in the single cross_entropy.cu: each translation unit
// keeps its own internal copies, so the kernels' code (and the names in their PTX) is unchanged.
#pragma once
#include <cstdint>

// a translation unit may use only some of these (nvcc warns about unreferenced ones)
#pragma nv_diag_suppress 177

namespace zgpt::cuda {
namespace {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives on `bar` and arms it for `bytes` more of bulk-copy traffic.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
// Arms `bar` for `bytes` and starts one bulk copy global -> shared that completes it.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
    mbar_expect_tx(bar, bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}
// An L2 cache policy for bulk_load: the copied lines evicted last (keep) or normally.
__device__ __forceinline__ uint64_t l2_policy(bool keep) {
    uint64_t policy;
    if (keep)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
// bulk_load under an L2 cache policy (l2_policy's).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar,
                                          uint64_t policy) {
    mbar_expect_tx(bar, bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
        "[%1], %2, [%3], %4;\n" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
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

}  // namespace
}  // namespace zgpt::cuda

#pragma nv_diag_default 177

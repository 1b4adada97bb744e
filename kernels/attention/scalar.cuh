// What the scalar attention kernels (flash.cu, naive.cu) share: where a head's q, k and v rows
// live, and the shape check of the launchers (the tensor-core paths' too).
#pragma once
#include "kernels/attention/attention.h"
#include "kernels/attention/geo.cuh"
#include "kernels/core/cuda_common.cuh"

namespace zgpt::cuda {

namespace {

using Geo = AttentionGeo;

// Query head h's q row t; key/value head kvh's k and v rows t.
template <typename T>
__device__ __forceinline__ const T* q_row(const T* qkv, const Geo& g, int64_t b, int64_t h,
                                          int64_t t) {
    return qkv + (b * g.Tn + t) * g.ld + h * g.hs;
}
template <typename T>
__device__ __forceinline__ const T* k_row(const T* qkv, const Geo& g, int64_t b, int64_t kvh,
                                          int64_t t) {
    return qkv + (b * g.Tn + t) * g.ld + g.k_col(kvh);
}
template <typename T>
__device__ __forceinline__ const T* v_row(const T* qkv, const Geo& g, int64_t b, int64_t kvh,
                                          int64_t t) {
    return qkv + (b * g.Tn + t) * g.ld + g.v_col(kvh);
}

inline void check_shape(const AttentionShape& s) {
    ZG_CHECK(s.B > 0 && s.Tn > 0 && s.C > 0 && s.NH > 0 && s.C % s.NH == 0, "attention: bad shape");
    ZG_CHECK(s.NKV >= 0 && (s.NKV == 0 || s.NH % s.NKV == 0),
             "attention: key/value heads (" + std::to_string(s.NKV) + ") must divide n_head (" +
                 std::to_string(s.NH) + ")");
    ZG_CHECK(s.B * s.NH <= 65535, "attention: B * n_head must be <= 65535");
}

}  // namespace

// The registry's entries, each defined beside its kernels; launch.cu lists them.
AttentionVariant flash_attention_entry(bool hopper);  // flash (hopper) or flash_mma
AttentionVariant naive_attention_entry();
// flash_fwd_naive_bwd (flash_forward) or naive_fwd_flash_bwd: ablations (hybrid.cu)
AttentionVariant hybrid_attention_entry(bool flash_forward);

}  // namespace zgpt::cuda

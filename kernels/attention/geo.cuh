// Where one head's rows live inside qkv [B, T, C + 2 KVC] and out [B, T, C]: shared by the
// attention kernels of attention/flash.cu, naive.cu, mma.cu and wgmma.cu.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/ops/rope.h"

namespace zgpt::cuda {

struct AttentionGeo {
    int64_t Tn, C, NH, hs;
    float scale;        // 1 / sqrt(head size)
    int64_t NKV;        // key/value heads (NH for multi-head attention)
    int64_t KVC;        // NKV hs: k's (and v's) width in a qkv row
    int64_t ld;         // a qkv row: C + 2 KVC
    int group;          // query heads per key/value head: NH / NKV
    const float* rope;  // AttentionShape::rope_table: cos [Tn, hs / 2], then sin (or null)
    // Columns of key/value head kvh's k and v in a qkv (or dqkv) row.
    __host__ __device__ int64_t k_col(int64_t kvh) const { return C + kvh * hs; }
    __host__ __device__ int64_t v_col(int64_t kvh) const { return C + KVC + kvh * hs; }
};

inline int64_t attention_kv_heads(const AttentionShape& s) {
    return s.NKV == 0 ? s.NH : s.NKV;
}

inline AttentionGeo attention_geometry(const AttentionShape& s) {
    const int64_t hs = s.C / s.NH, nkv = attention_kv_heads(s);
    return {s.Tn,
            s.C,
            s.NH,
            hs,
            float(1.0 / std::sqrt(double(hs))),
            nkv,
            nkv * hs,
            s.C + 2 * nkv * hs,
            int(s.NH / nkv),
            s.rope_table};
}

// The backward's inverse rotation of dq and dk as a pass over dqkv, for the kernels that do not
// take it at their stores (AttentionShape::rope_table).
inline void unrotate_dqk(void* dqkv, const AttentionShape& s, DType t, CUstream_st* st) {
    if (!s.rope_table) return;
    const AttentionGeo g = attention_geometry(s);
    rope_backward(dqkv, s.rope_table, s.B, s.Tn, s.NH + g.NKV, g.hs, g.ld, t, st);
}

}  // namespace zgpt::cuda

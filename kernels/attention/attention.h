// Causal multi-head self-attention. CPU reference (materializes the T x T probabilities).
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// qkv: [B, T, C + 2 KVC] with q (NH heads of hs = C / NH), k and v (NKV heads each, KVC = NKV hs)
// side by side; NKV 0 means NH (then [B, T, 3C]). With NKV < NH (grouped-query attention) query
// head h reads key/value head h / (NH / NKV). out: [B, T, C]; att: [B, NH, T, T] softmax
// probabilities saved for backward (entries above the diagonal are written as 0).
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                       int64_t NKV = 0);

// Adds into dqkv. The gradient of a shared key/value head sums its group's heads in order.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                        int64_t C, int64_t NH, int64_t NKV = 0);

// float (training) has its own vectorised layout of the same sums (attention.cpp).
template <>
void attention_forward<float>(float* out, float* att, const float* qkv, int64_t B, int64_t Tn,
                              int64_t C, int64_t NH, int64_t NKV);
template <>
void attention_backward<float>(float* dqkv, const float* dout, const float* qkv, const float* att,
                               int64_t B, int64_t Tn, int64_t C, int64_t NH, int64_t NKV);

}  // namespace zgpt::cpu

// CUDA causal attention (kernels/attention/*.cu; CUDA builds only), registered variants:
//   flash      online softmax over key tiles; the T x T scores never exist; saves lse [B, NH, T].
//              bf16 at head size 64: wgmma kernels on Hopper, mma.sync ones elsewhere
//   flash_mma  flash with the mma.sync kernels on every GPU (ablation of the Hopper kernels)
//   naive  scores and probabilities materialised ([B, NH, T, T] fp32 saved for backward)
//   flash_fwd_naive_bwd, naive_fwd_flash_bwd  ablations: one's forward with the other's backward
//          (hybrid.cu), to tell flash's forward rounding from its backward's in training
// qkv [B, T, C + 2 KVC] (q: NH heads of hs = C / NH, then k and v: NKV heads each, KVC = NKV hs;
// [B, T, 3C] when NKV = NH), out [B, T, C], dqkv written (not added) in qkv's layout. Query head h
// reads key/value head h / (NH / NKV); a shared head's dK/dV sums its group's query heads in head
// order, inside the block that owns its keys. Backward sums in a fixed order (deterministic).
#include <string>
#include <vector>

#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

// The `flash` variants' tuning knobs, for measuring the kernels against each other. Every default
// is the kernels' choice (the fastest measured); a value outside a knob's set is ignored (the
// default), and the config (kernels.attention_tuning.*) refuses it.
struct AttentionTuning {
    int fwd_m_tiles = 0;    // mma.sync forward: query m-tiles of 16 rows per warp, 1 | 2; 0: 2
    bool wgmma_fwd = true;  // flash on Hopper: the wgmma forward (false: the mma.sync one)
    bool wgmma_bwd = true;  // flash on Hopper: the wgmma backward (false: the mma.sync one)
    bool wgmma_fwd_pipeline = false;  // wgmma forward: S of tile t + 1 overlaps P V of tile t
    int wgmma_dq_tile = 0;            // wgmma backward: keys per dQ tile, 32 | 64 | 128 (the
                                      // warp-specialised kernel); 0: 64
    int wgmma_dkdv_tile = 0;          // wgmma backward: queries per dK/dV tile, 32 | 64 | 128
                                      // (the warp-specialised kernel); 0: 128 with two
                                      // warpgroups and the TMA ring where T % 4 == 0, else 64
    int wgmma_dkdv_wgs = 0;           // wgmma backward: warpgroups per dK/dV block, 1 | 2; 0: 2
    // wgmma backward: the streamed tiles by TMA into rings handed over by mbarriers (dK/dV: with
    // 64-query tiles, 2 warpgroups and T % 4 == 0; dQ: with 64-key tiles)
    bool wgmma_dkdv_tma = true;
    bool wgmma_dq_tma = true;
    bool wgmma_fwd_tma = true;  // wgmma forward: the key tiles by TMA (as the backward's rings)
    // wgmma forward: keys per tile, 64 | 128 (128: TMA ring only); 0: 128 with the TMA ring, 64
    // without
    int wgmma_fwd_keys = 0;
    // flash in bf16: the forward also saves the output's rounding residual (O - bf16(O), as bf16),
    // and the backward's D = rowsum(dO O) reads O unrounded. With peaked rows the true dS at a
    // row's winning key is tiny, and D from the rounded O buries it in rounding noise.
    bool unrounded_dsum = false;
};

// The launch's shape, and the tuning its kernels follow (they read it wherever they take the
// shape, colsum_rows included).
struct AttentionShape {
    int64_t B = 0, Tn = 0, C = 0, NH = 0;
    AttentionTuning tuning;  // the defaults: the kernels' choices
    // key/value heads (grouped-query attention), a divisor of NH; 0 means NH. After tuning, so
    // that {B, Tn, C, NH, tuning} still reads as multi-head attention.
    int64_t NKV = 0;
    // Rotary positions: kernels/ops/rope.h's rope_table(Tn, hs, theta) on the device, or null.
    // q and k arrive rotated (the caller rotates them after the qkv matmul); backward then returns
    // the gradients of the unrotated q and k: the wgmma kernels turn them back at their stores,
    // the other paths with a rope_backward pass after them.
    const float* rope_table = nullptr;
};

// flash's saved buffer: the lse [B, NH, T] (fp32), then, with tuning.unrounded_dsum, the output's
// rounding residual [B, T, C] (bf16) from a 256-byte boundary.
size_t flash_saved_bytes(const AttentionShape& s);
// The residual in saved, or null when tuning.unrounded_dsum is off.
void* flash_out_residual(void* saved, const AttentionShape& s);

struct AttentionVariant {
    const char* name;
    const char* description;
    size_t (*saved_bytes)(const AttentionShape&);    // kept from forward to backward
    size_t (*scratch_bytes)(const AttentionShape&);  // backward temporaries
    void (*forward)(void* out, void* saved, const void* qkv, const AttentionShape&, DType,
                    CUstream_st*);
    // Rows of partial column sums of dqkv that backward can write beside it (0: it cannot).
    // Summed over their rows they are the column sums, the qkv bias gradient, so the layer needs
    // no pass over dqkv for it.
    int64_t (*colsum_rows)(const AttentionShape&, DType);
    // dqkv_colsums: [colsum_rows, C + 2 KVC] or null (must be null when colsum_rows is 0)
    void (*backward)(void* dqkv, const void* dout, const void* qkv, const void* out, void* saved,
                     void* scratch, float* dqkv_colsums, const AttentionShape&, DType,
                     CUstream_st*);
};
const std::vector<AttentionVariant>& attention_variants();
const AttentionVariant& find_attention_variant(const std::string& name);

}  // namespace zgpt::cuda

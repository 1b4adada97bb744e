// Rotary position embedding (RoPE) on the heads of q or k. CPU reference.
//
// Hugging Face Llama's layout (rotate_half): in a head of hs channels, channel i < hs / 2 pairs
// with channel i + hs / 2, and the pair at position t turns by the angle t theta^(-2 i / hs):
//   y_i = x_i cos - x_{i + hs/2} sin,   y_{i + hs/2} = x_{i + hs/2} cos + x_i sin.
// (Meta's original checkpoints pair channels 2i and 2i + 1; Hugging Face's conversion permutes
// the q and k weights into this layout.)
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// Head h of token (b, t) is x + (b Tn + t) ld + h hs, for h < heads; t is its position. Rotates
// every head in place.
template <typename T>
void rope_forward(T* x, int64_t B, int64_t Tn, int64_t heads, int64_t hs, int64_t ld, double theta);

// The backward: the inverse rotation of the gradient, in place (the op is linear).
template <typename T>
void rope_backward(T* dx, int64_t B, int64_t Tn, int64_t heads, int64_t hs, int64_t ld,
                   double theta);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/ops/rope.cu; CUDA builds only). x's type is t; the math is fp32 from a
// table of cos and sin taken in double, as the CPU reference takes them.
#include <vector>

#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

// cos then sin of every (position t < Tn, pair i < hs / 2), [2, Tn, hs / 2] floats: made on the
// host once per sequence length, uploaded by the caller.
std::vector<float> rope_table(int64_t Tn, int64_t hs, double theta);

// In place on `heads` heads of every token (q's and k's heads lie side by side at the start of a
// qkv row, so one call rotates both); table from rope_table(Tn, hs, theta) on the device.
void rope_forward(void* x, const float* table, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
                  int64_t ld, DType t, CUstream_st* s);
void rope_backward(void* dx, const float* table, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
                   int64_t ld, DType t, CUstream_st* s);

}  // namespace zgpt::cuda

// Causal multi-head self-attention. CPU reference (materializes the T x T probabilities).
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// qkv: [B, T, 3C] with q, k, v side by side; out: [B, T, C]; att: [B, NH, T, T] softmax
// probabilities saved for backward (entries above the diagonal are written as 0).
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH);

// Adds into dqkv.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                        int64_t C, int64_t NH);

}  // namespace zgpt::cpu

// GELU, tanh approximation (GPT-2's form). CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);

// Adds into dinp.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

}  // namespace zgpt::cpu

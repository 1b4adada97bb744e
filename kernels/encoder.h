// Token + position embedding. CPU reference (fp32 in training, double in gradient checks).
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                     int64_t Tn, int64_t C);

// Adds into dwte and dwpe.
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn,
                      int64_t C);

}  // namespace zgpt::cpu

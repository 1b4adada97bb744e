// Matmul with optional bias: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC]. CPU reference.
#pragma once
#include <cstdint>

namespace zgpt::cpu {

// bias may be null.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC);

// Adds into dinp, dweight and dbias; any of them may be null (not needed).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC);

}  // namespace zgpt::cpu

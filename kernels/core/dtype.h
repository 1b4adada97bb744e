// Element types of device tensors. Plain C++: CUDA launchers take void pointers plus a DType, so
// their headers stay includable from host code that never sees cuda_bf16.h.
#pragma once
#include <cstddef>

namespace zgpt {

enum class DType { f32, bf16 };

inline size_t dtype_bytes(DType t) {
    return t == DType::f32 ? 4 : 2;
}
inline const char* dtype_name(DType t) {
    return t == DType::f32 ? "fp32" : "bf16";
}

}  // namespace zgpt

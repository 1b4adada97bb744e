// Where one head's rows live inside qkv [B, T, 3C] and out [B, T, C]: shared by the attention
// kernels of attention/flash.cu, naive.cu, mma.cu and wgmma.cu.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attention/attention.h"

namespace zgpt::cuda {

struct AttentionGeo {
    int64_t Tn, C, NH, hs;
    float scale;  // 1 / sqrt(head size)
};

inline AttentionGeo attention_geometry(const AttentionShape& s) {
    const int64_t hs = s.C / s.NH;
    return {s.Tn, s.C, s.NH, hs, float(1.0 / std::sqrt(double(hs)))};
}

}  // namespace zgpt::cuda

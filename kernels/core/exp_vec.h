// exp for float in a form the compiler vectorises (std::exp is a scalar libm call, about 11 ns an
// element). x = k ln2 + r with |r| <= ln2 / 2; exp(r) by its degree-6 Taylor polynomial
// (truncation 1.2e-7 relative); 2^k through the exponent bits. Inputs are clamped to [-87, 88].
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace zgpt::cpu {

inline float exp_vec(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    const float k = std::floor(x * 1.44269504f + 0.5f);
    const float r = (x - k * 0.693145751953125f) - k * 1.42860677e-06f;  // ln2 in two parts
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * std::bit_cast<float>((int32_t(k) + 127) << 23);
}

}  // namespace zgpt::cpu

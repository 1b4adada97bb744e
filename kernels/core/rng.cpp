#include "kernels/core/rng.h"

#include <cmath>

namespace zgpt {

// splitmix64: the state is a counter advanced by a fixed odd constant, so skipping ahead is one
// multiply (skip_normals)
uint64_t Rng::next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double Rng::uniform() {
    return double(next_u64() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
    // Box-Muller; one value per call keeps the state a single integer (easy to checkpoint).
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void Rng::skip_normals(uint64_t n) {
    state_ += 2 * n * 0x9E3779B97F4A7C15ull;  // each normal() takes two steps of the counter
}

uint64_t Rng::below(uint64_t n) {
    return n ? next_u64() % n : 0;
}

}  // namespace zgpt

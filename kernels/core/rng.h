// A small deterministic RNG (splitmix64 + Box-Muller). The standard library's distributions differ
// between implementations, which would make "same seed, same run" depend on the compiler.
#pragma once
#include <cstdint>

namespace zgpt {

class Rng {
  public:
    explicit Rng(uint64_t seed = 0) : state_(seed) {}
    uint64_t next_u64();
    double uniform();               // in [0, 1)
    double normal();                // standard normal
    void skip_normals(uint64_t n);  // as if normal() had been called n times
    uint64_t below(uint64_t n);     // uniform integer in [0, n)
    uint64_t state() const { return state_; }
    void set_state(uint64_t s) { state_ = s; }

  private:
    uint64_t state_;
};

}  // namespace zgpt

// AdamW over the whole parameter arena, walking the parameter table: weight decay where the table
// says (matrices), fp32 moments, one grad_scale (from clipping) applied on the fly.
#pragma once
#include <cstdint>
#include <vector>

#include "model/parameters.h"
#include "train/config.h"

namespace zgpt {

class AdamW {
  public:
    AdamW(const ParameterTable& table, const OptimConfig& cfg);
    // Owns (and updates) only the arena elements [lo, hi): a rank's shard under ZeRO-1. m() and
    // v() then hold hi - lo elements.
    AdamW(const ParameterTable& table, const OptimConfig& cfg, int64_t lo, int64_t hi);
    void step(float* params, const float* grads, double lr, double grad_scale);
    int64_t lo() const { return lo_; }
    int64_t hi() const { return hi_; }
    int64_t steps_taken() const { return t_; }
    void set_steps_taken(int64_t t) { t_ = t; }  // when resuming
    std::vector<float>& m() { return m_; }
    std::vector<float>& v() { return v_; }

  private:
    const ParameterTable& table_;
    OptimConfig cfg_;
    int64_t lo_ = 0, hi_ = 0;
    std::vector<float> m_, v_;
    int64_t t_ = 0;
};

// Global L2 norm of all gradients (fp64 accumulation).
double global_grad_norm(const float* grads, int64_t n);

}  // namespace zgpt

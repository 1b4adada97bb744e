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
    void step(float* params, const float* grads, double lr, double grad_scale);
    int64_t steps_taken() const { return t_; }
    void set_steps_taken(int64_t t) { t_ = t; }  // when resuming
    std::vector<float>& m() { return m_; }
    std::vector<float>& v() { return v_; }

  private:
    const ParameterTable& table_;
    OptimConfig cfg_;
    std::vector<float> m_, v_;
    int64_t t_ = 0;
};

// Global L2 norm of all gradients (fp64 accumulation).
double global_grad_norm(const float* grads, int64_t n);

}  // namespace zgpt

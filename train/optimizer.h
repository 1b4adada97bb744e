// AdamW over the whole parameter arena, walking the parameter table: weight decay where the table
// says (matrices), fp32 moments, one grad_scale (from clipping) applied on the fly.
#pragma once
#include <cstdint>
#include <vector>

#include "model/parameters.h"
#include "train/config.h"
#include "train/dist/comm.h"

namespace zgpt {

class AdamW {
  public:
    AdamW(const ParameterTable& table, const OptimConfig& cfg);
    // Owns (and updates) only the arena elements of `ranges`: a rank's share under ZeRO-1
    // (train/backends/zero1_share.h). m() and v() then hold those elements, range after range.
    AdamW(const ParameterTable& table, const OptimConfig& cfg, std::vector<ArenaSlice> ranges);
    void step(float* params, const float* grads, double lr, double grad_scale);
    int64_t steps_taken() const { return t_; }
    void set_steps_taken(int64_t t) { t_ = t; }  // when resuming
    std::vector<float>& m() { return m_; }
    std::vector<float>& v() { return v_; }
    const std::vector<float>& m() const { return m_; }
    const std::vector<float>& v() const { return v_; }

  private:
    const ParameterTable& table_;
    OptimConfig cfg_;
    std::vector<ArenaSlice> ranges_;
    std::vector<float> m_, v_;
    int64_t t_ = 0;
};

// Global L2 norm of all gradients (fp64 accumulation).
double global_grad_norm(const float* grads, int64_t n);

}  // namespace zgpt

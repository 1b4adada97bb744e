// Learning rate at a step: linear warmup to optim.lr, then cosine, linear or constant decay to
// optim.min_lr at decay_steps (default: max_steps), min_lr afterwards.
#pragma once
#include <cstdint>

#include "train/config.h"

namespace zgpt {

// step is 0-based: the rate used for the update that produces step + 1.
double learning_rate(const OptimConfig& o, int64_t step, int64_t max_steps);

}  // namespace zgpt

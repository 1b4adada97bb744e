// Text generation from a model: temperature, top-k and a seed. Each new token runs the model on
// the last block_size tokens (no KV cache: the CPU reference favours plainness over speed).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/core/rng.h"
#include "model/gpt.h"

namespace zgpt {

struct SampleOptions {
    int64_t max_new_tokens = 200;
    double temperature = 1.0;  // 0: greedy
    int64_t top_k = 0;         // 0: the whole vocabulary; 1: greedy
    int64_t stop_token = -1;   // stop after emitting this id (e.g. <|endoftext|>); -1: never
};

// Returns the prompt followed by the generated tokens.
std::vector<int32_t> generate(GPT<float>& model, std::vector<int32_t> prompt,
                              const SampleOptions& opts, Rng& rng);

// One token from one row of logits (the first vocab_size entries count).
int32_t sample_token(const float* logits, int64_t vocab_size, const SampleOptions& opts, Rng& rng);

}  // namespace zgpt

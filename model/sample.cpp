#include "model/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/core/check.h"

namespace zgpt {

int32_t sample_token(const float* logits, int64_t V, const SampleOptions& o, Rng& rng) {
    ZG_CHECK(V > 0, "sample_token: empty vocabulary");
    ZG_CHECK(o.temperature >= 0.0 && std::isfinite(o.temperature), "temperature must be >= 0");
    if (o.temperature == 0.0 || o.top_k == 1)  // greedy: the first maximum
        return int32_t(std::max_element(logits, logits + V) - logits);
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
    // the k largest, ties broken by the lower id (deterministic)
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const double m = logits[idx[0]];
    std::vector<double> p(k);
    double sum = 0.0;
    for (int64_t i = 0; i < k; i++)
        sum += p[i] = std::exp((double(logits[idx[i]]) - m) / o.temperature);
    double u = rng.uniform() * sum;
    for (int64_t i = 0; i < k; i++) {
        u -= p[i];
        if (u < 0.0) return idx[i];
    }
    return idx[k - 1];
}

std::vector<int32_t> generate(GPT<float>& model, std::vector<int32_t> tokens,
                              const SampleOptions& o, Rng& rng) {
    ZG_CHECK(!tokens.empty(), "generate: the prompt must have at least one token");
    const int64_t block = model.config().block_size, V = model.config().vocab_size;
    for (int64_t n = 0; n < o.max_new_tokens; n++) {
        const int64_t T = std::min<int64_t>(int64_t(tokens.size()), block);
        model.forward(tokens.data() + tokens.size() - T, 1, T);
        const float* last = model.logits() + (T - 1) * model.padded_vocab();
        const int32_t next = sample_token(last, V, o, rng);
        tokens.push_back(next);
        if (next == o.stop_token) break;
    }
    return tokens;
}

}  // namespace zgpt

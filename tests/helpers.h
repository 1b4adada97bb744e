// Shared test helpers: NaN-safe closeness, random inputs, finite differences, whole-binary skips.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/safetensors.h"
#include "kernels/core/rng.h"
#include "model/gpt_config.h"

namespace zgpt::test {

// A test binary that cannot run here registers why (e.g. no GPU); main() then exits 77 (skipped).
void skip_binary(const std::string& reason);
std::string skip_reason();

// Fails on NaN: true only when |a - b| <= atol + rtol |b|.
inline bool close(double a, double b, double rtol, double atol) {
    return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

struct MaxError {
    double abs = 0, rel = 0;
    int64_t worst = -1;
    bool ok = true;
};
// Compares a to the reference b element-wise; records the largest errors and whether all passed.
template <typename A, typename B>
MaxError compare(const A* a, const B* b, int64_t n, double rtol, double atol) {
    MaxError e;
    for (int64_t i = 0; i < n; i++) {
        const double x = double(a[i]), y = double(b[i]);
        const double d = std::fabs(x - y);
        if (!close(x, y, rtol, atol)) {
            if (e.ok || d > e.abs) e.worst = i;
            e.ok = false;
        }
        if (!(d <= e.abs)) e.abs = d;  // NaN sticks
        const double r = d / std::max(std::fabs(y), 1e-30);
        if (!(r <= e.rel)) e.rel = r;
    }
    return e;
}

template <typename T>
std::vector<T> random_vector(Rng& rng, int64_t n, double scale = 1.0) {
    std::vector<T> v(n);
    for (auto& x : v) x = T(scale * rng.normal());
    return v;
}

// Central-difference gradient of f at x (x is perturbed and restored in place).
std::vector<double> numeric_gradient(const std::function<double()>& f, std::vector<double>& x,
                                     double h = 1e-6);

// Directory of the shared oracle files: $ZGPT_ORACLES, else <source>/../shared/data/oracles.
std::string oracle_dir();

// The model an oracle file was made with: its metadata's "config" (n_layer, n_head, n_embd,
// block_size, vocab_size, tie_embeddings, bias, layer_norm_eps; a Llama oracle's n_kv_head,
// mlp_hidden, rms_norm_eps and rope_theta instead of layer_norm_eps).
ModelConfig oracle_model_config(const SafeTensors& st);

// The Llama-style options (docs/llama.md) the model tests cover: each one alone beside GPT-2's and
// together, with and without biases, tied embeddings and qk_norm; 1, 2 and 4 key/value heads for
// 4 query heads (0: one per query head).
struct LlamaCase {
    const char *norm, *pos, *mlp;
    int kv;
    bool tie, bias, qk;
};
inline constexpr LlamaCase kLlamaCases[] = {
    {"rmsnorm", "rope", "swiglu", 2, false, false, false},
    {"rmsnorm", "rope", "swiglu", 1, true, true, true},
    {"rmsnorm", "learned", "gelu", 0, true, true, false},
    {"layernorm", "rope", "gelu", 0, false, true, true},
    {"layernorm", "learned", "swiglu", 4, true, false, false},
    {"layernorm", "learned", "gelu", 2, false, true, false},
    {"layernorm", "learned", "gelu", 2, false, true, true},
    {"rmsnorm", "rope", "gelu", 1, false, false, true},
};
// c with a case's options on 4 heads of n_embd / 4: rotary angles that turn visibly within a few
// positions (theta 100), SwiGLU's derived width rounded up to 8.
inline ModelConfig with_llama(ModelConfig c, const LlamaCase& k, int n_embd) {
    c.tie_embeddings = k.tie;
    c.bias = k.bias;
    c.qk_norm = k.qk;
    c.n_head = 4;
    c.n_embd = n_embd;
    c.norm = k.norm;
    c.position = k.pos;
    c.rope_theta = 100.0;
    c.mlp = k.mlp;
    c.mlp_multiple_of = 8;
    c.n_kv_head = k.kv;
    return c;
}

// A shell command's exit code and its stdout + stderr.
struct CommandOutput {
    int code = 0;
    std::string text;
};
CommandOutput run_command(const std::string& cmd);

// The path of a built binary from the environment variable ctest sets; throws when it is unset.
std::string built_binary(const char* env_var);

}  // namespace zgpt::test

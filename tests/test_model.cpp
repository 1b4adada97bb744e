// The whole GPT: finite-difference gradient in double for each option combination on odd sizes
// (GPT-2's and the Llama-style ones),
// padded-vocabulary masking, parameter table, and overfitting one batch in float.
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/core/check.h"
#include "kernels/core/rng.h"
#include "model/gpt.h"
#include "model/sample.h"
#include "tests/helpers.h"
#include "train/config.h"
#include "train/optimizer.h"

using namespace zgpt;
using namespace zgpt::test;

namespace {

ModelConfig tiny(bool tie, bool bias, bool qk_norm) {
    ModelConfig c;
    c.n_layer = 2;
    c.n_head = 3;
    c.n_embd = 12;
    c.block_size = 7;
    c.vocab_size = 19;  // padded to 128
    c.tie_embeddings = tie;
    c.bias = bias;
    c.qk_norm = qk_norm;
    c.init_std = 0.3;  // larger than GPT-2's so every path carries signal in a 2-layer toy
    return c;
}

// Trains c (context 16, vocabulary 23, init std 0.02) with AdamW on one random batch of 2 x 16
// tokens until its loss is below 0.05 or 300 steps have run; returns the last loss.
double overfit_one_batch(ModelConfig c) {
    c.block_size = 16;
    c.vocab_size = 23;
    c.init_std = 0.02;
    GPT<float> m(c);
    m.init_weights(3);
    OptimConfig oc;
    oc.weight_decay = 0.0;
    AdamW opt(m.layout().table, oc);
    const int64_t B = 2, T = 16;
    Rng rng(9);
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (auto& x : tok) x = int32_t(rng.below(23));
    for (auto& x : tgt) x = int32_t(rng.below(23));
    const double one = 1.0;
    double loss = 1e9;
    for (int step = 0; step < 300 && loss >= 0.05; step++) {
        m.zero_grad();
        m.forward(tok.data(), B, T);
        loss = m.loss(tgt.data(), CrossEntropyOptions{}, {&one, false}, true).loss;
        m.backward();
        opt.step(m.params.data(), m.grads.data(), 3e-3, 1.0);
    }
    return loss;
}

}  // namespace

TEST_CASE("parameter table: GPT-2 names, sizes, decay on matrices, tied head") {
    GptLayout g = make_gpt_layout(tiny(true, true, false));
    CHECK(g.lm_head == g.wte);
    CHECK(g.table[g.wte].shape == std::vector<int64_t>{128, 12});
    CHECK(g.table[g.wte].decay);
    CHECK_FALSE(g.table[g.blocks[0].ln1_w].decay);
    CHECK(g.table.find("transformer.h.1.mlp.c_proj.weight") == g.blocks[1].fcproj_w);
    int64_t sum = 0;
    for (const auto& s : g.table.specs()) sum += s.numel;
    CHECK(sum == g.table.total());
    GptLayout u = make_gpt_layout(tiny(false, false, true));
    CHECK(u.lm_head != u.wte);
    CHECK(u.table.find("transformer.h.0.attn.c_attn.bias") == -1);
    CHECK(u.table.find("transformer.h.0.attn.q_norm.weight") >= 0);
    ModelConfig bad = tiny(true, true, false);
    bad.n_head = 5;
    CHECK_THROWS_AS(make_gpt_layout(bad), Error);
}

TEST_CASE("GPT-2 initialisation: std 0.02 and 0.02 / sqrt(2 n_layer) on residual projections") {
    ModelConfig c = tiny(true, true, false);
    c.init_std = 0.02;
    c.n_embd = 48;
    c.n_head = 4;
    GPT<float> m(c);
    m.init_weights(5);
    auto stdev = [&](int idx) {
        const ParamSpec& s = m.layout().table[idx];
        double ss = 0;
        for (int64_t i = 0; i < s.numel; i++)
            ss += double(m.params[s.offset + i]) * m.params[s.offset + i];
        return std::sqrt(ss / double(s.numel));
    };
    CHECK(close(stdev(m.layout().blocks[0].fc_w), 0.02, 0.05, 0));
    CHECK(close(stdev(m.layout().blocks[0].fcproj_w), 0.02 / 2.0, 0.05, 0));
    CHECK(m.params[m.layout().table[m.layout().blocks[0].ln1_w].offset] == 1.0f);
    // padded vocabulary rows are zero
    const int64_t padded =
        m.layout().table[m.layout().wte].offset + int64_t(c.vocab_size) * c.n_embd;
    CHECK(m.params[padded] == 0.0f);
}

TEST_CASE("initialisation in parallel blocks gives one sequential stream's values") {
    // fc's 4C x C = 147,456 values span three of init_weights' blocks of 65,536
    ModelConfig c = tiny(false, true, false);
    c.n_embd = 192;
    c.n_head = 4;
    GPT<float> m(c);
    m.init_weights(9);
    Rng rng(9);
    const double residual_std = c.init_std / std::sqrt(2.0 * c.n_layer);
    int64_t mismatches = 0;
    for (const ParamSpec& s : m.layout().table.specs()) {
        if (s.init != Init::normal && s.init != Init::residual_normal) continue;
        const double sd = s.init == Init::normal ? c.init_std : residual_std;
        for (int64_t i = 0; i < s.numel; i++) {
            const float want = float(sd * rng.normal());
            const bool padded =
                (s.name == "transformer.wte.weight" || s.name == "lm_head.weight") &&
                i >= int64_t(c.vocab_size) * c.n_embd;
            mismatches += m.params[s.offset + i] != (padded ? 0.0f : want);
        }
    }
    CHECK(mismatches == 0);
}

// Finite differences in double of a sample of every tensor's parameters (all of the small ones).
static void check_model_gradient(const ModelConfig& c) {
    const int64_t B = 2, T = 5;  // T < block_size
    std::vector<int32_t> tok = {1, 18, 3, 3, 7, 0, 12, 5, 9, 2};
    std::vector<int32_t> tgt = {18, 3, -100, 7, 0, 12, 5, 9, 2, 11};
    CrossEntropyOptions o;
    o.z_loss_weight = 1e-2;  // large enough that the z-loss gradient is checked too
    o.label_smoothing = 0.05;
    GPT<double> m(c);
    m.init_weights(42);
    Rng rng(7);  // perturb norm weights and biases away from 1 / 0
    for (const ParamSpec& s : m.layout().table.specs())
        if (s.shape.size() == 1)
            for (int64_t i = 0; i < s.numel; i++) m.params[s.offset + i] += 0.3 * rng.normal();
    const double one = 1.0;
    m.zero_grad();
    m.forward(tok.data(), B, T);
    m.loss(tgt.data(), o, {&one, false}, true);
    m.backward();
    int checked = 0;
    for (const ParamSpec& s : m.layout().table.specs()) {
        const int64_t step = std::max<int64_t>(1, s.numel / 12);
        for (int64_t i = 0; i < s.numel; i += step) {
            const int64_t k = s.offset + i;
            const double old = m.params[k], h = 1e-5;
            auto f = [&](double v) {
                m.params[k] = v;
                m.forward(tok.data(), B, T);
                return m.loss(tgt.data(), o, {&one, false}, false).loss;
            };
            const double num = (f(old + h) - f(old - h)) / (2 * h);
            m.params[k] = old;
            INFO(s.name << "[" << i << "]: analytic " << m.grads[k] << " numeric " << num);
            CHECK(close(m.grads[k], num, 1e-5, 1e-8));
            checked++;
        }
    }
    CHECK(checked > 100);
}

TEST_CASE("whole-model finite-difference gradient in double, every option combination") {
    for (bool tie : {true, false})
        for (bool bias : {true, false})
            for (bool qk : {false, true}) {
                CAPTURE(tie);
                CAPTURE(bias);
                CAPTURE(qk);
                check_model_gradient(tiny(tie, bias, qk));
            }
}

// Llama-style options on 4 heads of 4 channels (SwiGLU: 2/3 of 64 = 42, rounded up to 48).
static ModelConfig tiny_llama(const char* norm, const char* pos, const char* mlp, int kv, bool tie,
                              bool bias, bool qk) {
    return with_llama(tiny(tie, bias, qk), {norm, pos, mlp, kv, tie, bias, qk}, 16);
}

TEST_CASE("whole-model finite-difference gradient in double, Llama-style options") {
    for (const LlamaCase& k : kLlamaCases) {
        CAPTURE(k.norm);
        CAPTURE(k.pos);
        CAPTURE(k.mlp);
        CAPTURE(k.kv);
        CAPTURE(k.tie);
        CAPTURE(k.bias);
        CAPTURE(k.qk);
        check_model_gradient(tiny_llama(k.norm, k.pos, k.mlp, k.kv, k.tie, k.bias, k.qk));
    }
}

TEST_CASE("Llama-style parameter table: Hugging Face Llama's names, stacked q/k/v and gate/up") {
    ModelConfig c = tiny_llama("rmsnorm", "rope", "swiglu", 2, false, false, false);
    CHECK(mlp_hidden_size(c) == 48);
    GptLayout g = make_gpt_layout(c);
    CHECK(g.wpe == -1);
    CHECK(g.lnf_b == -1);
    const BlockParams& b = g.blocks[1];
    CHECK(g.table.find("model.layers.1.self_attn.k_proj.weight") == b.k_w);
    CHECK(g.table[b.k_w].shape == std::vector<int64_t>{8, 16});  // 2 kv heads of 4
    CHECK(g.table[b.k_w].offset == g.table[b.qkv_w].offset + 16 * 16);
    CHECK(g.table[b.v_w].offset == g.table[b.k_w].offset + 8 * 16);
    CHECK(g.table.find("model.layers.1.mlp.gate_proj.weight") == b.fc_w);
    CHECK(g.table[b.up_w].offset == g.table[b.fc_w].offset + 48 * 16);
    CHECK(g.table[b.fcproj_w].shape == std::vector<int64_t>{16, 48});
    CHECK(g.table.find("model.layers.0.input_layernorm.bias") == -1);
    CHECK(g.table.find("lm_head.weight") == g.lm_head);
    CHECK(g.table.find("model.norm.weight") == g.lnf_w);
    // Llama's own rule: 2/3 of 4 C rounded up to 256 (C = 768: 2048)
    ModelConfig l = c;
    l.n_embd = 768;
    l.n_head = 12;
    l.mlp_multiple_of = 256;
    CHECK(mlp_hidden_size(l) == 2048);
    l.mlp_hidden = 1000;
    CHECK(mlp_hidden_size(l) == 1000);
    // the defaults are GPT-2's table
    CHECK_FALSE(llama_style(tiny(true, true, false)));
    CHECK(make_gpt_layout(tiny(true, true, false)).table.find("transformer.wpe.weight") >= 0);
}

TEST_CASE("Llama-style options: bad combinations name the key") {
    auto refused = [](ModelConfig c, const std::string& key) {
        try {
            make_gpt_layout(c);
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(std::string(e.what()).find(key) != std::string::npos);
            return;
        }
        FAIL("accepted a bad " << key);
    };
    ModelConfig c = tiny_llama("rmsnorm", "rope", "swiglu", 3, false, false, false);
    refused(c, "model.n_kv_head");  // 4 heads, 3 kv heads
    c.n_kv_head = 8;
    refused(c, "model.n_kv_head");
    c = tiny_llama("rmsnorm", "rope", "swiglu", 0, false, false, false);
    c.n_embd = 12;
    c.n_head = 4;  // head size 3
    refused(c, "model.position");
    c = tiny_llama("batchnorm", "learned", "gelu", 0, false, false, false);
    refused(c, "model.norm");
    c = tiny_llama("rmsnorm", "alibi", "gelu", 0, false, false, false);
    refused(c, "model.position");
    c = tiny_llama("rmsnorm", "learned", "relu", 0, false, false, false);
    refused(c, "model.mlp");
}

TEST_CASE("a tiny Llama-style model overfits one batch (loss < 0.05)") {
    ModelConfig c = tiny_llama("rmsnorm", "rope", "swiglu", 2, false, false, false);
    c.n_embd = 32;
    const double loss = overfit_one_batch(c);
    INFO("final loss " << loss);
    CHECK(loss < 0.05);
}

TEST_CASE("padded vocabulary columns never receive probability or gradient") {
    GPT<float> m(tiny(true, true, false));
    m.init_weights(1);
    // Make padded rows non-zero: their logits must still be masked out of the loss.
    float* wte = m.param(m.layout().wte);
    for (int64_t i = 19 * 12; i < 128 * 12; i++) wte[i] = 5.0f;
    std::vector<int32_t> tok = {1, 2, 3}, tgt = {2, 3, 4};
    const double one = 1.0;
    m.forward(tok.data(), 1, 3);
    const auto s = m.loss(tgt.data(), CrossEntropyOptions{}, {&one, false}, true);
    CHECK(s.loss < 10.0);  // with padded columns counted the loss would jump by their large mass
    for (int64_t i = 0; i < 3; i++)
        for (int64_t j = 19; j < 128; j++) CHECK(m.logits()[i * 128 + j] == 0.0f);
}

TEST_CASE("a tiny model overfits one batch (loss < 0.05)") {
    ModelConfig c = tiny(true, true, false);
    c.n_embd = 32;
    c.n_head = 4;
    const double loss = overfit_one_batch(c);
    INFO("final loss " << loss);
    CHECK(loss < 0.05);
}

TEST_CASE("sampling: top-k = 1 and temperature 0 are greedy; top-k restricts; a seed repeats") {
    const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f, 2.0f, -3.0f};
    Rng rng(1);
    SampleOptions o;
    o.top_k = 1;
    CHECK(sample_token(logits.data(), 7, o, rng) == 1);  // the first of the tied maxima
    o.top_k = 0;
    o.temperature = 0.0;
    CHECK(sample_token(logits.data(), 7, o, rng) == 1);
    o.temperature = 1.0;
    o.top_k = 3;  // {1, 5, 3}
    std::vector<int> counts(7, 0);
    for (int i = 0; i < 3000; i++) counts[sample_token(logits.data(), 7, o, rng)]++;
    CHECK(counts[0] + counts[2] + counts[4] + counts[6] == 0);
    CHECK(counts[1] > 800);
    CHECK(counts[3] > 700);
    CHECK(counts[5] > 800);
    // whole vocabulary: the frequencies follow the softmax (loose: 3000 draws)
    o.top_k = 0;
    std::fill(counts.begin(), counts.end(), 0);
    for (int i = 0; i < 3000; i++) counts[sample_token(logits.data(), 7, o, rng)]++;
    double z = 0;
    for (float x : logits) z += std::exp(double(x));
    CHECK(close(counts[1] / 3000.0, std::exp(2.0) / z, 0.15, 0.0));
    CHECK(counts[6] < 20);

    ModelConfig c = tiny(true, true, false);
    c.init_std = 0.5;
    GPT<float> m(c);
    m.init_weights(3);
    SampleOptions so;
    so.max_new_tokens = 12;  // runs past block_size = 7: the window slides
    so.temperature = 0.9;
    so.top_k = 5;
    Rng a(42), b(42), d(43);
    const auto x = generate(m, {1, 2}, so, a), y = generate(m, {1, 2}, so, b),
               w = generate(m, {1, 2}, so, d);
    CHECK(x.size() == 14);
    CHECK(x == y);
    CHECK(x != w);
    // greedy generation picks the argmax of the logits at every step
    so.top_k = 1;
    Rng g(0);
    const auto greedy = generate(m, {4}, so, g);
    for (size_t t = 1; t < greedy.size(); t++) {
        const int64_t T = std::min<int64_t>(int64_t(t), c.block_size);
        m.forward(greedy.data() + t - T, 1, T);
        const float* row = m.logits() + (T - 1) * m.padded_vocab();
        CHECK(greedy[t] == int32_t(std::max_element(row, row + c.vocab_size) - row));
    }
}

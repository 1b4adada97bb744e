// AdamW against a hand computation, LR schedule values, clipping, and gradient accumulation.
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/ops/adamw.h"
#include "kernels/ops/global_norm.h"
#include "model/gpt.h"
#include "tests/helpers.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

using namespace zgpt;
using namespace zgpt::test;

TEST_CASE("AdamW: two steps against a hand computation") {
    // p = 1, g = 0.5 then -0.25; lr 0.1, betas (0.9, 0.99), eps 1e-8, wd 0.01.
    std::vector<double> p = {1.0}, m = {0}, v = {0};
    cpu::AdamWStep s;
    s.lr = 0.1;
    s.beta1 = 0.9;
    s.beta2 = 0.99;
    s.eps = 1e-8;
    s.weight_decay = 0.01;
    std::vector<double> g = {0.5};
    s.t = 1;
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), 1, s);
    // m = 0.05, v = 0.0025; mhat = 0.5, vhat = 0.25 -> update 0.5 / (0.5 + 1e-8)
    const double p1 = 1.0 * (1 - 0.1 * 0.01) - 0.1 * 0.5 / (0.5 + 1e-8);
    CHECK(close(m[0], 0.05, 1e-15, 0));
    CHECK(close(v[0], 0.0025, 1e-15, 0));
    CHECK(close(p[0], p1, 1e-15, 0));
    g = {-0.25};
    s.t = 2;
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), 1, s);
    const double m2 = 0.9 * 0.05 + 0.1 * -0.25, v2 = 0.99 * 0.0025 + 0.01 * 0.0625;
    const double p2 =
        p1 * (1 - 0.1 * 0.01) - 0.1 * (m2 / (1 - 0.81)) / (std::sqrt(v2 / (1 - 0.9801)) + 1e-8);
    CHECK(close(p[0], p2, 1e-14, 0));
}

namespace {
// A one-block model small enough to step by hand: matrices (decayed) beside norms and biases
ModelConfig tiny_model() {
    ModelConfig c;
    c.n_layer = 1;
    c.n_head = 2;
    c.n_embd = 8;
    c.block_size = 4;
    c.vocab_size = 5;
    return c;
}
}  // namespace

TEST_CASE("AdamW over the table: weight decay only on matrices; grad_scale scales gradients") {
    const ModelConfig c = tiny_model();
    GPT<float> model(c);
    model.init_weights(1);
    std::fill(model.grads.begin(), model.grads.end(), 0.0f);  // zero gradient: only decay moves p
    OptimConfig oc;
    oc.weight_decay = 0.5;
    AdamW opt(model.layout().table, oc);
    const std::vector<float> before = model.params;
    opt.step(model.params.data(), model.grads.data(), 0.1, 1.0);
    for (const ParamSpec& s : model.layout().table.specs()) {
        CAPTURE(s.name);
        const float b = before[s.offset], a = model.params[s.offset];
        CHECK(a == doctest::Approx(s.decay ? b * 0.95f : b).epsilon(1e-6));
    }
    // Scaling the gradient by k before the first step is invisible to Adam (up to eps): check that
    // grad_scale is applied to the gradient, by comparing with a pre-scaled gradient.
    std::vector<double> p1 = {1}, p2 = {1}, m1 = {0}, m2 = {0}, v1 = {0}, v2 = {0};
    std::vector<double> g = {2.0}, g_half = {1.0};
    cpu::AdamWStep s;
    s.eps = 0.5;  // large eps makes the step depend on the gradient's size
    s.grad_scale = 0.5;
    cpu::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), 1, s);
    s.grad_scale = 1.0;
    cpu::adamw_update(p2.data(), g_half.data(), m2.data(), v2.data(), 1, s);
    CHECK(p1[0] == p2[0]);
}

TEST_CASE("independent weight decay shrinks by weight_decay x lr / optim.lr, whatever optim.lr") {
    const ModelConfig c = tiny_model();
    for (double peak : {1e-3, 1e-1}) {
        CAPTURE(peak);
        GPT<float> model(c);
        model.init_weights(1);
        std::fill(model.grads.begin(), model.grads.end(), 0.0f);  // only the decay moves p
        OptimConfig oc;
        oc.lr = peak;
        oc.weight_decay = 1e-2;
        oc.weight_decay_independent = true;
        CHECK(decoupled_weight_decay(oc) == doctest::Approx(1e-2 / peak));
        AdamW opt(model.layout().table, oc);
        const std::vector<float> before = model.params;
        opt.step(model.params.data(), model.grads.data(), peak / 2, 1.0);  // half-way down
        for (const ParamSpec& s : model.layout().table.specs()) {
            CAPTURE(s.name);
            const float b = before[s.offset], a = model.params[s.offset];
            CHECK(a == doctest::Approx(s.decay ? b * (1 - 0.5e-2) : b).epsilon(1e-6));
        }
    }
    OptimConfig coupled;
    coupled.weight_decay = 0.1;
    CHECK(decoupled_weight_decay(coupled) == 0.1);
}

TEST_CASE("LR schedule: warmup, cosine / linear / constant decay, floor") {
    OptimConfig o;
    o.lr = 1.0;
    o.min_lr = 0.1;
    o.warmup_steps = 10;
    CHECK(close(learning_rate(o, 0, 110), 0.1, 1e-12, 0));
    CHECK(close(learning_rate(o, 9, 110), 1.0, 1e-12, 0));
    CHECK(close(learning_rate(o, 10, 110), 1.0, 1e-12, 0));
    CHECK(close(learning_rate(o, 60, 110), 0.55, 1e-12, 0));  // half way: cos = 0
    CHECK(close(learning_rate(o, 110, 110), 0.1, 1e-12, 0));
    CHECK(close(learning_rate(o, 500, 110), 0.1, 1e-12, 0));
    o.decay = "linear";
    CHECK(close(learning_rate(o, 35, 110), 1.0 - 0.25 * 0.9, 1e-12, 0));
    o.decay_steps = 60;
    CHECK(close(learning_rate(o, 35, 110), 0.55, 1e-12, 0));
    CHECK(close(learning_rate(o, 70, 110), 0.1, 1e-12, 0));
    o.decay = "constant";
    CHECK(learning_rate(o, 100, 110) == 1.0);
}

TEST_CASE("clipping: the norm is computed over everything and clipped to grad_clip") {
    std::vector<float> g = {3.0f, 4.0f, 0.0f, 12.0f};  // norm 13
    CHECK(close(std::sqrt(cpu::sum_of_squares(g.data(), 4)), 13.0, 1e-12, 0));
    CHECK(close(cpu::clip_scale(13.0, 1.0), 1.0 / (13.0 + 1e-6), 1e-12, 0));
    CHECK(cpu::clip_scale(0.5, 1.0) == 1.0);
    CHECK(cpu::clip_scale(100.0, 0.0) == 1.0);  // 0: off
    // a non-finite norm leaves the gradient unscaled (as std::min(1.0, NaN) did), so the NaN
    // reaches the weights and the trainer stops the run as diverged
    CHECK(cpu::clip_scale(std::nan(""), 1.0) == 1.0);
    CHECK(cpu::clip_scale(INFINITY, 1.0) == 0.0);
    std::vector<float> big(100'003, 0.5f);  // not a multiple of the chunking
    CHECK(close(cpu::sum_of_squares(big.data(), int64_t(big.size())), 0.25 * 100'003, 1e-12, 0));
}

TEST_CASE(
    "gradient accumulation, normalised once by the global valid count, equals one big batch") {
    ModelConfig c;
    c.n_layer = 1;
    c.n_head = 2;
    c.n_embd = 8;
    c.block_size = 6;
    c.vocab_size = 11;
    GPT<double> big(c), acc(c);
    big.init_weights(4);
    acc.init_weights(4);
    const int64_t T = 6;
    // Two micro-batches with different numbers of valid targets: per-batch means would differ.
    std::vector<int32_t> tok = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1};
    std::vector<int32_t> tgt = {2, 3, -100, -100, -100, 7, 8, 9, 10, 0, 1, 2};
    CrossEntropyOptions mean;
    mean.z_loss_weight = 1e-3;
    const double one = 1.0;
    big.zero_grad();
    big.forward(tok.data(), 2, T);
    const double big_loss = big.loss(tgt.data(), mean, {&one, false}, true).loss;
    big.backward();
    CrossEntropyOptions sum = mean;
    sum.reduction = Reduction::sum;
    const double inv_n = 1.0 / 9.0;  // 9 valid targets in the step
    acc.zero_grad();
    double acc_loss = 0;
    for (int k = 0; k < 2; k++) {
        acc.forward(tok.data() + k * T, 1, T);
        acc_loss += acc.loss(tgt.data() + k * T, sum, {&inv_n, false}, true).sum_loss * inv_n;
        acc.backward();
    }
    CHECK(close(acc_loss, big_loss, 1e-12, 0));
    const MaxError e =
        compare(acc.grads.data(), big.grads.data(), acc.num_parameters(), 1e-9, 1e-14);
    INFO("max abs " << e.abs);
    CHECK(e.ok);
}

// Finite-difference gradient checks, in double, of every CPU op family on odd sizes.
// Each op's scalar test loss is sum(out * R) for a fixed random R, so dL/dout = R.
#include <doctest/doctest.h>

#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "tests/helpers.h"

using namespace zgpt;
using namespace zgpt::test;
using Vec = std::vector<double>;

namespace {

double dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

// Checks the analytic gradient `analytic` of input `x` against central differences of `loss`.
void check_grad(const char* what, const std::function<double()>& loss, Vec& x,
                const Vec& analytic) {
    const Vec numeric = numeric_gradient(loss, x);
    const MaxError e = compare(analytic.data(), numeric.data(), int64_t(x.size()), 1e-6, 1e-8);
    INFO(what << ": max abs err " << e.abs << ", max rel err " << e.rel << " at " << e.worst);
    CHECK(e.ok);
}

}  // namespace

TEST_CASE("encoder: forward values and finite-difference gradient") {
    const int64_t B = 2, T = 5, C = 7, V = 11;
    Rng rng(1);
    Vec wte = random_vector<double>(rng, V * C), wpe = random_vector<double>(rng, T * C);
    std::vector<int32_t> tok = {3, 0, 10, 3, 7, 1, 1, 9, 2, 3};
    Vec R = random_vector<double>(rng, B * T * C), out(B * T * C);
    cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    CHECK(out[1 * C + 2] == wte[0 * C + 2] + wpe[1 * C + 2]);
    auto loss = [&] {
        cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
        return dot(out, R);
    };
    Vec dwte(V * C, 0), dwpe(T * C, 0);
    cpu::encoder_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
    check_grad("dwte", loss, wte, dwte);
    check_grad("dwpe", loss, wpe, dwpe);
}

TEST_CASE("layernorm: finite-difference gradient, with and without bias") {
    const int64_t N = 5, C = 13;
    for (bool with_bias : {true, false}) {
        CAPTURE(with_bias);
        Rng rng(2);
        Vec x = random_vector<double>(rng, N * C, 2.0), w = random_vector<double>(rng, C),
            b = random_vector<double>(rng, C), R = random_vector<double>(rng, N * C);
        Vec out(N * C), mean(N), rstd(N);
        const double* bias = with_bias ? b.data() : nullptr;
        auto loss = [&] {
            cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias,
                                   N, C);
            return dot(out, R);
        };
        loss();
        Vec dx(N * C, 0), dw(C, 0), db(C, 0);
        cpu::layernorm_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(),
                                x.data(), w.data(), mean.data(), rstd.data(), N, C);
        check_grad("dx", loss, x, dx);
        check_grad("dweight", loss, w, dw);
        if (with_bias) check_grad("dbias", loss, b, db);
    }
}

TEST_CASE("matmul: values against a naive triple loop, and finite-difference gradient") {
    const int64_t N = 7, C = 9, OC = 5;  // N not a multiple of the 4-row tile
    for (bool with_bias : {true, false}) {
        CAPTURE(with_bias);
        Rng rng(3);
        Vec x = random_vector<double>(rng, N * C), w = random_vector<double>(rng, OC * C),
            b = random_vector<double>(rng, OC), R = random_vector<double>(rng, N * OC), out(N * OC);
        const double* bias = with_bias ? b.data() : nullptr;
        cpu::matmul_forward(out.data(), x.data(), w.data(), bias, N, C, OC);
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) {
                double s = with_bias ? b[o] : 0;
                for (int64_t c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
                CHECK(close(out[n * OC + o], s, 1e-12, 1e-12));
            }
        auto loss = [&] {
            cpu::matmul_forward(out.data(), x.data(), w.data(), bias, N, C, OC);
            return dot(out, R);
        };
        Vec dx(N * C, 0), dw(OC * C, 0), db(OC, 0);
        cpu::matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(),
                             x.data(), w.data(), N, C, OC);
        check_grad("dinp", loss, x, dx);
        check_grad("dweight", loss, w, dw);
        if (with_bias) check_grad("dbias", loss, b, db);
    }
}

TEST_CASE("attention: causality and finite-difference gradient") {
    const int64_t B = 2, T = 5, C = 12, NH = 3;
    Rng rng(4);
    Vec qkv = random_vector<double>(rng, B * T * 3 * C), R = random_vector<double>(rng, B * T * C);
    Vec out(B * T * C), att(B * NH * T * T);
    auto loss = [&] {
        cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
        return dot(out, R);
    };
    loss();
    // The first position attends only to itself: its output is its own v.
    for (int64_t i = 0; i < C; i++) CHECK(close(out[i], qkv[2 * C + i], 1e-12, 1e-12));
    // Changing the last token's k/v must not change earlier outputs.
    Vec before = out;
    qkv[(T - 1) * 3 * C + C] += 1.0;
    qkv[(T - 1) * 3 * C + 2 * C] += 1.0;
    loss();
    for (int64_t t = 0; t < T - 1; t++)
        for (int64_t i = 0; i < C; i++) CHECK(out[t * C + i] == before[t * C + i]);
    Vec dqkv(B * T * 3 * C, 0);
    loss();
    cpu::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
    check_grad("dqkv", loss, qkv, dqkv);
}

TEST_CASE("attention in float (the vectorised layout) against the double reference") {
    // Odd sizes (head size 24 and 40, not a multiple of the vector width; T = 67), and logits
    // scaled up to about +-30 (peaked rows). float rounds each score's sum of hs products to about
    // hs eps |q||k| (eps = 6e-8: 1e-5 at hs = 40 and |q||k| ~ 4 scale^2), exp_vec is within 1.2e-7
    // relative, and the outputs and gradients sum T such terms: the bounds below are 1e-4 of each
    // tensor's largest magnitude.
    struct Case {
        int64_t B, T, C, NH;
    };
    for (const Case k :
         {Case{2, 67, 72, 3}, Case{1, 33, 80, 2}, Case{2, 64, 128, 4}, Case{1, 40, 48, 2}}) {
        for (double big : {1.0, 4.0}) {
            CAPTURE(k.T);
            CAPTURE(k.C);
            CAPTURE(big);
            Rng rng(uint64_t(k.T * 131 + k.C));
            const int64_t n = k.B * k.T * 3 * k.C, m = k.B * k.T * k.C;
            Vec qkv = random_vector<double>(rng, n, big), dout = random_vector<double>(rng, m);
            Vec out(m), att(k.B * k.NH * k.T * k.T), dqkv(n, 0.0);
            cpu::attention_forward(out.data(), att.data(), qkv.data(), k.B, k.T, k.C, k.NH);
            cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), k.B, k.T, k.C,
                                    k.NH);
            std::vector<float> qf(qkv.begin(), qkv.end()), df(dout.begin(), dout.end());
            std::vector<float> of(m), af(att.size()), dqf(n, 0.0f);
            cpu::attention_forward(of.data(), af.data(), qf.data(), k.B, k.T, k.C, k.NH);
            cpu::attention_backward(dqf.data(), df.data(), qf.data(), af.data(), k.B, k.T, k.C,
                                    k.NH);
            auto worst = [](const Vec& ref, const std::vector<float>& got) {
                double e = 0, mx = 0;
                for (size_t i = 0; i < ref.size(); i++) {
                    e = std::max(e, std::fabs(double(got[i]) - ref[i]));
                    mx = std::max(mx, std::fabs(ref[i]));
                }
                return std::make_pair(e, mx);
            };
            const auto [eo, mo] = worst(out, of);
            const auto [ea, ma] = worst(att, af);
            const auto [eg, mg] = worst(dqkv, dqf);
            INFO("out " << eo << " of " << mo << ", att " << ea << ", dqkv " << eg << " of " << mg);
            CHECK(eo <= 1e-4 * mo);
            CHECK(ea <= 1e-4 * ma);
            CHECK(eg <= 1e-4 * mg);
            for (int64_t b = 0; b < k.B * k.NH; b++)  // causal: zeros above the diagonal
                for (int64_t t = 0; t < k.T; t++)
                    for (int64_t t2 = t + 1; t2 < k.T; t2++)
                        REQUIRE(af[(b * k.T + t) * k.T + t2] == 0.0f);
        }
    }
}

TEST_CASE("gelu (tanh form): known values and finite-difference gradient") {
    Vec x = {-3.0, -1.0, -0.1, 0.0, 0.5, 1.0, 2.5}, out(x.size());
    cpu::gelu_forward(out.data(), x.data(), int64_t(x.size()));
    CHECK(out[3] == 0.0);
    CHECK(close(out[5], 0.8411919906082768, 1e-12, 0));  // 0.5 (1 + tanh(sqrt(2/pi) 1.044715))
    Rng rng(5);
    Vec R = random_vector<double>(rng, int64_t(x.size()));
    auto loss = [&] {
        cpu::gelu_forward(out.data(), x.data(), int64_t(x.size()));
        return dot(out, R);
    };
    Vec dx(x.size(), 0);
    cpu::gelu_backward(dx.data(), x.data(), R.data(), int64_t(x.size()));
    check_grad("dx", loss, x, dx);
}

TEST_CASE("gelu in float (vectorised tanh) equals the double reference") {
    // x over [-12, 12], the tails included: where tanh saturates, 1 - 2 / (1 + e^{2u}) must too.
    // Errors are taken relative to 1 + |x|, the scale of the terms. tanh_vec is within ~1.2e-7 of
    // tanh (Taylor truncation and a few roundings). The output multiplies that error by x / 2.
    // The gradient multiplies it by |0.5 - x th du|, which is up to ~2 where tanh has not
    // saturated, and adds its own ~10 float roundings. Bounds: 3e-7 for the output, 1e-6 for the
    // gradient. (Seen: 7.1e-8 and 3.2e-7; std::tanh in float gave 7.1e-8 and 8.5e-8.)
    std::vector<double> xd;
    for (double x = -12; x <= 12; x += 0.0137) xd.push_back(x);
    xd.push_back(0.0);
    xd.push_back(-90.0);  // exp clamps; GELU is -0 there
    xd.push_back(90.0);
    const int64_t n = int64_t(xd.size());
    std::vector<float> xf(xd.begin(), xd.end()), of(n), gf(n, 0.0f), ones(n, 1.0f);
    std::vector<double> od(n), gd(n, 0.0), onesd(n, 1.0), xr(xf.begin(), xf.end());
    cpu::gelu_forward(of.data(), xf.data(), n);
    cpu::gelu_backward(gf.data(), xf.data(), ones.data(), n);
    cpu::gelu_forward(od.data(), xr.data(), n);  // the reference at the same (float) inputs
    cpu::gelu_backward(gd.data(), xr.data(), onesd.data(), n);
    double worst_out = 0, worst_grad = 0;
    for (int64_t i = 0; i < n; i++) {
        // errors relative to the output's scale, 1 + |x| (cancellation near GELU's minimum)
        worst_out = std::max(worst_out, std::fabs(of[i] - od[i]) / (1 + std::fabs(xr[i])));
        worst_grad = std::max(worst_grad, std::fabs(gf[i] - gd[i]) / (1 + std::fabs(xr[i])));
    }
    CHECK(worst_out < 3e-7);
    CHECK(worst_grad < 1e-6);
    MESSAGE("float GELU: largest error " << worst_out << " (output), " << worst_grad << " (grad)");
}

TEST_CASE("residual: forward and finite-difference gradient") {
    Rng rng(6);
    const int64_t n = 11;
    Vec a = random_vector<double>(rng, n), b = random_vector<double>(rng, n),
        R = random_vector<double>(rng, n), out(n);
    auto loss = [&] {
        cpu::residual_forward(out.data(), a.data(), b.data(), n);
        return dot(out, R);
    };
    Vec da(n, 0), db(n, 0);
    cpu::residual_backward(da.data(), db.data(), R.data(), n);
    check_grad("da", loss, a, da);
    check_grad("db", loss, b, db);
}

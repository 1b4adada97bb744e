// Finite-difference gradient checks, in double, of every CPU op family on odd sizes. The float
// paths against the double reference are rows of test_kernels.
// Each op's scalar test loss is sum(out * R) for a fixed random R, so dL/dout = R.
#include <doctest/doctest.h>

#include "kernels/attention/attention.h"
#include "kernels/gemm/matmul.h"
#include "kernels/norms/layernorm.h"
#include "kernels/norms/rmsnorm.h"
#include "kernels/ops/encoder.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
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

TEST_CASE("bucket_tokens: the wte gradient's plan (entries of at most 128, partials, merges)") {
    // token 5: 129 positions (split 128 + 1), token 2: 256 (two full entries), token 9: 128
    // (one entry, not split), token 4: once; -1 (another shard's) twice, dropped
    const int seg = cuda::kBucketSegment;
    std::vector<int32_t> tok;
    for (int i = 0; i < 256; i++) tok.push_back(2);
    for (int i = 0; i < seg; i++) tok.push_back(9);
    for (int i = 0; i < seg + 1; i++) tok.push_back(5);
    tok.push_back(4);
    tok.push_back(-1);
    tok.push_back(-1);
    Rng rng(7);  // shuffled, so the positions of a token are not contiguous
    for (size_t i = tok.size() - 1; i > 0; i--) std::swap(tok[i], tok[rng.below(i + 1)]);
    const int64_t n = int64_t(tok.size());
    const cuda::TokenBuckets bk = cuda::bucket_tokens(tok.data(), n);
    CHECK(bk.token == std::vector<int32_t>{2, 2, 4, 5, 5, 9});
    CHECK(bk.offset == std::vector<int32_t>{0, seg, 2 * seg, 2 * seg + 1, 3 * seg + 1, 3 * seg + 2,
                                            4 * seg + 2});
    CHECK(bk.slot == std::vector<int32_t>{0, 1, -1, 2, 3, -1});
    CHECK(bk.merge_token == std::vector<int32_t>{2, 5});
    CHECK(bk.merge_offset == std::vector<int32_t>{0, 2, 4});
    CHECK(4 <= cuda::bucket_partial_rows(n));
    // every position of a token >= 0 once, grouped by token, in position order within a token
    REQUIRE(int64_t(bk.position.size()) == n - 2);
    for (size_t e = 0; e < bk.token.size(); e++)
        for (int32_t p = bk.offset[e]; p < bk.offset[e + 1]; p++) {
            CHECK(tok[bk.position[p]] == bk.token[e]);
            if (p > 0 && tok[bk.position[p - 1]] == bk.token[e])
                CHECK(bk.position[p - 1] < bk.position[p]);
        }
    // nothing to bucket
    const cuda::TokenBuckets none = cuda::bucket_tokens(tok.data(), 0);
    CHECK(none.entries() == 0);
    CHECK(none.offset == std::vector<int32_t>{0});
    CHECK(none.merge_offset == std::vector<int32_t>{0});
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

TEST_CASE("rmsnorm: the formula and finite-difference gradient") {
    const int64_t N = 3, C = 7;
    const double eps = 1e-5;
    Rng rng(11);
    Vec x = random_vector<double>(rng, N * C), w = random_vector<double>(rng, C),
        R = random_vector<double>(rng, N * C), out(N * C), rstd(N);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++) ss += x[n * C + c] * x[n * C + c];
        const double r = 1.0 / std::sqrt(ss / C + eps);
        for (int64_t c = 0; c < C; c++)
            CHECK(close(out[n * C + c], x[n * C + c] * r * w[c], 1e-14, 0));
    }
    auto loss = [&] {
        cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
        return dot(out, R);
    };
    Vec dx(N * C, 0), dw(C, 0);
    cpu::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
    check_grad("dinp", loss, x, dx);
    check_grad("dweight", loss, w, dw);
}

TEST_CASE(
    "rope: Hugging Face's rotate_half pairs, position 0 unchanged, finite-difference gradient") {
    const int64_t B = 2, T = 4, heads = 3, hs = 6, ld = 20;  // ld > heads * hs: strided rows
    const double theta = 50.0;
    Rng rng(12);
    Vec x = random_vector<double>(rng, B * T * ld), y = x;
    cpu::rope_forward(y.data(), B, T, heads, hs, ld, theta);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t row = (b * T + t) * ld;
            for (int64_t i = heads * hs; i < ld; i++) CHECK(y[row + i] == x[row + i]);
            for (int64_t h = 0; h < heads; h++)
                for (int64_t i = 0; i < hs / 2; i++) {
                    const double a = double(t) / std::pow(theta, 2.0 * i / hs);
                    const double x1 = x[row + h * hs + i], x2 = x[row + h * hs + i + hs / 2];
                    CHECK(close(y[row + h * hs + i], x1 * std::cos(a) - x2 * std::sin(a), 1e-14,
                                1e-15));
                    CHECK(close(y[row + h * hs + i + hs / 2], x2 * std::cos(a) + x1 * std::sin(a),
                                1e-14, 1e-15));
                }
        }
    for (int64_t i = 0; i < heads * hs; i++) CHECK(y[i] == x[i]);  // b 0, t 0: angle 0
    Vec R = random_vector<double>(rng, B * T * ld);
    auto loss = [&] {
        y = x;
        cpu::rope_forward(y.data(), B, T, heads, hs, ld, theta);
        return dot(y, R);
    };
    Vec dx = R;
    cpu::rope_backward(dx.data(), B, T, heads, hs, ld, theta);
    check_grad("dx", loss, x, dx);
}

TEST_CASE("swiglu: silu(gate) * up and finite-difference gradient") {
    const int64_t N = 3, H = 5;
    Rng rng(13);
    Vec x = random_vector<double>(rng, N * 2 * H), R = random_vector<double>(rng, N * H),
        out(N * H);
    for (double& v : x) v *= 3.0;  // reach the flat and the linear parts of silu
    cpu::swiglu_forward(out.data(), x.data(), N, H);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < H; i++) {
            const double g = x[n * 2 * H + i], u = x[n * 2 * H + H + i];
            CHECK(close(out[n * H + i], g / (1 + std::exp(-g)) * u, 1e-14, 1e-15));
        }
    auto loss = [&] {
        cpu::swiglu_forward(out.data(), x.data(), N, H);
        return dot(out, R);
    };
    Vec dx(N * 2 * H, 0);
    cpu::swiglu_backward(dx.data(), x.data(), R.data(), N, H);
    check_grad("dinp", loss, x, dx);
}

TEST_CASE("grouped-query attention: multi-head attention on repeated k/v heads; gradient") {
    const int64_t B = 2, T = 5, NH = 4, hs = 3, C = NH * hs;
    for (int64_t NKV : {1, 2}) {
        CAPTURE(NKV);
        const int64_t KVC = NKV * hs, Cq = C + 2 * KVC, group = NH / NKV;
        Rng rng(14);
        Vec qkv = random_vector<double>(rng, B * T * Cq), R = random_vector<double>(rng, B * T * C);
        // The same inputs for full multi-head attention: kv head g copied to heads g * group ...
        Vec full(B * T * 3 * C);
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t h = 0; h < NH; h++)
                for (int64_t i = 0; i < hs; i++) {
                    full[bt * 3 * C + h * hs + i] = qkv[bt * Cq + h * hs + i];
                    full[bt * 3 * C + C + h * hs + i] = qkv[bt * Cq + C + (h / group) * hs + i];
                    full[bt * 3 * C + 2 * C + h * hs + i] =
                        qkv[bt * Cq + C + KVC + (h / group) * hs + i];
                }
        Vec out(B * T * C), att(B * NH * T * T), want(B * T * C), att2(B * NH * T * T);
        cpu::attention_forward(want.data(), att2.data(), full.data(), B, T, C, NH);
        cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
        for (int64_t i = 0; i < B * T * C; i++) CHECK(close(out[i], want[i], 1e-13, 1e-14));
        // ... and the shared heads' gradients are their group's sums
        Vec dfull(B * T * 3 * C, 0), dqkv(B * T * Cq, 0);
        cpu::attention_backward(dfull.data(), R.data(), full.data(), att2.data(), B, T, C, NH);
        cpu::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH, NKV);
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t g = 0; g < NKV; g++)
                for (int64_t i = 0; i < hs; i++) {
                    double dk = 0, dv = 0;
                    for (int64_t h = g * group; h < (g + 1) * group; h++) {
                        dk += dfull[bt * 3 * C + C + h * hs + i];
                        dv += dfull[bt * 3 * C + 2 * C + h * hs + i];
                    }
                    CHECK(close(dqkv[bt * Cq + C + g * hs + i], dk, 1e-12, 1e-14));
                    CHECK(close(dqkv[bt * Cq + C + KVC + g * hs + i], dv, 1e-12, 1e-14));
                }
        auto loss = [&] {
            cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
            return dot(out, R);
        };
        check_grad("dqkv", loss, qkv, dqkv);
        // float's vectorised layout against the double reference, GQA included
        std::vector<float> qf(qkv.begin(), qkv.end()), of(B * T * C), af(B * NH * T * T),
            Rf(R.begin(), R.end()), dqf(B * T * Cq, 0.0f);
        cpu::attention_forward(of.data(), af.data(), qf.data(), B, T, C, NH, NKV);
        cpu::attention_backward(dqf.data(), Rf.data(), qf.data(), af.data(), B, T, C, NH, NKV);
        loss();
        for (int64_t i = 0; i < B * T * C; i++) CHECK(close(of[i], out[i], 1e-5, 1e-6));
        for (int64_t i = 0; i < B * T * Cq; i++) CHECK(close(dqf[i], dqkv[i], 1e-4, 1e-5));
    }
}

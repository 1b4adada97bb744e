// The CPU loss head: closed forms, z-loss algebra, ignore_index, reductions, grad_output, hard
// inputs, sharded == unsharded, option validation, and a finite-difference check in double.
#include <doctest/doctest.h>

#include <limits>

#include <cmath>

#include "kernels/core/check.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/loss_head/cross_entropy/slice_parts.h"
#include "tests/helpers.h"

using namespace zgpt;
using namespace zgpt::test;

namespace {

CrossEntropyOptions opts(double z, double eps, Reduction r = Reduction::mean) {
    CrossEntropyOptions o;
    o.z_loss_weight = z;
    o.label_smoothing = eps;
    o.reduction = r;
    return o;
}

struct HeadOut {
    CrossEntropySummary s;
    std::vector<double> loss, ce, z, lse;
    std::vector<float> dlogits;
};

// Runs the unsharded head on a copy of the logits.
HeadOut run_head(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t V,
                 const CrossEntropyOptions& o, std::vector<double> grad_output = {1.0}) {
    const int64_t N = int64_t(targets.size());
    HeadOut h;
    h.loss.resize(N);
    h.ce.resize(N);
    h.z.resize(N);
    h.lse.resize(N);
    h.dlogits = logits;
    h.s = cpu::cross_entropy(h.dlogits.data(), V, targets.data(), N, V, o,
                             {grad_output.data(), o.reduction == Reduction::none},
                             {h.loss.data(), h.ce.data(), h.z.data(), h.lse.data()}, true);
    return h;
}

std::vector<float> random_logits(Rng& rng, int64_t N, int64_t V, double scale) {
    return random_vector<float>(rng, N * V, scale);
}

}  // namespace

TEST_CASE("closed form: uniform logits and a two-way split") {
    // Uniform row over V = 5: ce = log 5, dlogits = (1/5 - [j == y]) / N.
    std::vector<float> logits(2 * 5, 0.75f);
    HeadOut h = run_head(logits, {2, 4}, 5, opts(0, 0));
    CHECK(close(h.s.loss, std::log(5.0), 1e-12, 0));
    CHECK(close(h.lse[0], 0.75 + std::log(5.0), 1e-12, 0));
    CHECK(close(h.dlogits[2], (0.2 - 1.0) / 2, 1e-6, 0));
    CHECK(close(h.dlogits[0], 0.2 / 2, 1e-6, 0));
    // logits [0, log 3], target 0: p0 = 1/4, ce = log 4; z-loss adds z * (log 4)^2.
    std::vector<float> two = {0.0f, float(std::log(3.0))};
    HeadOut z = run_head(two, {0}, 2, opts(0.01, 0));
    const double lse = std::log(1.0 + std::exp(double(two[1])));  // log 4 up to float rounding
    CHECK(close(z.lse[0], lse, 1e-7, 0));
    CHECK(close(z.ce[0], lse, 1e-7, 0));
    CHECK(close(z.z[0], 0.01 * lse * lse, 1e-7, 0));
    CHECK(close(z.s.loss, lse + 0.01 * lse * lse, 1e-7, 0));
    CHECK(close(z.dlogits[0], 0.25 * (1 + 0.02 * lse) - 1.0, 1e-6, 0));
    // Label smoothing: ce = (1 - eps)(lse - x_y) + eps (lse - mean x).
    HeadOut ls = run_head(two, {0}, 2, opts(0, 0.1));
    const double mean_x = double(two[1]) / 2;
    CHECK(close(ls.ce[0], 0.9 * lse + 0.1 * (lse - mean_x), 1e-7, 0));
    CHECK(close(ls.dlogits[1], 0.75 - 0.1 / 2, 1e-6, 0));
}

TEST_CASE("z = 0 is plain cross-entropy, bit for bit") {
    Rng rng(11);
    const int64_t N = 9, V = 37;
    const std::vector<float> logits = random_logits(rng, N, V, 3.0);
    std::vector<int32_t> t(N);
    for (auto& y : t) y = int32_t(rng.below(V));
    for (double g : {1.0, 0.37}) {
        HeadOut h = run_head(logits, t, V, opts(0, 0), {g});
        CHECK(h.s.sum_z_loss == 0.0);
        double lse_sq = 0;  // log^2 Z is reported even when it is not penalised
        for (int64_t i = 0; i < N; i++) lse_sq += h.lse[i] * h.lse[i];
        CHECK(h.s.sum_lse_sq == doctest::Approx(lse_sq).epsilon(1e-12));
        CHECK(h.s.sum_lse_sq > 0.0);
        for (int64_t i = 0; i < N; i++) {
            CHECK(h.z[i] == 0.0);
            CHECK(h.loss[i] == h.ce[i]);
            CHECK(h.ce[i] == h.lse[i] - double(logits[i * V + t[i]]));
        }
        CHECK(h.s.loss == h.s.sum_ce / double(N));
        // The textbook gradient g/N (softmax - onehot), rounded once: nothing else may leak in.
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < V; j++) {
                double p = std::exp(double(logits[i * V + j]) - h.lse[i]);
                if (j == t[i]) p -= 1.0;
                CHECK(h.dlogits[i * V + j] == float(g / double(N) * p));
            }
    }
}

TEST_CASE("z-loss gradient is added to the (label-smoothed) CE gradient, not multiplied into it") {
    Rng rng(12);
    const int64_t N = 6, V = 29;
    const std::vector<float> logits = random_logits(rng, N, V, 4.0);
    std::vector<int32_t> t(N);
    for (auto& y : t) y = int32_t(rng.below(V));
    const double z = 3e-3, eps = 0.2;
    HeadOut with = run_head(logits, t, V, opts(z, eps)),
            without = run_head(logits, t, V, opts(0, eps));
    for (int64_t i = 0; i < N; i++) {
        CHECK(close(with.loss[i] - without.loss[i], z * with.lse[i] * with.lse[i], 1e-9, 1e-12));
        for (int64_t j = 0; j < V; j++) {
            const double p = std::exp(double(logits[i * V + j]) - with.lse[i]);
            const double added = 2 * z * with.lse[i] * p / double(N);
            CHECK(close(double(with.dlogits[i * V + j]) - without.dlogits[i * V + j], added, 1e-4,
                        1e-8));
        }
    }
}

TEST_CASE(
    "finite-difference gradient of the head in double (z-loss, smoothing, ignore, all "
    "reductions)") {
    Rng rng(13);
    const int64_t N = 5, V = 13;
    std::vector<int32_t> t = {3, -100, 12, 0, 7};
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
        CAPTURE(reduction_name(r));
        std::vector<double> x = random_vector<double>(rng, N * V, 2.0);
        std::vector<double> g = r == Reduction::none ? std::vector<double>{0.5, 2.0, -1.5, 0.7, 1.3}
                                                     : std::vector<double>{0.8};
        const CrossEntropyOptions o = opts(0.05, 0.1, r);
        std::vector<double> rows(N);
        auto f = [&] {
            std::vector<double> copy = x;
            auto s = cpu::cross_entropy(copy.data(), V, t.data(), N, V, o,
                                        {g.data(), r == Reduction::none}, {rows.data()}, false);
            if (r != Reduction::none) return g[0] * s.loss;
            double acc = 0;  // the scalar whose gradient is sum_i g_i dloss_i
            for (int64_t i = 0; i < N; i++) acc += g[i] * rows[i];
            return acc;
        };
        std::vector<double> analytic = x;
        cpu::cross_entropy(analytic.data(), V, t.data(), N, V, o, {g.data(), r == Reduction::none},
                           {}, true);
        const std::vector<double> numeric = numeric_gradient(f, x);
        // The central difference (h = 1e-6) carries the rounding of two evaluations of f, a sum
        // of N V exp/log terms: about 16 eps |f| / h absolute (3.5e-8 at |f| = 10; truncation,
        // h^2 f''' / 6, is 1e-12). A 1e-9 floor held at -O3 by luck and failed at -O2 with the
        // sanitizers (2.7e-9). Relative 1e-6 still binds every gradient element above 0.035.
        const double noise =
            16 * std::numeric_limits<double>::epsilon() * std::max(1.0, std::fabs(f())) / 1e-6;
        const MaxError e = compare(analytic.data(), numeric.data(), N * V, 1e-6, noise);
        INFO("max abs " << e.abs << " rel " << e.rel << " (noise floor " << noise << ")");
        CHECK(e.ok);
        for (int64_t j = 0; j < V; j++) CHECK(analytic[1 * V + j] == 0.0);  // ignored row
    }
}

TEST_CASE("ignore_index: mean over valid rows only; ignored rows get exactly zero gradient") {
    Rng rng(14);
    const int64_t N = 6, V = 17;
    const std::vector<float> logits = random_logits(rng, N, V, 2.0);
    std::vector<int32_t> t = {1, -100, 5, -100, 16, 0};
    HeadOut h = run_head(logits, t, V, opts(1e-3, 0.1));
    CHECK(h.s.n_valid == 4);
    CHECK(close(h.s.loss, (h.loss[0] + h.loss[2] + h.loss[4] + h.loss[5]) / 4, 1e-12, 0));
    for (int64_t j = 0; j < V; j++) {
        CHECK(h.dlogits[1 * V + j] == 0.0f);
        CHECK(h.dlogits[3 * V + j] == 0.0f);
    }
    CHECK(h.loss[1] == 0.0);
    // The gradient rows still sum to zero: sum_j (p_j (1 + 2 z lse) - target_j) = 2 z lse.
    double rs = 0;
    for (int64_t j = 0; j < V; j++) rs += h.dlogits[j];
    CHECK(close(rs, 2e-3 * h.lse[0] / 4, 1e-4, 1e-7));
}

TEST_CASE("every row ignored: loss 0, zero gradient, no NaN, in every reduction") {
    Rng rng(15);
    const int64_t N = 4, V = 9;
    const std::vector<float> logits = random_logits(rng, N, V, 5.0);
    std::vector<int32_t> t(N, -100);
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
        CAPTURE(reduction_name(r));
        std::vector<double> g(r == Reduction::none ? N : 1, 1.0);
        HeadOut h = run_head(logits, t, V, opts(1e-4, 0.1, r), g);
        CHECK(h.s.loss == 0.0);
        CHECK(h.s.n_valid == 0);
        for (float d : h.dlogits) CHECK(d == 0.0f);
        for (double l : h.loss) CHECK(l == 0.0);
    }
}

TEST_CASE("reductions and grad_output: mean = sum / n, sum, none with per-row grad_output") {
    Rng rng(16);
    const int64_t N = 5, V = 23;
    const std::vector<float> logits = random_logits(rng, N, V, 2.0);
    std::vector<int32_t> t = {4, 0, -100, 22, 9};
    HeadOut mean = run_head(logits, t, V, opts(2e-4, 0.05, Reduction::mean), {0.37});
    HeadOut sum = run_head(logits, t, V, opts(2e-4, 0.05, Reduction::sum), {0.37});
    std::vector<double> per_row = {0.5, -2.0, 9.0, 1.25, 0.0};
    HeadOut none = run_head(logits, t, V, opts(2e-4, 0.05, Reduction::none), per_row);
    CHECK(close(mean.s.loss * 4, sum.s.loss, 1e-12, 0));
    CHECK(close(none.s.loss, sum.s.loss, 1e-12, 0));
    HeadOut unit = run_head(logits, t, V, opts(2e-4, 0.05, Reduction::sum), {1.0});
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < V; j++) {
            const double u = unit.dlogits[i * V + j];
            CHECK(close(sum.dlogits[i * V + j], 0.37 * u, 1e-6, 1e-9));
            CHECK(close(mean.dlogits[i * V + j], 0.37 / 4 * u, 1e-6, 1e-9));
            CHECK(close(none.dlogits[i * V + j], per_row[i] * u, 1e-6, 1e-9));
        }
    // A per-row grad_output with mean/sum (or a scalar with none) is a caller error.
    std::vector<float> copy = logits;
    CHECK_THROWS_AS(cpu::cross_entropy(copy.data(), V, t.data(), N, V, opts(0, 0, Reduction::mean),
                                       {per_row.data(), true}, {}, true),
                    Error);
}

TEST_CASE("hard rows: peaked (p -> 1), |logit| ~ 100, -inf entries") {
    const int64_t V = 1000;
    std::vector<float> logits(3 * V);
    Rng rng(17);
    for (int64_t j = 0; j < V; j++) {
        logits[j] = float(-100.0 + rng.uniform());               // row 0: peaked at 7 (logit 100)
        logits[V + j] = float(100.0 * (2 * rng.uniform() - 1));  // row 1: huge spread
        logits[2 * V + j] = j % 3 ? -INFINITY : float(rng.normal());  // row 2: mostly -inf
    }
    logits[7] = 100.0f;
    std::vector<int32_t> t = {7, 3, 6};
    HeadOut h = run_head(logits, t, V, opts(1e-4, 0, Reduction::sum));
    for (int i = 0; i < 3; i++) {
        // reference in long double, straightforwardly
        long double m = -INFINITY, d = 0;
        for (int64_t j = 0; j < V; j++) m = std::max<long double>(m, logits[i * V + j]);
        for (int64_t j = 0; j < V; j++) d += std::exp((long double)logits[i * V + j] - m);
        const long double lse = m + std::log(d);
        CHECK(close(h.lse[i], double(lse), 1e-12, 1e-12));
        CHECK(close(h.ce[i], double(lse - logits[i * V + t[i]]), 1e-9, 1e-15));
        for (int64_t j = 0; j < V; j++) {
            long double p = std::exp((long double)logits[i * V + j] - lse) * (1 + 2e-4L * lse);
            if (j == t[i]) p -= 1;
            CHECK(close(h.dlogits[i * V + j], double(p), 1e-6, 1e-30));
        }
    }
    // Row 0 is peaked: 1 - p is about 1000 e^-200, far below float epsilon, yet dlogits at the
    // target is exactly the fp64 value rounded once (2 z lse p - (1 - p)), not a rounding of p - 1.
    CHECK(std::isfinite(h.s.loss));
}

TEST_CASE("sharded (1, 2, 3 and 7 uneven shards) equals unsharded to 1e-6") {
    Rng rng(18);
    const int64_t N = 7, V = 101;
    std::vector<float> logits = random_logits(rng, N, V, 4.0);
    logits[2 * V + 50] = 60.0f;  // a peaked row whose max sits in a middle shard
    std::vector<int32_t> t = {0, 100, 50, -100, 33, 34, 67};
    const CrossEntropyOptions o = opts(1e-3, 0.1, Reduction::mean);
    HeadOut whole = run_head(logits, t, V, o, {0.9});
    for (std::vector<int64_t> cuts : std::vector<std::vector<int64_t>>{
             {0, 101}, {0, 60, 101}, {0, 1, 34, 101}, {0, 5, 6, 30, 51, 77, 100, 101}}) {
        CAPTURE(cuts.size() - 1);
        std::vector<RowStats> acc(N), part(N);
        for (size_t s = 0; s + 1 < cuts.size(); s++) {
            cpu::ce_shard_stats(part.data(), logits.data() + cuts[s], V, t.data(), N,
                                cuts[s + 1] - cuts[s], cuts[s], o.ignore_index);
            cpu::ce_merge_stats(acc.data(), part.data(), N);
        }
        std::vector<double> lse(N), row_grad(N), loss(N);
        const double g = 0.9;
        CrossEntropySummary s = cpu::ce_finalize(acc.data(), t.data(), N, V, o, {&g, false},
                                                 {loss.data()}, lse.data(), row_grad.data());
        std::vector<float> d(N * V);
        for (size_t k = 0; k + 1 < cuts.size(); k++)
            cpu::ce_shard_backward(d.data() + cuts[k], logits.data() + cuts[k], V, t.data(),
                                   lse.data(), row_grad.data(), N, cuts[k + 1] - cuts[k], cuts[k],
                                   V, o);
        CHECK(close(s.loss, whole.s.loss, 1e-6, 0));
        const MaxError e = compare(d.data(), whole.dlogits.data(), N * V, 1e-6, 1e-9);
        INFO("dlogits max abs " << e.abs << " rel " << e.rel);
        CHECK(e.ok);
        for (int64_t i = 0; i < N; i++) CHECK(close(loss[i], whole.loss[i], 1e-6, 1e-12));
    }
}

TEST_CASE("bad options are rejected with a clear error") {
    std::vector<float> logits(4, 0.0f);
    std::vector<int32_t> t = {1};
    const double one = 1.0;
    for (double z : {-1e-4, double(NAN), double(INFINITY)}) {
        CAPTURE(z);
        CHECK_THROWS_WITH_AS(cpu::cross_entropy(logits.data(), 4, t.data(), 1, 4, opts(z, 0),
                                                {&one, false}, {}, true),
                             doctest::Contains("z_loss_weight must be finite and >= 0"), Error);
    }
    for (double eps : {-0.1, 1.0, 1.5}) {
        CAPTURE(eps);
        CHECK_THROWS_WITH_AS(cpu::cross_entropy(logits.data(), 4, t.data(), 1, 4, opts(0, eps),
                                                {&one, false}, {}, true),
                             doctest::Contains("label_smoothing must be in [0, 1)"), Error);
    }
    std::vector<int32_t> bad = {4};
    CHECK_THROWS_WITH_AS(
        cpu::cross_entropy(logits.data(), 4, bad.data(), 1, 4, opts(0, 0), {&one, false}, {}, true),
        doctest::Contains("outside [0, 4)"), Error);
}

// fast's statistics pass reads a slice part by part for its max (each part as it lands) and whole
// for its sums; a thread must take the same chunks in both, or it sums values above its own max
// (and a thread whose max saw no chunk sums nothing). The first kernel with parts started each
// part at lo + tid and failed test_gpu on the H100 (docs/cross_entropy.md).
static std::vector<int> chunks_by_parts(int nv, int chunks, int parts, int threads, int tid,
                                        bool old) {
    const int size = zgpt::cuda::part_size(chunks, parts);
    std::vector<int> got;
    for (int p = 0; p < parts; p++) {
        const int lo = zgpt::cuda::part_lo(nv, p, size);
        const int hi = zgpt::cuda::part_hi(nv, p, parts, size);
        const int first = old ? lo + tid : p == 0 ? tid : zgpt::cuda::part_first(lo, tid, threads);
        for (int c = first; c < hi; c += threads) got.push_back(c);
    }
    return got;
}

TEST_CASE("fast's slice parts: a thread takes the same chunks part by part as over the whole") {
    int checked = 0, old_differs = 0;
    for (int threads : {256, 512, 1024})
        for (int parts : {1, 2, 3, 4})
            for (int nv : {0, 1, 5, 125, 512, 513, 1024, 1025, 6282, 10688})
                for (int tail : {0, 1}) {  // the copy's chunks: nv, or nv + 1 with a tail
                    const int chunks = nv + tail;
                    const int size = zgpt::cuda::part_size(chunks, parts);
                    // the parts tile [0, nv)
                    for (int p = 0; p < parts; p++) {
                        CHECK(zgpt::cuda::part_lo(nv, p, size) <=
                              zgpt::cuda::part_hi(nv, p, parts, size));
                        if (p + 1 < parts)
                            CHECK(zgpt::cuda::part_hi(nv, p, parts, size) ==
                                  zgpt::cuda::part_lo(nv, p + 1, size));
                    }
                    CHECK(zgpt::cuda::part_lo(nv, 0, size) == 0);
                    CHECK(zgpt::cuda::part_hi(nv, parts - 1, parts, size) == nv);
                    for (int tid = 0; tid < threads; tid++) {
                        std::vector<int> whole;
                        for (int c = tid; c < nv; c += threads) whole.push_back(c);
                        const auto got = chunks_by_parts(nv, chunks, parts, threads, tid, false);
                        if (got != whole) {
                            CAPTURE(threads);
                            CAPTURE(parts);
                            CAPTURE(nv);
                            CAPTURE(tid);
                            FAIL("a thread's chunks differ between the passes");
                        }
                        checked++;
                        old_differs +=
                            chunks_by_parts(nv, chunks, parts, threads, tid, true) != whole;
                    }
                }
    CHECK(checked == 4 * 10 * 2 * (256 + 512 + 1024));
    // the test would have caught the first version
    CHECK(old_differs > 0);
}

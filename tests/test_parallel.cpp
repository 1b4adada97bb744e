// The distributed path on the CPU, through the `local` communicator (ranks as threads): the
// collectives, the vocab-parallel loss head against one rank, data parallel and vocab parallel
// training against one rank with the same global batch, ZeRO-1, accumulation, resuming on another
// rank count, and a rank that fails or hangs.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/shard.h"
#include "kernels/core/check.h"
#include "kernels/gemm/matmul.h"
#include "model/parameters.h"
#include "tests/helpers.h"
#include "train/backends/backend.h"
#include "train/backends/backend_init.h"
#include "train/backends/zero1_share.h"
#include "train/backends/zero1_span_plan.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/dist/comm.h"
#include "train/timed_choices.h"
#include "train/trainer.h"
#include "train/vocab_parallel/vocab_parallel_head.h"
#include "train/vocab_parallel/vocab_sharded_arena.h"

using namespace zgpt;
using namespace zgpt::test;
namespace fs = std::filesystem;

namespace {

// Runs fn(rank, comm) on n threads; returns each rank's exception message ("" when none).
template <typename F>
std::vector<std::string> run_ranks(int n, F fn, double timeout_s = 30) {
    auto comms = make_local_group(n, timeout_s);
    std::vector<std::string> err(n);
    std::vector<std::thread> t;
    for (int r = 0; r < n; r++)
        t.emplace_back([&, r] {
            try {
                fn(r, *comms[r]);
            } catch (const std::exception& e) {
                err[r] = e.what();
                abort_local_group(*comms[r], "rank " + std::to_string(r) + " failed: " + e.what());
            }
        });
    for (auto& x : t) x.join();
    return err;
}

}  // namespace

TEST_CASE("GEMM choices of every rank: the lowest rank's line for each shape, on every rank") {
    // Lines: a shape key, then the candidate's index (train/timed_choices.h). Rank 1 runs a shape
    // rank 0 does not (B: a vocab-parallel shard of its own size) and one both run (A, where it
    // chose otherwise); rank 2 runs B and C; rank 3 is another GPU; rank 4 ran nothing.
    const std::string gpu = "# cuBLASLt 1, GPU X, 132 SMs\n";
    const std::vector<std::string> texts = {gpu + "1 1 1 a 0\n", gpu + "1 1 1 a 2\n2 2 2 b 3\n",
                                            gpu + "2 2 2 b 4\n3 3 3 c 5\n",
                                            "# cuBLASLt 1, GPU Y, 66 SMs\n4 4 4 d 6\n", ""};
    const std::string want = gpu + "1 1 1 a 0\n2 2 2 b 3\n3 3 3 c 5\n";
    std::vector<std::string> got(texts.size());
    const auto err = run_ranks(int(texts.size()), [&](int r, Communicator& c) {
        got[size_t(r)] = all_ranks_choices(c, texts[size_t(r)]);
    });
    for (size_t r = 0; r < texts.size(); r++) {
        CAPTURE(r);
        CHECK(err[r].empty());
        CHECK(got[r] == want);
    }
    // one rank: its own text; rank 0 empty: the first non-empty rank's lines
    std::string one;
    CHECK(run_ranks(1, [&](int, Communicator& c) { one = all_ranks_choices(c, texts[1]); })[0]
              .empty());
    CHECK(one == texts[1]);
    const std::vector<std::string> late = {"", texts[2]};
    std::vector<std::string> got2(2);
    const auto err2 = run_ranks(2, [&](int r, Communicator& c) {
        got2[size_t(r)] = all_ranks_choices(c, late[size_t(r)]);
    });
    CHECK(err2 == std::vector<std::string>(2));
    CHECK(got2 == std::vector<std::string>(2, texts[2]));
}

TEST_CASE("local communicator: every collective, in rank order, and sub-groups") {
    for (int n : {1, 2, 3}) {
        CAPTURE(n);
        // Values whose float sum depends on the order: ((1e8 + 1) + -1e8) + 0.5 is 0.5 in fp32.
        const float vals[3] = {1e8f, 1.0f, -1e8f};
        float expect = vals[0];
        for (int r = 1; r < n; r++) expect += vals[r];
        std::vector<std::vector<float>> got(n);
        const auto err = run_ranks(n, [&](int r, Communicator& c) {
            REQUIRE(c.size() == n);
            REQUIRE(c.rank() == r);
            std::vector<float> x = {vals[r], float(r)};
            c.all_reduce_sum(x.data(), 2);
            std::vector<double> g(2 * n);
            const double mine[2] = {double(r), 10.0 * r};
            c.all_gather(mine, g.data(), 2, CommType::f64);
            std::vector<int64_t> rs(2 * n);  // block b of rank r holds 100 r + b
            for (int b = 0; b < n; b++) rs[2 * b] = rs[2 * b + 1] = 100 * r + b;
            int64_t out[2];
            c.reduce_scatter_sum(rs.data(), out, 2, CommType::i64);
            double bc[2] = {double(r), -1};
            c.broadcast(bc, 2, CommType::f64, n - 1);
            c.barrier();
            got[r] = {x[0], x[1], float(g[2 * (n - 1) + 1]), float(out[0]), float(bc[0])};
        });
        for (int r = 0; r < n; r++) {
            REQUIRE(err[r] == "");
            CHECK(got[r][0] == expect);                  // rank order, bit for bit
            CHECK(got[r][1] == float(n * (n - 1) / 2));  // 0 + 1 + ... + n-1
            CHECK(got[r][2] == float(10 * (n - 1)));     // all_gather: the last rank's block
            CHECK(got[r][3] == float(100 * n * (n - 1) / 2 + n * r));  // sum of block r
            CHECK(got[r][4] == float(n - 1));  // broadcast from the last rank
        }
    }
    // split: colors {0: ranks 0, 2, 4; 1: ranks 1, 3}, keys reverse the order inside a group.
    std::vector<std::array<int, 3>> seen(5);
    const auto err = run_ranks(5, [&](int r, Communicator& c) {
        auto g = c.split(r % 2, -r);
        double x = double(r);
        g->all_reduce_sum(&x, 1);
        seen[r] = {g->rank(), g->size(), int(x)};
    });
    for (int r = 0; r < 5; r++) REQUIRE(err[r] == "");
    CHECK(seen[4] == std::array<int, 3>{0, 3, 6});
    CHECK(seen[2] == std::array<int, 3>{1, 3, 6});
    CHECK(seen[0] == std::array<int, 3>{2, 3, 6});
    CHECK(seen[3] == std::array<int, 3>{0, 2, 4});
    CHECK(seen[1] == std::array<int, 3>{1, 2, 4});
}

TEST_CASE("local communicator: a rank that fails or hangs stops the others within the timeout") {
    using Clock = std::chrono::steady_clock;
    SUBCASE("a rank throws: its peers, in the world and in a sub-group, get its message") {
        const auto t0 = Clock::now();
        const auto err = run_ranks(
            4,
            [&](int r, Communicator& c) {
                auto g = c.split(r / 2, r);  // ranks 0 and 1 wait in a sub-group collective
                if (r == 3) throw Error("out of memory (test)");
                double x = 1;
                if (r < 2) g->all_reduce_sum(&x, 1);  // rank 0 and 1 complete this one
                c.all_reduce_sum(&x, 1);              // rank 3 never arrives here
            },
            60);
        CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 10);  // not the timeout
        CHECK(err[3] == "out of memory (test)");
        for (int r : {0, 1, 2}) CHECK(err[r] == "rank 3 failed: out of memory (test)");
    }
    SUBCASE("a rank hangs: the others stop after the timeout, naming it") {
        const auto t0 = Clock::now();
        std::vector<double> failed_at(3, -1);
        const auto err = run_ranks(
            3,
            [&](int r, Communicator& c) {
                if (r == 2) {  // stuck outside any collective for 2 s, then leaves
                    std::this_thread::sleep_for(std::chrono::seconds(2));
                    return;
                }
                double x = 1;
                try {
                    c.all_reduce_sum(&x, 1);
                } catch (...) {
                    failed_at[r] = std::chrono::duration<double>(Clock::now() - t0).count();
                    throw;
                }
            },
            0.5);
        for (int r : {0, 1}) {
            CAPTURE(r);
            CHECK(err[r].find("rank(s) 2 of 3 did not reach all_reduce within") !=
                  std::string::npos);
            CHECK(failed_at[r] >= 0.4);  // after the timeout, not before, and not at the end
            CHECK(failed_at[r] < 1.9);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The vocab-parallel head against one rank, in double (so the only differences are summation
// order: relative 1e-6 leaves a margin of ~1e9 over double rounding).

namespace {

struct HeadCase {
    const char* name;
    CrossEntropyOptions opts;
    bool hard;  // peaked rows and large logits
};

}  // namespace

TEST_CASE("vocab-parallel head with 2, 3 and 7 ranks equals one rank (loss, dh, dW)") {
    const int64_t N = 5, C = 8, V = 53;  // 53 rows split unevenly by 2, 3 and 7
    std::vector<HeadCase> cases;
    {
        CrossEntropyOptions o;
        o.reduction = Reduction::sum;
        cases.push_back({"plain", o, false});
        o.z_loss_weight = 1e-3;
        o.label_smoothing = 0.1;
        cases.push_back({"z-loss + smoothing", o, false});
        o.reduction = Reduction::mean;
        o.ignore_index = 7;  // some targets are 7: ignored rows
        cases.push_back({"mean, ignore_index, z, smoothing, hard rows", o, true});
    }
    for (const HeadCase& hc : cases) {
        for (int P : {2, 3, 7}) {
            CAPTURE(hc.name);
            CAPTURE(P);
            const int64_t NA = N * P;
            Rng rng(1234 + P);
            std::vector<double> H = random_vector<double>(rng, NA * C);
            std::vector<double> W = random_vector<double>(rng, V * C, hc.hard ? 3.0 : 0.5);
            std::vector<int32_t> y(NA);
            for (auto& t : y) t = int32_t(rng.uniform() * V) % V;
            y[1] = 7;
            y[NA - 1] = 7;
            if (hc.hard) {  // a peaked row (p_y -> 1) and one of |logits| ~ 100
                for (int64_t c = 0; c < C; c++) H[2 * C + c] = 30.0 * W[y[2] * C + c];
                for (int64_t c = 0; c < C; c++) H[3 * C + c] *= 20.0;
            }
            const double g = 0.37;  // never 1: the backward must multiply by it

            // One rank: the whole head on all rows.
            std::vector<double> logits(NA * V), dW1(V * C, 0.0), dH1(NA * C, 0.0), rows1(NA);
            cpu::matmul_forward(logits.data(), H.data(), W.data(), (const double*)nullptr, NA, C,
                                V);
            CrossEntropyRows r1;
            r1.loss = rows1.data();
            const CrossEntropySummary s1 = cpu::cross_entropy(logits.data(), V, y.data(), NA, V,
                                                              hc.opts, {&g, false}, r1, true);
            cpu::matmul_backward(dH1.data(), dW1.data(), (double*)nullptr, logits.data(), H.data(),
                                 W.data(), NA, C, V);

            // P ranks, each with N of the rows.
            std::vector<std::vector<double>> dW(P, std::vector<double>(V * C, 0.0));
            std::vector<double> dH(NA * C), rowsP(NA), loss(P);
            std::vector<int64_t> nvalid(P);
            const auto err = run_ranks(P, [&](int r, Communicator& c) {
                VocabParallelHead<double> head;
                CrossEntropyRows rr;
                rr.loss = rowsP.data() + r * N;
                const VocabShard sh = vocab_shard(V, P, r);  // the rank holds its rows only
                const CrossEntropySummary s = head.run(
                    c, H.data() + r * N * C, y.data() + r * N, N, C, W.data() + sh.v0 * C,
                    dW[r].data() + sh.v0 * C, V, hc.opts, {&g, false}, dH.data() + r * N * C, rr);
                loss[r] = s.loss;
                nvalid[r] = s.n_valid;
            });
            for (int r = 0; r < P; r++) REQUIRE(err[r] == "");
            double total = 0;
            int64_t nv = 0;
            for (int r = 0; r < P; r++) {
                total += loss[r];
                nv += nvalid[r];
            }
            CHECK(nv == s1.n_valid);
            CHECK(close(total, s1.loss, 1e-6, 0));  // not "+ log(P)"
            CHECK(compare(rowsP.data(), rows1.data(), NA, 1e-6, 1e-12).ok);
            const MaxError eh = compare(dH.data(), dH1.data(), NA * C, 1e-6, 1e-12);
            CHECK_MESSAGE(eh.ok, "dh max abs " << eh.abs << " rel " << eh.rel);
            // Each rank wrote only its shard's rows; together they are the whole dW.
            std::vector<double> dWsum(V * C, 0.0);
            for (int r = 0; r < P; r++) {
                const VocabShard sh = vocab_shard(V, P, r);
                for (int64_t i = 0; i < V * C; i++) {
                    const bool mine = i >= sh.v0 * C && i < (sh.v0 + sh.V_local) * C;
                    if (!mine) REQUIRE(dW[r][i] == 0.0);
                    dWsum[i] += dW[r][i];
                }
            }
            const MaxError ew = compare(dWsum.data(), dW1.data(), V * C, 1e-6, 1e-12);
            CHECK_MESSAGE(ew.ok, "dW max abs " << ew.abs << " rel " << ew.rel);
        }
    }
}

TEST_CASE("vocab-parallel head memory per rank is about 1/P of one rank's head") {
    // One rank doing the group's P N rows holds [P N, V] logits; each of P ranks holds
    // [P N, V / P] plus the gathered hidden states and statistics.
    const int64_t N = 64, C = 16, V = 8000;
    for (int P : {1, 2, 4, 8}) {
        CAPTURE(P);
        Rng rng(5);
        const std::vector<float> H = random_vector<float>(rng, N * P * C);
        const std::vector<float> W = random_vector<float>(rng, V * C, 0.1);
        std::vector<int32_t> y(N * P, 1);
        std::vector<size_t> bytes(P);
        const double g = 1.0;
        CrossEntropyOptions o;
        o.reduction = Reduction::sum;
        const auto err = run_ranks(P, [&](int r, Communicator& c) {
            VocabParallelHead<float> head;
            const VocabShard sh = vocab_shard(V, P, r);
            std::vector<float> dW(sh.V_local * C), dh(N * C);
            head.run(c, H.data() + r * N * C, y.data() + r * N, N, C, W.data() + sh.v0 * C,
                     dW.data(), V, o, {&g, false}, dh.data());
            bytes[r] = head.buffer_bytes();
        });
        for (int r = 0; r < P; r++) REQUIRE(err[r] == "");
        const double one_rank_logits = double(N * P) * V * 4;
        for (int r = 0; r < P; r++) {
            MESSAGE("P = " << P << ": " << bytes[r] / 1e6 << " MB against " << one_rank_logits / 1e6
                           << " MB of one rank's logits");
            CHECK(double(bytes[r]) <= 1.15 * one_rank_logits / P);
            CHECK(double(bytes[r]) >= 0.95 * one_rank_logits / P);
        }
    }
}

TEST_CASE("vocab shards: contiguous, uneven when V does not divide, covering [0, V)") {
    for (int P : {1, 2, 3, 7}) {
        int64_t next = 0;
        for (int r = 0; r < P; r++) {
            const VocabShard s = vocab_shard(50, P, r);
            CHECK(s.v0 == next);
            CHECK(s.V_local >= 50 / P);
            CHECK(s.V_local <= 50 / P + 1);
            next += s.V_local;
        }
        CHECK(next == 50);
    }
    CHECK_THROWS_AS(vocab_shard(5, 7, 0), Error);
}

TEST_CASE("shard order: rows dealt out in turn, ids a bijection, clustered ids spread") {
    // Shard p stores the vocabulary's rows p, p + P, ...; in shard order they are the ids
    // [v0, v0 + V_local) of vocab_shard. Ids past the vocabulary and negative (ignored) ones are
    // kept. Ids below V / 4, as a tokenizer's most used cluster, land in every shard alike.
    for (const int64_t V : {int64_t(50), int64_t(67), int64_t(1000)}) {
        for (int P : {1, 2, 3, 7}) {
            CAPTURE(V);
            CAPTURE(P);
            std::vector<int> seen(V, 0), low(P, 0);
            for (int64_t y = 0; y < V; y++) {
                const int32_t s = shard_order_id(int32_t(y), V, P);
                REQUIRE(s >= 0);
                REQUIRE(s < V);
                seen[s]++;
                const int p = int(y % P);
                const VocabShard sh = vocab_shard(V, P, p);
                CHECK(s >= sh.v0);
                CHECK(s < sh.v0 + sh.V_local);
                CHECK(vocab_row_of_shard(P, p, s - sh.v0) == y);
                if (y < V / 4) low[p]++;
            }
            CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
            for (int p = 0; p < P; p++) CHECK(std::abs(low[p] - int(V / 4 / P)) <= 1);
            for (int32_t y : {-100, -1, int32_t(V), int32_t(V + 5)})
                CHECK(shard_order_id(y, V, P) == y);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Training with several ranks against one rank with the same global batch.

namespace {

const fs::path& data_dir() {
    static const fs::path d = [] {
        const fs::path dir = fs::temp_directory_path() / "zgpt_test_parallel";
        fs::remove_all(dir);
        fs::create_directories(dir);
        Rng rng(7);
        std::vector<uint32_t> toks(40000);
        // Learnable structure: mostly a repeating pattern, some noise.
        for (size_t i = 0; i < toks.size(); i++)
            toks[i] = rng.uniform() < 0.8 ? uint32_t((i * 7 + i / 5) % 67)
                                          : uint32_t(rng.uniform() * 67) % 67;
        write_shard((dir / "train_000.bin").string(), toks);
        write_shard((dir / "val_000.bin").string(),
                    std::vector<uint32_t>(toks.begin(), toks.begin() + 4000));
        return dir;
    }();
    return d;
}

Config tiny_config(const std::string& name, int batch, int ranks) {
    Config c;
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.n_embd = 16;
    c.model.block_size = 16;
    c.model.vocab_size = 67;  // prime: no rank count divides it
    c.data.train = (data_dir() / "train_*.bin").string();
    c.data.val = (data_dir() / "val_*.bin").string();
    c.data.shuffle = true;
    c.train.batch_size = batch;
    c.train.max_steps = 10;
    c.train.eval_every = 5;
    c.train.eval_batches = 2;
    c.train.log_every = 100;
    c.train.threads = 2;
    c.train.device = "cpu";
    c.train.checkpoint_every = 5;
    c.train.out_dir = (data_dir() / "runs").string();
    c.train.run_name = name;
    c.optim.lr = 1e-2;
    c.optim.warmup_steps = 2;
    c.optim.decay_steps = 10;  // the schedule does not depend on max_steps (runs cut at 5)
    c.loss.z_loss_weight = 1e-3;
    c.loss.label_smoothing = 0.05;
    // Targets equal to 3 are ignored: ranks then hold different numbers of valid tokens, and
    // only one normalisation by the global count matches one rank.
    c.loss.ignore_index = 3;
    c.parallel.local_ranks = ranks;
    c.parallel.timeout_s = 60;
    return c;
}

struct RunOut {
    std::vector<double> loss, val;
    std::vector<float> params, m, v;
    std::string dir;
};

RunOut run(const Config& c) {
    const TrainResult r = train(c, "", "test");
    RunOut o;
    o.dir = r.run_dir;
    std::ifstream f(fs::path(r.run_dir) / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) o.loss.push_back(j["loss"]);
        if (j.contains("val_loss")) o.val.push_back(j["val_loss"]);
    }
    const auto ck = list_checkpoints(r.run_dir + "/checkpoints");
    REQUIRE(!ck.empty());
    const CheckpointState st = load_checkpoint(ck[0], make_gpt_layout(c.model).table);
    o.params = st.params;
    o.m = st.m;
    o.v = st.v;
    return o;
}

// The bound for runs that differ only in fp32 summation order (per-rank partial sums added in
// rank order instead of one pass over the global batch). Each gradient element then differs by a
// few ulps of the sum of its terms' magnitudes (~1e-7 relative). The loss, a smooth function of
// the weights, follows at that order: 1e-6 relative (seen: at most 2.5e-8). AdamW's m/sqrt(v) is
// insensitive to a relative error, except where a gradient element is itself rounding noise
// (cancelling terms): there the update can change by up to lr per step; a few such elements over
// 10 steps at lr = 1e-2 stay under 1e-4 absolute (seen: at most 2.0e-5).
void check_same_run(const RunOut& a, const RunOut& b) {
    REQUIRE(a.loss.size() == b.loss.size());
    REQUIRE(a.val.size() == b.val.size());
    double worst = 0;
    for (size_t i = 0; i < a.loss.size(); i++) {
        CAPTURE(i);
        CHECK(close(a.loss[i], b.loss[i], 1e-6, 0));
        worst = std::max(worst, std::fabs(a.loss[i] - b.loss[i]) / std::fabs(b.loss[i]));
    }
    for (size_t i = 0; i < a.val.size(); i++) CHECK(close(a.val[i], b.val[i], 1e-6, 0));
    const MaxError e =
        compare(a.params.data(), b.params.data(), int64_t(a.params.size()), 0.0, 1e-4);
    CHECK_MESSAGE(e.ok, "weights: max abs " << e.abs << " rel " << e.rel << " at " << e.worst);
    MESSAGE("largest differences: loss " << worst << " relative, weights " << e.abs);
}

// How a cut run is continued: ranks, the per-rank batch (the global batch unchanged), the
// vocab-parallel group and ZeRO-1.
struct Layout {
    int ranks, batch, vp;
    bool zero1 = false;
};

// `base` resumed, in `k`'s layout, from a copy of the run directory `cut` named `name`.
RunOut resumed(const Config& base, const std::string& cut, const std::string& name,
               const Layout& k) {
    const fs::path dst = data_dir() / "runs" / name;
    fs::remove_all(dst);
    fs::copy(data_dir() / "runs" / cut, dst, fs::copy_options::recursive);
    Config c = base;
    c.train.run_name = name;
    c.train.resume = "auto";
    c.train.batch_size = k.batch;
    c.parallel.local_ranks = k.ranks;
    c.parallel.vocab_parallel = k.vp;
    c.parallel.zero1 = k.zero1;
    return run(c);
}

}  // namespace

TEST_CASE("data parallel with 2 and 3 ranks equals one rank with the same global batch") {
    const RunOut one = run(tiny_config("dp1", 6, 1));
    CHECK(one.loss.size() == 10);
    CHECK(one.loss.back() < one.loss.front());
    for (int R : {2, 3}) {
        CAPTURE(R);
        const RunOut many = run(tiny_config("dp" + std::to_string(R), 6 / R, R));
        check_same_run(many, one);
    }
}

TEST_CASE("gradient accumulation x data parallel equals one big batch") {
    const RunOut one = run(tiny_config("acc1", 6, 1));
    Config c = tiny_config("acc3x2", 1, 3);
    c.train.grad_accum = 2;
    c.train.eval_batches = 4;  // 4 x 3 ranks x 1 = the same 12 validation windows as 2 x 6
    // One rank's micro-batch k takes windows [(k R + r) B, ...): with accumulation the global
    // batch of a step is the 6 windows of two consecutive loader batches, the same 6 windows.
    const RunOut many = run(c);
    check_same_run(many, one);
}

TEST_CASE("ZeRO-1 (sharded AdamW moments) is bit-identical to replicated AdamW") {
    Config c = tiny_config("zero_off", 2, 3);
    const RunOut plain = run(c);
    c.parallel.zero1 = true;
    c.train.run_name = "zero_on";
    const RunOut zero = run(c);
    CHECK(zero.loss == plain.loss);
    CHECK(zero.params == plain.params);
    CHECK(zero.m == plain.m);  // the checkpoint gathered every rank's slice
}

TEST_CASE("vocab parallel (3 and 7 ranks, uneven shards), tied and untied, equals one rank") {
    for (bool tied : {true, false}) {
        for (int R : {3, 7}) {
            CAPTURE(tied);
            CAPTURE(R);
            const std::string tag = std::string(tied ? "tied" : "untied") + std::to_string(R);
            Config c1 = tiny_config("vp1_" + tag, 7, 1);
            c1.model.tie_embeddings = tied;
            c1.train.max_steps = 6;
            c1.train.checkpoint_every = 0;
            c1.train.batch_size = R;  // one sequence per rank below
            const RunOut one = run(c1);
            Config c = c1;
            c.train.run_name = "vp_" + tag;
            c.train.batch_size = 1;
            c.parallel.local_ranks = R;
            c.parallel.vocab_parallel = R;
            const RunOut many = run(c);
            check_same_run(many, one);
        }
    }
}

TEST_CASE("data parallel x vocab parallel: 4 ranks in 2 groups of 2 equals one rank") {
    const RunOut one = run(tiny_config("dpvp1", 8, 1));
    Config c = tiny_config("dpvp4", 2, 4);
    c.parallel.vocab_parallel = 2;
    check_same_run(run(c), one);
}

TEST_CASE("a Llama-style model: data x vocab parallel, and ZeRO-1, equal one rank") {
    // RMSNorm, rotary positions (no position table for the split embedding to add), SwiGLU and
    // one key/value head for two query heads, through the same parallel paths as GPT-2's block
    auto llama = [](Config c) {
        c.model.norm = "rmsnorm";
        c.model.position = "rope";
        c.model.mlp = "swiglu";
        c.model.mlp_multiple_of = 8;
        c.model.n_kv_head = 1;
        c.model.tie_embeddings = false;
        return c;
    };
    const RunOut one = run(llama(tiny_config("llama1", 8, 1)));
    CHECK(one.loss.back() < one.loss.front());
    Config c = llama(tiny_config("llama_dpvp4", 2, 4));
    c.parallel.vocab_parallel = 2;
    check_same_run(run(c), one);
    c.parallel.zero1 = true;
    c.train.run_name = "llama_dpvp4_zero";
    check_same_run(run(c), one);
}

TEST_CASE("model.init_jitter: every weight moved by about that fraction, zeros kept, per seed") {
    Config c = tiny_config("jitter", 1, 1);
    const std::vector<float> base = initial_params(c);
    c.model.init_jitter = 1e-3;
    const std::vector<float> a = initial_params(c), again = initial_params(c);
    c.model.init_jitter_seed = 2;
    const std::vector<float> b = initial_params(c);
    REQUIRE(a.size() == base.size());
    CHECK(a == again);  // the seed fixes the draws
    CHECK(a != b);
    double sq = 0;
    int64_t n = 0, zeros_moved = 0, too_far = 0;
    for (size_t i = 0; i < base.size(); i++) {
        if (base[i] == 0) {
            zeros_moved += a[i] != 0;
            continue;
        }
        const double rel = (double(a[i]) - base[i]) / base[i];
        sq += rel * rel;
        too_far += std::fabs(rel) > 6e-3;  // 6 standard deviations
        n++;
    }
    CHECK(zeros_moved == 0);
    CHECK(too_far == 0);
    CHECK(std::sqrt(sq / double(n)) == doctest::Approx(1e-3).epsilon(0.05));  // the draws' sd
}

TEST_CASE("a split vocabulary: each rank stores 1/P of the tables, whole checkpoints round-trip") {
    // Tied and untied, P = 2 and 3 (V = 67: uneven shards). Each rank's backend holds its shard's
    // rows; params() gathers the whole model, identical to the initial weights of one rank.
    for (bool tied : {true, false}) {
        for (int P : {2, 3}) {
            CAPTURE(tied);
            CAPTURE(P);
            Config c = tiny_config("store", 2, P);
            c.model.tie_embeddings = tied;
            const std::vector<float> init = initial_params(c);
            const GptLayout whole = make_gpt_layout(c.model);
            const int64_t C = c.model.n_embd, tables = tied ? 1 : 2;
            const int64_t table_rows = vocab_table_rows(c.model, P);
            CHECK(table_rows < padded_vocab_size(c.model.vocab_size));
            std::vector<int64_t> stored(P);
            std::vector<std::vector<float>> gathered(P);
            const auto err = run_ranks(P, [&](int r, Communicator& group) {
                auto peers = make_single_rank_comm();
                const auto b = make_backend("cpu", c, {&group, peers.get()});
                stored[r] = b->stored_parameters();
                CHECK(b->num_parameters() == whole.table.total());
                gathered[r] = b->params();
            });
            for (int r = 0; r < P; r++) {
                REQUIRE(err[r] == "");
                CHECK(stored[r] ==
                      whole.table.total() -
                          tables * (padded_vocab_size(c.model.vocab_size) - table_rows) * C);
                CHECK(gathered[r] == init);
            }
        }
    }
}

TEST_CASE("a split arena stores each shard's rows in shard order and puts them back") {
    // wte's local row j of shard p is the whole table's row p + j P; put() of every shard gives
    // the whole arena back; the ids the model takes, and an ignore_index among them, are in the
    // same order.
    Config c = tiny_config("order", 2, 3);
    c.model.tie_embeddings = false;
    const std::vector<float> init = initial_params(c);
    const int64_t C = c.model.n_embd, V = c.model.vocab_size;
    for (int P : {2, 3}) {
        CAPTURE(P);
        std::vector<float> back(init.size(), 0.0f);
        for (int p = 0; p < P; p++) {
            const VocabShardedArena arena(c.model, P, p);
            const std::vector<float> local = arena.take_shard(init);
            const VocabShard sh = arena.shard();
            for (int idx : {arena.whole().wte, arena.whole().lm_head}) {
                const int64_t w = arena.whole().table[idx].offset;
                const int64_t l = arena.local().table[idx].offset;
                for (int64_t j = 0; j < sh.V_local; j++)
                    CHECK(std::equal(local.begin() + l + j * C, local.begin() + l + (j + 1) * C,
                                     init.begin() + w + (p + j * P) * C));
            }
            arena.put(local.data(), p, p == 0, back);
            std::vector<int32_t> scratch;
            const int32_t y = int32_t(V - 1 - p);
            CHECK(*arena.in_shard_order(&y, 1, scratch) == shard_order_id(y, V, P));
            const std::vector<int32_t> ids = {3, -100, int32_t(V - 1), int32_t(V + 5)};
            const int32_t* got = arena.in_shard_order(ids.data(), 4, scratch);
            CHECK(std::vector<int32_t>(got, got + 4) ==
                  std::vector<int32_t>{shard_order_id(3, V, P), -100,
                                       shard_order_id(int32_t(V - 1), V, P), int32_t(V + 5)});
            // an ignore_index that is a vocabulary id maps with the targets; others are kept
            CrossEntropyOptions o;
            for (const int64_t ignore : {int64_t(-100), int64_t(5), V, V + 1}) {
                o.ignore_index = ignore;
                const int64_t want = ignore >= 0 && ignore < V
                                         ? int64_t(shard_order_id(int32_t(ignore), V, P))
                                         : ignore;
                CHECK(arena.in_shard_order(o).ignore_index == want);
            }
        }
        // the whole arena's padding rows past V are zero in `init` too
        CHECK(back == init);
    }
    const VocabShardedArena one(c.model, 1, 0);
    std::vector<int32_t> scratch;
    const int32_t ids[2] = {5, 7};
    CHECK(one.in_shard_order(ids, 2, scratch) == ids);  // one part: the ids themselves
}

TEST_CASE("vocab parallel x ZeRO-1 (the body over every rank, the rows over the peers) is exact") {
    // P = R: no two ranks hold the same rows, so each keeps its rows' moments and the body's are
    // cut over all ranks (3 ranks: V = 67 in uneven shards, the body in uneven slices); 4 ranks in
    // 2 groups: the rows' moments cut over the 2 peers. Untied tables put a vocabulary span on
    // each side of the body.
    struct Case {
        int ranks, vp;
        bool tied;
    };
    for (const Case k :
         {Case{2, 2, true}, Case{3, 3, false}, Case{4, 2, false}, Case{4, 2, true}}) {
        CAPTURE(k.ranks);
        CAPTURE(k.vp);
        CAPTURE(k.tied);
        const std::string tag =
            std::to_string(k.ranks) + "_" + std::to_string(k.vp) + (k.tied ? "t" : "u");
        Config c = tiny_config("vpz_off" + tag, 12 / k.ranks, k.ranks);
        c.model.tie_embeddings = k.tied;
        c.parallel.vocab_parallel = k.vp;
        const RunOut plain = run(c);
        c.parallel.zero1 = true;
        c.train.run_name = "vpz_on" + tag;
        const RunOut zero = run(c);
        CHECK(zero.loss == plain.loss);
        CHECK(zero.val == plain.val);
        CHECK(zero.params == plain.params);
        CHECK(zero.m == plain.m);  // the checkpoint gathered every rank's slices
        CHECK(zero.v == plain.v);
    }
}

TEST_CASE("ZeRO-1 under a split: each rank's share, and the memory count of the largest") {
    // Every element of the stored arena in exactly one rank's share among those that store it:
    // the body's over all R ranks, a shard's rows over its R / P peers.
    for (bool tied : {true, false}) {
        for (const auto& [R, P] : {std::pair{2, 2}, {3, 3}, {4, 2}, {3, 1}}) {
            CAPTURE(tied);
            CAPTURE(R);
            CAPTURE(P);
            Config c = tiny_config("share", 1, R);
            c.model.tie_embeddings = tied;
            const int64_t n = make_gpt_layout(c.model, P).table.total();
            std::vector<int64_t> sizes(R);
            std::vector<std::vector<int>> owners(R);  // per rank: how many ranks own each element
            const auto err = run_ranks(R, [&](int r, Communicator& world) {
                auto peers = world.split(r % P, r);
                const VocabShardedArena arena(c.model, P, r % P);
                const Zero1Share share(arena, &world, peers.get());
                sizes[r] = share.size();
                // owners: every rank marks its slices; summed over the ranks storing the same rows
                std::vector<float> mark(n, 0.0f);
                for (const Zero1Piece& p : share.pieces())
                    for (int64_t i = p.mine.lo; i < p.mine.hi; i++) mark[i] += 1.0f;
                for (const ArenaSlice& s : arena.replicated_spans())
                    world.all_reduce_sum(mark.data() + s.lo, s.hi - s.lo);
                for (const ArenaSlice& s : arena.vocab_spans())
                    peers->all_reduce_sum(mark.data() + s.lo, s.hi - s.lo);
                owners[r].assign(mark.begin(), mark.end());
                // gather(take(x)) is x
                std::vector<float> x(n);
                for (int64_t i = 0; i < n; i++) x[i] = float(i);
                CHECK(share.gather(share.take(x).data(), n) == x);
            });
            for (int r = 0; r < R; r++) {
                REQUIRE(err[r] == "");
                CHECK(std::count(owners[r].begin(), owners[r].end(), 1) == n);
            }
            const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
            CHECK(Zero1Share::largest_share(VocabShardedArena(c.model, P, 0), R) == largest);
            CHECK(Zero1Share::largest_share(VocabShardedArena(c.model, P, 0), 1) == n);
            // the rows' moments cut over the R / P peers, the body's over all R ranks (each cut
            // rounds up by less than one element)
            int64_t rows = 0;
            const VocabShardedArena arena0(c.model, P, 0);
            for (const ArenaSlice& s : arena0.vocab_spans()) rows += s.hi - s.lo;
            CHECK(largest <= rows / (R / P) + (n - rows) / R + 3);
        }
    }
}

TEST_CASE(
    "ZeRO-1's packed gather of a few spans gives every rank their fresh values, nothing else") {
    // Each rank's arena is fresh (rank r's values) in its own chunk only, as after its AdamW;
    // the plan packs its spans' pieces into its block, the blocks are concatenated as an
    // all-gather does, and each rank unpacks the others'. Spans cross chunk edges, skip ranks,
    // sit in the padded last chunk's short tail, and one chunk holds none.
    const std::vector<std::pair<int64_t, int64_t>> spans = {{0, 3}, {9, 14}, {20, 21}, {30, 33}};
    const int64_t n = 33;
    for (int R : {1, 2, 3, 4, 5}) {
        CAPTURE(R);
        const int64_t chunk = (n + R - 1) / R;
        auto fresh = [&](int64_t i) { return float(1000 + i); };  // the value after the step
        std::vector<std::vector<float>> arena(static_cast<size_t>(R),
                                              std::vector<float>(static_cast<size_t>(n)));
        std::vector<Zero1SpanPlan> plans;
        for (int r = 0; r < R; r++) {
            for (int64_t i = 0; i < n; i++) {
                const bool own = i >= r * chunk && i < (r + 1) * chunk;
                arena[size_t(r)][size_t(i)] = own ? fresh(i) : float(-1 - r);  // stale
            }
            plans.push_back(plan_span_gather(spans, n, R, r, chunk));
            CHECK(plans.back().block == plans.front().block);
        }
        const int64_t block = plans.front().block;
        std::vector<float> staging(size_t(R * block), -7.0f);
        for (int r = 0; r < R; r++)
            for (const cuda::CopySpan& c : plans[size_t(r)].pack) {
                CHECK(c.to >= r * block);
                CHECK(c.to + c.len <= (r + 1) * block);  // inside its own block
                for (int64_t k = 0; k < c.len; k++)
                    staging[size_t(c.to + k)] = arena[size_t(r)][size_t(c.from + k)];
            }
        for (int r = 0; r < R; r++) {
            const std::vector<float> before = arena[size_t(r)];
            for (const cuda::CopySpan& c : plans[size_t(r)].unpack)
                for (int64_t k = 0; k < c.len; k++)
                    arena[size_t(r)][size_t(c.to + k)] = staging[size_t(c.from + k)];
            for (int64_t i = 0; i < n; i++) {
                CAPTURE(r);
                CAPTURE(i);
                bool in_span = false;
                for (const auto& [lo, hi] : spans) in_span = in_span || (i >= lo && i < hi);
                if (in_span)
                    CHECK(arena[size_t(r)][size_t(i)] == fresh(i));
                else
                    CHECK(arena[size_t(r)][size_t(i)] == before[size_t(i)]);  // untouched
            }
        }
    }
    CHECK_THROWS_AS(plan_span_gather({{5, 9}, {7, 12}}, 33, 2, 0, 17), Error);  // overlapping
    CHECK_THROWS_AS(plan_span_gather({{0, 3}}, 33, 2, 0, 16), Error);           // chunks short of n
}

TEST_CASE("shard_of gives take_shard's values, without the copy for one part with zero padding") {
    for (bool tied : {true, false}) {
        CAPTURE(tied);
        Config c = tiny_config("shardof", 1, 1);
        c.model.tie_embeddings = tied;
        c.model.vocab_size = 61;  // padded to 128 rows: 67 padding rows in each vocabulary table
        const std::vector<float> init = initial_params(c);
        for (int P : {1, 2, 3}) {
            for (int p = 0; p < P; p++) {
                CAPTURE(P);
                CAPTURE(p);
                const VocabShardedArena arena(c.model, P, p);
                std::vector<float> scratch;
                const float* got = arena.shard_of(init, scratch);
                const std::vector<float> want = arena.take_shard(init);
                CHECK(std::equal(want.begin(), want.end(), got));
                CHECK((got == init.data()) == (P == 1));  // one part: the whole itself
                CHECK(scratch.empty() == (P == 1));
            }
        }
        // padding rows that are not zero: copied, and zero in the shard as take_shard makes it
        const GptLayout whole = make_gpt_layout(c.model);
        const VocabShardedArena one(c.model, 1, 0);
        std::vector<float> scratch;
        for (int idx : {whole.wte, whole.lm_head}) {
            const ParamSpec& table = whole.table[idx];
            std::vector<float> dirty = init;
            dirty[size_t(table.offset + table.numel - 1)] = 1.0f;
            const float* got = one.shard_of(dirty, scratch);
            CHECK(got == scratch.data());
            CHECK(got[table.offset + table.numel - 1] == 0.0f);
            CHECK(std::equal(scratch.begin(), scratch.end(), one.take_shard(dirty).begin()));
        }
        // the size is checked
        std::vector<float> short_one(init.begin(), init.end() - 1);
        CHECK_THROWS_WITH_AS(one.shard_of(short_one, scratch),
                             doctest::Contains("take_shard: the arena has"), Error);
    }
}

TEST_CASE("a checkpoint of a split over every rank with ZeRO-1 resumes in any layout") {
    // 2 ranks, vocab_parallel 2, ZeRO-1, cut at step 5; continued with and without ZeRO-1 on the
    // same layout (bit for bit: the checkpoint holds every moment), on one rank, on 3 ranks split
    // 3 ways with ZeRO-1, and on 4 ranks in 2 groups with ZeRO-1.
    Config c2 = tiny_config("vpzck", 6, 2);
    c2.model.tie_embeddings = false;
    c2.parallel.vocab_parallel = 2;
    c2.parallel.zero1 = true;
    const RunOut full = run(c2);
    Config cut = c2;
    cut.train.run_name = "vpzck_cut";
    cut.train.max_steps = 5;
    run(cut);
    for (const Layout k : {Layout{2, 6, 2, true}, Layout{2, 6, 2, false}, Layout{1, 12, 1, false},
                           Layout{3, 4, 3, true}, Layout{4, 3, 2, true}}) {
        CAPTURE(k.ranks);
        CAPTURE(k.vp);
        CAPTURE(k.zero1);
        const RunOut cont = resumed(c2, "vpzck_cut",
                                    "vpzck_resume" + std::to_string(k.ranks) + "_" +
                                        std::to_string(k.vp) + (k.zero1 ? "z" : ""),
                                    k);
        if (k.ranks == 2) {
            CHECK(cont.loss == full.loss);
            CHECK(cont.params == full.params);
            CHECK(cont.m == full.m);
            CHECK(cont.v == full.v);
        } else {
            check_same_run(cont, full);
        }
    }
}

TEST_CASE("a vocab-parallel checkpoint resumes split the same way bit for bit, and on one rank") {
    Config c2 = tiny_config("vpck", 3, 2);
    c2.parallel.vocab_parallel = 2;
    const RunOut full = run(c2);
    Config cut = c2;
    cut.train.run_name = "vpck_cut";
    cut.train.max_steps = 5;
    run(cut);
    for (const Layout k : {Layout{2, 3, 2}, Layout{1, 6, 1}, Layout{3, 2, 3}}) {
        CAPTURE(k.ranks);
        CAPTURE(k.vp);
        const RunOut cont = resumed(c2, "vpck_cut", "vpck_resume" + std::to_string(k.ranks), k);
        if (k.ranks == 2) {
            CHECK(cont.loss == full.loss);
            CHECK(cont.params == full.params);
            CHECK(cont.m == full.m);
        } else {
            check_same_run(cont, full);
        }
    }
}

TEST_CASE("a checkpoint of 3 ranks resumes with 1 and 2 ranks; with 3, bit for bit") {
    Config c3 = tiny_config("ck3", 2, 3);
    const RunOut full = run(c3);  // 10 steps, checkpoints at 5 and 10
    // The 3-rank run cut at step 5, then continued by 3, 2 and 1 ranks (global batch 6 each).
    Config cut = c3;
    cut.train.run_name = "ck3_cut";
    cut.train.max_steps = 5;
    run(cut);
    for (const Layout k : {Layout{3, 2, 1}, Layout{2, 3, 1}, Layout{1, 6, 1}}) {
        CAPTURE(k.ranks);
        const RunOut cont = resumed(c3, "ck3_cut", "ck3_resume" + std::to_string(k.ranks), k);
        REQUIRE(cont.loss.size() == full.loss.size());
        if (k.ranks == 3) {
            CHECK(cont.loss == full.loss);
            CHECK(cont.params == full.params);
        } else {
            check_same_run(cont, full);
        }
    }
    // A global batch that does not divide the checkpoint's position is refused, clearly.
    const fs::path dst = data_dir() / "runs" / "ck3_bad";
    fs::remove_all(dst);
    fs::copy(data_dir() / "runs" / "ck3_cut", dst, fs::copy_options::recursive);
    Config bad = c3;
    bad.train.run_name = "ck3_bad";
    bad.train.resume = "auto";
    bad.train.batch_size = 4;  // 5 batches of 6 windows = 30, not a multiple of 4 x 2 ranks
    bad.parallel.local_ranks = 2;
    CHECK_THROWS_WITH_AS(train(bad, "", "test"), doctest::Contains("cannot resume"), Error);
}

TEST_CASE("parallel config errors name the key") {
    Config c = tiny_config("bad_vp", 2, 3);
    c.parallel.vocab_parallel = 2;  // does not divide 3 ranks
    CHECK_THROWS_WITH_AS(train(c, "", "test"), doctest::Contains("parallel.vocab_parallel=2"),
                         Error);
}

// ---------------------------------------------------------------------------------------------
// Several processes through the real binary: `train --nproc N` (the tcp communicator between CPU
// processes) against the same ranks as threads.

namespace {

void write_yaml(const fs::path& p, const std::string& name, int batch) {
    std::ofstream(p)
        << "model: {n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 67}\n"
        << "data: {train: " << (data_dir() / "train_*.bin").string()
        << ", val: " << (data_dir() / "val_*.bin").string() << "}\n"
        << "train: {batch_size: " << batch
        << ", max_steps: 8, eval_every: 4, eval_batches: 2, threads: 1, device: cpu, "
        << "out_dir: " << (data_dir() / "runs").string() << ", run_name: " << name
        << "}\nloss: {z_loss_weight: 1.0e-3, ignore_index: 3}\n"
        << "parallel: {vocab_parallel: 3, timeout_s: 20}\n";
}

std::vector<std::string> metric_lines(const std::string& run) {
    std::vector<std::string> out;
    std::ifstream f(data_dir() / "runs" / run / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
        auto j = nlohmann::json::parse(line);
        j.erase("step_ms");  // timings differ; everything else must not
        j.erase("tok_per_s");
        j.erase("grad_all_reduce_ms");
        out.push_back(j.dump());
    }
    return out;
}

}  // namespace

TEST_CASE("train --nproc 3 (processes, tcp) equals 3 ranks as threads, bit for bit") {
    const std::string bin = built_binary("ZGPT_TRAIN_BIN");
    const fs::path yaml = data_dir() / "nproc.yaml";
    for (const char* run : {"np3", "th3"}) fs::remove_all(data_dir() / "runs" / run);
    write_yaml(yaml, "np3", 2);
    const CommandOutput a = run_command(bin + " -c " + yaml.string() + " --nproc 3");
    REQUIRE_MESSAGE(a.code == 0, a.text);
    CHECK(a.text.find("ranks: 3 (tcp communicator)") != std::string::npos);
    const CommandOutput b = run_command(bin + " -c " + yaml.string() +
                                        " --set train.run_name=th3 --set parallel.local_ranks=3");
    REQUIRE_MESSAGE(b.code == 0, b.text);
    const auto ma = metric_lines("np3"), mb = metric_lines("th3");
    CHECK(ma.size() == 9);  // the evaluation at step 0, then steps 1-8
    CHECK(ma == mb);
    const auto pa =
        load_checkpoint(list_checkpoints((data_dir() / "runs/np3/checkpoints").string())[0],
                        make_gpt_layout(load_config(yaml.string()).model).table);
    const auto pb =
        load_checkpoint(list_checkpoints((data_dir() / "runs/th3/checkpoints").string())[0],
                        make_gpt_layout(load_config(yaml.string()).model).table);
    CHECK(pa.params == pb.params);
}

TEST_CASE(
    "train --nproc 3: a rank that stops before a micro-batch stops every rank, in bounded "
    "time") {
    // Rank 1 hangs before step 3's second micro-batch, where the vocabulary group's collectives
    // follow with no collective of the whole world between: the others wait in the group's
    // first one until parallel.timeout_s, then stop with the reason.
    const std::string bin = built_binary("ZGPT_TRAIN_BIN");
    const fs::path yaml = data_dir() / "nproc_hang_micro.yaml";
    fs::remove_all(data_dir() / "runs" / "nphang");
    write_yaml(yaml, "nphang", 2);
    const auto t0 = std::chrono::steady_clock::now();
    const CommandOutput r =
        run_command("ZGPT_TEST_HANG_RANK_AT_MICRO_BATCH=1:3:2 " + bin + " -c " + yaml.string() +
                    " --nproc 3 --set train.grad_accum=2 --set parallel.timeout_s=4");
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(r.code != 0);
    CHECK(took < 30);  // start-up, the 4 s timeout, the launcher's grace period
    CHECK_MESSAGE(r.text.find("launch: rank") != std::string::npos, r.text);
    // the metrics stop after step 2: step 3 never ended
    const auto lines = metric_lines("nphang");
    CHECK(lines.size() >= 2);
    for (const std::string& l : lines) CHECK(nlohmann::json::parse(l)["step"].get<int>() <= 2);
    MESSAGE("stopped in " << took << " s");
}

TEST_CASE("train --nproc 3: a rank that fails stops every rank with its message, in bounded time") {
    const std::string bin = built_binary("ZGPT_TRAIN_BIN");
    const fs::path yaml = data_dir() / "nproc_fail.yaml";
    fs::remove_all(data_dir() / "runs" / "npfail");
    write_yaml(yaml, "npfail", 2);
    const auto t0 = std::chrono::steady_clock::now();
    const CommandOutput r = run_command("ZGPT_TEST_FAIL_RANK_AT_STEP=1:3 " + bin + " -c " +
                                        yaml.string() + " --nproc 3");
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(r.code != 0);
    CHECK(took <
          15);  // well inside parallel.timeout_s = 20: the failure is reported, not waited out
    // Rank 1 says why; the others name rank 1 (its report, or its closed connection, whichever
    // reaches them first).
    CHECK_MESSAGE(r.text.find("error: test failure injected at step 3") != std::string::npos,
                  r.text);
    const bool named = r.text.find("error: tcp communicator: rank 1 ") != std::string::npos ||
                       r.text.find("error: rank 1 failed") != std::string::npos;
    CHECK_MESSAGE(named, r.text);
    CHECK_MESSAGE(r.text.find("launch: rank") != std::string::npos, r.text);
}

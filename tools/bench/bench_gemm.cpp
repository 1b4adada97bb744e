// bench_gemm: times each GEMM of the GPT trainer's step alone (bf16 operands, the trainer's
// layouts and epilogues), against its FLOP floor at the bf16 matmul rate measured in the same
// run (cuBLASLt, 8192^3), with every candidate algorithm cuBLASLt's heuristic offers for it
// (the trainer runs the first) and, for the forward products, the `wgmma` matmul variant.
//
//   bench_gemm [--out results.json] [--shape BT,C,V] [--chunks 4] [--candidates 32] [--iters 20]
//   bench_gemm --sustain SECONDS [--out sustained.json]
//
// Per layer: the forward of qkv, proj, fc (bias + GELU, the pre-activation stored) and fcproj;
// the input gradients (fcproj's with GELU' from the stored pre-activation); the weight gradients
// (fp32, accumulated: beta 1). The LM head: its logits and input gradient per row chunk (BT /
// chunks rows), its weight gradient over all rows. A row's "step" column is the time of that
// GEMM in one step (12 layers, or the head's chunks), for the candidate the trainer runs.
//
// --sustain runs the 8192^3 product back to back for that long instead, and reports its rate in
// the first launches and over the second half with the board's power and SM clock there: at the
// power limit a training step's GEMMs run at the sustained rate, not at the first one, and the
// step's FLOP floor is the sustained rate's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/core/check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/core/gpu_power.h"
#include "kernels/gemm/matmul.h"
#include "kernels/gemm/matmul_wgmma.h"
#include "tools/bench/bench_util.h"
#include "train/cli.h"

using namespace zgpt::bench;
using zgpt::DType;
using zgpt::cuda::Epilogue;
using zgpt::cuda::Gemm;

namespace {

struct Options {
    std::string out, only, shape = "65536,768,50257";
    int iters = 20, max_candidates = 32, chunks = 4, layers = 12, configs = 0;
    double sustain_s = 0;  // > 0: the sustained-rate run alone
};

// --shape: the step's rows, width and vocabulary
struct Shape {
    int64_t BT = 0, C = 0, V = 0;
    int64_t Vp() const { return (V + 63) / 64 * 64; }  // the padded vocabulary
};

struct Case {
    std::string name;
    Gemm g;
    int per_step;  // how many of it a step runs
};

const char* epilogue_name(Epilogue e) {
    switch (e) {
        case Epilogue::none:
            return "none";
        case Epilogue::bias:
            return "bias";
        case Epilogue::gelu_aux_bias:
            return "gelu_aux_bias";
        case Epilogue::gelu_aux:
            return "gelu_aux";
        case Epilogue::dgelu:
            return "dgelu";
        case Epilogue::bias_grad:
            return "bias_grad";
        case Epilogue::dgelu_bias_grad:
            return "dgelu_bias_grad";
        case Epilogue::swiglu_aux:
            return "swiglu_aux";
        case Epilogue::swiglu_aux_bias:
            return "swiglu_aux_bias";
    }
    return "?";
}

// ---- parse -------------------------------------------------------------------------------------

std::optional<Options> parse(int argc, char** argv, int& exit_code) {
    CLI::App app{"Time the GPT trainer's GEMMs, and cuBLASLt's candidate algorithms for each."};
    zgpt::report_cli_errors(app);
    Options o;
    app.add_option("--out", o.out, "write the results as JSON here");
    app.add_option("--shape", o.shape, "BT,C,V: rows, width, vocabulary (GPT-2 124M, B=64 T=1024)")
        ->capture_default_str();
    app.add_option("--chunks", o.chunks, "the LM head's row chunks")->capture_default_str();
    app.add_option("--layers", o.layers, "layers a step runs")->capture_default_str();
    app.add_option("--candidates", o.max_candidates, "candidates timed per GEMM (at most 32)")
        ->capture_default_str();
    app.add_option("--iters", o.iters, "timed runs per candidate")->capture_default_str();
    app.add_option("--only", o.only, "time only the GEMMs whose name contains this");
    app.add_option("--sustain", o.sustain_s,
                   "run the 8192^3 product back to back this many seconds and report its "
                   "sustained rate, power and clock (nothing else runs)")
        ->check(CLI::Range(0.0, 3600.0));
    app.add_option("--configs", o.configs,
                   "also time up to this many of cuBLASLt's configurations beyond its heuristic's "
                   "list (every algorithm's tiles, stages and cluster shapes) and re-time the 8 "
                   "fastest beside the best candidate")
        ->capture_default_str();
    if (const std::optional<int> code = zgpt::parse_cli(app, argc, argv)) {
        exit_code = *code;
        return std::nullopt;
    }
    return o;
}

// --shape, checked with --chunks and --candidates; throws on a bad one
Shape shape_of(const Options& o) {
    std::stringstream ss(o.shape);
    std::vector<int64_t> v;
    for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoll(item));
    ZG_CHECK(v.size() == 3 && v[0] > 0 && v[1] > 0 && v[2] > 0,
             "--shape: expected BT,C,V, got '" + o.shape + "'");
    const Shape s{v[0], v[1], v[2]};
    ZG_CHECK(o.chunks >= 1 && s.BT % o.chunks == 0, "--chunks must divide BT");
    ZG_CHECK(o.max_candidates >= 1 && o.max_candidates <= 32, "--candidates: 1 to 32");
    return s;
}

// ---- cases -------------------------------------------------------------------------------------

// Buffers large enough for every case: x the A operand (up to the head's whole BT x Vp
// gradient of the logits), y the output or second operand (rows x 4C, a head chunk's
// logits), aux a pre-activation, a weight (max(4C, Vp) x C), fp32 weight gradients.
struct Buffers {
    __nv_bfloat16 *x, *y, *aux, *w, *bias, *res;
    float *dw, *dbias;
    Buffers(const Shape& s, int chunks) {
        const int64_t BT = s.BT, C = s.C, Vp = s.Vp(), HR = BT / chunks;
        const size_t act = size_t(std::max(BT * 4 * C, HR * Vp)),
                     xs = size_t(BT * std::max(4 * C, Vp));
        const size_t wts = size_t(std::max(4 * C, Vp) * C);
        CK(cudaMalloc(&x, xs * 2));
        CK(cudaMalloc(&y, act * 2));
        CK(cudaMalloc(&aux, size_t(BT * 4 * C) * 2));
        CK(cudaMalloc(&w, wts * 2));
        CK(cudaMalloc(&bias, size_t(4 * C) * 2));
        CK(cudaMalloc(&res, size_t(BT * C) * 2));
        CK(cudaMalloc(&dw, wts * 4));
        CK(cudaMalloc(&dbias, size_t(4 * C) * 4));
        fill_logits(x, xs, 31, 1.0);
        fill_logits(y, act, 32, 1.0);
        fill_logits(aux, size_t(BT * 4 * C), 33, 2.0);
        fill_logits(w, wts, 35, 0.05);
        fill_logits(bias, size_t(4 * C), 37, 0.1);
        fill_logits(res, size_t(BT * C), 39, 1.0);
        CK(cudaMemset(dw, 0, wts * 4));
    }
    ~Buffers() {
        for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(aux),
                        static_cast<void*>(res), static_cast<void*>(w), static_cast<void*>(bias),
                        static_cast<void*>(dw), static_cast<void*>(dbias)})
            cudaFree(p);
    }
};

// A step's GEMMs (per_step > 0) and the alternatives to some of them (per_step 0), on b.
std::vector<Case> cases_of(const Buffers& b, const Shape& s, const Options& o) {
    const int64_t BT = s.BT, C = s.C, Vp = s.Vp(), HR = BT / o.chunks;
    const int layers = o.layers, chunks = o.chunks;
    auto fwd = [&](int64_t M, int64_t K, int64_t N, Epilogue e) {
        Gemm g = zgpt::cuda::linear_forward_gemm(b.y, b.x, b.w, M, K, N, DType::bf16);
        g.epilogue = e;
        if (e == Epilogue::bias || e == Epilogue::gelu_aux_bias) g.bias = b.bias;
        if (e == Epilogue::gelu_aux_bias || e == Epilogue::gelu_aux) g.aux = b.aux;
        return g;
    };
    auto with_residual = [&](Gemm g) {  // residual_in_matmul's projections: + C, beta 1
        g.C = b.res;
        g.beta = 1.0f;
        return g;
    };
    auto dinp = [&](int64_t M, int64_t K, int64_t N, Epilogue e) {  // D[M, K] = dout[M, N] W[N, K]
        Gemm g = zgpt::cuda::linear_input_grad_gemm(b.y, b.x, b.w, M, K, N, DType::bf16);
        g.epilogue = e;
        if (e == Epilogue::dgelu || e == Epilogue::dgelu_bias_grad) g.aux = b.aux;
        if (e == Epilogue::dgelu_bias_grad) g.bias = b.dbias;
        return g;
    };
    auto dW = [&](int64_t M, int64_t K, int64_t N) {  // dW[N, K] += dout[M, N]^T inp[M, K]
        return zgpt::cuda::linear_weight_grad_gemm(b.dw, b.x, b.y, M, K, N, DType::bf16);
    };
    auto dW_written = [&](int64_t M, int64_t K, int64_t N) {  // into a scratch, as the trainer
        Gemm g = dW(M, K, N);
        g.beta = 0;
        return g;
    };
    auto rows_apart = [](Gemm g, int64_t lda) {  // the input's rows lda apart (ln2 with its ones)
        g.lda = lda;
        return g;
    };
    const int64_t ones64 = (C + 64) / 64 * 64;  // kernels.fc_ones_align: 64
    return {
        {"fwd qkv", fwd(BT, C, 3 * C, Epilogue::bias), layers},
        {"fwd proj", fwd(BT, C, C, Epilogue::bias), layers},
        {"fwd fc + GELU", fwd(BT, C, 4 * C, Epilogue::gelu_aux_bias), layers},
        {"fwd fc, no epilogue", fwd(BT, C, 4 * C, Epilogue::none), 0},
        {"fwd fcproj", fwd(BT, 4 * C, C, Epilogue::bias), layers},
        // what the trainer runs (residual_in_matmul); fc with its bias alone (GELU elsewhere)
        {"fwd fcproj + residual", with_residual(fwd(BT, 4 * C, C, Epilogue::bias)), 0},
        {"fwd fc + bias, pre-activation only", fwd(BT, C, 4 * C, Epilogue::bias), 0},
        // the bias as one more column of the product instead of an epilogue: the input with a
        // column of ones (and 7 zeros, K + 8), the weight with the bias in that column
        {"fwd qkv, no epilogue", fwd(BT, C, 3 * C, Epilogue::none), 0},
        {"fwd qkv, bias as a ones column", fwd(BT, C + 8, 3 * C, Epilogue::none), 0},
        {"fwd proj, bias as a ones column", with_residual(fwd(BT, C + 8, C, Epilogue::none)), 0},
        {"fwd proj + residual", with_residual(fwd(BT, C, C, Epilogue::bias)), 0},
        {"fwd fc + GELU, bias as a ones column", fwd(BT, C + 8, 4 * C, Epilogue::gelu_aux), 0},
        // what fc_bias_in_dw makes of fc's forward: ln2's rows C + 8 apart (fc_ones_align 8) or
        // 128-byte aligned (fc_ones_align 64), the product over the first C columns
        {"fwd fc + GELU, rows C + 8 apart",
         rows_apart(fwd(BT, C, 4 * C, Epilogue::gelu_aux_bias), C + 8), 0},
        {"fwd fc + GELU, rows 64-aligned",
         rows_apart(fwd(BT, C, 4 * C, Epilogue::gelu_aux_bias), ones64), 0},
        {"fwd fcproj + residual, bias as a ones column",
         with_residual(fwd(BT, 4 * C + 8, C, Epilogue::none)), 0},
        {"dinp qkv", dinp(BT, C, 3 * C, Epilogue::none), layers},
        {"dinp proj", dinp(BT, C, C, Epilogue::none), layers},
        {"dinp fc", dinp(BT, C, 4 * C, Epilogue::none), layers},
        {"dinp fcproj + GELU'", dinp(BT, 4 * C, C, Epilogue::dgelu), layers},
        // the same with fc's bias gradient summed in the epilogue (instead of its own pass)
        {"dinp fcproj + GELU' + fc bias grad", dinp(BT, 4 * C, C, Epilogue::dgelu_bias_grad), 0},
        {"dinp fcproj, no epilogue", dinp(BT, 4 * C, C, Epilogue::none), 0},
        {"dW qkv", dW(BT, C, 3 * C), layers},
        {"dW proj", dW(BT, C, C), layers},
        {"dW fc", dW(BT, C, 4 * C), layers},
        // fc's bias gradient as the GEMM's last column: ln2 with a column of ones (padded to 8)
        {"dW fc + a ones column", dW_written(BT, C + 8, 4 * C), 0},
        {"dW fc + a ones column, 64-aligned", dW_written(BT, ones64, 4 * C), 0},
        {"dW fcproj", dW(BT, 4 * C, C), layers},
        {"head logits", fwd(HR, C, Vp, Epilogue::none), chunks},
        {"head dinp", dinp(HR, C, Vp, Epilogue::none), chunks},
        {"head dW", dW(BT, C, Vp), 1},
    };
}

// ---- run ---------------------------------------------------------------------------------------

// What the cases record: a row each, and a step's GEMM time summed over them (per_step times).
struct Bench {
    Options opt;
    double rate = 0;  // bf16 matmul FLOP/s
    nlohmann::json rows = nlohmann::json::array();
    double step_default = 0, step_best = 0, step_floor = 0;
};

// cuBLASLt's heuristic candidates for one GEMM, timed: the first is what the trainer runs.
struct Candidates {
    double first = 0, best = 1e30;
    int best_i = -1;
    nlohmann::json rows = nlohmann::json::array();
};

Candidates time_candidates(const Bench& b, const Case& c) {
    Candidates r;
    const int n = std::min(b.opt.max_candidates, zgpt::cuda::gemm_candidates(c.g));
    for (int i = 0; i < n; i++) {
        double ms = -1;
        try {
            ms = time_ms([&] { zgpt::cuda::try_gemm_candidate(c.g, i, nullptr); }, b.opt.iters);
        } catch (const std::exception& e) {  // a candidate that fails to launch: skip it
            std::fprintf(stderr, "%s candidate %d: %s\n", c.name.c_str(), i, e.what());
            continue;
        }
        if (i == 0) r.first = ms;
        if (ms < r.best) r.best = ms, r.best_i = i;
        r.rows.push_back(
            {{"index", i}, {"ms", ms}, {"config", zgpt::cuda::gemm_candidate_name(c.g, i)}});
    }
    return r;
}

// Beyond the heuristic's list: a quick pass over (a spread of) the configurations, then the 8
// fastest and the best candidate again, alternated, with the usual iterations. Prints its line.
nlohmann::json time_configs(const Bench& b, const Case& c, int best_i, double floor_ms) {
    const Gemm& g = c.g;
    const int nc = zgpt::cuda::gemm_configs(g);
    const int step = std::max(1, (nc + b.opt.configs - 1) / b.opt.configs);
    std::vector<std::pair<double, int>> quick;
    for (int i = 0; i < nc; i += step) {
        double ms = -1;
        try {
            bool ok = zgpt::cuda::try_gemm_config(g, i, nullptr);
            CK(cudaDeviceSynchronize());
            if (!ok) continue;
            ms = time_ms([&] { zgpt::cuda::try_gemm_config(g, i, nullptr); }, 3);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s config %d: %s\n", c.name.c_str(), i, e.what());
            continue;
        }
        quick.push_back({ms, i});
    }
    std::sort(quick.begin(), quick.end());
    if (quick.size() > 8) quick.resize(8);
    double cand = 1e30, conf = 1e30;
    int conf_i = -1;
    for (int round = 0; round < 2; round++) {
        cand = std::min(cand, time_ms([&] { zgpt::cuda::try_gemm_candidate(g, best_i, nullptr); },
                                      b.opt.iters));
        for (const auto& q : quick) {
            const double ms =
                time_ms([&] { zgpt::cuda::try_gemm_config(g, q.second, nullptr); }, b.opt.iters);
            if (ms < conf) conf = ms, conf_i = q.second;
        }
    }
    const std::string conf_name =
        conf_i >= 0 ? zgpt::cuda::gemm_config_name(g, conf_i) : std::string();
    std::printf(
        "%28s %d configurations (%zu timed again): best %7.1f us (%4.2fx) against "
        "the best candidate's %7.1f us: %s\n",
        "", nc, quick.size(), conf * 1e3, conf / floor_ms, cand * 1e3,
        conf_i >= 0 ? conf_name.c_str() : "none");
    return {{"configs", nc},
            {"best_config_ms", conf},
            {"best_candidate_ms", cand},
            {"best_config", conf_name}};
}

// One GEMM: its candidates, our wgmma kernel where it applies, the configurations with
// --configs; prints its lines and records its row and its part of the step.
void run_case(Bench& b, const Case& c) {
    const Gemm& g = c.g;
    const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
    const double floor_ms = flops / b.rate * 1e3;
    const Candidates cand = time_candidates(b, c);
    double wg = -1, pp = -1;  // our kernel's two schedules (kernels.matmul_wgmma_schedule)
    if (zgpt::cuda::gemm_wgmma_usable(g)) {
        using zgpt::cuda::WgmmaSchedule;
        wg = time_ms([&] { zgpt::cuda::try_gemm_wgmma(g, nullptr, WgmmaSchedule::cooperative); },
                     b.opt.iters);
        pp = time_ms([&] { zgpt::cuda::try_gemm_wgmma(g, nullptr, WgmmaSchedule::pingpong); },
                     b.opt.iters);
    }
    std::printf(
        "%-26s M=%-6lld N=%-6lld K=%-6lld %-13s floor %7.1f us  first %7.1f us (%4.2fx)  "
        "best #%-2d %7.1f us (%4.2fx)%s",
        c.name.c_str(), (long long)g.M, (long long)g.N, (long long)g.K, epilogue_name(g.epilogue),
        floor_ms * 1e3, cand.first * 1e3, cand.first / floor_ms, cand.best_i, cand.best * 1e3,
        cand.best / floor_ms, wg > 0 ? "" : "\n");
    if (wg > 0)
        std::printf("  wgmma %7.1f us (%4.2fx), ping-pong %7.1f us (%4.2fx)\n", wg * 1e3,
                    wg / floor_ms, pp * 1e3, pp / floor_ms);
    if (cand.best_i > 0)
        std::printf("%28s best: %s\n", "", zgpt::cuda::gemm_candidate_name(g, cand.best_i).c_str());
    const nlohmann::json beyond = b.opt.configs > 0 && cand.best_i >= 0
                                      ? time_configs(b, c, cand.best_i, floor_ms)
                                      : nlohmann::json::object();
    b.step_default += c.per_step * cand.first;
    b.step_best += c.per_step * cand.best;
    b.step_floor += c.per_step * floor_ms;
    b.rows.push_back({{"gemm", c.name},
                      {"M", g.M},
                      {"N", g.N},
                      {"K", g.K},
                      {"epilogue", epilogue_name(g.epilogue)},
                      {"per_step", c.per_step},
                      {"floor_ms", floor_ms},
                      {"first_ms", cand.first},
                      {"best_ms", cand.best},
                      {"best_index", cand.best_i},
                      {"wgmma_ms", wg},
                      {"wgmma_pingpong_ms", pp},
                      {"beyond_heuristic", beyond},
                      {"candidates", cand.rows}});
}

// What the GELU' + bias-gradient epilogue replaces: fc's bias gradient as its own pass over
// the 4C-wide gradient (the trainer runs it on the weight-gradient stream). Prints its line.
double run_bias_pass(const Bench& b, const Buffers& buf, const Shape& s) {
    const int64_t BT = s.BT, C = s.C;
    void* scratch = nullptr;
    CK(cudaMalloc(&scratch, zgpt::cuda::bias_backward_scratch_bytes(BT, 4 * C)));
    const double ms = time_ms(
        [&] {
            zgpt::cuda::bias_backward(buf.dbias, buf.y, BT, 4 * C, DType::bf16, scratch, nullptr);
        },
        b.opt.iters);
    std::printf("fc bias gradient as its own pass (%lld x %lld bf16): %.1f us\n", (long long)BT,
                (long long)(4 * C), ms * 1e3);
    cudaFree(scratch);
    return ms;
}

void write_json(const Bench& b, const zgpt::cuda::DeviceInfo& dev, const Shape& s,
                double bias_pass) {
    std::ofstream f(b.opt.out);
    f << nlohmann::json{{"device", dev.name},
                        {"matmul_TFLOPs", b.rate / 1e12},
                        {"shape", {{"BT", s.BT}, {"C", s.C}, {"V", s.V}, {"chunks", b.opt.chunks}}},
                        {"step_floor_ms", b.step_floor},
                        {"step_first_ms", b.step_default},
                        {"step_best_ms", b.step_best},
                        {"fc_bias_pass_ms", bias_pass},
                        {"rows", b.rows}}
             .dump(2)
      << "\n";
}

// --sustain: the 8192^3 product back to back for `seconds`, timed in batches of 20 launches; the
// rate of the first batch, and the rate, board power and SM clock over the second half.
nlohmann::json sustained_rate(double seconds) {
    const int64_t batch = 20;
    const SquareProduct product;
    const double flop = SquareProduct::kFlop * batch;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // one untimed launch: cuBLASLt's heuristic query, the workspace and the module load
    product.run();
    CK(cudaDeviceSynchronize());
    zgpt::cuda::PowerSampler power;
    double elapsed_s = 0, first_rate = 0, half_flop = 0, half_s = 0;
    bool sampling = false;
    while (elapsed_s < seconds) {
        if (!sampling && elapsed_s >= seconds / 2) {
            power.start();
            sampling = true;
        }
        CK(cudaEventRecord(e0));
        for (int64_t i = 0; i < batch; i++) product.run();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (first_rate == 0) first_rate = flop / (ms * 1e-3);
        if (sampling) half_flop += flop, half_s += ms * 1e-3;
        elapsed_s += ms * 1e-3;
    }
    const zgpt::cuda::PowerSummary p = power.stop();
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    const double rate = half_s > 0 ? half_flop / half_s : first_rate;
    std::printf(
        "bf16 matmul 8192^3 back to back for %.1f s: first %d launches %.1f TFLOP/s; second "
        "half %.1f TFLOP/s at %.0f W (limit %.0f W), SM clock %.0f MHz%s\n",
        elapsed_s, int(batch), first_rate / 1e12, rate / 1e12, p.power_w, p.limit_w, p.sm_clock_mhz,
        power.unavailable().empty() ? "" : " (no power readings)");
    // null where the second half was too short to time or to sample
    const auto or_null = [](bool ok, double v) {
        return ok ? nlohmann::json(v) : nlohmann::json();
    };
    return {{"seconds", elapsed_s},
            {"launches_per_timing", batch},
            {"first_TFLOPs", first_rate / 1e12},
            {"sustained_TFLOPs", or_null(half_s > 0, rate / 1e12)},
            {"power_w", or_null(p.samples > 0, p.power_w)},
            {"power_limit_w", p.limit_w},
            {"sm_clock_mhz", or_null(p.samples > 0, p.sm_clock_mhz)},
            {"power_samples", p.samples},
            {"power_unavailable", power.unavailable()}};
}

}  // namespace

int main(int argc, char** argv) {
    int code = 0;
    const std::optional<Options> opt = parse(argc, argv, code);
    if (!opt) return code;
    Bench b;
    b.opt = *opt;
    Shape shape;
    try {
        shape = shape_of(b.opt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
    const zgpt::cuda::DeviceInfo dev = zgpt::cuda::query_devices();
    if (dev.count == 0) {
        std::fprintf(stderr, "no CUDA device: %s\n", dev.error.c_str());
        return 1;
    }
    if (b.opt.sustain_s > 0) {
        nlohmann::json r = sustained_rate(b.opt.sustain_s);
        r["device"] = dev.name;
        if (!b.opt.out.empty()) std::ofstream(b.opt.out) << r.dump(2) << "\n";
        return 0;
    }
    b.rate = matmul_rate(b.opt.iters);
    std::printf("device %s, %d SMs; bf16 matmul 8192^3 through cuBLASLt: %.1f TFLOP/s\n",
                dev.name.c_str(), dev.sm_count, b.rate / 1e12);
    const Buffers buf(shape, b.opt.chunks);
    for (const Case& c : cases_of(buf, shape, b.opt))
        if (b.opt.only.empty() || c.name.find(b.opt.only) != std::string::npos) run_case(b, c);
    std::printf(
        "a step's GEMMs (%d layers, %d head chunks): floor %.2f ms, cuBLASLt's first choice %.2f "
        "ms (%.2fx), the best candidate of each %.2f ms (%.2fx)\n",
        b.opt.layers, b.opt.chunks, b.step_floor, b.step_default, b.step_default / b.step_floor,
        b.step_best, b.step_best / b.step_floor);
    const double bias_pass = run_bias_pass(b, buf, shape);
    if (!b.opt.out.empty()) write_json(b, dev, shape, bias_pass);
    return 0;
}

// bench_ce: times every registered CUDA cross_entropy variant (forward + backward, bf16 logits,
// z = 1e-4, mean, dlogits in place) and the fused linear heads, against two floors measured on
// this GPU in the same run: the copy floor (one read of the logits and one write of dlogits at the
// copy bandwidth; the heads from hidden states: their GEMMs at the bf16 matmul rate) and the
// latency floor (the head's own launches as empty kernels of the same shapes,
// tools/bench/bench_latency.h).
//
//   bench_ce [--out results.json] [--variants naive,online,fast] [--iters 20] [--shapes NxV,...]
//            [--hidden 768,2048] [--set kernels.cross_entropy_tuning.parts=4 ...] [--trace]
//   bench_ce --sweep [--out sweep.json]
//
// --sweep: Liger's vocabulary sweep, N = 16384 rows (its B x T) at V = 1024 ... 256000, forward
// alone and forward + backward, the fused heads at C = 768 and 2048. The forward alone of the
// logits heads is the vocab-parallel statistics pass (ce_shard_stats, ce_count_valid, ce_reduce:
// one read of the logits, the loss without a gradient), the fused heads' is run() without
// gradients (the trainer's evaluation).
//
// --set takes the trainer's kernels.* keys: kernels.cross_entropy_tuning.* (fast, fast_lockstep)
// and kernels.linear_ce_* (fused_linear*), checked as the config checks them (each key applies to
// the variants that read it; the others ignore it).
//
// Each timed iteration starts from a fresh copy of the logits (copied outside the timed events),
// so in-place variants never run on their own gradients. The median of the iterations is reported.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "kernels/core/check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/matmul.h"
#include "kernels/loss_head/cross_entropy.h"
#include "tools/bench/bench_latency.h"
#include "tools/bench/bench_util.h"
#include "train/cli.h"
#include "train/config.h"

using namespace zgpt::bench;

namespace {

// Liger's benchmark sweep: B x T = 8 x 2048 rows, and the vocabularies people train with
constexpr int64_t kSweepRows = 16384;
const std::vector<int64_t> kSweepVocab = {1024,  2048,  4096,   8192,  16384,
                                          32768, 50304, 128256, 256000};

struct Options {
    std::string out, only, shapes, hidden;
    int iters = 20;
    bool dweight_acc = false, trace = false, sweep = false;
    double weight_std = 0.02;
    std::vector<std::string> sets;
};

struct Shape {
    int64_t N, V, ld;
};

// What every case needs: the options, the tunings read from --set, this GPU's rates, the rows.
struct Bench {
    Options opt;
    zgpt::Config cfg;
    zgpt::cuda::CrossEntropyTuning ce_tuning;
    zgpt::cuda::LinearCrossEntropyTuning linear_tuning;
    double copy_bw = 0;  // bytes read + written per second
    double matmul_flops = 0;
    nlohmann::json results = nlohmann::json::array();

    bool selected(const char* name) const {
        return opt.only.empty() ||
               ("," + opt.only + ",").find("," + std::string(name) + ",") != std::string::npos;
    }
    // the latency floor of fn's launches, and how many there are (0 when fn cannot be captured)
    std::pair<double, int> latency_floor(const std::function<void(cudaStream_t)>& fn) const {
        const std::vector<LaunchShape> chain = captured_launches(fn);
        if (chain.empty()) return {0.0, 0};
        return {empty_chain_ms(chain, opt.iters), int(chain.size())};
    }
};

// ---- parse -------------------------------------------------------------------------------------

std::optional<Options> parse(int argc, char** argv, int& exit_code) {
    CLI::App app{"Time the registered CUDA cross-entropy variants against their floors."};
    zgpt::report_cli_errors(app);
    Options o;
    app.add_option("--out", o.out, "write the results as JSON here");
    app.add_option("--variants", o.only,
                   "comma-separated variant names, fused_linear included (default: all)");
    app.add_option("--iters", o.iters, "timed iterations per variant")->capture_default_str();
    app.add_option("--weight-std", o.weight_std,
                   "the fused linear heads' W spread (h's is 0.5): 0.02, the anchors', gives "
                   "near-uniform softmax rows; 0.2 peaked ones (what gradient filtering skips "
                   "depends on it)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--shapes", o.shapes,
                   "CE shapes as NxV or NxV:LD (rows of stride LD >= V, as the trainer's padded "
                   "logits), comma-separated (default: 32768x128256,8192x50304); the fused "
                   "linear heads take N x V");
    app.add_option("--hidden", o.hidden,
                   "the fused linear heads' hidden sizes C, comma-separated (default: 768; "
                   "--sweep: 768,2048)");
    app.add_flag("--sweep", o.sweep,
                 "N = 16384 at V = 1024 ... 256000, forward alone and forward + backward "
                 "(replaces --shapes)");
    app.add_flag("--dweight-acc", o.dweight_acc,
                 "fused_linear adds dW into an fp32 accumulator (as the trainer does) instead of "
                 "writing it as bf16");
    app.add_option(
        "--set", o.sets,
        "kernels.key=value: the kernels' tuning keys of the trainer's config "
        "(kernels.cross_entropy_tuning.*, kernels.linear_ce_*; train --help lists them)");
    app.add_flag("--trace", o.trace,
                 "fast, bf16: record where a row's time goes and print it to stderr after each "
                 "launch (synchronises; CrossEntropyTuning::trace)");
    if (const std::optional<int> code = zgpt::parse_cli(app, argc, argv)) {
        exit_code = *code;
        return std::nullopt;
    }
    return o;
}

// "a,b,c" as numbers; throws zgpt::Error naming the flag on anything else
std::vector<int64_t> parse_list(const std::string& text, const std::string& flag) {
    std::vector<int64_t> out;
    std::stringstream ss(text);
    for (std::string item; std::getline(ss, item, ',');) {
        ZG_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos,
                 flag + " '" + text + "': expected comma-separated positive integers");
        out.push_back(std::stoll(item));
        ZG_CHECK(out.back() > 0, flag + " '" + text + "': sizes must be positive");
    }
    return out;
}

// ---- cases -------------------------------------------------------------------------------------

std::vector<Shape> shapes_of(const Options& o) {
    std::vector<Shape> shapes;
    if (o.sweep) {
        for (int64_t V : kSweepVocab) shapes.push_back({kSweepRows, V, V});
        return shapes;
    }
    if (o.shapes.empty()) return {{32768, 128256, 128256}, {8192, 50304, 50304}};
    std::stringstream ss(o.shapes);  // "NxV,NxV:LD,..."
    for (std::string item; std::getline(ss, item, ',');) {
        const size_t x = item.find('x'), c = item.find(':');
        ZG_CHECK(x != std::string::npos, "--shapes: expected NxV or NxV:LD, got '" + item + "'");
        Shape sh{std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1)), 0};
        sh.ld = c == std::string::npos ? sh.V : std::stoll(item.substr(c + 1));
        ZG_CHECK(sh.N > 0 && sh.V > 0 && sh.ld >= sh.V,
                 "--shapes: need N, V > 0 and LD >= V in '" + item + "'");
        shapes.push_back(sh);
    }
    return shapes;
}

std::vector<int64_t> hidden_sizes(const Options& o) {
    if (!o.hidden.empty()) return parse_list(o.hidden, "--hidden");
    return o.sweep ? std::vector<int64_t>{768, 2048} : std::vector<int64_t>{768};
}

// ---- run: the logits heads ---------------------------------------------------------------------

// The logits, targets and per-row outputs of one shape, on the device.
struct CeBuffers {
    Shape sh;
    size_t n;  // allocated elements; the floors count the N x V used
    __nv_bfloat16 *pristine, *logits;
    int32_t* targets;
    float *go, *rows;
    zgpt::cuda::LossSummaryF* summary;
    explicit CeBuffers(Shape s) : sh(s), n(size_t(s.N) * s.ld) {
        CK(cudaMalloc(&pristine, n * 2));
        CK(cudaMalloc(&logits, n * 2));
        CK(cudaMalloc(&targets, sh.N * 4));
        CK(cudaMalloc(&go, 4));
        CK(cudaMalloc(&rows, 4 * sh.N * 4));
        CK(cudaMalloc(&summary, sizeof(zgpt::cuda::LossSummaryF)));
        fill_logits(pristine, n, 7);
        std::vector<int32_t> ht(sh.N);
        for (int64_t i = 0; i < sh.N; i++) ht[i] = int32_t((i * 2654435761ull) % uint64_t(sh.V));
        CK(cudaMemcpy(targets, ht.data(), sh.N * 4, cudaMemcpyHostToDevice));
        const float one = 1.0f;
        CK(cudaMemcpy(go, &one, 4, cudaMemcpyHostToDevice));
    }
    ~CeBuffers() {
        cudaFree(pristine);
        cudaFree(logits);
        cudaFree(targets);
        cudaFree(go);
        cudaFree(rows);
        cudaFree(summary);
    }
    zgpt::cuda::CrossEntropyArgs args(const zgpt::cuda::CrossEntropyTuning& t) const {
        zgpt::cuda::CrossEntropyArgs a;
        a.logits = logits;
        a.dlogits = logits;
        a.type = zgpt::cuda::LogitsType::bf16;
        a.V_local = a.V = sh.V;
        a.ld = sh.ld;
        a.N = sh.N;
        a.targets = targets;
        a.grad_output = go;
        a.loss_rows = rows;
        a.ce_rows = rows + sh.N;
        a.z_rows = rows + 2 * sh.N;
        a.lse_rows = rows + 3 * sh.N;
        a.summary = summary;
        a.tuning = t;
        return a;
    }
    float loss() const {
        zgpt::cuda::LossSummaryF s;
        CK(cudaMemcpy(&s, summary, sizeof s, cudaMemcpyDeviceToHost));
        return s.loss;
    }
    void restore() const { CK(cudaMemcpy(logits, pristine, n * 2, cudaMemcpyDeviceToDevice)); }
};

void record_ce(Bench& b, const CeBuffers& buf, const char* variant, const char* mode, double ms,
               double copy_floor_ms, std::pair<double, int> latency, double extra_bytes) {
    const Shape sh = buf.sh;
    const double floor_ms = std::max(copy_floor_ms, latency.first);
    const double loss = buf.loss();
    std::printf(
        "%-8s %-7s N=%-6lld V=%-7lld ld=%-7lld %8.3f ms  %5.2fx floor (copy %.3f ms, latency "
        "%.3f ms, %d launches)  extra %.3f GB  loss %.5f\n",
        variant, mode, (long long)sh.N, (long long)sh.V, (long long)sh.ld, ms, ms / floor_ms,
        copy_floor_ms, latency.first, latency.second, extra_bytes / 1e9, loss);
    std::fflush(stdout);
    b.results.push_back({{"variant", variant},
                         {"mode", mode},
                         {"N", sh.N},
                         {"V", sh.V},
                         {"ld", sh.ld},
                         {"ms", ms},
                         {"floor_ms", copy_floor_ms},
                         {"x_floor", ms / copy_floor_ms},
                         {"latency_floor_ms", latency.first},
                         {"launches", latency.second},
                         {"x_max_floor", ms / floor_ms},
                         {"extra_GB", extra_bytes / 1e9},
                         {"loss", loss},
                         {"iters", b.opt.iters}});
}

void run_logits_heads(Bench& b, Shape sh) {
    CeBuffers buf(sh);
    const double used_bytes = double(sh.N) * double(sh.V) * 2;  // bf16 logits read once
    zgpt::CrossEntropyOptions o;
    o.z_loss_weight = 1e-4;
    // the variants as the trainer runs them, asking for no per-row outputs: then their workspace
    // (extra_GB) is all they hold beyond the logits, targets and summary
    zgpt::cuda::CrossEntropyArgs a = buf.args(b.ce_tuning);
    a.loss_rows = a.ce_rows = a.z_rows = a.lse_rows = nullptr;
    for (const auto& v : zgpt::cuda::cross_entropy_variants()) {
        if (!b.selected(v.name)) continue;
        const size_t ws_bytes = v.workspace_bytes(sh.N, sh.V, zgpt::cuda::LogitsType::bf16);
        void* ws = nullptr;
        if (cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
            cudaGetLastError();
            std::printf("%-8s N=%lld V=%lld: workspace of %.2f GB does not fit\n", v.name,
                        (long long)sh.N, (long long)sh.V, ws_bytes / 1e9);
            b.results.push_back({{"variant", v.name}, {"N", sh.N}, {"V", sh.V}, {"note", "OOM"}});
            continue;
        }
        const double ms =
            time_ms([&] { v.run(a, o, ws, nullptr); }, b.opt.iters, [&] { buf.restore(); });
        buf.restore();
        const auto latency = b.latency_floor([&](cudaStream_t s) { v.run(a, o, ws, s); });
        record_ce(b, buf, v.name, "fwd_bwd", ms, 2 * used_bytes / b.copy_bw * 1e3, latency,
                  double(ws_bytes));
        cudaFree(ws);
    }
    if (!b.opt.sweep) return;
    // forward alone: the vocab shards' pipeline on one shard (statistics, the per-row results,
    // their reduction), the loss without a gradient: one read of the logits
    zgpt::cuda::RowStatsF* stats;
    zgpt::cuda::RowGradParams* params;
    int* n_valid;
    CK(cudaMalloc(&stats, sh.N * sizeof(zgpt::cuda::RowStatsF)));
    CK(cudaMalloc(&params, sh.N * sizeof(zgpt::cuda::RowGradParams)));
    CK(cudaMalloc(&n_valid, sizeof(int)));
    zgpt::cuda::CrossEntropyArgs fa = buf.args(b.ce_tuning);  // the building blocks need rows
    fa.dlogits = nullptr;
    auto forward = [&](cudaStream_t s) {
        zgpt::cuda::ce_count_valid(n_valid, fa.targets, sh.N, o.ignore_index, s);
        zgpt::cuda::ce_shard_stats(stats, fa, o, s);
        zgpt::cuda::ce_finalize(params, stats, n_valid, fa, o, s);  // writes the per-row results
        zgpt::cuda::ce_reduce(fa, stats, n_valid, o, s);
    };
    CK(cudaMemset(buf.summary, 0xff, sizeof(zgpt::cuda::LossSummaryF)));  // no stale loss
    const double ms = time_ms([&] { forward(nullptr); }, b.opt.iters);
    // its buffers beyond the inputs: statistics, gradient parameters, the ce and lse rows the
    // summary reads, the valid count
    const double extra =
        double(sh.N) * (sizeof(zgpt::cuda::RowStatsF) + sizeof(zgpt::cuda::RowGradParams) + 8) + 4;
    // the floor: one read at the copy rate (a read alone may run faster: not a lower bound)
    record_ce(b, buf, "stats", "fwd", ms, used_bytes / b.copy_bw * 1e3, b.latency_floor(forward),
              extra);
    cudaFree(stats);
    cudaFree(params);
    cudaFree(n_valid);
}

// ---- run: the fused linear heads ---------------------------------------------------------------

// fused linear + CE from hidden states: floor = the GEMMs of 2 N C V FLOPs (one forward, three
// forward + backward) at the bf16 matmul rate measured here through the same cuBLASLt wrapper
void run_linear_heads(Bench& b, Shape sh, int64_t C, bool with_grad) {
    const int64_t N = sh.N, V = sh.V;
    void *h, *w;
    int32_t* targets;
    float *go, *rows;
    zgpt::cuda::LossSummaryF* summary;
    CK(cudaMalloc(&h, N * C * 2));
    CK(cudaMalloc(&w, V * C * 2));
    CK(cudaMalloc(&targets, N * 4));
    CK(cudaMalloc(&go, 4));
    CK(cudaMalloc(&rows, N * 4));
    CK(cudaMalloc(&summary, sizeof(zgpt::cuda::LossSummaryF)));
    fill_logits(static_cast<__nv_bfloat16*>(h), N * C, 3, 1.22);  // std 0.5, as the anchors
    // two uniforms summed: std half_width / sqrt(6), so 0.049 gives 0.02
    fill_logits(static_cast<__nv_bfloat16*>(w), V * C, 5, 0.049 * b.opt.weight_std / 0.02);
    std::vector<int32_t> ht(N);
    for (int64_t i = 0; i < N; i++) ht[i] = int32_t((i * 2654435761ull) % uint64_t(V));
    CK(cudaMemcpy(targets, ht.data(), N * 4, cudaMemcpyHostToDevice));
    const float one = 1.0f;
    CK(cudaMemcpy(go, &one, 4, cudaMemcpyHostToDevice));
    const bool acc = b.opt.dweight_acc;
    for (const auto& v : zgpt::cuda::linear_cross_entropy_variants()) {
        if (!b.selected(v.name)) continue;
        const size_t ws_bytes = v.workspace_bytes(N, C, V, b.linear_tuning);
        const size_t dh_bytes = with_grad ? size_t(N) * C * 2 : 0;
        const size_t dw_bytes = with_grad ? size_t(V) * C * (acc ? 4 : 2) : 0;  // fp32 or bf16
        void *dh = nullptr, *dw = nullptr, *ws = nullptr;
        if (with_grad) {
            CK(cudaMalloc(&dh, dh_bytes));
            CK(cudaMalloc(&dw, dw_bytes));
        }
        CK(cudaMalloc(&ws, ws_bytes));
        zgpt::cuda::LinearCrossEntropyArgs la;
        la.hidden = h;
        la.weight = w;
        la.N = N;
        la.C = C;
        la.V = V;
        la.targets = targets;
        la.grad_output = go;
        if (with_grad) {
            la.dhidden = dh;
            if (acc)
                la.dweight_acc = static_cast<float*>(dw);
            else
                la.dweight = dw;
        }
        la.loss_rows = rows;
        la.summary = summary;
        la.tuning = b.linear_tuning;
        zgpt::CrossEntropyOptions o;
        o.z_loss_weight = 1e-4;
        const double ms = time_ms([&] { v.run(la, o, ws, nullptr); }, std::max(3, b.opt.iters / 2));
        const auto latency = b.latency_floor([&](cudaStream_t s) { v.run(la, o, ws, s); });
        zgpt::cuda::LossSummaryF s;
        CK(cudaMemcpy(&s, summary, sizeof s, cudaMemcpyDeviceToHost));
        // forward + backward: 3 GEMMs (the logits once); 4: the logits twice, the least an
        // exact head needs within the memory targets (docs/cross_entropy.md)
        const double gemms = with_grad ? 3.0 : 1.0;
        const double floor_ms = gemms * 2.0 * N * C * V / b.matmul_flops * 1e3;
        const double floor4_ms = floor_ms * 4.0 / 3.0;
        const double floor_max = std::max(floor_ms, latency.first);
        // everything the head allocates beyond its inputs: workspace, the gradients, and the
        // cuBLASLt workspace of the one stream it runs on
        const double extra =
            double(ws_bytes + dh_bytes + dw_bytes + zgpt::cuda::gemm_workspace_bytes_per_stream()) /
            1e9;
        const char* mode = with_grad ? "fwd_bwd" : "fwd";
        std::printf(
            "%-12s %-7s N=%-6lld V=%-7lld C=%-5lld dW %s %8.3f ms  %5.2fx floor (%.3f ms, %g "
            "GEMMs; latency %.3f ms, %d launches)  extra %.3f GB  loss %.5f\n",
            v.name, mode, (long long)N, (long long)V, (long long)C,
            !with_grad ? "none"
            : acc      ? "fp32 acc"
                       : "bf16",
            ms, ms / floor_max, floor_ms, gemms, latency.first, latency.second, extra, s.loss);
        std::fflush(stdout);
        nlohmann::json row{{"variant", v.name},
                           {"mode", mode},
                           {"N", N},
                           {"V", V},
                           {"C", C},
                           {"ms", ms},
                           {"floor_ms", floor_ms},
                           {"x_floor", ms / floor_ms},
                           {"latency_floor_ms", latency.first},
                           {"launches", latency.second},
                           {"x_max_floor", ms / floor_max},
                           {"dweight", !with_grad ? "none"
                                       : acc      ? "fp32_acc"
                                                  : "bf16"},
                           {"extra_GB", extra},
                           {"matmul_TFLOPs", b.matmul_flops / 1e12},
                           {"weight_std", b.opt.weight_std},
                           {"loss", s.loss}};
        if (with_grad) row["floor_4gemm_ms"] = floor4_ms;
        b.results.push_back(row);
        for (void* p : {dh, dw, ws}) cudaFree(p);
    }
    for (void* p : {h, w}) cudaFree(p);
    cudaFree(targets);
    cudaFree(go);
    cudaFree(rows);
    cudaFree(summary);
}

bool any_linear_selected(const Bench& b) {
    for (const auto& v : zgpt::cuda::linear_cross_entropy_variants())
        if (b.selected(v.name)) return true;
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    int code = 0;
    std::optional<Options> opt = parse(argc, argv, code);
    if (!opt) return code;
    Bench b;
    b.opt = *opt;
    std::vector<Shape> shapes;
    std::vector<int64_t> hidden;
    try {
        for (const std::string& o : b.opt.sets)
            ZG_CHECK(o.rfind("kernels.", 0) == 0,
                     "--set " + o + ": bench_ce takes kernels.* keys only");
        ZG_CHECK(!(b.opt.sweep && !b.opt.shapes.empty()),
                 "--sweep sets its own shapes: leave out --shapes");
        zgpt::apply_overrides(b.cfg, b.opt.sets);
        shapes = shapes_of(b.opt);
        hidden = hidden_sizes(b.opt);
    } catch (const zgpt::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
    b.ce_tuning = b.cfg.kernels.cross_entropy_tuning;
    b.ce_tuning.trace = b.opt.trace;
    b.linear_tuning = zgpt::linear_ce_tuning(b.cfg.kernels);
    // with --dweight-acc the heads add into the tool's fp32 dW, so fused_linear_rows needs no fp32
    // buffer of its own (as in the trainer)
    b.linear_tuning.fp32_dweight_only = b.opt.dweight_acc;

    const zgpt::cuda::DeviceInfo dev = zgpt::cuda::query_devices();
    if (dev.count == 0) {
        std::fprintf(stderr, "no CUDA device: %s\n", dev.error.c_str());
        return 1;
    }
    b.copy_bw = copy_bandwidth();
    std::printf("device %s, %d SMs, copy %.2f TB/s (read + write)\n", dev.name.c_str(),
                dev.sm_count, b.copy_bw / 1e12);
    for (Shape sh : shapes) run_logits_heads(b, sh);
    if (any_linear_selected(b)) {
        b.matmul_flops = matmul_rate(b.opt.iters);
        std::printf("bf16 matmul 8192^3 through cuBLASLt: %.1f TFLOP/s\n", b.matmul_flops / 1e12);
        for (int64_t C : hidden)
            for (Shape sh : shapes) {  // (the fused heads ignore LD)
                run_linear_heads(b, sh, C, true);
                if (b.opt.sweep) run_linear_heads(b, sh, C, false);
            }
    }
    nlohmann::json doc{{"device", dev.name},
                       {"sm_count", dev.sm_count},
                       {"driver", dev.driver_version},
                       {"runtime", dev.runtime_version},
                       {"copy_TBps", b.copy_bw / 1e12},
                       {"results", b.results},
                       {"sweep", b.opt.sweep},
                       {"overrides", b.opt.sets},
                       {"kernel_tuning", zgpt::kernel_tuning_json(b.cfg)},
                       {"trace", b.opt.trace}};
    if (!b.opt.out.empty()) std::ofstream(b.opt.out) << doc.dump(2) << "\n";
    return 0;
}

// bench_ce: times every registered CUDA cross_entropy variant (forward + backward, bf16 logits,
// z = 1e-4, mean, dlogits in place) at the benchmark shapes, against the floor of one read of the
// logits and one write of dlogits at the copy bandwidth measured on this GPU in the same run.
//
//   bench_ce [--out results.json] [--variants naive,online,fast] [--iters 20] [--shapes NxV,...]
//            [--set kernels.cross_entropy_tuning.parts=4 ...] [--trace]
//
// --set takes the trainer's kernels.* keys: kernels.cross_entropy_tuning.* (fast, fast_lockstep)
// and kernels.linear_ce_* (fused_linear), checked as the config checks them (each key applies to
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
#include <sstream>

#include "kernels/core/check.h"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/matmul.h"
#include "kernels/loss_head/cross_entropy.h"
#include "tools/bench/bench_util.h"
#include "train/cli.h"
#include "train/config.h"

using namespace zgpt::bench;

int main(int argc, char** argv) {
    CLI::App app{"Time the registered CUDA cross-entropy variants against the memory floor."};
    zgpt::report_cli_errors(app);
    std::string out, only, shapes_arg;
    int iters = 20;
    bool dweight_acc = false;
    app.add_option("--out", out, "write the results as JSON here");
    app.add_option("--variants", only,
                   "comma-separated variant names, fused_linear included (default: all)");
    app.add_option("--iters", iters, "timed iterations per variant")->capture_default_str();
    double weight_std = 0.02;
    app.add_option("--weight-std", weight_std,
                   "the fused linear heads' W spread (h's is 0.5): 0.02, the anchors', gives "
                   "near-uniform softmax rows; 0.2 peaked ones (what gradient filtering skips "
                   "depends on it)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--shapes", shapes_arg,
                   "CE shapes as NxV or NxV:LD (rows of stride LD >= V, as the trainer's padded "
                   "logits), comma-separated (default: 32768x128256,8192x50304); the fused "
                   "linear heads take N x V with C = 768");
    app.add_flag("--dweight-acc", dweight_acc,
                 "fused_linear adds dW into an fp32 accumulator (as the trainer does) instead of "
                 "writing it as bf16");
    std::vector<std::string> sets;
    app.add_option(
        "--set", sets,
        "kernels.key=value: the kernels' tuning keys of the trainer's config "
        "(kernels.cross_entropy_tuning.*, kernels.linear_ce_*; train --help lists them)");
    bool trace = false;
    app.add_flag("--trace", trace,
                 "fast, bf16: record where a row's time goes and print it to stderr after each "
                 "launch (synchronises; CrossEntropyTuning::trace)");
    CLI11_PARSE(app, argc, argv);
    zgpt::Config cfg;
    try {
        for (const std::string& o : sets)
            ZG_CHECK(o.rfind("kernels.", 0) == 0,
                     "--set " + o + ": bench_ce takes kernels.* keys only");
        zgpt::apply_overrides(cfg, sets);
    } catch (const zgpt::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
    zgpt::cuda::CrossEntropyTuning ce_tuning = cfg.kernels.cross_entropy_tuning;
    ce_tuning.trace = trace;
    zgpt::cuda::LinearCrossEntropyTuning linear_tuning = zgpt::linear_ce_tuning(cfg.kernels);
    // with --dweight-acc the heads add into the tool's fp32 dW, so fused_linear_rows needs no fp32
    // buffer of its own (as in the trainer)
    linear_tuning.fp32_dweight_only = dweight_acc;

    const zgpt::cuda::DeviceInfo dev = zgpt::cuda::query_devices();
    if (dev.count == 0) {
        std::fprintf(stderr, "no CUDA device: %s\n", dev.error.c_str());
        return 1;
    }
    const double bw = copy_bandwidth();
    std::printf("device %s, %d SMs, copy %.2f TB/s (read + write)\n", dev.name.c_str(),
                dev.sm_count, bw / 1e12);
    nlohmann::json results = nlohmann::json::array();
    struct Shape {
        int64_t N, V, ld;
    };
    std::vector<Shape> ce_shapes = {{32768, 128256, 128256}, {8192, 50304, 50304}};
    if (!shapes_arg.empty()) {  // "NxV,NxV:LD,..."
        ce_shapes.clear();
        std::stringstream ss(shapes_arg);
        for (std::string item; std::getline(ss, item, ',');) {
            const size_t x = item.find('x'), c = item.find(':');
            if (x == std::string::npos) {
                std::fprintf(stderr, "--shapes: expected NxV or NxV:LD, got '%s'\n", item.c_str());
                return 2;
            }
            Shape sh{std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1)), 0};
            sh.ld = c == std::string::npos ? sh.V : std::stoll(item.substr(c + 1));
            if (sh.N <= 0 || sh.V <= 0 || sh.ld < sh.V) {
                std::fprintf(stderr, "--shapes: need N, V > 0 and LD >= V in '%s'\n", item.c_str());
                return 2;
            }
            ce_shapes.push_back(sh);
        }
    }
    for (Shape sh : ce_shapes) {
        const size_t n = size_t(sh.N) * sh.ld;  // allocated; the floor counts the N x V used
        __nv_bfloat16 *pristine, *logits;
        int32_t* targets;
        float *go, *rows;
        zgpt::cuda::LossSummaryF* summary;
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
        const double used = double(sh.N) * double(sh.V);
        const double floor_ms = 2.0 * used * 2 / bw * 1e3;
        zgpt::CrossEntropyOptions o;
        o.z_loss_weight = 1e-4;
        for (const auto& v : zgpt::cuda::cross_entropy_variants()) {
            if (!only.empty() &&
                ("," + only + ",").find("," + std::string(v.name) + ",") == std::string::npos)
                continue;
            const size_t ws_bytes = v.workspace_bytes(sh.N, sh.V, zgpt::cuda::LogitsType::bf16);
            void* ws = nullptr;
            if (cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
                cudaGetLastError();
                std::printf("%-8s N=%lld V=%lld: workspace of %.2f GB does not fit\n", v.name,
                            (long long)sh.N, (long long)sh.V, ws_bytes / 1e9);
                results.push_back({{"variant", v.name}, {"N", sh.N}, {"V", sh.V}, {"note", "OOM"}});
                continue;
            }
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
            a.tuning = ce_tuning;
            const double med =
                time_ms([&] { v.run(a, o, ws, nullptr); }, iters,
                        [&] { CK(cudaMemcpy(logits, pristine, n * 2, cudaMemcpyDeviceToDevice)); });
            zgpt::cuda::LossSummaryF s;
            CK(cudaMemcpy(&s, summary, sizeof s, cudaMemcpyDeviceToHost));
            const double gbps = 2.0 * used * 2 / (med * 1e-3) / 1e9;
            std::printf(
                "%-8s N=%-6lld V=%-7lld ld=%-7lld %8.3f ms  %7.0f GB/s  %5.2fx floor (%.3f ms)  "
                "extra %.3f GB  loss %.5f\n",
                v.name, (long long)sh.N, (long long)sh.V, (long long)sh.ld, med, gbps,
                med / floor_ms, floor_ms, ws_bytes / 1e9, s.loss);
            std::fflush(stdout);
            results.push_back({{"variant", v.name},
                               {"N", sh.N},
                               {"V", sh.V},
                               {"ld", sh.ld},
                               {"ms", med},
                               {"GBps", gbps},
                               {"floor_ms", floor_ms},
                               {"x_floor", med / floor_ms},
                               {"extra_GB", ws_bytes / 1e9},
                               {"loss", s.loss},
                               {"iters", iters}});
            cudaFree(ws);
        }
        cudaFree(pristine);
        cudaFree(logits);
        cudaFree(targets);
        cudaFree(go);
        cudaFree(rows);
        cudaFree(summary);
    }
    // fused linear + CE from hidden states: floor = 3 GEMMs of 2 N C V FLOPs at the bf16 matmul
    // rate measured here through the same cuBLASLt wrapper (8192^3)
    if (only.empty() || only.find("fused_linear") != std::string::npos) {
        const double flops = matmul_rate(iters);
        std::printf("bf16 matmul 8192^3 through cuBLASLt: %.1f TFLOP/s\n", flops / 1e12);
        for (const auto& v : zgpt::cuda::linear_cross_entropy_variants())
            for (Shape sh : ce_shapes) {  // (the fused heads ignore LD)
                if (!only.empty() &&
                    ("," + only + ",").find("," + std::string(v.name) + ",") == std::string::npos)
                    continue;
                const int64_t N = sh.N, V = sh.V, C = 768;
                void *h, *w, *dh, *dw, *ws;
                int32_t* targets;
                float *go, *rows;
                zgpt::cuda::LossSummaryF* summary;
                CK(cudaMalloc(&h, N * C * 2));
                CK(cudaMalloc(&w, V * C * 2));
                CK(cudaMalloc(&targets, N * 4));
                CK(cudaMalloc(&go, 4));
                CK(cudaMalloc(&rows, N * 4));
                CK(cudaMalloc(&summary, sizeof(zgpt::cuda::LossSummaryF)));
                fill_logits(static_cast<__nv_bfloat16*>(h), N * C, 3,
                            1.22);  // std 0.5, as the anchors
                // two uniforms summed: std half_width / sqrt(6), so 0.049 gives 0.02
                fill_logits(static_cast<__nv_bfloat16*>(w), V * C, 5, 0.049 * weight_std / 0.02);
                std::vector<int32_t> ht(N);
                for (int64_t i = 0; i < N; i++) ht[i] = int32_t((i * 2654435761ull) % uint64_t(V));
                CK(cudaMemcpy(targets, ht.data(), N * 4, cudaMemcpyHostToDevice));
                const float one = 1.0f;
                CK(cudaMemcpy(go, &one, 4, cudaMemcpyHostToDevice));
                const size_t ws_bytes = v.workspace_bytes(N, C, V, linear_tuning);
                CK(cudaMalloc(&dh, N * C * 2));
                const size_t dw_bytes = size_t(V) * C * (dweight_acc ? 4 : 2);  // fp32 or bf16
                CK(cudaMalloc(&dw, dw_bytes));
                CK(cudaMalloc(&ws, ws_bytes));
                zgpt::cuda::LinearCrossEntropyArgs la;
                la.hidden = h;
                la.weight = w;
                la.N = N;
                la.C = C;
                la.V = V;
                la.targets = targets;
                la.grad_output = go;
                la.dhidden = dh;
                if (dweight_acc)
                    la.dweight_acc = static_cast<float*>(dw);
                else
                    la.dweight = dw;
                la.loss_rows = rows;
                la.summary = summary;
                la.tuning = linear_tuning;
                zgpt::CrossEntropyOptions o;
                o.z_loss_weight = 1e-4;
                const double ms =
                    time_ms([&] { v.run(la, o, ws, nullptr); }, std::max(3, iters / 2));
                zgpt::cuda::LossSummaryF s;
                CK(cudaMemcpy(&s, summary, sizeof s, cudaMemcpyDeviceToHost));
                // 3 GEMMs: the logits once; 4: the logits twice, the least an exact head needs
                // within the memory targets (docs/cross_entropy.md)
                const double floor_ms = 3.0 * 2.0 * N * C * V / flops * 1e3;
                const double floor4_ms = floor_ms * 4.0 / 3.0;
                // everything the head allocates beyond its inputs: workspace, the two gradients,
                // cuBLASLt's
                const double extra =
                    double(ws_bytes + N * C * 2 + dw_bytes + zgpt::cuda::gemm_workspace_bytes()) /
                    1e9;
                std::printf(
                    "%-12s N=%-6lld V=%-7lld C=768 dW %s %8.3f ms  %6.0f TFLOP/s (4 GEMMs)  %5.2fx "
                    "floor (%.3f ms, 3 GEMMs; 4 GEMMs %.3f ms)  extra %.3f GB  loss %.5f\n",
                    v.name, (long long)N, (long long)V, dweight_acc ? "fp32 acc" : "bf16", ms,
                    4.0 * 2 * N * C * V / (ms * 1e-3) / 1e12, ms / floor_ms, floor_ms, floor4_ms,
                    extra, s.loss);
                results.push_back({{"variant", v.name},
                                   {"N", N},
                                   {"V", V},
                                   {"C", C},
                                   {"ms", ms},
                                   {"floor_ms", floor_ms},
                                   {"x_floor", ms / floor_ms},
                                   {"floor_4gemm_ms", floor4_ms},
                                   {"dweight", dweight_acc ? "fp32_acc" : "bf16"},
                                   {"extra_GB", extra},
                                   {"matmul_TFLOPs", flops / 1e12},
                                   {"weight_std", weight_std},
                                   {"loss", s.loss}});
                for (void* p : {h, w, dh, dw, ws}) cudaFree(p);
                cudaFree(targets);
                cudaFree(go);
                cudaFree(rows);
                cudaFree(summary);
            }
    }
    nlohmann::json doc{{"device", dev.name},
                       {"sm_count", dev.sm_count},
                       {"driver", dev.driver_version},
                       {"runtime", dev.runtime_version},
                       {"copy_TBps", bw / 1e12},
                       {"results", results},
                       {"overrides", sets},
                       {"kernel_tuning", zgpt::kernel_tuning_json(cfg)},
                       {"trace", trace}};
    if (!out.empty()) std::ofstream(out) << doc.dump(2) << "\n";
    return 0;
}

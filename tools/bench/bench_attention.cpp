// bench_attention: times the registered CUDA attention variants alone (bf16, causal), forward and
// backward separately, at the trainer's shape, against the FLOP floor at the bf16 matmul rate
// measured in the same run (cuBLASLt, 8192^3).
//
//   bench_attention [--out results.json] [--variants flash,flash_mma] [--iters 20]
//                   [--shape B,T,C,NH] [--kv-heads NKV]
//                   [--set kernels.attention_tuning.wgmma_dkdv_wgs=1 ...]
//   bench_attention --io DIR [--variants ...] [--shape ...] [--set ...]
//
// --io runs each variant once, untimed, on inputs another program wrote (DIR/qkv.bin,
// [B, T, C + 2 KVC], and DIR/dout.bin, [B, T, C], raw bf16) and writes its output and gradient
// beside them (DIR/<variant>.out.bin, DIR/<variant>.dqkv.bin): tools/dev/attention_accuracy.py
// compares them, and PyTorch's kernels on the same inputs, with a float64 reference. --out and
// --iters do not apply.
//
// The floor counts the products a causal attention needs: forward S = Q K^T and O = P V over the
// T (T + 1) / 2 query-key pairs of each head (4 hd FLOPs a pair), backward 2.5 times that (S is
// recomputed; dP = dO V^T, dV = P^T dO, dK = dS^T Q, dQ = dS K). Kernels that recompute more
// (ours compute S and dP twice, so that dQ needs no atomics) are still held to that floor.
// The backward is timed with the colsum rows the trainer passes (the qkv bias gradient).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "kernels/attention/attention.h"
#include "kernels/core/check.h"
#include "kernels/core/cuda_device.h"
#include "tools/bench/bench_util.h"
#include "train/cli.h"
#include "train/config.h"

using namespace zgpt::bench;
using zgpt::cuda::AttentionShape;
using zgpt::cuda::AttentionVariant;

namespace {

struct Options {
    std::string out, only, io, shape = "64,1024,768,12";
    int iters = 20;
    int64_t kv_heads = 0;  // grouped-query attention's key/value heads; 0: NH
    std::vector<std::string> sets;
};

// A shape's FLOPs and their floors (ms) at the measured bf16 matmul rate.
struct Floors {
    double rate = 0;  // FLOP/s
    double fwd_flops = 0, bwd_flops = 0, fwd_ms = 0, bwd_ms = 0;
};

// ---- parse -------------------------------------------------------------------------------------

std::optional<Options> parse(int argc, char** argv, int& exit_code) {
    CLI::App app{"Time the registered CUDA attention variants against their FLOP floor."};
    zgpt::report_cli_errors(app);
    Options o;
    app.add_option("--out", o.out, "write the results as JSON here");
    app.add_option("--variants", o.only,
                   "comma-separated variant names (default: flash,flash_mma)");
    app.add_option("--iters", o.iters, "timed iterations per direction")->capture_default_str();
    app.add_option("--io", o.io,
                   "run each variant once on DIR/qkv.bin and DIR/dout.bin (raw bf16) and write "
                   "DIR/<variant>.out.bin and .dqkv.bin, untimed");
    app.add_option("--shape", o.shape, "B,T,C,NH (GPT-2 124M's by default)")->capture_default_str();
    app.add_option("--kv-heads", o.kv_heads,
                   "key/value heads for grouped-query attention, a divisor of NH (0: NH)")
        ->capture_default_str();
    app.add_option("--set", o.sets,
                   "kernels.attention_tuning.key=value (train --help lists them), applied to "
                   "every variant timed");
    if (const std::optional<int> code = zgpt::parse_cli(app, argc, argv)) {
        exit_code = *code;
        return std::nullopt;
    }
    return o;
}

// ---- cases -------------------------------------------------------------------------------------

// --shape with the --set tuning; throws on a key outside kernels.attention_tuning or a bad shape
AttentionShape shape_of(const Options& o) {
    zgpt::Config cfg;
    for (const std::string& s : o.sets)
        ZG_CHECK(s.rfind("kernels.attention_tuning.", 0) == 0,
                 "--set " + s + ": bench_attention takes kernels.attention_tuning.* keys only");
    zgpt::apply_overrides(cfg, o.sets);
    std::stringstream ss(o.shape);
    std::vector<int64_t> v;
    for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoll(item));
    ZG_CHECK(v.size() == 4 && v[0] > 0 && v[1] > 0 && v[2] > 0 && v[3] > 0 && v[2] % v[3] == 0,
             "--shape: expected B,T,C,NH with C a multiple of NH, got '" + o.shape + "'");
    ZG_CHECK(o.kv_heads >= 0 && (o.kv_heads == 0 || v[3] % o.kv_heads == 0),
             "--kv-heads: expected a divisor of NH (" + std::to_string(v[3]) + "), got " +
                 std::to_string(o.kv_heads));
    AttentionShape sh;
    sh.B = v[0], sh.Tn = v[1], sh.C = v[2], sh.NH = v[3];
    sh.NKV = o.kv_heads;
    sh.tuning = cfg.kernels.attention_tuning;
    return sh;
}

// A row of qkv: C + 2 KVC (3C without grouped-query attention)
int64_t qkv_width(const AttentionShape& sh) {
    return sh.C + 2 * (sh.NKV ? sh.NKV : sh.NH) * (sh.C / sh.NH);
}

// --variants (default: flash,flash_mma)
std::string variant_list(const Options& o) {
    return o.only.empty() ? "flash,flash_mma" : o.only;
}

// the registered variants --variants names, in registry order
std::vector<const AttentionVariant*> variants_of(const Options& o) {
    const std::string only = variant_list(o);
    std::vector<const AttentionVariant*> out;
    for (const AttentionVariant& v : zgpt::cuda::attention_variants())
        if (("," + only + ",").find("," + std::string(v.name) + ",") != std::string::npos)
            out.push_back(&v);
    return out;
}

// ---- run ---------------------------------------------------------------------------------------

Floors floors_of(const AttentionShape& sh, double rate) {
    Floors f;
    f.rate = rate;
    const double hd = double(sh.C / sh.NH);
    const double pairs = double(sh.B) * sh.NH * double(sh.Tn) * double(sh.Tn + 1) / 2;
    f.fwd_flops = 4.0 * hd * pairs, f.bwd_flops = 2.5 * f.fwd_flops;
    f.fwd_ms = f.fwd_flops / rate * 1e3, f.bwd_ms = f.bwd_flops / rate * 1e3;
    return f;
}

// The inputs and outputs every variant shares: qkv and dout filled, o and dqkv written.
struct Buffers {
    void *qkv, *o, *dout, *dqkv;
    explicit Buffers(const AttentionShape& sh) {
        const size_t n_qkv = size_t(sh.B) * sh.Tn * qkv_width(sh),
                     n_out = size_t(sh.B) * sh.Tn * sh.C;
        CK(cudaMalloc(&qkv, n_qkv * 2));
        CK(cudaMalloc(&dqkv, n_qkv * 2));
        CK(cudaMalloc(&o, n_out * 2));
        CK(cudaMalloc(&dout, n_out * 2));
        fill_logits(static_cast<__nv_bfloat16*>(qkv), n_qkv, 21, 2.0);
        fill_logits(static_cast<__nv_bfloat16*>(dout), n_out, 23, 0.01);
    }
    ~Buffers() {
        cudaFree(qkv);
        cudaFree(dqkv);
        cudaFree(o);
        cudaFree(dout);
    }
};

// Times v's forward and backward, prints its line and returns its row.
nlohmann::json run_variant(const AttentionVariant& v, const Buffers& b, const AttentionShape& sh,
                           const Floors& f, int iters) {
    void *saved = nullptr, *scratch = nullptr;
    float* colsums = nullptr;
    const size_t saved_b = v.saved_bytes(sh), scratch_b = v.scratch_bytes(sh);
    const int64_t cs_rows = v.colsum_rows(sh, zgpt::DType::bf16);
    if (saved_b) CK(cudaMalloc(&saved, saved_b));
    if (scratch_b) CK(cudaMalloc(&scratch, scratch_b));
    if (cs_rows) CK(cudaMalloc(&colsums, size_t(cs_rows) * qkv_width(sh) * 4));
    auto forward = [&] { v.forward(b.o, saved, b.qkv, sh, zgpt::DType::bf16, nullptr); };
    const double fwd_ms = time_ms(forward, iters);
    const double bwd_ms = time_ms(
        [&] {
            v.backward(b.dqkv, b.dout, b.qkv, b.o, saved, scratch, colsums, sh, zgpt::DType::bf16,
                       nullptr);
        },
        iters, forward);
    std::printf(
        "%-10s forward %7.3f ms %6.1f TFLOP/s %5.2fx floor   backward %7.3f ms %6.1f TFLOP/s "
        "%5.2fx floor   both %5.2fx\n",
        v.name, fwd_ms, f.fwd_flops / fwd_ms / 1e9, fwd_ms / f.fwd_ms, bwd_ms,
        f.bwd_flops / bwd_ms / 1e9, bwd_ms / f.bwd_ms, (fwd_ms + bwd_ms) / (f.fwd_ms + f.bwd_ms));
    cudaFree(saved);
    cudaFree(scratch);
    cudaFree(colsums);
    return {{"variant", v.name},
            {"fwd_ms", fwd_ms},
            {"bwd_ms", bwd_ms},
            {"fwd_x_floor", fwd_ms / f.fwd_ms},
            {"bwd_x_floor", bwd_ms / f.bwd_ms},
            {"both_x_floor", (fwd_ms + bwd_ms) / (f.fwd_ms + f.bwd_ms)}};
}

// The bytes of DIR/name, which must be `bytes` long.
std::vector<char> read_exact(const std::string& path, size_t bytes) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    ZG_CHECK(in.good(), "--io: cannot read " + path);
    ZG_CHECK(size_t(in.tellg()) == bytes, "--io: " + path + " holds " +
                                              std::to_string(size_t(in.tellg())) +
                                              " bytes; the shape needs " + std::to_string(bytes));
    std::vector<char> data(bytes);
    in.seekg(0);
    in.read(data.data(), std::streamsize(bytes));
    return data;
}

void write_device(const std::string& path, const void* d, size_t bytes) {
    std::vector<char> host(bytes);
    CK(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost));
    std::ofstream out(path, std::ios::binary);
    out.write(host.data(), std::streamsize(bytes));
    ZG_CHECK(out.good(), "--io: cannot write " + path);
}

// --io: each variant once on the given inputs, its output and gradient written beside them.
void run_io(const Options& o, const AttentionShape& sh) {
    const Buffers b(sh);
    const size_t qkv_b = size_t(sh.B) * sh.Tn * qkv_width(sh) * 2,
                 out_b = size_t(sh.B) * sh.Tn * sh.C * 2;
    CK(cudaMemcpy(b.qkv, read_exact(o.io + "/qkv.bin", qkv_b).data(), qkv_b,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.dout, read_exact(o.io + "/dout.bin", out_b).data(), out_b,
                  cudaMemcpyHostToDevice));
    // every name must be a variant: a typo writes nothing, and the reader would find old files
    std::stringstream names(variant_list(o));
    for (std::string name; std::getline(names, name, ',');)
        zgpt::cuda::find_attention_variant(name);
    for (const AttentionVariant* v : variants_of(o)) {
        // outputs a variant leaves unwritten read as NaN, not as the previous variant's
        CK(cudaMemset(b.o, 0xff, out_b));
        CK(cudaMemset(b.dqkv, 0xff, qkv_b));
        void *saved = nullptr, *scratch = nullptr;
        if (const size_t n = v->saved_bytes(sh)) CK(cudaMalloc(&saved, n));
        if (const size_t n = v->scratch_bytes(sh)) CK(cudaMalloc(&scratch, n));
        v->forward(b.o, saved, b.qkv, sh, zgpt::DType::bf16, nullptr);
        v->backward(b.dqkv, b.dout, b.qkv, b.o, saved, scratch, nullptr, sh, zgpt::DType::bf16,
                    nullptr);
        CK(cudaDeviceSynchronize());
        write_device(o.io + "/" + v->name + ".out.bin", b.o, out_b);
        write_device(o.io + "/" + v->name + ".dqkv.bin", b.dqkv, qkv_b);
        std::printf("%s: wrote %s/%s.out.bin and .dqkv.bin\n", v->name, o.io.c_str(), v->name);
        cudaFree(saved);
        cudaFree(scratch);
    }
}

void write_json(const std::string& path, const zgpt::cuda::DeviceInfo& dev,
                const AttentionShape& sh, const Options& o, const Floors& f,
                const nlohmann::json& rows) {
    std::ofstream out(path);
    out << nlohmann::json{{"device", dev.name},
                          {"matmul_TFLOPs", f.rate / 1e12},
                          {"shape",
                           {{"B", sh.B},
                            {"T", sh.Tn},
                            {"C", sh.C},
                            {"NH", sh.NH},
                            {"NKV", sh.NKV ? sh.NKV : sh.NH}}},
                          {"sets", o.sets},
                          {"fwd_floor_ms", f.fwd_ms},
                          {"bwd_floor_ms", f.bwd_ms},
                          {"rows", rows}}
               .dump(2)
        << "\n";
}

}  // namespace

int main(int argc, char** argv) {
    int code = 0;
    const std::optional<Options> opt = parse(argc, argv, code);
    if (!opt) return code;
    AttentionShape sh;
    try {
        sh = shape_of(*opt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
    const zgpt::cuda::DeviceInfo dev = zgpt::cuda::query_devices();
    if (dev.count == 0) {
        std::fprintf(stderr, "no CUDA device: %s\n", dev.error.c_str());
        return 1;
    }
    if (!opt->io.empty()) {
        try {
            run_io(*opt, sh);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s\n", e.what());
            return 1;
        }
        return 0;
    }
    const Floors f = floors_of(sh, matmul_rate(opt->iters));
    std::printf(
        "device %s, %d SMs; bf16 matmul 8192^3 through cuBLASLt: %.1f TFLOP/s\n"
        "B=%lld T=%lld C=%lld NH=%lld NKV=%lld: forward %.3f TFLOP (floor %.3f ms), backward "
        "%.3f TFLOP (floor %.3f ms)\n",
        dev.name.c_str(), dev.sm_count, f.rate / 1e12, (long long)sh.B, (long long)sh.Tn,
        (long long)sh.C, (long long)sh.NH, (long long)(sh.NKV ? sh.NKV : sh.NH), f.fwd_flops / 1e12,
        f.fwd_ms, f.bwd_flops / 1e12, f.bwd_ms);
    nlohmann::json rows = nlohmann::json::array();
    {
        const Buffers buf(sh);
        for (const AttentionVariant* v : variants_of(*opt))
            rows.push_back(run_variant(*v, buf, sh, f, opt->iters));
    }
    if (!opt->out.empty()) write_json(opt->out, dev, sh, *opt, f, rows);
    return 0;
}

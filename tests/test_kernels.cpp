// The kernel table: every op family x variant x shape x type against the CPU reference (ggml's
// test-backend-ops is the model). The variants of the registered families come from
// kernel_families() (kernels/core/registry.h), so a newly registered variant gets its rows at once,
// and one the table has no runner for fails by name. Ops without a registry family (the encoder,
// the qk LayerNorm, GELU, the residual add, AdamW, the global norm) have one variant, "cuda". The
// variant "cpu" is a family's vectorised float CPU path against the same reference in double.
//
// Built in every build. Where CUDA is not built, or no GPU is usable, the CPU rows run and the GPU
// rows are counted as skipped with the reason; the last test case prints rows run and skipped per
// family. The GPU checks and their tolerances are in tests/kernel_checks_gpu.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/core/cuda_device.h"
#include "kernels/core/registry.h"
#include "kernels/gemm/matmul.h"
#include "kernels/loss_head/cross_entropy.h"
#include "kernels/ops/gelu.h"
#include "tests/helpers.h"
#include "tests/kernel_table.h"

using namespace zgpt;
using namespace zgpt::test;

namespace {

// A GPU row's check: the call where CUDA is built, nothing (a skipped row) where it is not.
#ifdef ZGPT_HAVE_CUDA
#define GPU_CHECK(call) std::function<void()>([=] { call; })
#else
#define GPU_CHECK(call) std::function<void()>()
#endif

// Why this process cannot run the GPU rows; empty when it can.
const std::string& gpu_unavailable() {
#ifdef ZGPT_HAVE_CUDA
    static const std::string why = [] {
        const cuda::DeviceInfo d = cuda::query_devices();
        return d.count > 0 ? std::string() : "no usable CUDA device: " + d.error;
    }();
#else
    static const std::string why = "a CPU-only build (no CUDA backend)";
#endif
    return why;
}

// One row of the table, with printable parameters.
struct Row {
    std::string family, variant, shape, types;
    bool gpu = true;
    std::function<void()> check;  // runs the op and CHECKs it against the CPU reference
    std::string name() const { return family + " / " + variant + " / " + shape + " / " + types; }
    bool runnable() const { return check && (!gpu || gpu_unavailable().empty()); }
};

// "B=2 T=7 C=12" from names and values.
std::string dims(std::initializer_list<std::pair<const char*, int64_t>> d) {
    std::string s;
    for (const auto& [k, v] : d) {
        if (!s.empty()) s += ' ';
        s += k;
        s += '=';
        s += std::to_string(v);
    }
    return s;
}

const DType kTypes[] = {DType::f32, DType::bf16};

// The activation and residual-stream types of the ops that take both: one type, or bf16
// activations over an fp32 residual stream (train.fp32_residual).
struct TypePair {
    DType t, res;
    std::string text() const {
        return t == res ? dtype_name(t) : std::string(dtype_name(t)) + ", fp32 residual";
    }
};
const TypePair kTypePairs[] = {
    {DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}};

// ---------------------------------------------------------------------------------------------
// The CPU rows: float paths (vectorised loops, OpenBLAS) against the same code in double.

using Vec = std::vector<double>;

void cpu_attention(const AttentionDims& k, double big) {
    // Odd sizes (head size 24 and 40, not a multiple of the vector width; T = 67), and logits
    // scaled up to about +-30 (peaked rows). float rounds each score's sum of hs products to about
    // hs eps |q||k| (eps = 6e-8: 1e-5 at hs = 40 and |q||k| ~ 4 scale^2), exp_vec is within 1.2e-7
    // relative, and the outputs and gradients sum T such terms: the bounds below are 1e-4 of each
    // tensor's largest magnitude.
    Rng rng(uint64_t(k.T * 131 + k.C));
    const int64_t n = k.B * k.T * 3 * k.C, m = k.B * k.T * k.C;
    Vec qkv = random_vector<double>(rng, n, big), dout = random_vector<double>(rng, m);
    Vec out(m), att(k.B * k.NH * k.T * k.T), dqkv(n, 0.0);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), k.B, k.T, k.C, k.NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), k.B, k.T, k.C, k.NH);
    std::vector<float> qf(qkv.begin(), qkv.end()), df(dout.begin(), dout.end());
    std::vector<float> of(m), af(att.size()), dqf(n, 0.0f);
    cpu::attention_forward(of.data(), af.data(), qf.data(), k.B, k.T, k.C, k.NH);
    cpu::attention_backward(dqf.data(), df.data(), qf.data(), af.data(), k.B, k.T, k.C, k.NH);
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
            for (int64_t t2 = t + 1; t2 < k.T; t2++) REQUIRE(af[(b * k.T + t) * k.T + t2] == 0.0f);
}

void cpu_gelu() {
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
    INFO("float GELU: largest error " << worst_out << " (output), " << worst_grad << " (grad)");
    CHECK(worst_out < 3e-7);
    CHECK(worst_grad < 1e-6);
}

// got (float) against want (double) within (K + 2) 2^-24 of mag, elementwise: a float sum of K
// products of float inputs, in any order and with or without FMA, is within gamma_K ~ K 2^-24 of
// sum |products| (Higham's bound); one more term for the bias or the value added into.
void check_float_sums(const char* what, const std::vector<float>& got, const Vec& want,
                      const Vec& mag, int64_t K) {
    const double u = std::ldexp(1.0, -24);
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double bound = double(K + 2) * u * mag[i];
        const double err = std::fabs(double(got[i]) - want[i]);
        if (!(err <= bound)) bad++;
        const double ratio = err / std::max(bound, 1e-300);
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = int64_t(i);
        }
    }
    INFO(std::string(what) << ": " << bad << " elements over the bound; worst at " << worst << " ("
                           << worst_ratio << " of its bound)");
    CHECK(bad == 0);
}

void cpu_matmul(const MatmulDims& s) {
    // float (OpenBLAS where built, else the loops) against double on the same float inputs
    const int64_t N = s.N, C = s.C, OC = s.OC;
    Rng rng(uint64_t(N * 7919 + C * 31 + OC));
    auto floats = [&](int64_t n, double scale) {
        std::vector<float> v(n);
        for (float& x : v) x = float(scale * rng.normal());
        return v;
    };
    const std::vector<float> x = floats(N * C, 1.0), w = floats(OC * C, 0.3), b = floats(OC, 1.0),
                             dy = floats(N * OC, 1.0);
    const Vec xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end()),
        dyd(dy.begin(), dy.end());
    Vec y(N * OC), gx(N * C, 0.0), gw(OC * C, 0.0), gb(OC, 0.0);
    cpu::matmul_forward(y.data(), xd.data(), wd.data(), bd.data(), N, C, OC);
    cpu::matmul_backward(gx.data(), gw.data(), gb.data(), dyd.data(), xd.data(), wd.data(), N, C,
                         OC);
    std::vector<float> yf(N * OC), gxf(N * C, 0.0f), gwf(OC * C, 0.0f), gbf(OC, 0.0f);
    cpu::matmul_forward(yf.data(), x.data(), w.data(), b.data(), N, C, OC);
    cpu::matmul_backward(gxf.data(), gwf.data(), gbf.data(), dy.data(), x.data(), w.data(), N, C,
                         OC);
    // sum |products| of each output
    Vec my(N * OC), mx(N * C, 0.0), mw(OC * C, 0.0), mb(OC, 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double m = std::fabs(bd[o]);
            for (int64_t c = 0; c < C; c++) {
                m += std::fabs(xd[n * C + c] * wd[o * C + c]);
                mx[n * C + c] += std::fabs(dyd[n * OC + o] * wd[o * C + c]);
                mw[o * C + c] += std::fabs(dyd[n * OC + o] * xd[n * C + c]);
            }
            my[n * OC + o] = m;
            mb[o] += std::fabs(dyd[n * OC + o]);
        }
    check_float_sums("out", yf, y, my, C);
    check_float_sums("dinp", gxf, gx, mx, OC);
    check_float_sums("dweight", gwf, gw, mw, N);
    check_float_sums("dbias", gbf, gb, mb, N);
}

// ---------------------------------------------------------------------------------------------
// The runners: the rows of one (family, variant).

// Multi-head, then grouped-query (NKV of NH key/value heads: a third, one, and NH given
// explicitly) at head sizes 4, 32, 64 (the tensor-core kernels) and 128, odd and even T (the
// Hopper dK/dV kernel's TMA ring runs where T % 4 == 0, its cp.async one elsewhere).
const AttentionDims kAttentionShapes[] = {
    {2, 7, 12, 3},        {1, 65, 64, 1},      {2, 130, 128, 2},     {1, 33, 256, 2},
    {2, 256, 128, 2},     {1, 200, 64, 1},     {1, 1024, 128, 2},    {2, 7, 48, 12, 4},
    {2, 67, 192, 6, 2},   {1, 1, 768, 12, 4},  {2, 129, 768, 12, 4}, {1, 1000, 768, 12, 4},
    {1, 1025, 256, 4, 1}, {2, 256, 256, 4, 1}, {1, 130, 256, 2, 1},  {2, 130, 128, 2, 2},
    {1, 7, 384, 6, 1}};
std::string text(const AttentionDims& s) {
    return dims({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"NH", s.NH}}) +
           (s.NKV ? " NKV=" + std::to_string(s.NKV) : "") +
           (s.dkdv_wgs ? " dkdv_wgs=" + std::to_string(s.dkdv_wgs) : "") +
           (s.dkdv_tile ? " dkdv_tile=" + std::to_string(s.dkdv_tile) : "") +
           (s.dq_tile ? " dq_tile=" + std::to_string(s.dq_tile) : "") +
           (s.fwd_pipeline ? " fwd_pipeline=true" : "") + (s.dkdv_tma ? "" : " dkdv_tma=false") +
           (s.dq_tma ? "" : " dq_tma=false") + (s.fwd_tma ? "" : " fwd_tma=false") +
           (s.fwd_keys ? " fwd_keys=" + std::to_string(s.fwd_keys) : "") + (s.rope ? " rope" : "") +
           (s.unrounded_dsum ? " unrounded_dsum" : "");
}
// Rotary positions (the inverse rotation at the Hopper kernels' stores, a pass elsewhere): head
// sizes 4, 32 and 64, grouped-query and multi-query, odd T.
const AttentionDims kRopeShapes[] = {
    {.B = 2, .T = 7, .C = 48, .NH = 12, .NKV = 4, .rope = true},
    {.B = 2, .T = 67, .C = 192, .NH = 6, .NKV = 2, .rope = true},
    {.B = 2, .T = 129, .C = 768, .NH = 12, .NKV = 4, .rope = true},
    {.B = 1, .T = 1000, .C = 768, .NH = 12, .NKV = 4, .rope = true},
    {.B = 2, .T = 256, .C = 256, .NH = 4, .NKV = 1, .rope = true}};

void attention_rows(const std::string& v, std::vector<Row>& rows) {
    for (DType t : kTypes)
        for (const AttentionDims& s : kRopeShapes) {
            rows.push_back(
                {"attention", v, text(s), dtype_name(t), true, GPU_CHECK(gpu::attention(v, s, t))});
            if (v == "flash" && t == DType::bf16 && s.C / s.NH == 64) {  // the other dK/dV stores
                AttentionDims w = s;
                w.dkdv_wgs = 1;
                w.dkdv_tma = false;
                w.dq_tma = false;
                rows.push_back({"attention", v, text(w), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, w, t))});
                AttentionDims ws = s;  // the warp-specialised kernels' stores
                ws.dkdv_tile = 128;
                ws.dq_tile = 128;
                rows.push_back({"attention", v, text(ws), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, ws, t))});
                // the forward's 64-key tiles and the dK/dV kernel's 64-query tiles by TMA, checked
                // bit for bit against the cp.async kernels
                AttentionDims k = s;
                k.fwd_keys = 64;
                k.dkdv_tile = 64;
                rows.push_back({"attention", v, text(k), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, k, t))});
            }
        }
    for (DType t : kTypes)
        for (const AttentionDims& s : kAttentionShapes) {
            rows.push_back(
                {"attention", v, text(s), dtype_name(t), true, GPU_CHECK(gpu::attention(v, s, t))});
            // flash's other Hopper kernels (the forward that overlaps consecutive tiles, one
            // warpgroup per dK/dV block); they run where the wgmma kernels do: bf16, head size 64
            if (v == "flash" && t == DType::bf16 && s.C / s.NH == 64) {
                AttentionDims w = s;
                w.dkdv_wgs = 1;
                w.fwd_pipeline = true;
                rows.push_back({"attention", v, text(w), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, w, t))});
                // the cp.async kernels, against which the default rows check their TMA rings bit
                // for bit (the dK/dV kernel's ring runs where T % 4 == 0)
                AttentionDims m = s;
                m.dkdv_tma = false;
                m.dq_tma = false;
                m.fwd_tma = false;
                rows.push_back({"attention", v, text(m), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, m, t))});
                // the warp-specialised kernels (128-row tiles; where T % 4 != 0 the default
                // dK/dV kernel runs)
                AttentionDims ws = s;
                ws.dkdv_tile = 128;
                ws.dq_tile = 128;
                rows.push_back({"attention", v, text(ws), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, ws, t))});
                // the forward's 64-key tiles and the dK/dV kernel's 64-query tiles by TMA,
                // checked bit for bit against the cp.async kernels (the default rows run 128-key
                // forward tiles, the diagonal tile half masked for a block's first warpgroup and a
                // tile reaching past T zero-filled by the TMA, and where T % 4 == 0 the
                // warp-specialised dK/dV kernel)
                AttentionDims k = s;
                k.fwd_keys = 64;
                k.dkdv_tile = 64;
                rows.push_back({"attention", v, text(k), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, k, t))});
            }
        }
    // attention_tuning.unrounded_dsum: the output's rounding residual saved and read into D, on
    // the wgmma (head size 64), mma.sync and scalar (head size 32) paths and the warp-specialised
    // dQ kernel; then its gain on peaked rows
    if (v == "flash" || v == "flash_mma") {
        for (DType t : kTypes)
            for (AttentionDims u :
                 {AttentionDims{1, 65, 64, 1}, AttentionDims{2, 129, 768, 12, 4},
                  AttentionDims{2, 67, 192, 6, 2},
                  AttentionDims{
                      .B = 2, .T = 256, .C = 256, .NH = 4, .dkdv_tile = 128, .dq_tile = 128},
                  AttentionDims{
                      .B = 1, .T = 130, .C = 256, .NH = 4, .dkdv_wgs = 1, .fwd_pipeline = true}}) {
                u.unrounded_dsum = true;
                rows.push_back({"attention", v, text(u), dtype_name(t), true,
                                GPU_CHECK(gpu::attention(v, u, t))});
            }
        for (const AttentionDims& u :
             {AttentionDims{2, 256, 256, 4}, AttentionDims{1, 200, 192, 6}}) {
            rows.push_back({"attention", v, text(u) + " unrounded_dsum gain on peaked rows",
                            dtype_name(DType::bf16), true,
                            GPU_CHECK(gpu::attention_unrounded_dsum_gain(v, u))});
        }
    }
    // T = 192: the last dK/dV block's second warpgroup has no key below T (the warp-specialised
    // kernels' loader still fills and the warpgroup still releases every tile)
    if (v == "flash") {
        const AttentionDims w{
            .B = 2, .T = 192, .C = 128, .NH = 2, .dkdv_tile = 128, .dq_tile = 128};
        rows.push_back({"attention", v, text(w), dtype_name(DType::bf16), true,
                        GPU_CHECK(gpu::attention(v, w, DType::bf16))});
    }
}

void attention_cpu_rows(std::vector<Row>& rows) {
    for (const AttentionDims& s :
         {AttentionDims{2, 67, 72, 3}, {1, 33, 80, 2}, {2, 64, 128, 4}, {1, 40, 48, 2}})
        for (double big : {1.0, 4.0})
            rows.push_back({"attention", "cpu", text(s) + " scale=" + std::to_string(int(big)),
                            "fp32", false, [=] { cpu_attention(s, big); }});
}

// V below, at and above block and vector sizes, not multiples of them, and the real vocabularies.
const int64_t kVocab[] = {1, 7, 64, 127, 128, 129, 513, 4097, 50257, 50304, 128256, 256000};

// Each variant's rows take the options of its turn in the registry (seed, reduction, ignored
// targets, in place), as test_gpu's loop over the variants did: the options change from variant
// to variant at each vocabulary. fused_linear takes bf16 only and runs as a loss
// head through a V x V identity weight (ce_gpu.h): up to V = 50304 (5 GB).
void cross_entropy_rows(const std::string& v, std::vector<Row>& rows) {
    const std::vector<std::string>& names = kernel_family("cross_entropy").variants;
    const int64_t turn = std::find(names.begin(), names.end(), v) - names.begin();
    const int64_t n_vocab = int64_t(std::size(kVocab));
    for (int64_t ti = 0; ti < 2; ti++)
        for (int64_t vi = 0; vi < n_vocab; vi++) {
            const DType t = kTypes[ti];
            const int64_t V = kVocab[vi];
            if (is_linear_cross_entropy(v) && (t != DType::bf16 || V > 50304)) continue;
            const uint64_t s = uint64_t(100 + (turn * 2 + ti) * n_vocab + vi);
            const Reduction r = s % 3 == 0   ? Reduction::mean
                                : s % 3 == 1 ? Reduction::sum
                                             : Reduction::none;
            const CeDims d{V >= 100000 ? 6 : 13, V, r, V > 1 ? 0.1 : 0.0, int(s % 3),
                           (s + 1) % 2 == 0,     s};
            const std::string shape = dims({{"N", d.N}, {"V", V}}) + " " + reduction_name(r) +
                                      " ignored=" + std::to_string(d.ignored) +
                                      (d.in_place ? " in place" : "");
            rows.push_back({"cross_entropy", v, shape, dtype_name(t), true,
                            GPU_CHECK(gpu::cross_entropy(v, d, t))});
        }
}

// C of one element, below and at a warp's vector (8 per lane), multiples of 8 (the vectorised
// kernels: GPT widths, 64 with most lanes idle, 1288 the narrowest whose backward keeps its sums
// in shared memory (or splits its rows: six chunks, three a warp, the last with one live lane),
// 1600 = GPT-2 1558M's with a last chunk of 64 columns, 2048 the widest) and C off them (769) or
// past the widest (2056) for the scalar ones.
// Widths of whole vectors take enough rows that every warp of the persistent backward owns
// several (the next row is prefetched while one is worked on).
const int64_t kLayernormWidths[] = {1, 7, 64, 256, 768, 769, 1288, 1600, 2048, 2056};

void layernorm_rows(const std::string& v, std::vector<Row>& rows) {
    for (const TypePair& p : kTypePairs)
        for (int64_t C : kLayernormWidths) {
            const LayernormDims s{C % 8 == 0 && C >= 256 ? 4099 : 37, C};
            rows.push_back({"layernorm", v, dims({{"N", s.N}, {"C", C}}), p.text(), true,
                            GPU_CHECK(gpu::layernorm(v, s, p.t, p.res))});
        }
}

// 4099 x 264: several rows per lane of the vectorised column sums, a partial block.
const MatmulDims kMatmulShapes[] = {{13, 24, 40}, {64, 64, 256}, {33, 7, 5}, {4099, 8, 264}};
std::string text(const MatmulDims& s) {
    return dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}});
}

// wgmma's own tiles (128 x 256, K in steps of 64): K past the last full step, a partial last row
// and column tile, and more tiles than SMs (each CTA walks several: the ring and the tile buffer
// go round more than once).
// {2056, 520, 1160}: more k steps (9) than the ping-pong ring's stages (5) and 170 tiles of 128
// x 128, so some CTAs' two warpgroups take one tile each and wait for their turn.
const MatmulDims kWgmmaShapes[] = {{300, 200, 520}, {16411, 40, 776}, {2056, 520, 1160}};

void matmul_rows(const std::string& v, std::vector<Row>& rows) {
    std::vector<MatmulDims> shapes(std::begin(kMatmulShapes), std::end(kMatmulShapes));
    if (v == "wgmma") shapes.insert(shapes.end(), std::begin(kWgmmaShapes), std::end(kWgmmaShapes));
    for (DType t : kTypes)
        for (const MatmulDims& s : shapes)
            rows.push_back(
                {"matmul", v, text(s), dtype_name(t), true, GPU_CHECK(gpu::matmul(v, s, t))});
}

void matmul_wgmma_schedules_rows(std::vector<Row>& rows) {
    // the trainer's fc + GELU product at a quarter of its rows: 128 x 24 tiles of 128 x 128, about
    // 23 a CTA (each warpgroup's turn many times), 12 k steps a tile through 5 stages
    rows.push_back({"matmul_wgmma_schedules", "wgmma",
                    dims({{"M", 16384}, {"K", 768}, {"N", 3072}}), "bf16", true,
                    GPU_CHECK(gpu::matmul_wgmma_schedules(16384, 768, 3072))});
}

void matmul_wgmma_swiglu_rows(std::vector<Row>& rows) {
    // an odd M (a partial row tile), H of 2 and 3 tiles of 128 units, K within one k step and past
    // it; then more tiles than SMs (65 row tiles x 3)
    for (const auto& [M, K, H] :
         {std::tuple<int64_t, int64_t, int64_t>{333, 64, 256}, {333, 200, 384}, {8195, 200, 384}})
        rows.push_back({"matmul_wgmma_swiglu", "wgmma", dims({{"M", M}, {"K", K}, {"H", H}}),
                        "bf16", true, GPU_CHECK(gpu::matmul_wgmma_swiglu(M, K, H))});
}

void matmul_wgmma_rope_rows(std::vector<Row>& rows) {
    // q's and k's 2 heads each rotated, v's 2 not; T odd and T = 64 (row tiles of 128 hold two
    // sequences); the last has more tiles than SMs
    for (const auto& [B, T, K] :
         {std::tuple<int64_t, int64_t, int64_t>{21, 17, 200}, {3, 64, 64}, {300, 64, 64}})
        rows.push_back({"matmul_wgmma_rope", "wgmma",
                        dims({{"B", B}, {"T", T}, {"K", K}, {"N", 384}, {"rope_cols", 256}}),
                        "bf16", true, GPU_CHECK(gpu::matmul_wgmma_rope(B, T, K, 384, 256))});
}

void dgelu_bias_grad_rows(std::vector<Row>& rows) {
    // the trainer's fc width, 65 row tiles of 128 and a ragged last one
    rows.push_back({"matmul_dgelu_bias_grad", "cuda", dims({{"M", 8195}, {"K", 3072}, {"N", 768}}),
                    "bf16", true, GPU_CHECK(gpu::dgelu_bias_grad(8195, 3072, 768))});
}

void matmul_strided_rows(std::vector<Row>& rows) {
    // a vocab-parallel shard of odd length (the head's 50257 rows over 2 ranks leave 25129), its
    // logits' rows padded to 128 as the model pads them; and an odd stride (rows unaligned)
    for (DType t : kTypes)
        for (const auto& [N, ld] : {std::pair<int64_t, int64_t>{131, 256}, {131, 133}})
            rows.push_back({"matmul_strided", "cuda",
                            dims({{"M", 300}, {"K", 64}, {"N", N}, {"ld", ld}}), dtype_name(t),
                            true, GPU_CHECK(gpu::matmul_strided(300, 64, N, ld, t))});
}

void column_sums_rows(std::vector<Row>& rows) {
    // 32 thread rows of 4 chains: fewer rows than thread rows, each tail length (1, 2 and 3 of the
    // last 4-chain step), whole steps, a persistent grid's count; 37 columns (a partial block)
    for (int64_t n : {1, 31, 33, 65, 97, 128, 129, 300, 396})
        rows.push_back({"column_sums", "cuda", dims({{"rows", n}, {"cols", 37}}), "fp32", true,
                        GPU_CHECK(gpu::column_sums(n, 37))});
}

void matmul_cpu_rows(std::vector<Row>& rows) {
    // N not a multiple of the 4-row tile; C and OC odd; one GPT-like width
    for (const MatmulDims& s : {MatmulDims{7, 9, 5}, {33, 7, 5}, {64, 64, 256}, {129, 768, 65}})
        rows.push_back({"matmul", "cpu", text(s), "fp32", false, [=] { cpu_matmul(s); }});
}

void qk_layernorm_rows(std::vector<Row>& rows) {
    const HeadsDims s{9, 3, 5};
    for (DType t : kTypes)
        rows.push_back({"qk_layernorm", "cuda", dims({{"BT", s.BT}, {"NH", s.NH}, {"hs", s.hs}}),
                        dtype_name(t), true, GPU_CHECK(gpu::qk_layernorm(s, t))});
}

void encoder_rows(std::vector<Row>& rows) {
    for (DType t : kTypes)
        for (const EncoderDims& s :
             {EncoderDims{3, 7, 37, 11}, {4, 64, 769, 101}, {2, 33, 768, 50}, {4, 512, 72, 9}})
            rows.push_back({"encoder", "cuda",
                            dims({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"V", s.V}}), dtype_name(t),
                            true, GPU_CHECK(gpu::encoder(s, t))});
}

void gelu_rows(std::vector<Row>& rows) {
    for (DType t : kTypes)
        for (int64_t n : {10007, 8192})
            rows.push_back({"gelu", "cuda", dims({{"n", n}}), dtype_name(t), true,
                            GPU_CHECK(gpu::gelu(n, t))});
}

// RMSNorm: the LayerNorm's widths (the same kernels) and rows, fused with the residual add, and
// q's heads inside qkv rows (qk_norm: 4 heads of 64 in rows of 512, grouped k/v beside them)
void rmsnorm_rows(std::vector<Row>& rows) {
    for (const TypePair& p : kTypePairs)
        for (int64_t C : kLayernormWidths) {
            const RmsnormDims s{C % 8 == 0 && C >= 256 ? 4099 : 37, C};
            rows.push_back({"rmsnorm", "cuda", dims({{"N", s.N}, {"C", C}}), p.text(), true,
                            GPU_CHECK(gpu::rmsnorm(s, p.t, p.res))});
        }
    for (DType t : kTypes)
        for (const RmsnormDims& s : {RmsnormDims{9, 5, 3, 45}, RmsnormDims{67, 64, 4, 512}})
            rows.push_back({"rmsnorm", "cuda (heads)",
                            dims({{"BT", s.N}, {"NH", s.NH}, {"hs", s.C}, {"ld", s.ld}}),
                            dtype_name(t), true, GPU_CHECK(gpu::rmsnorm(s, t, t))});
}

// Rotary embedding on q's and k's heads of a qkv row: 12 + 4 heads of 64 (grouped-query,
// v's 4 after them), odd head counts and T, a head of 2.
void rope_rows(std::vector<Row>& rows) {
    for (DType t : kTypes)
        for (const RopeDims& s : {RopeDims{2, 67, 16, 64, 1280}, RopeDims{1, 1024, 16, 64, 1280},
                                  RopeDims{3, 7, 5, 6, 33}, RopeDims{2, 5, 3, 2, 6}})
            rows.push_back(
                {"rope", "cuda",
                 dims({{"B", s.B}, {"T", s.T}, {"heads", s.heads}, {"hs", s.hs}, {"ld", s.ld}}),
                 dtype_name(t), true, GPU_CHECK(gpu::rope(s, t))});
}

// SwiGLU: H off the vector width, and llama-124m's 2048 (the 16-byte path)
void swiglu_rows(std::vector<Row>& rows) {
    for (DType t : kTypes)
        for (auto [N, H] : {std::pair<int64_t, int64_t>{37, 13}, {1031, 2048}, {64, 88}})
            rows.push_back({"swiglu", "cuda", dims({{"N", N}, {"H", H}}), dtype_name(t), true,
                            GPU_CHECK(gpu::swiglu(N, H, t))});
}

void gelu_cpu_rows(std::vector<Row>& rows) {
    rows.push_back({"gelu", "cpu", "x in [-12, 12] by 0.0137, 0, +-90", "fp32", false, cpu_gelu});
}

void residual_rows(std::vector<Row>& rows) {
    for (const TypePair& p : kTypePairs)
        for (int64_t n : {1, 255, 257, 1000003})
            rows.push_back({"residual", "cuda", dims({{"n", n}}), p.text(), true,
                            GPU_CHECK(gpu::residual(n, p.t, p.res))});
}

void adamw_rows(std::vector<Row>& rows) {
    const int64_t n = 100003;
    // one span; 99 spans (the trainer's GPT-2 table); 300 spans (three launches); an odd base
    // (the scalar path); bases that are multiples of 4 (the vector path with m and v offset)
    for (auto [base, spans] :
         {std::pair<int64_t, int>{0, 1}, {0, 99}, {0, 300}, {5, 7}, {8, 7}, {4, 300}})
        rows.push_back({"adamw", "cuda", dims({{"n", n}, {"base", base}, {"spans", spans}}),
                        "fp32, bf16 copy", true, GPU_CHECK(gpu::adamw(n, base, spans))});
}

void global_norm_rows(std::vector<Row>& rows) {
    for (int64_t n : {257, 100003})
        rows.push_back({"global_norm", "cuda", dims({{"n", n}}), "fp32", true,
                        GPU_CHECK(gpu::global_norm(n))});
}

struct Runner {
    std::string family, variant;
    std::function<void(std::vector<Row>&)> add_rows;
};

// Every (family, variant) the table can run. A family's variant "cpu" is its CPU float path.
std::vector<Runner> runners() {
    std::vector<Runner> r;
    auto per_variant = [&](const std::string& family, std::initializer_list<const char*> names,
                           void (*add)(const std::string&, std::vector<Row>&)) {
        for (const char* v : names)
            r.push_back(
                {family, v, [add, v = std::string(v)](std::vector<Row>& rows) { add(v, rows); }});
    };
    per_variant("attention",
                {"flash", "flash_mma", "naive", "flash_fwd_naive_bwd", "naive_fwd_flash_bwd"},
                attention_rows);
    r.push_back({"attention", "cpu", attention_cpu_rows});
    per_variant("cross_entropy",
                {"naive", "online", "fast", "fast_lockstep", "fused_linear", "fused_linear_wgmma",
                 "fused_linear_rows", "fused_linear_rows_filtered"},
                cross_entropy_rows);
    per_variant("layernorm", {"fused_residual", "separate", "residual_in_matmul"}, layernorm_rows);
    per_variant("matmul", {"fused_epilogue", "separate", "wgmma"}, matmul_rows);
    r.push_back({"matmul", "cpu", matmul_cpu_rows});
    r.push_back({"matmul_wgmma_schedules", "wgmma", matmul_wgmma_schedules_rows});
    r.push_back({"matmul_wgmma_swiglu", "wgmma", matmul_wgmma_swiglu_rows});
    r.push_back({"matmul_wgmma_rope", "wgmma", matmul_wgmma_rope_rows});
    r.push_back({"matmul_dgelu_bias_grad", "cuda", dgelu_bias_grad_rows});
    r.push_back({"matmul_strided", "cuda", matmul_strided_rows});
    r.push_back({"column_sums", "cuda", column_sums_rows});
    r.push_back({"qk_layernorm", "cuda", qk_layernorm_rows});
    r.push_back({"encoder", "cuda", encoder_rows});
    r.push_back({"gelu", "cuda", gelu_rows});
    r.push_back({"gelu", "cpu", gelu_cpu_rows});
    r.push_back({"rmsnorm", "cuda", rmsnorm_rows});
    r.push_back({"rope", "cuda", rope_rows});
    r.push_back({"swiglu", "cuda", swiglu_rows});
    r.push_back({"residual", "cuda", residual_rows});
    r.push_back({"adamw", "cuda", adamw_rows});
    r.push_back({"global_norm", "cuda", global_norm_rows});
    return r;
}

struct Table {
    std::vector<Row> rows;
    std::vector<std::string> families;  // in order: the registry's, then the others
    std::vector<std::string> problems;  // registered variants without a runner, and the reverse
};

Table build_table() {
    Table t;
    const std::vector<Runner> all = runners();
    auto registered = [](const std::string& family) -> const KernelFamily* {
        for (const KernelFamily& f : kernel_families())
            if (f.name == family) return &f;
        return nullptr;
    };
    for (const KernelFamily& f : kernel_families()) {
        t.families.push_back(f.name);
        for (const std::string& v : f.variants) {
            bool found = false;
            for (const Runner& r : all) found |= r.family == f.name && r.variant == v;
            if (!found)
                t.problems.push_back("no runner for " + f.name + " variant " + v +
                                     " (kernels/core/registry.cpp registers it; add its rows to "
                                     "tests/test_kernels.cpp)");
        }
    }
    for (const Runner& r : all) {
        const KernelFamily* f = registered(r.family);
        if (f && r.variant != "cpu" &&
            std::find(f->variants.begin(), f->variants.end(), r.variant) == f->variants.end())
            t.problems.push_back("a runner for " + r.family + " variant " + r.variant +
                                 ", which kernels/core/registry.cpp does not register");
        if (std::find(t.families.begin(), t.families.end(), r.family) == t.families.end())
            t.families.push_back(r.family);
        r.add_rows(t.rows);
    }
    return t;
}

const Table& table() {
    static const Table t = build_table();
    return t;
}

}  // namespace

TEST_CASE("every registered kernel variant has a runner in the table") {
    for (const std::string& p : table().problems) FAIL_CHECK(p);
    CHECK(table().problems.empty());
}

namespace {

// The rows in kParts parts (row i in part i mod kParts), each its own test case, so that ctest runs
// them side by side (tests/CMakeLists.txt: test_kernels_rows_1 ... _4): the GPU rows' CPU
// references, not the GPU, take most of the time.
// ZGPT_ROWS=<text> keeps the rows whose name holds the text (a kernel's rows alone, where device
// time is short); a run so narrowed says how many rows it left out.
constexpr size_t kParts = 4;
void check_rows(size_t part) {
    const std::vector<Row>& rows = table().rows;
    const char* only = std::getenv("ZGPT_ROWS");
    size_t left_out = 0;
    for (size_t i = part; i < rows.size(); i += kParts) {
        const Row& r = rows[i];
        if (!r.runnable()) continue;
        if (only && *only && r.name().find(only) == std::string::npos) {
            ++left_out;
            continue;
        }
        INFO(r.name());
        try {
            r.check();
        } catch (const std::exception& e) {
            FAIL_CHECK("threw: " << std::string(e.what()));
        } catch (...) {
            // a failed REQUIRE (reported above) ends its row only: the next rows still run
            FAIL_CHECK("row stopped by the failed REQUIRE above");
        }
    }
    if (left_out)
        MESSAGE("ZGPT_ROWS=" << std::string(only) << " left out " << left_out
                             << " rows of this part");
}

}  // namespace

TEST_CASE("the kernel table's rows against the CPU reference, part 1 of 4") {
    check_rows(0);
}
TEST_CASE("the kernel table's rows against the CPU reference, part 2 of 4") {
    check_rows(1);
}
TEST_CASE("the kernel table's rows against the CPU reference, part 3 of 4") {
    check_rows(2);
}
TEST_CASE("the kernel table's rows against the CPU reference, part 4 of 4") {
    check_rows(3);
}

TEST_CASE("the kernel table's rows run and skipped, by family") {
    int64_t skipped_gpu = 0;
    for (const std::string& f : table().families) {
        int64_t run = 0, skipped = 0;
        std::string variants;
        for (const Row& r : table().rows) {
            if (r.family != f) continue;
            (r.runnable() ? run : skipped)++;
            if (("," + variants + ",").find("," + r.variant + ",") == std::string::npos)
                variants += (variants.empty() ? "" : ",") + r.variant;
        }
        skipped_gpu += skipped;
        std::printf("test_kernels: %s (%s): %lld rows, %lld run, %lld skipped\n", f.c_str(),
                    variants.c_str(), (long long)(run + skipped), (long long)run,
                    (long long)skipped);
        CHECK(run + skipped > 0);  // every family has rows
    }
    if (skipped_gpu > 0)
        std::printf("test_kernels: skipped %lld GPU rows: %s\n", (long long)skipped_gpu,
                    gpu_unavailable().c_str());
    std::fflush(stdout);
}

#ifdef ZGPT_HAVE_CUDA
TEST_CASE("the loss head's workspace: online and fast hold 8 bytes a row, naive its softmax too") {
    // (the query only measures the layout: no GPU needed.) Each array takes whole 256-byte slots:
    // the valid count (one int) and the largest logit's key (one word), then the ce and lse rows
    // (N floats each) that online and fast keep when the caller gives no row outputs; naive adds
    // its row maxima (4 bytes a row), statistics (16), gradient parameters (20) and the fp32
    // softmax (4 V).
    auto slot = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    for (const int64_t N : {int64_t(1), int64_t(1000), int64_t(16384)}) {
        for (const int64_t V : {int64_t(1024), int64_t(50304), int64_t(256000)}) {
            for (const cuda::LogitsType t : {cuda::LogitsType::f32, cuda::LogitsType::bf16}) {
                CAPTURE(N);
                CAPTURE(V);
                const size_t rows = 2 * slot(4) + 2 * slot(4 * size_t(N));
                for (const char* v : {"online", "fast", "fast_lockstep"})
                    CHECK(cuda::find_cross_entropy_variant(v).workspace_bytes(N, V, t) == rows);
                CHECK(cuda::find_cross_entropy_variant("naive").workspace_bytes(N, V, t) ==
                      rows + slot(4 * size_t(N)) + slot(16 * size_t(N)) + slot(20 * size_t(N)) +
                          slot(4 * size_t(N) * size_t(V)));
            }
        }
    }
    // at Liger's benchmark shape (N = 16384): 8 bytes a row and two slots, below the 0.181 MB
    // Liger adds there (docs/results/ce_vocab_sweep_h200.json, liger_extra_gb)
    CHECK(cuda::find_cross_entropy_variant("fast").workspace_bytes(
              16384, 50304, cuda::LogitsType::bf16) <= size_t(8) * 16384 + 512);
}
#endif

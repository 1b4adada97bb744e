// The GPU checks of test_kernels' rows (tests/kernel_table.h): one CUDA op against the CPU
// reference (kernels/*/*.cpp, run in double) on the same inputs. CUDA builds only.
//
// Tolerances, one per type (rtol_of and check_close in gpu_helpers.h), argued from the rounding:
// - fp32: the GPU and the reference read the same fp32 inputs; the GPU's sums of up to a few
//   thousand fp32 terms are within about K 2^-24 of the exact ones for K terms (1e-5 relative for
//   the sizes here), plus 1e-5 of the tensor's largest magnitude for elements produced by
//   cancellation (LayerNorm and softmax backward, gradients).
// - bf16: every input is rounded to bf16 before the reference sees it, so both read the same
//   values; the GPU computes in fp32 and rounds each output once. bf16 has 8 significand bits:
//   a stored value is within 2^-9 relative of the fp32 one, so 2^-8 relative plus 2^-8 of the
//   largest magnitude (cancellation).
// - Weight and bias gradients are fp32 sums over all N rows (4099 at most) of products of bf16
//   values: 1e-4 of the largest magnitude.
// - Where a bf16 output goes through a second op inside the kernel (GELU of the fp32
//   pre-activation, dgelu, the attention backward's chain of tensor-core products), 2^-7: two
//   roundings of 2^-9 and the fp32 work between them.
// - The loss head: ce_gpu.h argues its bounds.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/wgmma.h"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/matmul.h"
#include "kernels/gemm/matmul_wgmma.h"
#include "kernels/norms/layernorm.h"
#include "kernels/norms/rmsnorm.h"
#include "kernels/ops/adamw.h"
#include "kernels/ops/encoder.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/global_norm.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "tests/ce_gpu.h"
#include "tests/gpu_helpers.h"
#include "tests/helpers.h"
#include "tests/kernel_table.h"

namespace zgpt::test::gpu {

namespace {

// A row's inputs depend on its shape and type only: rerunning one row repeats it.
uint64_t seed_of(std::initializer_list<int64_t> parts) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t p : parts) h = (h ^ uint64_t(p)) * 1099511628211ull;
    return h;
}

// A bias gradient summed beside a stored [rows, cols] result (a GEMM epilogue's), both of type t:
// within rounding of the column sums of what was stored. Each stored value is the summed one
// rounded to t (a relative 2^-9 for bf16); fp32 sums of `rows` terms add at most rows * 2^-24 of
// the absolute sum; the sum is rounded to t once more. So per column |got - sum| <=
// (2^-9 + rows * 2^-24) * sum |stored| + 2^-9 |sum| for bf16 (without the 2^-9 terms for fp32).
void check_stored_colsums(const char* what, const std::vector<double>& got,
                          const std::vector<double>& stored, int64_t rows, int64_t cols, DType t) {
    REQUIRE(int64_t(got.size()) == cols);
    std::vector<double> sum(size_t(cols), 0.0), abs_sum(size_t(cols), 0.0);
    for (int64_t i = 0; i < rows * cols; i++) {
        sum[size_t(i % cols)] += stored[size_t(i)];
        abs_sum[size_t(i % cols)] += std::abs(stored[size_t(i)]);
    }
    const double round = t == DType::f32 ? 0.0 : 1.0 / 512, rel = round + double(rows) * 0x1p-24;
    int bad = 0;
    for (int64_t c = 0; c < cols; c++) {
        const double bound = rel * abs_sum[size_t(c)] + round * std::abs(sum[size_t(c)]) + 1e-30;
        if (std::abs(got[size_t(c)] - sum[size_t(c)]) > bound && bad++ < 3)
            MESSAGE(what << ": column " << c << " " << got[size_t(c)] << " against "
                         << sum[size_t(c)] << " (bound " << bound << ")");
    }
    CHECK(bad == 0);
}

// The column sums a norm backward left beside the dinp [N, C] it stored: those of what it stored
// (fp32 sums of the stored values, to 1e-5).
void check_dinp_column_sums(const std::vector<double>& got, const std::vector<double>& dinp,
                            int64_t N, int64_t C, DType t) {
    std::vector<double> colsum(size_t(C), 0.0);
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++) colsum[size_t(c)] += as_stored(dinp[size_t(i * C + c)], t);
    check_close("dinp column sums", got, colsum, DType::f32, 1e-5);
}

// Token ids on the device that free themselves.
struct DevInts {
    Dev d;
    explicit DevInts(const std::vector<int32_t>& v) : d(v.size() * 4) {
        CUDA_OK(cudaMemcpy(d.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    }
    int32_t* p() const { return d.as<int32_t>(); }
};

}  // namespace

// qkv rows of W = C + 2 KVC (3C for multi-head attention); dqkv's k and v columns of a shared
// head are the sums over its group, as the reference sums them.
void attention(const std::string& variant, const AttentionDims& s, DType t) {
    const cuda::AttentionVariant& v = cuda::find_attention_variant(variant);
    Rng rng(s.NKV ? seed_of({s.B, s.T, s.C, s.NH, s.NKV, int64_t(t)})
                  : seed_of({s.B, s.T, s.C, s.NH, int64_t(t)}));
    const int64_t BT = s.B * s.T, W = s.C + 2 * (s.NKV ? s.NKV : s.NH) * (s.C / s.NH);
    const auto qkv = rnd(rng, BT * W, t), dout = rnd(rng, BT * s.C, t);
    std::vector<double> out(BT * s.C), att(s.B * s.NH * s.T * s.T), dqkv(BT * W, 0.0);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.NKV);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH,
                            s.NKV);
    // with rotary positions qkv stands for the rotated q and k; backward turns dq and dk back
    const int64_t hs = s.C / s.NH, nkv = s.NKV ? s.NKV : s.NH;
    const double theta = 10000.0;
    if (s.rope) {
        cpu::rope_backward(dqkv.data(), s.B, s.T, s.NH, hs, W, theta);
        cpu::rope_backward(dqkv.data() + s.C, s.B, s.T, nkv, hs, W, theta);
    }
    const std::vector<float> tab = cuda::rope_table(s.T, hs, theta);
    DevT d_tab(DType::f32, std::vector<double>(tab.begin(), tab.end()));
    cuda::AttentionShape sh{s.B, s.T, s.C, s.NH};
    if (s.rope) sh.rope_table = d_tab.f();
    sh.NKV = s.NKV;
    sh.tuning.wgmma_dkdv_wgs = s.dkdv_wgs;
    sh.tuning.wgmma_dkdv_tile = s.dkdv_tile;
    sh.tuning.wgmma_dq_tile = s.dq_tile;
    sh.tuning.wgmma_fwd_pipeline = s.fwd_pipeline;
    sh.tuning.wgmma_dkdv_tma = s.dkdv_tma;
    sh.tuning.wgmma_dq_tma = s.dq_tma;
    sh.tuning.wgmma_fwd_tma = s.fwd_tma;
    sh.tuning.wgmma_fwd_keys = s.fwd_keys;
    sh.tuning.unrounded_dsum = s.unrounded_dsum;
    DevT d_qkv(t, qkv), d_out(t, BT * s.C), d_dout(t, dout), d_dqkv(t, BT * W);
    DevT saved(DType::f32, int64_t(v.saved_bytes(sh) / 4) + 1),
        scratch(DType::f32, int64_t(v.scratch_bytes(sh) / 4) + 1);
    v.forward(d_out.p, saved.p, d_qkv.p, sh, t, nullptr);
    check_close("out", d_out.get(), out, t);
    // The forward's 128-key tiles (the default with its TMA ring) against its 64-key ones: the
    // same lse up to the fp32 rounding of the sums' grouping (about 1e-6). A key let through the
    // causal mask, or one masked wrongly, moves its row's lse by about 1/T (1e-3 at T = 1000),
    // which the output's bf16 tolerance above cannot see in long rows. Where both settings run
    // the same kernel (fp32, other head sizes, other GPUs) the lse is the same bits.
    if (variant == "flash" && s.fwd_tma && s.fwd_keys != 64 && !s.fwd_pipeline) {
        cuda::AttentionShape k64 = sh;
        k64.tuning.wgmma_fwd_keys = 64;
        DevT o64(t, BT * s.C), saved64(DType::f32, int64_t(v.saved_bytes(sh) / 4) + 1);
        v.forward(o64.p, saved64.p, d_qkv.p, k64, t, nullptr);
        const std::vector<double> lse = saved.get(), lse64 = saved64.get();
        int64_t bad = 0;
        for (size_t i = 0; i < size_t(s.B * s.NH * s.T); i++)
            if (!(std::fabs(lse[i] - lse64[i]) <= 1e-4)) bad++;
        CHECK(bad == 0);
    }
    // dqkv is written, not added: NaN in every element first, so one left unwritten fails
    CUDA_OK(cudaMemset(d_dqkv.p, 0xff, size_t(BT * W) * dtype_bytes(t)));
    CUDA_OK(cudaDeviceSynchronize());
    // the GPU's backward reads the output it produced (its rounding, as in training)
    v.backward(d_dqkv.p, d_dout.p, d_qkv.p, d_out.p, saved.p, scratch.p, nullptr, sh, t, nullptr);
    const std::vector<double> got = d_dqkv.get();
    check_close("dqkv", got, dqkv, t, t == DType::f32 ? 1e-5 : 1.0 / 128);
    if (s.unrounded_dsum && t == DType::bf16 && variant != "naive") {
        // The residual and D, checked where they are (the tolerance above cannot see a residual
        // in the wrong place: it moves D by 2^-9): each residual is at most half an ulp of its
        // output, and D (scratch) is rowsum(dO (out + residual)) of the same row and head.
        std::vector<__nv_bfloat16> res(size_t(BT * s.C));
        CUDA_OK(cudaMemcpy(res.data(), cuda::flash_out_residual(saved.p, sh), res.size() * 2,
                           cudaMemcpyDeviceToHost));
        const std::vector<double> o = d_out.get(), dsum = scratch.get();
        const int64_t hs = s.C / s.NH;
        int bad_res = 0, bad_d = 0;
        for (int64_t i = 0; i < BT * s.C; i++)
            if (!(std::fabs(double(__bfloat162float(res[size_t(i)]))) <=
                  std::fabs(o[size_t(i)]) * 0.00390625 + 1e-30))
                bad_res++;
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.NH; h++)
                for (int64_t r = 0; r < s.T; r++) {
                    double want = 0, mag = 0;
                    for (int64_t d = 0; d < hs; d++) {
                        const int64_t at = (b * s.T + r) * s.C + h * hs + d;
                        const double x =
                            dout[size_t(at)] * (o[size_t(at)] + __bfloat162float(res[size_t(at)]));
                        want += x;
                        mag += std::fabs(x);
                    }
                    if (!(std::fabs(dsum[size_t((b * s.NH + h) * s.T + r)] - want) <=
                          1e-5 * mag + 1e-30))
                        bad_d++;
                }
        CHECK(bad_res == 0);
        CHECK(bad_d == 0);
    }
    // flash's TMA rings (the Hopper kernels) change the loads only: the cp.async kernels' bits
    // (not the warp-specialised kernels' 128-row tiles, other kernels than the cp.async ones')
    const bool dkdv_ws = cuda::attention_wgmma::dkdv_warp_specialised(sh);
    if (variant == "flash" && (s.dkdv_tma || s.dq_tma || s.fwd_tma) && !dkdv_ws &&
        s.dq_tile != 128) {
        cuda::AttentionShape plain = sh;
        plain.tuning.wgmma_dkdv_tma = false;
        plain.tuning.wgmma_dq_tma = false;
        plain.tuning.wgmma_fwd_tma = false;
        DevT o_plain(t, BT * s.C);
        v.forward(o_plain.p, saved.p, d_qkv.p, plain, t, nullptr);
        // the forward's bits where it streams 64-key tiles as the cp.async kernel does (128-key
        // tiles, the default with TMA, sum a row's keys in other groups)
        if (s.fwd_keys == 64 || !s.fwd_tma || s.fwd_pipeline) CHECK(o_plain.get() == d_out.get());
        v.forward(d_out.p, saved.p, d_qkv.p, sh, t, nullptr);  // its lse again in `saved`
        DevT d_plain(t, BT * W);
        v.backward(d_plain.p, d_dout.p, d_qkv.p, d_out.p, saved.p, scratch.p, nullptr, plain, t,
                   nullptr);
        CHECK(d_plain.get() == got);
    }
    // column sums with rotary positions would be of the rotated gradient: refused
    const int64_t rows = v.colsum_rows(sh, t);
    if (rows > 0 && s.rope) {
        CHECK_THROWS(v.backward(d_dqkv.p, d_dout.p, d_qkv.p, d_out.p, saved.p, scratch.p,
                                scratch.f(), sh, t, nullptr));
        return;
    }
    if (rows == 0) return;
    // The partial column sums, summed, against the column sums of the dqkv it wrote. They add the
    // fp32 values before bf16 rounding, and each stored value is within 2^-8 of its fp32 value
    // (relative), so a column may differ by 2^-8 sum |dqkv|, plus fp32 summation error (< 1e-4 of
    // that sum for these lengths).
    DevT parts(DType::f32, rows * W);
    CUDA_OK(cudaMemset(parts.p, 0xff, size_t(rows) * W * 4));  // NaN: unwritten
    v.backward(d_dqkv.p, d_dout.p, d_qkv.p, d_out.p, saved.p, scratch.p,
               static_cast<float*>(parts.p), sh, t, nullptr);
    CHECK(d_dqkv.get() == got);  // the sums change nothing else
    const std::vector<double> part = parts.get();
    std::vector<double> want(W, 0.0), mag(W, 0.0), sum(W, 0.0);
    for (int64_t i = 0; i < BT * W; i++) {
        want[i % W] += got[i];
        mag[i % W] += std::fabs(got[i]);
    }
    for (int64_t i = 0; i < rows * W; i++) sum[i % W] += part[i];
    int bad = 0;
    for (int64_t c = 0; c < W; c++)
        if (!(std::fabs(sum[c] - want[c]) <= (0.00390625 + 1e-4) * mag[c] + 1e-30)) bad++;
    CHECK(bad == 0);
}

void attention_unrounded_dsum_gain(const std::string& variant, const AttentionDims& s) {
    const cuda::AttentionVariant& v = cuda::find_attention_variant(variant);
    const DType t = DType::bf16;
    Rng rng(seed_of({s.B, s.T, s.C, s.NH, 32}));
    const int64_t BT = s.B * s.T, W = 3 * s.C;
    // q and k of standard deviation sqrt(32): scores q.k / sqrt(hs) of standard deviation 32, so
    // most rows put nearly all their weight on one key (the regime where D from the rounded output
    // drowns dS at that key)
    std::vector<double> qkv = rnd(rng, BT * W, t);
    const double big = std::sqrt(32.0);
    for (int64_t i = 0; i < BT; i++)
        for (int64_t c = 0; c < 2 * s.C; c++) qkv[i * W + c] = as_stored(qkv[i * W + c] * big, t);
    const auto dout = rnd(rng, BT * s.C, t);
    std::vector<double> out(BT * s.C), att(s.B * s.NH * s.T * s.T), dqkv(BT * W, 0.0);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
    // dq and dk (columns [0, 2C)) against the reference: relative error in the Frobenius norm
    auto qk_error = [&](const std::vector<double>& got) {
        double e = 0, n = 0;
        for (int64_t i = 0; i < BT; i++)
            for (int64_t c = 0; c < 2 * s.C; c++) {
                const double d = got[i * W + c] - dqkv[i * W + c];
                e += d * d;
                n += dqkv[i * W + c] * dqkv[i * W + c];
            }
        return std::sqrt(e / n);
    };
    DevT d_qkv(t, qkv), d_dout(t, dout);
    std::vector<double> outs[2], errs(2);
    for (int on = 0; on < 2; on++) {
        cuda::AttentionShape sh{s.B, s.T, s.C, s.NH};
        sh.tuning.unrounded_dsum = on == 1;
        DevT d_out(t, BT * s.C), d_dqkv(t, BT * W);
        DevT saved(DType::f32, int64_t(v.saved_bytes(sh) / 4) + 1),
            scratch(DType::f32, int64_t(v.scratch_bytes(sh) / 4) + 1);
        v.forward(d_out.p, saved.p, d_qkv.p, sh, t, nullptr);
        v.backward(d_dqkv.p, d_dout.p, d_qkv.p, d_out.p, saved.p, scratch.p, nullptr, sh, t,
                   nullptr);
        outs[on] = d_out.get();
        errs[size_t(on)] = qk_error(d_dqkv.get());
    }
    CHECK(outs[1] == outs[0]);  // the residual is saved beside the output, which is unchanged
    // (the default tuning: the rows of attention() cover the other kernels with the key on)
    // printed on every run, so that a GPU run records the gain, not only whether it held
    MESSAGE(variant << " " << s.B << "x" << s.T << " C=" << s.C << " NH=" << s.NH
                    << ": dq, dk relative error " << errs[0] << " from the rounded output, "
                    << errs[1] << " with its residual");
    CHECK(errs[1] <= 0.5 * errs[0]);
}

void cross_entropy(const std::string& variant, const CeDims& s, DType t) {
    const LogitsType lt = t == DType::f32 ? LogitsType::f32 : LogitsType::bf16;
    Case c = make_case(s.seed, s.N, s.V, lt, 1e-4, s.label_smoothing, s.reduction, s.ignored);
    c.in_place = s.in_place;
    if (is_linear_cross_entropy(variant)) {
        // as a loss head: through an identity weight (ce_gpu.h), whose hidden states cannot
        // hold -inf (-inf x 0 is NaN): masked entries are -1e4 instead
        for (float& x : c.logits)
            if (std::isinf(x)) x = -1e4f;
        check_result(run_linear_identity(c, kSchedules[0], variant), reference(c), c);
        return;
    }
    check_result(run_variant(cuda::find_cross_entropy_variant(variant), c), reference(c), c);
}

void layernorm(const std::string& variant, const LayernormDims& s, DType t, DType r) {
    const int64_t N = s.N, C = s.C;
    Rng rng(seed_of({N, C, int64_t(t), int64_t(r)}));
    const auto a = rnd(rng, N * C, r, 2.0), b = rnd(rng, N * C, t), w = rnd(rng, C, r),
               bias = rnd(rng, C, r), dout = rnd(rng, N * C, t), dinp0 = rnd(rng, N * C, r);
    // residual_in_matmul, where the residual stream has the activations' type: the branch is a
    // projection, x [N, K] P [C, K]^T + pb, whose GEMM adds a as its C operand, then LayerNorm
    // alone. (Over an fp32 stream of bf16 activations the model takes the fused kernel.)
    const bool in_matmul = variant == "residual_in_matmul" && t == r;
    // the fused residual + LayerNorm kernel: fused_residual's, and residual_in_matmul's fallback
    const bool fused_kernel =
        !in_matmul && (variant == "fused_residual" || variant == "residual_in_matmul");
    constexpr int64_t K = 40;
    const auto x = in_matmul ? rnd(rng, N * K, t) : std::vector<double>{},
               proj = in_matmul ? rnd(rng, C * K, t, 0.3) : std::vector<double>{},
               pb = in_matmul ? rnd(rng, C, t) : std::vector<double>{};
    std::vector<double> branch = b;
    if (in_matmul) cpu::matmul_forward(branch.data(), x.data(), proj.data(), pb.data(), N, K, C);
    // reference: res = a + branch (rounded once, as the GPU stores it; the GEMM's unrounded: its
    // fp32 sum may round either way), then LayerNorm
    std::vector<double> res(N * C);
    for (int64_t i = 0; i < N * C; i++)
        res[i] = in_matmul ? a[i] + branch[i] : as_stored(a[i] + branch[i], r);
    // the forward passes read fp32 weights (the master copy), the backward passes weights in r
    DevT da(r, a), db(t, b), dw(r, w), dwf(DType::f32, w), dbias(DType::f32, bias), dres(r, N * C),
        dout_(t, N * C);
    DevT dmean(DType::f32, N), drstd(DType::f32, N);
    if (in_matmul) {
        DevT dx(t, x), dp(t, proj), dpb(t, pb);
        cuda::Gemm g = cuda::linear_forward_gemm(dres.p, dx.p, dp.p, N, K, C, t);
        g.epilogue = cuda::Epilogue::bias;
        g.bias = dpb.p;
        g.C = da.p;
        g.beta = 1.0f;
        cuda::gemm(g, nullptr);
        CHECK(da.get() == a);  // C is only read
        cuda::layernorm_forward(dout_.p, {1, C}, dmean.f(), drstd.f(), dres.p, {1, C}, dwf.f(),
                                dbias.f(), N, C, 1e-5, t, r, nullptr);
    } else if (fused_kernel) {
        cuda::residual_layernorm_forward(dres.p, dout_.p, dmean.f(), drstd.f(), da.p, db.p, dwf.f(),
                                         dbias.f(), N, C, 1e-5, t, r, nullptr);
    } else {
        REQUIRE(variant == "separate");
        cuda::residual_forward(dres.p, da.p, db.p, N * C, t, r, nullptr);
        cuda::layernorm_forward(dout_.p, {1, C}, dmean.f(), drstd.f(), dres.p, {1, C}, dwf.f(),
                                dbias.f(), N, C, 1e-5, t, r, nullptr);
    }
    const auto got_res = dres.get();
    check_close("res", got_res, res, r);
    // The GEMM sums its K products in fp32, so a stored value may round to the neighbour of the
    // double reference's (within the check above). The LayerNorm is checked on the input it was
    // given: a one-ulp flip of a residual value moves a row's mean by far more than fp32's
    // tolerance. (The adds of the other variants are exact in fp32: the same res.)
    if (in_matmul) res = got_res;
    std::vector<double> out(N * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(),
                           N, C, 1e-5);
    const auto got_out = dout_.get();
    check_close("out", got_out, out, t);
    // The same forward into rows C + 8 apart (the trainer's ln2 beside its column of ones): the
    // same bits in the first C columns, the 8 after them untouched.
    {
        const int64_t ld = C + 8;
        std::vector<double> sentinel(N * ld, 3.0);
        DevT wide(t, sentinel), res2(r, N * C), m2(DType::f32, N), s2(DType::f32, N);
        if (fused_kernel)
            cuda::residual_layernorm_forward(res2.p, wide.p, m2.f(), s2.f(), da.p, db.p, dwf.f(),
                                             dbias.f(), N, C, 1e-5, t, r, nullptr, ld);
        else
            cuda::layernorm_forward(wide.p, {1, ld}, m2.f(), s2.f(), dres.p, {1, C}, dwf.f(),
                                    dbias.f(), N, C, 1e-5, t, r, nullptr);
        const auto got_wide = wide.get();
        int64_t bad = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = 0; c < ld; c++)
                bad += got_wide[i * ld + c] != (c < C ? got_out[i * C + c] : 3.0);
        CHECK(bad == 0);
    }
    check_close("mean", dmean.get(), mean, DType::f32);
    check_close("rstd", drstd.get(), rstd, DType::f32, 1e-5);
    // backward (the same kernel under both variants), adding into dinp, of the reference's res
    // with the statistics this variant's forward saved
    std::vector<double> dinp = dinp0, gw(C, 0.0), gb(C, 0.0);
    cpu::layernorm_backward(dinp.data(), gw.data(), gb.data(), dout.data(), res.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
    DevT dres_in(r, res), d_dinp(r, dinp0), d_dout(t, dout), d_gw(DType::f32, C),
        d_gb(DType::f32, C);
    DevT scratch(DType::f32, int64_t(cuda::layernorm_backward_scratch_bytes(N, C) / 4));
    cuda::layernorm_backward(d_dinp.p, {1, C}, true, d_gw.f(), d_gb.f(), d_dout.p, {1, C},
                             dres_in.p, {1, C}, dw.p, dmean.f(), drstd.f(), N, C, scratch.p, t, r,
                             nullptr);
    check_close("dinp", d_dinp.get(), dinp, r);
    check_close("dweight", d_gw.get(), gw, DType::f32, 1e-4);
    check_close("dbias", d_gb.get(), gb, DType::f32, 1e-4);
    // Again, with dinp's column sums (the projections' bias gradient in the trainer): dinp the
    // same bits, the sums those of the dinp written, rounded to t as the matmuls read it, summed
    // in double here. fp32 sums of N values: 1e-5 of the largest sum (a dropped row or a sum of
    // unrounded values is off by far more).
    DevT d_dinp2(r, dinp0), d_gw2(DType::f32, C), d_gb2(DType::f32, C), d_sum(DType::f32, C);
    DevT parts(DType::f32, int64_t(cuda::layernorm_backward_sums_bytes(N, C) / 4));
    cuda::ColumnSumParts sums{parts.f()};
    cuda::layernorm_backward(d_dinp2.p, {1, C}, true, d_gw2.f(), d_gb2.f(), d_dout.p, {1, C},
                             dres_in.p, {1, C}, dw.p, dmean.f(), drstd.f(), N, C, scratch.p, t, r,
                             nullptr, &sums);
    REQUIRE(sums.rows > 0);
    cuda::bias_backward_from_partials(d_sum.f(), sums.parts, sums.rows, C, nullptr);
    const auto got_dinp = d_dinp.get(), got_dinp2 = d_dinp2.get();
    CHECK(got_dinp2 == got_dinp);
    check_close("dweight (with the sums)", d_gw2.get(), gw, DType::f32, 1e-4);
    check_close("dbias (with the sums)", d_gb2.get(), gb, DType::f32, 1e-4);
    check_dinp_column_sums(d_sum.get(), got_dinp, N, C, t);
    // kernels.layernorm_split_rows: rows above 1280 columns two warps a row (bf16 activations)
    if (t == DType::bf16 && C > 1280 && C <= 2048 && C % 8 == 0) {
        DevT d_dinp3(r, dinp0), d_gw3(DType::f32, C), d_gb3(DType::f32, C), d_sum3(DType::f32, C);
        cuda::ColumnSumParts sums3{parts.f()};
        cuda::layernorm_backward(d_dinp3.p, {1, C}, true, d_gw3.f(), d_gb3.f(), d_dout.p, {1, C},
                                 dres_in.p, {1, C}, dw.p, dmean.f(), drstd.f(), N, C, scratch.p, t,
                                 r, nullptr, &sums3, true);
        REQUIRE(sums3.rows > 0);
        cuda::bias_backward_from_partials(d_sum3.f(), sums3.parts, sums3.rows, C, nullptr);
        const auto got_dinp3 = d_dinp3.get();
        check_close("dinp (split rows)", got_dinp3, dinp, r);
        check_close("dweight (split rows)", d_gw3.get(), gw, DType::f32, 1e-4);
        check_close("dbias (split rows)", d_gb3.get(), gb, DType::f32, 1e-4);
        check_dinp_column_sums(d_sum3.get(), got_dinp3, N, C, t);
        // and without the sums, writing dinp rather than adding into it
        std::vector<double> fresh(N * C, 0.0), gw4(C, 0.0), gb4(C, 0.0);
        cpu::layernorm_backward(fresh.data(), gw4.data(), gb4.data(), dout.data(), res.data(),
                                w.data(), mean.data(), rstd.data(), N, C);
        DevT d_dinp4(r, dinp0), d_gw4(DType::f32, C), d_gb4(DType::f32, C);
        cuda::layernorm_backward(d_dinp4.p, {1, C}, false, d_gw4.f(), d_gb4.f(), d_dout.p, {1, C},
                                 dres_in.p, {1, C}, dw.p, dmean.f(), drstd.f(), N, C, scratch.p, t,
                                 r, nullptr, nullptr, true);
        check_close("dinp (split rows, written)", d_dinp4.get(), fresh, r);
        check_close("dweight (split rows, no sums)", d_gw4.get(), gw4, DType::f32, 1e-4);
        check_close("dbias (split rows, no sums)", d_gb4.get(), gb4, DType::f32, 1e-4);
    }
}

void qk_layernorm(const HeadsDims& s, DType t) {
    // rows of hs at (r / NH) * 3C + (r % NH) * hs (the heads of q inside qkv), backward in place
    const int64_t BT = s.BT, NH = s.NH, hs = s.hs, C = NH * hs;
    Rng rng(seed_of({BT, NH, hs, int64_t(t)}));
    const auto qkv = rnd(rng, BT * 3 * C, t), w = rnd(rng, hs, t), dq = rnd(rng, BT * 3 * C, t);
    std::vector<double> q(BT * C), qo(BT * C), mean(BT * NH), rstd(BT * NH), dqv(BT * C);
    for (int64_t r = 0; r < BT; r++)
        for (int64_t c = 0; c < C; c++) {
            q[r * C + c] = qkv[r * 3 * C + c];
            dqv[r * C + c] = dq[r * 3 * C + c];
        }
    cpu::layernorm_forward(qo.data(), mean.data(), rstd.data(), q.data(), w.data(),
                           (const double*)nullptr, BT * NH, hs, 1e-5);
    DevT d_qkv(t, qkv), d_out(t, BT * 3 * C), d_w(t, w), d_wf(DType::f32, w),
        dm(DType::f32, BT * NH), dr(DType::f32, BT * NH);
    const cuda::RowMap heads{NH, 3 * C};
    cuda::layernorm_forward(d_out.p, heads, dm.f(), dr.f(), d_qkv.p, heads, d_wf.f(), nullptr,
                            BT * NH, hs, 1e-5, t, nullptr);
    const auto got = d_out.get();
    std::vector<double> got_q(BT * C);
    for (int64_t r = 0; r < BT; r++)
        for (int64_t c = 0; c < C; c++) got_q[r * C + c] = got[r * 3 * C + c];
    check_close("q heads", got_q, qo, t);
    std::vector<double> dqi(BT * C, 0.0), gw(hs, 0.0);
    cpu::layernorm_backward(dqi.data(), gw.data(), (double*)nullptr, dqv.data(), q.data(), w.data(),
                            mean.data(), rstd.data(), BT * NH, hs);
    DevT d_dq(t, dq), d_gw(DType::f32, hs);
    DevT scratch(DType::f32, int64_t(cuda::layernorm_backward_scratch_bytes(BT * NH, hs) / 4));
    cuda::layernorm_backward(d_dq.p, heads, false, d_gw.f(), nullptr, d_dq.p, heads, d_qkv.p, heads,
                             d_w.p, dm.f(), dr.f(), BT * NH, hs, scratch.p, t, nullptr);
    const auto gotd = d_dq.get();
    std::vector<double> got_dq(BT * C);
    bool rest_untouched = true;
    for (int64_t r = 0; r < BT; r++) {
        for (int64_t c = 0; c < C; c++) got_dq[r * C + c] = gotd[r * 3 * C + c];
        for (int64_t c = C; c < 3 * C; c++)
            rest_untouched &= gotd[r * 3 * C + c] == dq[r * 3 * C + c];
    }
    check_close("dq heads (in place)", got_dq, dqi, t);
    check_close("dq_norm weight", d_gw.get(), gw, DType::f32, 1e-4);
    CHECK(rest_untouched);
}

// The wgmma product g (bf16) with epilogue e, its bias where e has one, on both schedules
// (kernels.matmul_wgmma_schedule), each into fresh buffers of n elements: D, and aux with GELU.
struct WgmmaSchedules {
    bool bias, gelu;
    std::vector<double> d_co, aux_co, d_pp, aux_pp;  // cooperative, ping-pong
};
WgmmaSchedules run_wgmma_schedules(cuda::Gemm g, cuda::Epilogue e, void* bias, int64_t n) {
    using cuda::Epilogue;
    WgmmaSchedules r;
    r.bias = e == Epilogue::bias || e == Epilogue::gelu_aux_bias;
    r.gelu = e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias;
    const DType t = DType::bf16;
    DevT d_co(t, n), x_co(t, n), d_pp(t, n), x_pp(t, n);
    g.epilogue = e;
    g.bias = r.bias ? bias : nullptr;
    g.D = d_co.p;
    g.aux = r.gelu ? x_co.p : nullptr;
    REQUIRE(cuda::try_gemm_wgmma(g, nullptr, cuda::WgmmaSchedule::cooperative));
    g.D = d_pp.p;
    g.aux = r.gelu ? x_pp.p : nullptr;
    REQUIRE(cuda::try_gemm_wgmma(g, nullptr, cuda::WgmmaSchedule::pingpong));
    r.d_co = d_co.get();
    r.d_pp = d_pp.get();
    if (r.gelu) {
        r.aux_co = x_co.get();
        r.aux_pp = x_pp.get();
    }
    return r;
}
constexpr cuda::Epilogue kWgmmaEpilogues[] = {cuda::Epilogue::none, cuda::Epilogue::bias,
                                              cuda::Epilogue::gelu_aux_bias,
                                              cuda::Epilogue::gelu_aux};

void matmul(const std::string& variant, const MatmulDims& s, DType t) {
    // wgmma: the forward products on our Hopper kernel where it runs, cuBLASLt's otherwise (and
    // cuBLASLt's backward, as fused_epilogue)
    const bool wgmma = variant == "wgmma";
    const bool fused = variant == "fused_epilogue" || wgmma;
    REQUIRE((fused || variant == "separate"));
    const int64_t N = s.N, C = s.C, OC = s.OC;
    Rng rng(seed_of({N, C, OC, int64_t(t)}));
    const auto x = rnd(rng, N * C, t), w = rnd(rng, OC * C, t, 0.3), b = rnd(rng, OC, t),
               dy = rnd(rng, N * OC, t);
    std::vector<double> y(N * OC), g(N * OC);
    cpu::matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    cpu::gelu_forward(g.data(), y.data(), N * OC);
    DevT dx(t, x), dw(t, w), db(t, b), dY(t, N * OC), dAux(t, N * OC), dG(t, N * OC);
    // GELU after the GEMM: of the fp32 pre-activation (fused) or of the stored one (separate, one
    // more rounding of 2^-9 that GELU' <= 1.13 carries): the reference's gelu(y) within 2^-7
    const double gelu_tol = t == DType::f32 ? 1e-5 : 1.0 / 128;
    cuda::Gemm gm = cuda::linear_forward_gemm(dY.p, dx.p, dw.p, N, C, OC, t);
    // where the wgmma kernel must run: bf16, K and N multiples of 8, an sm_90 device
    const bool ours =
        wgmma && t == DType::bf16 && C % 8 == 0 && OC % 8 == 0 && cuda::current_device_is_sm90();
    if (wgmma && !ours) MESSAGE("matmul wgmma: cuBLASLt runs this shape (not sm_90, or sizes)");
    auto run = [&](const cuda::Gemm& g) {
        if (wgmma) {
            const bool ran = cuda::try_gemm_wgmma(g, nullptr);
            CHECK(ran == ours);
            if (ran) return;
        }
        cuda::gemm(g, nullptr);
    };
    if (fused) {
        gm.epilogue = cuda::Epilogue::bias;
        gm.bias = db.p;
        run(gm);
        const auto got_y = dY.get();
        check_close("x W^T + b", got_y, y, t);
        gm.D = dG.p;
        gm.epilogue = cuda::Epilogue::gelu_aux_bias;
        gm.aux = dAux.p;
        run(gm);
        const auto got_aux = dAux.get(), got_g = dG.get();
        check_close("aux (pre-GELU)", got_aux, y, t);
        check_close("GELU(x W^T + b)", got_g, g, t, gelu_tol);
        if (ours) {
            // the same bits: the pre-activation of both epilogues, and GELU of the stored one
            // (the separate pass), and again on a second run (no atomics, fixed order)
            CHECK(got_aux == got_y);
            DevT dG2(t, N * OC), dAux2(t, N * OC);
            cuda::gelu_forward(dG2.p, dAux.p, N * OC, t, nullptr);
            CHECK(dG2.get() == got_g);
            gm.D = dG2.p;
            gm.aux = dAux2.p;
            run(gm);
            CHECK(dAux2.get() == got_aux);
            CHECK(dG2.get() == got_g);
            // without a bias
            gm.epilogue = cuda::Epilogue::gelu_aux;
            run(gm);
            std::vector<double> y0(N * OC), g0(N * OC);
            cpu::matmul_forward(y0.data(), x.data(), w.data(), static_cast<const double*>(nullptr),
                                N, C, OC);
            cpu::gelu_forward(g0.data(), y0.data(), N * OC);
            check_close("aux, no bias", dAux2.get(), y0, t);
            check_close("GELU(x W^T)", dG2.get(), g0, t, gelu_tol);
            gm.epilogue = cuda::Epilogue::none;
            gm.D = dY.p;
            run(gm);
            check_close("x W^T", dY.get(), y0, t);
            // the ping-pong schedule (kernels.matmul_wgmma_schedule): the reference's values and
            // the cooperative kernel's bits, for each epilogue
            for (cuda::Epilogue e : kWgmmaEpilogues) {
                CAPTURE(int(e));
                const WgmmaSchedules r = run_wgmma_schedules(gm, e, db.p, N * OC);
                const std::vector<double>& pre = r.bias ? y : y0;
                if (r.gelu) {
                    check_close("ping-pong aux", r.aux_pp, pre, t);
                    check_close("ping-pong GELU", r.d_pp, r.bias ? g : g0, t, gelu_tol);
                    CHECK(r.aux_pp == r.aux_co);
                } else {
                    check_close("ping-pong D", r.d_pp, pre, t);
                }
                CHECK(r.d_pp == r.d_co);
            }
        }
    } else {
        cuda::gemm(gm, nullptr);
        cuda::add_bias(dY.p, db.p, N, OC, t, nullptr);
        check_close("x W^T, then + b", dY.get(), y, t);
        cuda::gelu_forward(dG.p, dY.p, N * OC, t, nullptr);
        check_close("GELU(x W^T + b), separate", dG.get(), g, t, gelu_tol);
    }
    // backward: dx = dy W, dW += dy^T x, db += colsum dy
    std::vector<double> gx(N * C, 0.0), gW(OC * C, 1.0), gb(OC, 1.0);
    cpu::matmul_backward(gx.data(), gW.data(), gb.data(), dy.data(), x.data(), w.data(), N, C, OC);
    DevT d_dy(t, dy), d_gx(t, N * C), d_gW(DType::f32, std::vector<double>(OC * C, 1.0)),
        d_gb(DType::f32, std::vector<double>(OC, 1.0));
    cuda::Gemm gd = cuda::linear_input_grad_gemm(d_gx.p, d_dy.p, dw.p, N, C, OC, t);
    cuda::gemm(gd, nullptr);
    cuda::Gemm gw2 = cuda::linear_weight_grad_gemm(d_gW.f(), d_dy.p, dx.p, N, C, OC, t);
    cuda::gemm(gw2, nullptr);
    DevT scratch(DType::f32, int64_t(cuda::bias_backward_scratch_bytes(N, OC) / 4));
    cuda::bias_backward(d_gb.f(), d_dy.p, N, OC, t, scratch.p, nullptr);
    check_close("dx", d_gx.get(), gx, t);
    check_close("dW (+= into fp32)", d_gW.get(), gW, DType::f32);
    check_close("db", d_gb.get(), gb, DType::f32);
    {
        // the same products with cuBLASLt's candidates timed (kernels.matmul_search): the chosen
        // algorithm's dx is as close, dW is added to once (what the timing runs added is undone),
        // and a second run repeats the first bit for bit (the choice is kept)
        cuda::Gemm gs = gd, gws = gw2;
        DevT s_gx(t, N * C), s_gW(DType::f32, std::vector<double>(OC * C, 1.0));
        gs.D = s_gx.p;
        gws.D = s_gW.p;
        gs.search = gws.search = 8;
        cuda::gemm(gs, nullptr);
        cuda::gemm(gws, nullptr);
        check_close("dx, searched", s_gx.get(), gx, t);
        check_close("dW (+= into fp32), searched", s_gW.get(), gW, DType::f32);
        const std::vector<double> first = s_gx.get();
        cuda::gemm(gs, nullptr);
        CHECK(s_gx.get() == first);
        // the choice as text (gemm_choices), changed to another candidate and given back: the
        // next run is that candidate's, bit for bit
        const int n = std::min(8, cuda::gemm_candidates(gs));
        const std::string prefix = std::to_string(N) + " " + std::to_string(C) + " " +
                                   std::to_string(OC) + " 0 0 " + std::to_string(int(t)) + " " +
                                   std::to_string(int(t)) + " 0 ";
        // one line per shape, types and epilogue here (cudaMalloc's buffers: one alignment)
        std::string text = cuda::gemm_choices(), needle = prefix;
        text.insert(0, 1, '\n');
        needle.insert(0, 1, '\n');
        const size_t hit = text.find(needle);
        REQUIRE(hit != std::string::npos);
        const size_t at = hit + 1;
        std::string line = text.substr(at, text.find('\n', at) - at);
        const size_t last = line.rfind(' ');
        const int chosen = std::stoi(line.substr(last + 1));
        CHECK(chosen < n);
        if (n > 1) {
            const int other = (chosen + 1) % n;
            line.resize(last + 1);
            line.append(std::to_string(other)).push_back('\n');
            // text names its cuBLASLt and GPU on its first line: for another, nothing changes
            const std::string head = text.substr(1, text.find('\n', 1));
            CHECK_FALSE(cuda::set_gemm_choices("# cuBLASLt 1, another GPU, 1 SMs\n" + line));
            CHECK(cuda::gemm_choices().find(line) == std::string::npos);
            CHECK(cuda::set_gemm_choices(head + line));
            cuda::gemm(gs, nullptr);
            DevT c_gx(t, N * C);
            cuda::Gemm gc = gs;
            gc.D = c_gx.p;
            REQUIRE(cuda::try_gemm_candidate(gc, other, nullptr));
            CHECK(s_gx.get() == c_gx.get());
            CHECK(cuda::gemm_choices().find(line) != std::string::npos);
        }
    }
    // GELU's backward at the pre-activation x (standing in for one): dx * GELU'(x)
    std::vector<double> gxg(N * C, 0.0);
    cpu::gelu_backward(gxg.data(), x.data(), gx.data(), N * C);
    DevT d_gxg(t, N * C);
    if (!fused) {  // of the stored dx: one more rounding of 2^-9
        cuda::gelu_backward(d_gxg.p, dx.p, d_gx.p, N * C, t, nullptr);
        check_close("dgelu, separate", d_gxg.get(), gxg, t, t == DType::f32 ? 1e-5 : 1.0 / 128);
        return;
    }
    // the fused backward epilogues: dx * GELU'(pre-activation) and the bias gradient (taken when
    // cuBLASLt offers them for these types; the trainer falls back otherwise)
    std::vector<double> colsum(OC, 0.0);
    for (int64_t i = 0; i < N * OC; i++) colsum[i % OC] += dy[i];
    DevT d_gW3(DType::f32, OC * C), d_bg(DType::f32, OC);
    gd.D = d_gxg.p;
    gd.epilogue = cuda::Epilogue::dgelu;
    gd.aux = dx.p;
    if (cuda::try_gemm(gd, nullptr))
        check_close("dgelu epilogue", d_gxg.get(), gxg, t, t == DType::f32 ? 1e-5 : 1.0 / 128);
    else
        MESSAGE("cuBLASLt offers no DGELU epilogue for " << dtype_name(t));
    // GELU' with the GELU layer's bias gradient in the same epilogue (the trainer's fc bias)
    gd.epilogue = cuda::Epilogue::dgelu_bias_grad;
    DevT d_gxg2(t, N * C), d_gbg(t, C);
    gd.D = d_gxg2.p;
    gd.bias = d_gbg.p;
    if (cuda::try_gemm(gd, nullptr)) {
        check_close("dgelu_bias_grad epilogue", d_gxg2.get(), gxg, t,
                    t == DType::f32 ? 1e-5 : 1.0 / 128);
        check_stored_colsums("dgelu_bias_grad's bias gradient", d_gbg.get(), d_gxg2.get(), N, C, t);
    } else {
        MESSAGE("cuBLASLt offers no DGELU_BGRAD epilogue for " << dtype_name(t));
    }
    gd.bias = nullptr;
    gw2.D = d_gW3.p;
    gw2.beta = 0.0f;
    gw2.epilogue = cuda::Epilogue::bias_grad;
    gw2.bias = d_bg.p;
    if (cuda::try_gemm(gw2, nullptr))
        check_close("bias_grad epilogue", d_bg.get(), colsum, DType::f32);
    else
        MESSAGE("cuBLASLt offers no BGRADB epilogue for " << dtype_name(t));
}

// The wgmma matmul's two schedules at a trainer-like shape: the same bits for each epilogue,
// sampled rows against the double reference, and a repeated run's bits.
void matmul_wgmma_schedules(int64_t M, int64_t K, int64_t N) {
    if (!cuda::current_device_is_sm90()) {
        MESSAGE("the wgmma matmul runs on sm_90 devices only: nothing to compare here");
        return;
    }
    Rng rng(seed_of({M, K, N}));
    const DType t = DType::bf16;
    const auto x = rnd(rng, M * K, t), w = rnd(rng, N * K, t, 0.3), b = rnd(rng, N, t);
    DevT dx(t, x), dw(t, w), db(t, b);
    // the reference of every 97th row and the last, in double, without and with the bias
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < M; r += 97) rows.push_back(r);
    rows.push_back(M - 1);
    std::vector<double> ref(rows.size() * N, 0.0), ref_b(rows.size() * N), gelu_b(ref.size()),
        gelu0(ref.size());
    for (size_t i = 0; i < rows.size(); i++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += x[rows[i] * K + k] * w[n * K + k];
            ref[i * N + n] = acc;
            ref_b[i * N + n] = acc + b[n];
        }
    cpu::gelu_forward(gelu0.data(), ref.data(), int64_t(ref.size()));
    cpu::gelu_forward(gelu_b.data(), ref_b.data(), int64_t(ref.size()));
    auto sampled = [&](const std::vector<double>& all) {
        std::vector<double> v;
        for (int64_t r : rows) v.insert(v.end(), all.begin() + r * N, all.begin() + (r + 1) * N);
        return v;
    };
    for (cuda::Epilogue e : kWgmmaEpilogues) {
        CAPTURE(int(e));
        const cuda::Gemm g = cuda::linear_forward_gemm(nullptr, dx.p, dw.p, M, K, N, t);
        const WgmmaSchedules r = run_wgmma_schedules(g, e, db.p, M * N);
        CHECK(r.d_pp == r.d_co);
        if (r.gelu) CHECK(r.aux_pp == r.aux_co);
        const auto& pre = r.gelu ? r.aux_pp : r.d_pp;
        check_close("pre-activation, sampled rows", sampled(pre), r.bias ? ref_b : ref, t);
        if (r.gelu)
            check_close("GELU, sampled rows", sampled(r.d_pp), r.bias ? gelu_b : gelu0, t,
                        1.0 / 128);
        // a second run repeats the bits (no atomics, a fixed order)
        const WgmmaSchedules again = run_wgmma_schedules(g, e, db.p, M * N);
        CHECK(again.d_pp == r.d_pp);
    }
}

// SwiGLU in the wgmma GEMM's epilogue. aux is the product rounded once: the type's bound against
// the double reference. D is silu(gate) * up of the stored aux values in fp32, rounded once: the
// separate pass's bits (the backward's recompute), and the type's bound against the double SwiGLU
// of what aux holds; against the SwiGLU of the unrounded product 2^-7, as GELU's epilogue.
void matmul_wgmma_swiglu(int64_t M, int64_t K, int64_t H) {
    const DType t = DType::bf16;
    const int64_t N = 2 * H;
    Rng rng(seed_of({M, K, H, 2}));
    const auto x = rnd(rng, M * K, t), w = rnd(rng, N * K, t, 0.3), b = rnd(rng, N, t);
    DevT dx(t, x), dw(t, w), db(t, b), dD(t, M * H), dAux(t, M * N), dSep(t, M * H);
    cuda::Gemm g = cuda::linear_forward_gemm(dD.p, dx.p, dw.p, M, K, N, t);
    g.epilogue = cuda::Epilogue::swiglu_aux;
    g.aux = dAux.p;
    CHECK_THROWS(cuda::gemm(g, nullptr));  // cuBLASLt has no SwiGLU epilogue: refused, not run
    if (!cuda::current_device_is_sm90()) {
        MESSAGE("the wgmma matmul runs on sm_90 devices only: nothing to compare here");
        CHECK_FALSE(cuda::try_gemm_wgmma(g, nullptr));
        return;
    }
    {  // the hidden width in whole tiles of 128 units only: not H - 64
        cuda::Gemm odd = g;
        odd.N = N - 128;
        CHECK_FALSE(cuda::try_gemm_wgmma(odd, nullptr));
    }
    for (const bool bias : {false, true}) {
        CAPTURE(bias);
        std::vector<double> pre(M * N), y(M * H);
        cpu::matmul_forward(pre.data(), x.data(), w.data(), bias ? b.data() : nullptr, M, K, N);
        cpu::swiglu_forward(y.data(), pre.data(), M, H);
        g.epilogue = bias ? cuda::Epilogue::swiglu_aux_bias : cuda::Epilogue::swiglu_aux;
        g.bias = bias ? db.p : nullptr;
        std::vector<double> first;
        for (const cuda::WgmmaSchedule sched :
             {cuda::WgmmaSchedule::cooperative, cuda::WgmmaSchedule::pingpong}) {
            CAPTURE(int(sched));
            CUDA_OK(cudaMemset(dD.p, 0xff, size_t(M * H) * 2));  // NaN: unwritten
            CUDA_OK(cudaMemset(dAux.p, 0xff, size_t(M * N) * 2));
            REQUIRE(cuda::try_gemm_wgmma(g, nullptr, sched));
            const auto aux = dAux.get(), got = dD.get();
            check_close("aux (gate, up)", aux, pre, t);
            std::vector<double> y_stored(M * H);
            cpu::swiglu_forward(y_stored.data(), aux.data(), M, H);
            check_close("silu(gate) * up of the stored aux", got, y_stored, t);
            check_close("silu(gate) * up", got, y, t, 1.0 / 128);
            cuda::swiglu_forward(dSep.p, dAux.p, M, H, t, nullptr);
            CHECK(dSep.get() == got);
            if (first.empty())
                first = got;
            else
                CHECK(got == first);  // either schedule: the same kernel, the same bits
        }
    }
}

// RoPE in the wgmma GEMM's epilogue: the fp32 product (+ bias) rotated, then rounded once. The
// double reference rotates the exact product with cos and sin in double; the kernel's table is
// fp32 (2^-24 relative) and its sums fp32: the type's bound. Columns from rope_cols on are the
// plain GEMM's bits. Against the separate pass (the plain GEMM, then RoPE on its rounded values):
// two roundings, 2^-7.
void matmul_wgmma_rope(int64_t B, int64_t T, int64_t K, int64_t N, int64_t rope_cols) {
    const DType t = DType::bf16;
    const int64_t M = B * T, hs = 64;
    const double theta = 10000.0;
    Rng rng(seed_of({B, T, K, N, rope_cols}));
    const auto x = rnd(rng, M * K, t), w = rnd(rng, N * K, t, 0.3), b = rnd(rng, N, t);
    const std::vector<float> tab = cuda::rope_table(T, hs, theta);
    DevT dx(t, x), dw(t, w), db(t, b), dD(t, M * N), dPlain(t, M * N);
    DevT dtab(DType::f32, std::vector<double>(tab.begin(), tab.end()));
    cuda::Gemm g = cuda::linear_forward_gemm(dD.p, dx.p, dw.p, M, K, N, t);
    g.rope_table = dtab.f();
    g.rope_Tn = T;
    g.rope_hs = hs;
    g.rope_cols = rope_cols;
    CHECK_THROWS(cuda::gemm(g, nullptr));  // cuBLASLt has no RoPE epilogue: refused, not run
    if (!cuda::current_device_is_sm90()) {
        MESSAGE("the wgmma matmul runs on sm_90 devices only: nothing to compare here");
        CHECK_FALSE(cuda::try_gemm_wgmma(g, nullptr));
        return;
    }
    {  // heads of 64 only, whole ones, inside N
        cuda::Gemm bad = g;
        bad.rope_hs = 32;
        CHECK_FALSE(cuda::try_gemm_wgmma(bad, nullptr));
        bad = g;
        bad.rope_cols = rope_cols - 32;
        CHECK_FALSE(cuda::try_gemm_wgmma(bad, nullptr));
        bad = g;
        bad.rope_cols = N + 64;
        CHECK_FALSE(cuda::try_gemm_wgmma(bad, nullptr));
    }
    for (const bool bias : {false, true}) {
        CAPTURE(bias);
        std::vector<double> y(M * N);
        cpu::matmul_forward(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, M, K, N);
        cpu::rope_forward(y.data(), B, T, rope_cols / hs, hs, N, theta);
        g.epilogue = bias ? cuda::Epilogue::bias : cuda::Epilogue::none;
        g.bias = bias ? db.p : nullptr;
        // the separate path: the plain GEMM, then the RoPE pass on its stored values
        cuda::Gemm plain = g;
        plain.D = dPlain.p;
        plain.rope_table = nullptr;
        REQUIRE(cuda::try_gemm_wgmma(plain, nullptr));
        const auto unrotated = dPlain.get();
        cuda::rope_forward(dPlain.p, dtab.f(), B, T, rope_cols / hs, hs, N, t, nullptr);
        const auto separate = dPlain.get();
        std::vector<double> first;
        for (const cuda::WgmmaSchedule sched :
             {cuda::WgmmaSchedule::cooperative, cuda::WgmmaSchedule::pingpong}) {
            CAPTURE(int(sched));
            CUDA_OK(cudaMemset(dD.p, 0xff, size_t(M * N) * 2));  // NaN: unwritten
            REQUIRE(cuda::try_gemm_wgmma(g, nullptr, sched));
            const auto got = dD.get();
            check_close("RoPE(x W^T (+ b))", got, y, t);
            check_close("against the separate RoPE pass", got, separate, t, 1.0 / 128);
            int64_t moved = 0;  // v's columns: not rotated
            for (int64_t r = 0; r < M; r++)
                for (int64_t c = rope_cols; c < N; c++)
                    moved += got[r * N + c] != unrotated[r * N + c];
            CHECK(moved == 0);
            if (first.empty())
                first = got;
            else
                CHECK(got == first);  // the two schedules: the same products, the same rotation
        }
    }
}

// The trainer's fc bias gradient from the GELU' epilogue at a trainer-like width and more row
// tiles than SMs (so the column sums are reduced across CTAs): within rounding of the column
// sums of the stored result, and the same bits on every run (no atomics in the reduction).
void dgelu_bias_grad(int64_t M, int64_t K, int64_t N) {
    Rng rng(seed_of({M, K, N}));
    const DType t = DType::bf16;
    DevT dout(t, rnd(rng, M * N, t)), w(t, rnd(rng, N * K, t, 0.05)),
        pre(t, rnd(rng, M * K, t, 2.0));
    DevT d(t, M * K), db(t, K);
    // d[M, K] = (dout[M, N] @ w[N, K]) * GELU'(pre); db = column sums of d
    cuda::Gemm g = cuda::linear_input_grad_gemm(d.p, dout.p, w.p, M, K, N, t);
    g.epilogue = cuda::Epilogue::dgelu_bias_grad;
    g.aux = pre.p;
    g.bias = db.p;
    if (!cuda::try_gemm(g, nullptr)) {
        MESSAGE("cuBLASLt offers no DGELU_BGRAD epilogue here; the trainer sums the bias itself");
        return;
    }
    const std::vector<double> first_d = d.get(), first_b = db.get();
    check_stored_colsums("bias gradient", first_b, first_d, M, K, t);
    for (int run = 0; run < 3; run++) {
        CUDA_OK(cudaMemset(db.p, 0, size_t(K) * dtype_bytes(t)));
        cuda::gemm(g, nullptr);
        CHECK(db.get() == first_b);
        CHECK(d.get() == first_d);
    }
}

void matmul_strided(int64_t M, int64_t K, int64_t N, int64_t ld, DType t) {
    REQUIRE(ld >= N);
    Rng rng(seed_of({M, K, N, ld, int64_t(t)}));
    const auto h = rnd(rng, M * K, t), w = rnd(rng, N * K, t, 0.3), g = rnd(rng, M * N, t);
    // the references, in double from the stored values
    std::vector<double> logits(M * N, 0.0), dw(N * K, 0.5), dh(M * K, 0.0);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++) {
                logits[i * N + j] += h[i * K + k] * w[j * K + k];
                dw[j * K + k] += g[i * N + j] * h[i * K + k];
                dh[i * K + k] += g[i * N + j] * w[j * K + k];
            }
    // g and the logits in rows ld apart; the padding holds a value no product writes
    constexpr double kPad = 7.0;
    std::vector<double> g_pad(M * ld, kPad);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) g_pad[i * ld + j] = g[i * N + j];
    DevT dH(t, h), dW(t, w), dG(t, g_pad), dL(t, std::vector<double>(M * ld, kPad));
    DevT dWg(DType::f32, std::vector<double>(N * K, 0.5)), dHg(DType::f32, M * K);
    cuda::Gemm f = cuda::linear_forward_gemm(dL.p, dH.p, dW.p, M, K, N, t);  // logits = h w^T
    f.ldd = ld;
    cuda::gemm(f, nullptr);
    cuda::Gemm gw = cuda::linear_weight_grad_gemm(dWg.f(), dG.p, dH.p, M, K, N, t);  // dw += g^T h
    gw.lda = ld;
    cuda::gemm(gw, nullptr);
    cuda::Gemm gi = cuda::linear_input_grad_gemm(dHg.p, dG.p, dW.p, M, K, N, t);  // dh = g w
    gi.d_type = DType::f32;
    gi.lda = ld;
    cuda::gemm(gi, nullptr);
    const auto got = dL.get();
    std::vector<double> got_logits(M * N);
    bool pad_kept = true;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ld; j++) {
            if (j < N)
                got_logits[i * N + j] = got[i * ld + j];
            else
                pad_kept &= got[i * ld + j] == kPad;
        }
    CHECK(pad_kept);
    check_close("logits (rows ld apart)", got_logits, logits, t);
    check_close("dw += g^T h (g's rows ld apart)", dWg.get(), dw, DType::f32);
    check_close("dh = g w (g's rows ld apart)", dHg.get(), dh, DType::f32);
    // w in rows ldw apart (Gemm::ldb), in both orientations: the logits again (w transposed) and
    // dh again (w as stored)
    const int64_t ldw = K + 8;
    std::vector<double> w_pad(N * ldw, kPad);
    for (int64_t j = 0; j < N; j++)
        for (int64_t k = 0; k < K; k++) w_pad[j * ldw + k] = w[j * K + k];
    DevT dWp(t, w_pad), dL2(t, M * N), dHg2(DType::f32, M * K);
    cuda::Gemm f2 = f;
    f2.D = dL2.p;
    f2.B = dWp.p;
    f2.ldb = ldw;
    f2.ldd = 0;
    cuda::gemm(f2, nullptr);
    check_close("logits (w's rows ldw apart)", dL2.get(), logits, t);
    cuda::Gemm gi2 = gi;
    gi2.D = dHg2.p;
    gi2.B = dWp.p;
    gi2.ldb = ldw;
    cuda::gemm(gi2, nullptr);
    check_close("dh = g w (w's rows ldw apart)", dHg2.get(), dh, DType::f32);
    // a stride shorter than the row is refused
    cuda::Gemm bad = f;
    bad.ldd = N - 1;
    CHECK_THROWS_AS(cuda::gemm(bad, nullptr), Error);
}

void column_sums(int64_t rows, int64_t cols) {
    // out[c] += the sum of parts[k][c] (kernels/core/column_sums.cuh, through the bias gradient's
    // entry point): fp32 partials of either sign, summed here in double; fp32 sums of `rows`
    // terms within 1e-5 of the largest
    Rng rng(seed_of({rows, cols}));
    const auto parts = rnd(rng, rows * cols, DType::f32, 3.0), out0 = rnd(rng, cols, DType::f32);
    std::vector<double> want = out0;
    for (int64_t k = 0; k < rows; k++)
        for (int64_t c = 0; c < cols; c++) want[c] += parts[k * cols + c];
    DevT d_parts(DType::f32, parts), d_out(DType::f32, out0);
    cuda::bias_backward_from_partials(d_out.f(), d_parts.f(), rows, cols, nullptr);
    check_close("column sums", d_out.get(), want, DType::f32);
}

void encoder(const EncoderDims& s, DType t) {
    // wte rows summed per token, in order; tokens repeat (ids below 5, half the positions id 1,
    // so that at B x T = 2048 every token's positions are split over several bucket entries and
    // added from partials) and one is the last id
    const int64_t B = s.B, T = s.T, C = s.C, V = s.V;
    Rng rng(seed_of({B, T, C, V, int64_t(t)}));
    std::vector<int32_t> tok(B * T);
    for (auto& x : tok) x = rng.next_u64() % 2 ? 1 : int32_t(rng.next_u64() % 5);
    tok[4] = int32_t(V - 1);
    const auto wte = rnd(rng, V * C, t), wpe = rnd(rng, T * C, t), dout = rnd(rng, B * T * C, t);
    std::vector<double> out(B * T * C), dwte(V * C, 0.5), dwpe(T * C, 0.25);
    DevT d_wte(t, wte), d_wpe(t, wpe), d_out(t, B * T * C), d_dout(t, dout);
    DevT g_wte(DType::f32, dwte), g_wpe(DType::f32, dwpe);
    const DevInts d_tok(tok);
    cuda::encoder_forward(d_out.p, d_tok.p(), d_wte.p, d_wpe.p, B, T, C, t, nullptr);
    cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    check_close("out", d_out.get(), out, t);
    // The split's path: each of two vocabulary shards looks up its rows for two ranks' blocks of
    // tokens (zero bits elsewhere; the gap after each block keeps what it held), vectorised when
    // the stride allows and not when it is odd; with all of each block's tokens, and with fewer
    // rows than the token stride from an offset (a later chunk's). The shards' sum plus positions
    // (add_positions) then equals encoder_forward bit for bit.
    const int64_t BT = B * T, half = V / 2;
    std::vector<int32_t> tok2(tok);
    tok2.insert(tok2.end(), tok.rbegin(), tok.rend());  // block 1: the tokens reversed
    const DevInts d_tok2(tok2);
    constexpr double kUntouched = 3.0;
    for (const int64_t stride : {BT * C + 8, BT * C + 1})
        for (const int64_t skip : {0, 1}) {
            const int64_t n = BT - 3 * skip;  // rows of each block, from token `skip` on
            std::vector<double> summed(BT * C, 0.0);
            int64_t wrong = 0;
            for (int shard = 0; shard < 2; shard++) {
                const int64_t v0 = shard ? half : 0, rows = shard ? V - half : half;
                DevT look(t, std::vector<double>(2 * stride, kUntouched));
                const char* shard_table =
                    static_cast<const char*>(d_wte.p) + v0 * C * dtype_bytes(t);
                cuda::lookup_rows_in_shard(look.p, stride, d_tok2.p() + skip, BT, 2, n, shard_table,
                                           v0, rows, C, t, nullptr);
                const std::vector<double> got = look.get();
                for (int64_t b = 0; b < 2; b++)
                    for (int64_t i = 0; i < stride; i++) {
                        const int64_t k = i / C, tk = k < n ? tok2[b * BT + skip + k] : -1;
                        const bool mine = tk >= v0 && tk < v0 + rows;
                        const double want = k >= n ? kUntouched : mine ? wte[tk * C + i % C] : 0.0;
                        wrong += got[b * stride + i] != want;
                        if (b == 0 && k < n) summed[i] += got[i];
                    }
            }
            CHECK(wrong == 0);
            if (skip) continue;
            DevT d_rows(t, summed), d_sum(t, BT * C);
            cuda::add_positions(d_sum.p, d_rows.p, d_wpe.p, B, T, C, t, nullptr);
            CHECK(d_sum.get() == d_out.get());
        }
    CHECK_THROWS_AS(cuda::lookup_rows_in_shard(d_out.p, BT * C - 1, d_tok2.p(), BT, 2, BT, d_wte.p,
                                               0, V, C, t, nullptr),
                    Error);
    const cuda::TokenBuckets bk = cuda::bucket_tokens(tok.data(), B * T);
    if (B * T >= 2048) CHECK(bk.merged() == 5);  // every token split over entries
    const DevInts bt(bk.token), bo(bk.offset), bp(bk.position), bs(bk.slot), mt(bk.merge_token),
        mo(bk.merge_offset);
    DevT partials(DType::f32, cuda::bucket_partial_rows(B * T) * C);
    const cuda::DeviceBuckets dbk{bt.p(), bo.p(),       bp.p(),      bs.p(),      mt.p(),
                                  mo.p(), bk.entries(), bk.merged(), partials.f()};
    cuda::encoder_backward(g_wte.f(), g_wpe.f(), d_dout.p, dbk, B, T, C, t, nullptr);
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
    check_close("dwte", g_wte.get(), dwte, DType::f32);
    check_close("dwpe", g_wpe.get(), dwpe, DType::f32);
}

void gelu(int64_t n, DType t) {
    Rng rng(seed_of({n, int64_t(t)}));
    const auto x = rnd(rng, n, t, 3.0), dy = rnd(rng, n, t);
    std::vector<double> y(n), dx(n, 0.0);
    cpu::gelu_forward(y.data(), x.data(), n);
    cpu::gelu_backward(dx.data(), x.data(), dy.data(), n);
    DevT dX(t, x), dY(t, n), dDY(t, dy), dDX(t, n);
    cuda::gelu_forward(dY.p, dX.p, n, t, nullptr);
    cuda::gelu_backward(dDX.p, dX.p, dDY.p, n, t, nullptr);
    check_close("gelu", dY.get(), y, t);
    check_close("dgelu", dDX.get(), dx, t);
}

void rmsnorm(const RmsnormDims& s, DType t, DType r) {
    // Plain rows (NH 1): the norm alone and with the residual add fused, then the backward adding
    // into dinp, with and without dinp's column sums. Heads (NH > 1, qk_norm): rows of hs inside
    // rows of ld, in t, backward in place; the columns between the heads untouched.
    const int64_t N = s.N, C = s.C, NH = s.NH, ld = s.ld ? s.ld : NH * C, rows = N * NH;
    const bool heads = NH > 1;
    Rng rng(seed_of({N, C, NH, ld, int64_t(t), int64_t(r)}));
    const auto a = rnd(rng, N * ld, r, 2.0), b = rnd(rng, N * ld, t), w = rnd(rng, C, r),
               dout = rnd(rng, N * ld, t), dinp0 = rnd(rng, N * ld, r);
    // the rows the norm reads: a + b (rounded once to r) for plain rows, a itself for heads
    std::vector<double> x(rows * C), dy(rows * C), d0(rows * C);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < C; c++) {
            const int64_t at = (i / NH) * ld + (i % NH) * C + c;
            x[i * C + c] = heads ? a[at] : as_stored(a[at] + b[at], r);
            dy[i * C + c] = dout[at];
            d0[i * C + c] = dinp0[at];
        }
    std::vector<double> y(rows * C), rstd(rows);
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, 1e-5);
    const cuda::RowMap map{NH, ld};
    // the forward passes read fp32 weights (the master copy), the backward passes weights in r
    DevT da(r, a), db(t, b), dw(r, w), dwf(DType::f32, w), dres(r, N * ld), dy_(t, N * ld),
        drstd(DType::f32, rows);
    const void* xin = da.p;
    if (heads) {
        cuda::rmsnorm_forward(dy_.p, map, drstd.f(), da.p, map, dwf.f(), rows, C, 1e-5, t, r,
                              nullptr);
    } else {
        cuda::residual_rmsnorm_forward(dres.p, dy_.p, drstd.f(), da.p, db.p, dwf.f(), N, C, 1e-5, t,
                                       r, nullptr);
        check_close("res", dres.get(), x, r);
        xin = dres.p;
        // the unfused forward on the stored sum: the same bits
        DevT y2(t, N * C), r2(DType::f32, N);
        cuda::rmsnorm_forward(y2.p, {1, C}, r2.f(), dres.p, {1, C}, dwf.f(), N, C, 1e-5, t, r,
                              nullptr);
        CHECK(y2.get() == dy_.get());
    }
    const auto got = dy_.get();
    std::vector<double> got_y(rows * C);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < C; c++) got_y[i * C + c] = got[(i / NH) * ld + (i % NH) * C + c];
    check_close("out", got_y, y, t);
    check_close("rstd", drstd.get(), rstd, DType::f32, 1e-5);
    std::vector<double> dx = heads ? std::vector<double>(rows * C, 0.0) : d0, gw(C, 0.0);
    cpu::rmsnorm_backward(dx.data(), gw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows,
                          C);
    DevT scratch(DType::f32, int64_t(cuda::layernorm_backward_scratch_bytes(rows, C) / 4));
    DevT d_gw(DType::f32, C);
    if (heads) {  // in place on dout's heads, as the model runs qk_norm's backward
        DevT d(t, dout);
        cuda::rmsnorm_backward(d.p, map, false, d_gw.f(), d.p, map, xin, map, dw.p, drstd.f(), rows,
                               C, scratch.p, t, t, nullptr);
        const auto gd = d.get();
        std::vector<double> got_dx(rows * C);
        int64_t moved = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = 0; c < ld; c++) {
                if (c < NH * C)
                    got_dx[i * NH * C + c] = gd[i * ld + c];
                else
                    moved += gd[i * ld + c] != dout[i * ld + c];
            }
        CHECK(moved == 0);
        check_close("dinp", got_dx, dx, t);
        check_close("dweight", d_gw.get(), gw, DType::f32, 1e-4);
        return;
    }
    DevT d_dinp(r, dinp0), d_dout(t, dout);
    cuda::rmsnorm_backward(d_dinp.p, {1, C}, true, d_gw.f(), d_dout.p, {1, C}, xin, {1, C}, dw.p,
                           drstd.f(), N, C, scratch.p, t, r, nullptr);
    check_close("dinp", d_dinp.get(), dx, r);
    check_close("dweight", d_gw.get(), gw, DType::f32, 1e-4);
    // with dinp's column sums: dinp the same bits, the sums those of the stored dinp
    DevT d_dinp2(r, dinp0), d_gw2(DType::f32, C), d_sum(DType::f32, C);
    DevT parts(DType::f32, int64_t(cuda::layernorm_backward_sums_bytes(N, C) / 4));
    cuda::ColumnSumParts sums{parts.f()};
    cuda::rmsnorm_backward(d_dinp2.p, {1, C}, true, d_gw2.f(), d_dout.p, {1, C}, xin, {1, C}, dw.p,
                           drstd.f(), N, C, scratch.p, t, r, nullptr, &sums);
    REQUIRE(sums.rows > 0);
    cuda::bias_backward_from_partials(d_sum.f(), sums.parts, sums.rows, C, nullptr);
    const auto got_dinp = d_dinp.get();
    CHECK(d_dinp2.get() == got_dinp);
    check_close("dweight (with the sums)", d_gw2.get(), gw, DType::f32, 1e-4);
    check_dinp_column_sums(d_sum.get(), got_dinp, N, C, t);
    // kernels.layernorm_split_rows: rows above 1280 columns two warps a row (bf16 activations)
    if (t == DType::bf16 && C > 1280 && C <= 2048 && C % 8 == 0) {
        DevT d_dinp3(r, dinp0), d_gw3(DType::f32, C), d_sum3(DType::f32, C);
        cuda::ColumnSumParts sums3{parts.f()};
        cuda::rmsnorm_backward(d_dinp3.p, {1, C}, true, d_gw3.f(), d_dout.p, {1, C}, xin, {1, C},
                               dw.p, drstd.f(), N, C, scratch.p, t, r, nullptr, &sums3, true);
        REQUIRE(sums3.rows > 0);
        cuda::bias_backward_from_partials(d_sum3.f(), sums3.parts, sums3.rows, C, nullptr);
        const auto got_dinp3 = d_dinp3.get();
        check_close("dinp (split rows)", got_dinp3, dx, r);
        check_close("dweight (split rows)", d_gw3.get(), gw, DType::f32, 1e-4);
        check_dinp_column_sums(d_sum3.get(), got_dinp3, N, C, t);
        // and without the sums, writing dinp rather than adding into it
        std::vector<double> fresh(N * C, 0.0), gw4(C, 0.0);
        cpu::rmsnorm_backward(fresh.data(), gw4.data(), dy.data(), x.data(), w.data(), rstd.data(),
                              N, C);
        DevT d_dinp4(r, dinp0), d_gw4(DType::f32, C);
        cuda::rmsnorm_backward(d_dinp4.p, {1, C}, false, d_gw4.f(), d_dout.p, {1, C}, xin, {1, C},
                               dw.p, drstd.f(), N, C, scratch.p, t, r, nullptr, nullptr, true);
        check_close("dinp (split rows, written)", d_dinp4.get(), fresh, r);
        check_close("dweight (split rows, no sums)", d_gw4.get(), gw4, DType::f32, 1e-4);
    }
}

void rope(const RopeDims& s, DType t) {
    // In place on the heads; the columns after them (v, in the model) untouched. Angles up to
    // T radians on the fastest pair: cos and sin come from the table in fp32 (2^-24 relative),
    // so fp32 is within 1e-5 and bf16 within one rounding.
    const int64_t B = s.B, T = s.T, heads = s.heads, hs = s.hs, ld = s.ld, n = B * T * ld;
    const double theta = 10000.0;
    Rng rng(seed_of({B, T, heads, hs, ld, int64_t(t)}));
    const auto x = rnd(rng, n, t), dy = rnd(rng, n, t);
    std::vector<double> y = x, dx = dy;
    cpu::rope_forward(y.data(), B, T, heads, hs, ld, theta);
    cpu::rope_backward(dx.data(), B, T, heads, hs, ld, theta);
    const std::vector<float> tab = cuda::rope_table(T, hs, theta);
    DevT dt(DType::f32, std::vector<double>(tab.begin(), tab.end())), dX(t, x), dDY(t, dy);
    cuda::rope_forward(dX.p, dt.f(), B, T, heads, hs, ld, t, nullptr);
    cuda::rope_backward(dDY.p, dt.f(), B, T, heads, hs, ld, t, nullptr);
    const auto gy = dX.get(), gd = dDY.get();
    int64_t moved = 0;
    for (int64_t i = 0; i < B * T; i++)
        for (int64_t c = heads * hs; c < ld; c++)
            moved += gy[i * ld + c] != x[i * ld + c] || gd[i * ld + c] != dy[i * ld + c];
    CHECK(moved == 0);
    check_close("rope", gy, y, t);
    check_close("rope backward", gd, dx, t);
}

void swiglu(int64_t N, int64_t H, DType t) {
    // gates up to +-12 (silu's tails); one rounding of an fp32 result: the type's bounds, and
    // 2^-7 for the gate's gradient in bf16 (the product of two fp32 factors of the stored values)
    Rng rng(seed_of({N, H, int64_t(t)}));
    const auto x = rnd(rng, N * 2 * H, t, 4.0), dy = rnd(rng, N * H, t);
    std::vector<double> y(N * H), dx(N * 2 * H, 0.0);
    cpu::swiglu_forward(y.data(), x.data(), N, H);
    cpu::swiglu_backward(dx.data(), x.data(), dy.data(), N, H);
    DevT dX(t, x), dY(t, N * H), dDY(t, dy), dDX(t, N * 2 * H);
    cuda::swiglu_forward(dY.p, dX.p, N, H, t, nullptr);
    cuda::swiglu_backward(dDX.p, dX.p, dDY.p, N, H, t, nullptr);
    check_close("swiglu", dY.get(), y, t);
    check_close("dswiglu", dDX.get(), dx, t, t == DType::bf16 ? 1.0 / 128 : -1);
}

void residual(int64_t n, DType t, DType r) {
    // Exact: one fp32 add of the stored values, rounded once to r. For bf16 + bf16 the fp32 sum
    // is exact (8 + 8 significand bits) unless the exponents differ by more than 16, and then the
    // smaller term moves the larger by under 2^-16 relative, far from a bf16 rounding boundary
    // (2^-10 away at least): either way the stored value is the exact sum rounded once.
    Rng rng(seed_of({n, int64_t(t), int64_t(r)}));
    const auto a = rnd(rng, n, r), b = rnd(rng, n, t);
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; i++) want[i] = as_stored(a[i] + b[i], r);
    DevT da(r, a), db(t, b), dout(r, n);
    if (t == DType::f32 && r == DType::f32)
        cuda::residual_forward(dout.f(), da.f(), db.f(), n, nullptr);  // the fp32 launcher
    else
        cuda::residual_forward(dout.p, da.p, db.p, n, t, r, nullptr);
    const std::vector<double> got = dout.get();
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) differ += got[i] != want[i];
    CHECK(differ == 0);
}

void adamw(int64_t n, int64_t base, int nspans) {
    // The arena [0, n) updated over [base, n) in nspans spans of uneven lengths with alternating
    // decay (more than 128 spans take two launches; an odd base takes the scalar path), against
    // the CPU reference span by span.
    Rng rng(seed_of({n, base, nspans}));
    std::vector<float> p(n), g(n), m(n - base), v(n - base);
    for (int64_t i = 0; i < n; i++) {
        p[i] = float(rng.normal());
        g[i] = float(rng.normal() * 0.01);
    }
    for (int64_t i = 0; i < n - base; i++) {
        m[i] = float(rng.normal() * 0.01);
        v[i] = float(std::fabs(rng.normal()) * 1e-4);
    }
    std::vector<cuda::AdamWSpan> spans;
    for (int k = 0; k < nspans; k++) {
        const int64_t lo = base + (n - base) * k / nspans,
                      hi = base + (n - base) * (k + 1) / nspans;
        spans.push_back({lo, hi, k % 2 == 0});
    }
    cpu::AdamWStep s;
    s.lr = 3e-3;
    s.beta1 = 0.9;
    s.beta2 = 0.95;
    s.weight_decay = 0.1;
    s.t = 7;
    s.grad_scale = 0.5;
    std::vector<double> pd(p.begin(), p.end()), gd(g.begin(), g.end()), md(m.begin(), m.end()),
        vd(v.begin(), v.end());
    DevT dp(DType::f32, pd), dg(DType::f32, gd), dm(DType::f32, md), dv(DType::f32, vd),
        p16(DType::bf16, n);
    if (nspans == 1 && base == 0) {
        cuda::adamw_update(dp.f(), p16.p, dg.f(), dm.f(), dv.f(), n, s, nullptr);
    } else {
        cuda::adamw_update(dp.f(), p16.p, dg.f(), dm.f(), dv.f(), base, spans, s, nullptr);
    }
    for (const cuda::AdamWSpan& sp : spans) {
        cpu::AdamWStep sd = s;
        sd.weight_decay = sp.decay ? s.weight_decay : 0.0;
        cpu::adamw_update(p.data() + sp.begin, g.data() + sp.begin, m.data() + (sp.begin - base),
                          v.data() + (sp.begin - base), sp.end - sp.begin, sd);
    }
    const auto gp = dp.get(), gm = dm.get(), gv = dv.get(), g16 = p16.get();
    int64_t exact = 0, untouched = 0;
    bool bf16_ok = true;
    for (int64_t i = 0; i < base; i++) untouched += gp[i] == pd[i];
    CHECK(untouched == base);  // outside the spans nothing moves
    for (int64_t i = base; i < n; i++) {
        exact += gp[i] == double(p[i]) && gm[i - base] == double(m[i - base]) &&
                 gv[i - base] == double(v[i - base]);
        bf16_ok &= g16[i] == as_stored(gp[i], DType::bf16);
    }
    // double math on both sides (the GPU multiplies by the bias corrections' reciprocals where the
    // CPU divides, 1 ulp of a double apart): equal after rounding to fp32 up to rare ties
    CHECK(exact >= (n - base) - (n - base) / 1000);
    check_close("params", gp, std::vector<double>(p.begin(), p.end()), DType::f32);
    CHECK(bf16_ok);  // the bf16 copy is the fp32 master rounded once
}

void global_norm(int64_t n) {
    // a sum of squares in double on both sides (in other orders): 1e-12 relative
    Rng rng(seed_of({n, 1}));
    std::vector<float> g(n);
    for (float& x : g) x = float(rng.normal() * 0.01);
    const DevT dg(DType::f32, std::vector<double>(g.begin(), g.end()));
    DevT scratch(DType::f32, int64_t(cuda::sum_of_squares_scratch_bytes() / 4));
    Dev d_sum(8);
    cuda::sum_of_squares(d_sum.as<double>(), dg.f(), n, scratch.p, nullptr);
    double got = 0;
    CUDA_OK(cudaMemcpy(&got, d_sum.p, 8, cudaMemcpyDeviceToHost));
    CHECK(close(got, cpu::sum_of_squares(g.data(), n), 1e-12, 0));
}

}  // namespace zgpt::test::gpu

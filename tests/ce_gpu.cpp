#include "tests/ce_gpu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace zgpt::test {

// Host logits stored as the device type; returns the values the device will actually see.
std::vector<float> to_device_values(const std::vector<float>& x, LogitsType t) {
    if (t == LogitsType::f32) return x;
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); i++) r[i] = bf16_round(x[i]);
    return r;
}

void upload(void* dst, const std::vector<float>& x, LogitsType t) {
    if (t == LogitsType::f32) {
        CUDA_OK(cudaMemcpy(dst, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    } else {
        std::vector<__nv_bfloat16> b(x.size());
        for (size_t i = 0; i < x.size(); i++) b[i] = __float2bfloat16_rn(x[i]);
        CUDA_OK(cudaMemcpy(dst, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    }
}

std::vector<float> download(const void* src, size_t n, LogitsType t) {
    std::vector<float> r(n);
    if (t == LogitsType::f32) {
        CUDA_OK(cudaMemcpy(r.data(), src, n * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<__nv_bfloat16> b(n);
        CUDA_OK(cudaMemcpy(b.data(), src, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) r[i] = __bfloat162float(b[i]);
    }
    return r;
}

Reference reference(const Case& c) {
    Reference r;
    const std::vector<float> seen = to_device_values(c.logits, c.type);
    r.dlogits.assign(seen.begin(), seen.end());
    r.loss.resize(c.N);
    r.ce.resize(c.N);
    r.z.resize(c.N);
    r.lse.resize(c.N);
    std::vector<double> g(c.grad_output.begin(), c.grad_output.end());
    r.summary = cpu::cross_entropy(r.dlogits.data(), c.V, c.targets.data(), c.N, c.V, c.opts,
                                   {g.data(), c.opts.reduction == Reduction::none},
                                   {r.loss.data(), r.ce.data(), r.z.data(), r.lse.data()}, true);
    return r;
}

std::vector<float> pad_rows(const std::vector<float>& x, int64_t N, int64_t V, int64_t ld,
                            float pad) {
    std::vector<float> r(size_t(N) * ld, pad);
    for (int64_t i = 0; i < N; i++)
        std::copy(x.begin() + i * V, x.begin() + (i + 1) * V, r.begin() + i * ld);
    return r;
}

// A variant's arguments for whole rows of V values at stride ld: rows holds the per-row loss, ce,
// z-loss and lse (N floats each, in that order).
cuda::CrossEntropyArgs ce_args(void* logits, void* dlogits, LogitsType t, int64_t ld, int64_t N,
                               int64_t V, const Dev& targets, const Dev& go, const Dev& rows,
                               const Dev& summary) {
    cuda::CrossEntropyArgs a;
    a.logits = logits;
    a.type = t;
    a.ld = ld;
    a.N = N;
    a.V_local = V;
    a.V = V;
    a.targets = targets.as<int32_t>();
    a.grad_output = go.as<float>();
    a.dlogits = dlogits;
    a.loss_rows = rows.as<float>();
    a.ce_rows = rows.as<float>() + N;
    a.z_rows = rows.as<float>() + 2 * N;
    a.lse_rows = rows.as<float>() + 3 * N;
    a.summary = summary.as<cuda::LossSummaryF>();
    return a;
}

// The per-row loss, ce, z-loss and lse (rows: N floats each, in that order) and the summary,
// from the device into r.
void read_rows(Result& r, const Dev& rows, const Dev& summary, int64_t N) {
    std::vector<float> all(4 * N);
    CUDA_OK(cudaMemcpy(all.data(), rows.p, all.size() * 4, cudaMemcpyDeviceToHost));
    r.loss.assign(all.begin(), all.begin() + N);
    r.ce.assign(all.begin() + N, all.begin() + 2 * N);
    r.z.assign(all.begin() + 2 * N, all.begin() + 3 * N);
    r.lse.assign(all.begin() + 3 * N, all.end());
    CUDA_OK(cudaMemcpy(&r.summary, summary.p, sizeof r.summary, cudaMemcpyDeviceToHost));
}

Result run_variant(const cuda::CrossEntropyVariant& v, const Case& c,
                   const cuda::CrossEntropyTuning& tuning) {
    const int64_t ld = c.ld ? c.ld : c.V;
    const size_t es = c.type == LogitsType::f32 ? 4 : 2, n = size_t(c.N) * ld;
    Dev logits(n * es), dl(c.in_place ? 0 : n * es), targets(c.N * 4), go(c.grad_output.size() * 4);
    Dev rows(4 * c.N * 4), summary(sizeof(cuda::LossSummaryF));
    Dev ws(v.workspace_bytes(c.N, c.V, c.type));
    upload(logits.p, pad_rows(c.logits, c.N, c.V, ld, NAN), c.type);
    CUDA_OK(cudaMemcpy(targets.p, c.targets.data(), c.N * 4, cudaMemcpyHostToDevice));
    CUDA_OK(
        cudaMemcpy(go.p, c.grad_output.data(), c.grad_output.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(rows.p, 0xFF, rows.bytes));  // poison: every output must be written
    if (!c.in_place) upload(dl.p, pad_rows(c.logits, c.N, c.V, ld, NAN), c.type);
    cuda::CrossEntropyArgs a = ce_args(logits.p, c.in_place ? logits.p : dl.p, c.type, ld, c.N, c.V,
                                       targets, go, rows, summary);
    a.tuning = tuning;
    v.run(a, c.opts, ws.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    Result r;
    const std::vector<float> out = download(a.dlogits, n, c.type);
    r.dlogits.resize(size_t(c.N) * c.V);
    for (int64_t i = 0; i < c.N; i++) {
        std::copy(out.begin() + i * ld, out.begin() + i * ld + c.V, r.dlogits.begin() + i * c.V);
        for (int64_t j = c.V; j < ld; j++)  // nothing is written past V
            if (!std::isnan(out[i * ld + j])) {
                r.padding_written = true;
            }
    }
    read_rows(r, rows, summary, c.N);
    return r;
}

// dlogits against the reference with the per-element bound argued at the top of this file.
MaxError compare_dlogits(const std::vector<float>& got, const std::vector<double>& want,
                         const std::vector<float>& seen_logits, const std::vector<double>& lse,
                         int64_t V, double base_rtol) {
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    MaxError e;
    for (size_t k = 0; k < want.size(); k++) {
        const double t = std::fabs(double(seen_logits[k]) - lse[k / V]);
        const double rtol = base_rtol + 2.4e-7 * (std::isfinite(t) ? t : 0.0);
        const double d = std::fabs(double(got[k]) - want[k]);
        if (!close(got[k], want[k], rtol, 1e-6 * scale + 1e-30)) {
            if (e.ok || d > e.abs) e.worst = int64_t(k);
            e.ok = false;
        }
        if (!(d <= e.abs)) e.abs = d;
        const double r = d / std::max(std::fabs(want[k]), 1e-30);
        if (!(r <= e.rel)) e.rel = r;
    }
    return e;
}

void check_result(const Result& got, const Reference& want, const Case& c) {
    const double loss_rtol = 2e-5;
    for (int64_t i = 0; i < c.N; i++) {
        CAPTURE(i);
        const bool valid = c.targets[i] != c.opts.ignore_index;
        CHECK(close(got.loss[i], want.loss[i], loss_rtol, 1e-6));
        CHECK(close(got.ce[i], want.ce[i], loss_rtol, 1e-6));
        CHECK(close(got.z[i], want.z[i], loss_rtol, 1e-9));
        if (valid) CHECK(close(got.lse[i], want.lse[i], 1e-6, 1e-5));
    }
    CHECK(got.summary.n_valid == want.summary.n_valid);
    CHECK(close(got.summary.loss, want.summary.loss, loss_rtol, 1e-6));
    CHECK(close(got.summary.sum_z_loss, want.summary.sum_z_loss, loss_rtol, 1e-9));
    CHECK(close(got.summary.sum_lse_sq, want.summary.sum_lse_sq, loss_rtol, 1e-9));
    MaxError e;
    if (c.type == LogitsType::f32) {
        e = compare_dlogits(got.dlogits, want.dlogits, c.logits, want.lse, c.V, 1e-5);
    } else {  // one bf16 rounding of the output dominates
        e = compare(got.dlogits.data(), want.dlogits.data(), int64_t(want.dlogits.size()),
                    1.0 / 256 + 1e-5, 1e-6 * max_abs(want.dlogits) + 1e-30);
    }
    INFO("dlogits: max abs err " << e.abs << ", max rel err " << e.rel << " at " << e.worst);
    std::ostringstream worst;  // the worst element, with its row's context
    if (!e.ok) {
        const int64_t i = e.worst / c.V, j = e.worst % c.V;
        worst << "row " << i << " col " << j << " target " << c.targets[i] << ": got "
              << got.dlogits[e.worst] << " want " << want.dlogits[e.worst] << " logit "
              << c.logits[e.worst] << " lse " << want.lse[i];
    }
    INFO(worst.str());
    CHECK(e.ok);
}

// Random logits with hard rows mixed in: peaked (p -> 1), large magnitude, -inf entries.
Case make_case(uint64_t seed, int64_t N, int64_t V, LogitsType t, double z, double eps, Reduction r,
               int ignored) {
    Case c;
    c.N = N;
    c.V = V;
    c.type = t;
    c.opts.z_loss_weight = z;
    c.opts.label_smoothing = eps;
    c.opts.reduction = r;
    Rng rng(seed);
    c.logits.resize(N * V);
    c.targets.resize(N);
    for (int64_t i = 0; i < N; i++) {
        const int64_t y = int64_t(rng.below(uint64_t(V)));
        c.targets[i] = int32_t(y);
        const int kind = int(i % 4);
        for (int64_t j = 0; j < V; j++) {
            float x = float(2.0 * rng.normal());
            if (kind == 1) x = float(100.0 * (2 * rng.uniform() - 1));  // |logit| ~ 100
            // -inf (masked) entries; with label smoothing their mean makes the loss infinite on
            // both sides, so there a large finite mask value stands in
            if (kind == 3 && j % 5 == 1) x = eps == 0.0 ? -INFINITY : -1e4f;
            c.logits[i * V + j] = x;
        }
        if (kind == 2) c.logits[i * V + y] = 40.0f;  // peaked on the target: 1 - p ~ V e^-40
        if (kind == 3) c.logits[i * V + y] = float(rng.normal());  // target itself finite
    }
    for (int k = 0; k < ignored && k < N; k++)
        c.targets[(k * 7) % N] = int32_t(c.opts.ignore_index);
    if (r == Reduction::none) {
        c.grad_output.resize(N);
        for (auto& g : c.grad_output) g = float(rng.normal());
    } else {
        c.grad_output = {0.37f};
    }
    return c;
}

std::string type_name(LogitsType t) {
    return t == LogitsType::f32 ? "f32" : "bf16";
}

// fused_linear's arguments over device buffers: h [N, C], W [V, C], targets, grad_output; outputs
// dh, dW (bf16, or added to the fp32 dW_acc, as the schedule says), per-row loss and the summary;
// vocabulary chunks of 384 columns (several, the last one ragged for the sizes the tests use).
cuda::LinearCrossEntropyArgs linear_ce_args(const Dev& h, const Dev& W, const Dev& targets,
                                            const Dev& go, const Dev& dh, const Dev& dW,
                                            const Dev& dW_acc, const Dev& rows, const Dev& summary,
                                            int64_t N, int64_t C, int64_t V, const Schedule& sc) {
    cuda::LinearCrossEntropyArgs a;
    a.hidden = h.p;
    a.weight = W.p;
    a.N = N;
    a.C = C;
    a.V = V;
    a.targets = targets.as<int32_t>();
    a.grad_output = go.as<float>();
    a.dhidden = dh.p;
    if (sc.fp32_dw)
        a.dweight_acc = dW_acc.as<float>();
    else
        a.dweight = dW.p;
    a.loss_rows = rows.as<float>();
    a.summary = summary.as<cuda::LossSummaryF>();
    a.tuning.vocab_chunk = 384;
    a.tuning.row_block = sc.row_block;
    a.tuning.rows_outer = sc.rows_outer;
    // fused_linear_rows_filtered skips nothing: the exact tests hold its GEMMs to the fp64 head
    // (its filter has its own test in test_gpu.cpp)
    a.tuning.filter_eps = 0.0f;
    return a;
}

// fused_linear on a CE case through an identity weight: h = the case's logits (bf16), C = V and
// W = I, so that h W^T is exactly the bf16 logits and dh = dlogits W is exactly the bf16 dlogits
// the head computed. The result reads like a CE variant's, with dh as its dlogits. Hidden states
// are finite, so -inf logits cannot be made this way (-inf x 0 is NaN): cases must not have them.
Result run_linear_identity(const Case& c, const Schedule& sc, const std::string& variant) {
    REQUIRE(c.type == LogitsType::bf16);
    const int64_t N = c.N, V = c.V, C = V;
    for (float x : c.logits) REQUIRE(std::isfinite(x));
    Dev hd(N * C * 2), Wd(size_t(V) * C * 2), td(N * 4), god(c.grad_output.size() * 4),
        dh(N * C * 2), dW(sc.fp32_dw ? 0 : size_t(V) * C * 2),
        dWacc(sc.fp32_dw ? size_t(V) * C * 4 : 0), rows(4 * N * 4), sd(sizeof(cuda::LossSummaryF));
    upload(hd.p, c.logits, LogitsType::bf16);
    CUDA_OK(cudaMemset(Wd.p, 0, Wd.bytes));
    const std::vector<__nv_bfloat16> ones(V, __float2bfloat16_rn(1.0f));
    CUDA_OK(cudaMemcpy2D(Wd.p, size_t(V + 1) * 2, ones.data(), 2, 2, V, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(td.p, c.targets.data(), N * 4, cudaMemcpyHostToDevice));
    CUDA_OK(
        cudaMemcpy(god.p, c.grad_output.data(), c.grad_output.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(rows.p, 0xFF, rows.bytes));  // poison: every output must be written
    CUDA_OK(cudaMemset(dWacc.p, 0, dWacc.bytes));
    cuda::LinearCrossEntropyArgs a =
        linear_ce_args(hd, Wd, td, god, dh, dW, dWacc, rows, sd, N, C, V, sc);
    a.ce_rows = rows.as<float>() + N;
    a.z_rows = rows.as<float>() + 2 * N;
    a.lse_rows = rows.as<float>() + 3 * N;
    const auto& v = cuda::find_linear_cross_entropy_variant(variant);
    Dev ws(v.workspace_bytes(N, C, V, a.tuning));
    v.run(a, c.opts, ws.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    Result r;
    r.dlogits = download(dh.p, N * C, LogitsType::bf16);
    read_rows(r, rows, sd, N);
    return r;
}

}  // namespace zgpt::test

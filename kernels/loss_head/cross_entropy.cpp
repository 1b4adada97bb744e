#include "kernels/loss_head/cross_entropy.h"

#include <cmath>
#include <vector>

#include "kernels/core/check.h"

namespace zgpt {

Reduction parse_reduction(const std::string& s) {
    if (s == "mean") return Reduction::mean;
    if (s == "sum") return Reduction::sum;
    if (s == "none") return Reduction::none;
    throw Error("unknown reduction '" + s + "' (expected mean, sum or none)");
}

const char* reduction_name(Reduction r) {
    switch (r) {
        case Reduction::mean:
            return "mean";
        case Reduction::sum:
            return "sum";
        case Reduction::none:
            return "none";
    }
    return "?";
}

void validate(const CrossEntropyOptions& o) {
    ZG_CHECK(std::isfinite(o.z_loss_weight) && o.z_loss_weight >= 0.0,
             "z_loss_weight must be finite and >= 0, got " + std::to_string(o.z_loss_weight));
    ZG_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing < 1.0,
             "label_smoothing must be in [0, 1), got " + std::to_string(o.label_smoothing));
}

RowStats merge(const RowStats& a, const RowStats& b) {
    RowStats r;
    r.max = std::max(a.max, b.max);
    // An empty side (max = -inf) contributes nothing; this also avoids exp(-inf - -inf) = NaN.
    const double da = a.sum_exp == 0.0 ? 0.0 : a.sum_exp * std::exp(a.max - r.max);
    const double db = b.sum_exp == 0.0 ? 0.0 : b.sum_exp * std::exp(b.max - r.max);
    r.sum_exp = da + db;
    r.target_logit = a.target_logit + b.target_logit;
    r.sum_logits = a.sum_logits + b.sum_logits;
    return r;
}

namespace cpu {

template <typename T>
void ce_shard_stats(RowStats* stats, const T* logits, int64_t ld, const int32_t* targets, int64_t N,
                    int64_t V_local, int64_t v0, int64_t ignore_index) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const T* x = logits + i * ld;
        double m = -INFINITY, d = 0.0, sum = 0.0;
        for (int64_t j = 0; j < V_local; j++) {
            const double v = x[j];
            sum += v;
            if (v > m) {  // new running max: rescale what was summed so far
                d = d * std::exp(m - v) + 1.0;
                m = v;
            } else if (v != -INFINITY) {
                d += std::exp(v - m);
            }
        }
        RowStats s;
        s.max = m;
        s.sum_exp = d;
        s.sum_logits = sum;
        const int64_t y = targets[i];
        if (y != ignore_index && y >= v0 && y < v0 + V_local) s.target_logit = x[y - v0];
        stats[i] = s;
    }
}

void ce_merge_stats(RowStats* acc, const RowStats* shard, int64_t N) {
    for (int64_t i = 0; i < N; i++) acc[i] = merge(acc[i], shard[i]);
}

CrossEntropySummary ce_finalize(const RowStats* stats, const int32_t* targets, int64_t N, int64_t V,
                                const CrossEntropyOptions& opts, GradOutput grad_output,
                                CrossEntropyRows rows, double* lse_out, double* row_grad) {
    validate(opts);
    ZG_CHECK(grad_output.values != nullptr, "grad_output is required");
    ZG_CHECK(grad_output.per_row == (opts.reduction == Reduction::none),
             "grad_output must be per-row exactly when reduction is none");
    const double eps = opts.label_smoothing, z = opts.z_loss_weight;
    CrossEntropySummary s;
    for (int64_t i = 0; i < N; i++) {
        const RowStats& st = stats[i];
        const double lse = st.max + std::log(st.sum_exp);
        lse_out[i] = lse;
        if (rows.lse) rows.lse[i] = lse;
        if (st.max > s.max_logit) s.max_logit = st.max;
        const int64_t y = targets[i];
        const bool valid = y != opts.ignore_index;
        if (valid)
            ZG_CHECK(y >= 0 && y < V, "target " + std::to_string(y) + " of row " +
                                          std::to_string(i) + " is outside [0, " +
                                          std::to_string(V) + ")");
        double ce = 0.0, zl = 0.0;
        if (valid) {
            ce = lse - st.target_logit;
            // eps == 0 leaves ce untouched, so plain CE is reproduced bit for bit.
            if (eps != 0.0) ce = (1.0 - eps) * ce + eps * (lse - st.sum_logits / double(V));
            zl = z * lse * lse;
            s.sum_ce += ce;
            s.sum_z_loss += zl;
            s.sum_loss += ce + zl;
            s.sum_lse += lse;
            s.sum_lse_sq += lse * lse;
            s.n_valid++;
        }
        if (rows.loss) rows.loss[i] = ce + zl;
        if (rows.ce) rows.ce[i] = ce;
        if (rows.z_loss) rows.z_loss[i] = zl;
    }
    const double inv_n = s.n_valid > 0 ? 1.0 / double(s.n_valid) : 0.0;
    s.loss = opts.reduction == Reduction::mean ? s.sum_loss * inv_n : s.sum_loss;
    for (int64_t i = 0; i < N; i++) {
        const bool valid = targets[i] != opts.ignore_index;
        const double g = grad_output.values[grad_output.per_row ? i : 0];
        row_grad[i] = !valid ? 0.0 : (opts.reduction == Reduction::mean ? g * inv_n : g);
    }
    return s;
}

template <typename T>
void ce_shard_backward(T* dlogits, const T* logits, int64_t ld, const int32_t* targets,
                       const double* lse, const double* row_grad, int64_t N, int64_t V_local,
                       int64_t v0, int64_t V, const CrossEntropyOptions& opts) {
    const double eps = opts.label_smoothing, z = opts.z_loss_weight;
    const double smooth = eps / double(V), target_weight = 1.0 - eps;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const T* x = logits + i * ld;
        T* dx = dlogits + i * ld;
        const double g = row_grad[i];
        if (targets[i] == opts.ignore_index) {  // exactly zero, whatever g is
            for (int64_t j = 0; j < V_local; j++) dx[j] = T(0);
            continue;
        }
        const double zscale = 1.0 + 2.0 * z * lse[i];  // exactly 1 when z == 0
        const int64_t y_local = int64_t(targets[i]) - v0;
        for (int64_t j = 0; j < V_local; j++) {
            // fp64 here and one rounding at the end: never subtract 1 from a rounded probability.
            double d = std::exp(double(x[j]) - lse[i]) * zscale - smooth;
            if (j == y_local) d -= target_weight;
            dx[j] = T(g * d);
        }
    }
}

template <typename T>
CrossEntropySummary cross_entropy(T* logits, int64_t ld, const int32_t* targets, int64_t N,
                                  int64_t V, const CrossEntropyOptions& opts,
                                  GradOutput grad_output, CrossEntropyRows rows,
                                  bool compute_grad) {
    std::vector<RowStats> stats(N);
    std::vector<double> lse(N), row_grad(N);
    ce_shard_stats(stats.data(), logits, ld, targets, N, V, 0, opts.ignore_index);
    CrossEntropySummary s = ce_finalize(stats.data(), targets, N, V, opts, grad_output, rows,
                                        lse.data(), row_grad.data());
    if (compute_grad)
        ce_shard_backward(logits, logits, ld, targets, lse.data(), row_grad.data(), N, V, 0, V,
                          opts);
    return s;
}

#define ZG_INSTANTIATE(T)                                                                        \
    template void ce_shard_stats<T>(RowStats*, const T*, int64_t, const int32_t*, int64_t,       \
                                    int64_t, int64_t, int64_t);                                  \
    template void ce_shard_backward<T>(T*, const T*, int64_t, const int32_t*, const double*,     \
                                       const double*, int64_t, int64_t, int64_t, int64_t,        \
                                       const CrossEntropyOptions&);                              \
    template CrossEntropySummary cross_entropy<T>(T*, int64_t, const int32_t*, int64_t, int64_t, \
                                                  const CrossEntropyOptions&, GradOutput,        \
                                                  CrossEntropyRows, bool);
ZG_INSTANTIATE(float)
ZG_INSTANTIATE(double)
#undef ZG_INSTANTIATE

}  // namespace cpu
}  // namespace zgpt

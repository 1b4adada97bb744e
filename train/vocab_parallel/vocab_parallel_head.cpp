#include "train/vocab_parallel/vocab_parallel_head.h"

#include <algorithm>

#include "kernels/core/check.h"
#include "kernels/gemm/matmul.h"

namespace zgpt {

VocabShard vocab_shard(int64_t V, int parts, int index) {
    ZG_CHECK(parts >= 1 && index >= 0 && index < parts && V >= parts,
             "vocab shard " + std::to_string(index) + " of " + std::to_string(parts) +
                 " over a vocabulary of " + std::to_string(V));
    const int64_t base = V / parts, extra = V % parts;
    VocabShard s;
    s.V_local = base + (index < extra ? 1 : 0);
    s.v0 = index * base + std::min<int64_t>(index, extra);
    return s;
}

int32_t shard_order_id(int32_t y, int64_t V, int parts) {
    if (y < 0 || y >= V || parts == 1) return y;
    return int32_t(vocab_shard(V, parts, int(y % parts)).v0 + y / parts);
}

template <typename T>
CrossEntropySummary VocabParallelHead<T>::run(Communicator& group, const T* hidden,
                                              const int32_t* targets, int64_t N, int64_t C,
                                              const T* W, T* dW, int64_t V,
                                              const CrossEntropyOptions& opts,
                                              GradOutput grad_output, T* dhidden,
                                              CrossEntropyRows rows) {
    validate(opts);
    const int P = group.size(), p = group.rank();
    const VocabShard sh = vocab_shard(V, P, p);
    const int64_t NA = int64_t(P) * N;  // rows of the whole group
    const bool grad = dhidden != nullptr;

    // The group's rows, in rank order.
    h_all_.resize(NA * C);
    group.all_gather(hidden, h_all_.data(), N * C, comm_type_of<T>());
    y64_.assign(targets, targets + N);  // the communicators move 32-bit floats or 64-bit values
    y64_all_.resize(NA);
    group.all_gather(y64_.data(), y64_all_.data(), N, CommType::i64);
    y_all_.assign(y64_all_.begin(), y64_all_.end());
    g_all_.assign(grad_output.per_row ? NA : 1, 0.0);
    if (grad_output.per_row)
        group.all_gather(grad_output.values, g_all_.data(), N, CommType::f64);
    else
        g_all_[0] = grad_output.values[0];

    // This shard's logits and statistics; one collective to exchange the statistics.
    logits_.resize(NA * sh.V_local);
    cpu::matmul_forward(logits_.data(), h_all_.data(), W, (const T*)nullptr, NA, C, sh.V_local);
    stats_.resize(NA);
    cpu::ce_shard_stats(stats_.data(), logits_.data(), sh.V_local, y_all_.data(), NA, sh.V_local,
                        sh.v0, opts.ignore_index);
    static_assert(sizeof(RowStats) == 4 * sizeof(double), "RowStats travels as 4 doubles");
    gathered_.resize(size_t(P) * NA);
    group.all_gather(stats_.data(), gathered_.data(), NA * 4, CommType::f64);
    for (int64_t i = 0; i < NA; i++) {  // rank order: every rank merges identically
        RowStats acc = gathered_[i];
        for (int r = 1; r < P; r++) acc = merge(acc, gathered_[size_t(r) * NA + i]);
        stats_[i] = acc;
    }

    // Loss and the gradient factors of every row of the group, from the global statistics.
    lse_.resize(NA);
    row_grad_.resize(NA);
    const CrossEntropySummary all =
        cpu::ce_finalize(stats_.data(), y_all_.data(), NA, V, opts,
                         {g_all_.data(), grad_output.per_row}, {}, lse_.data(), row_grad_.data());
    // This rank's rows for what it reports.
    std::vector<double> lse_own(N), rg_own(N);
    CrossEntropySummary own =
        cpu::ce_finalize(stats_.data() + p * N, targets, N, V, opts,
                         {g_all_.data() + (grad_output.per_row ? p * N : 0), grad_output.per_row},
                         rows, lse_own.data(), rg_own.data());
    if (opts.reduction == Reduction::mean)
        own.loss = all.n_valid ? own.sum_loss / double(all.n_valid) : 0.0;
    if (!grad) return own;

    cpu::ce_shard_backward(logits_.data(), logits_.data(), sh.V_local, y_all_.data(), lse_.data(),
                           row_grad_.data(), NA, sh.V_local, sh.v0, V, opts);
    dh_all_.assign(NA * C, T(0));
    cpu::matmul_backward(dh_all_.data(), dW, (T*)nullptr, logits_.data(), h_all_.data(), W, NA, C,
                         sh.V_local);
    group.reduce_scatter_sum(dh_all_.data(), dhidden, N * C, comm_type_of<T>());
    return own;
}

template <typename T>
size_t VocabParallelHead<T>::buffer_bytes() const {
    return (h_all_.capacity() + logits_.capacity() + dh_all_.capacity()) * sizeof(T) +
           (stats_.capacity() + gathered_.capacity()) * sizeof(RowStats) +
           (lse_.capacity() + row_grad_.capacity() + g_all_.capacity()) * sizeof(double) +
           (y64_.capacity() + y64_all_.capacity()) * 8 + y_all_.capacity() * 4;
}

template class VocabParallelHead<float>;
template class VocabParallelHead<double>;

}  // namespace zgpt

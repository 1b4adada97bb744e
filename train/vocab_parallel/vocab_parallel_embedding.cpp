#include "train/vocab_parallel/vocab_parallel_embedding.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace zgpt {

template <typename T>
void VocabParallelEmbedding<T>::forward(Communicator& group, const int32_t* tokens, int64_t N,
                                        int64_t C, const T* table, VocabShard shard, T* rows) {
    const int64_t NA = int64_t(group.size()) * N;
    tokens_.assign(tokens, tokens + N);  // the communicators move 64-bit integers
    tokens_all_.resize(NA);
    group.all_gather(tokens_.data(), tokens_all_.data(), N, CommType::i64);
    rows_all_.assign(NA * C, T(0));
#pragma omp parallel for
    for (int64_t i = 0; i < NA; i++) {
        const int64_t r = tokens_all_[i] - shard.v0;
        if (r >= 0 && r < shard.V_local)
            std::copy(table + r * C, table + (r + 1) * C, rows_all_.data() + i * C);
    }
    group.reduce_scatter_sum(rows_all_.data(), rows, N * C, comm_type_of<T>());
}

template <typename T>
void VocabParallelEmbedding<T>::backward(Communicator& group, const T* drows, int64_t N, int64_t C,
                                         T* dtable, VocabShard shard) {
    const int64_t NA = int64_t(group.size()) * N;
    ZG_CHECK(int64_t(tokens_all_.size()) == NA, "VocabParallelEmbedding: backward before forward");
    rows_all_.resize(NA * C);
    group.all_gather(drows, rows_all_.data(), N * C, comm_type_of<T>());
    // In the group's token order, serially: rows that share a token add in a fixed order.
    for (int64_t i = 0; i < NA; i++) {
        const int64_t r = tokens_all_[i] - shard.v0;
        if (r < 0 || r >= shard.V_local) continue;
        const T* d = rows_all_.data() + i * C;
        T* e = dtable + r * C;
        for (int64_t c = 0; c < C; c++) e[c] += d[c];
    }
}

template class VocabParallelEmbedding<float>;
template class VocabParallelEmbedding<double>;

}  // namespace zgpt

// The loss head split by vocabulary rows across a group of ranks (vocab parallel), on the CPU
// reference ops. Each rank of the group holds the LM head's rows [v0, v0 + V_local) of the ids it
// is given (contiguous; uneven when V does not divide: the first V % P ranks hold one row more;
// the padded vocabulary rows belong to nobody and never enter the softmax). A split model stores
// its vocabulary in shard order (below), where those ranges are rows dealt out in turn. One call:
//   all-gather the group's hidden states and targets -> logits of this shard for every row of the
//   group -> per-row statistics of the shard -> one all-gather of the statistics, merged in rank
//   order (kernels/loss_head/cross_entropy.h's exact merge) -> loss + z-loss + dlogits in place ->
//   dW_shard += dlogits^T H, dH = dlogits W_shard -> reduce-scatter dH: each rank gets the sum
//   over the shards of its own rows' gradient.
// Head memory per rank: [P N, V / P] logits, against [P N, V] for one rank doing the group's rows.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/loss_head/cross_entropy.h"
#include "train/dist/comm.h"

namespace zgpt {

struct VocabShard {
    int64_t v0 = 0, V_local = 0;
};
// Shard `index` of `parts` over V rows.
VocabShard vocab_shard(int64_t V, int parts, int index);

// The order a split model's vocabulary is stored in (the arena, train/vocab_parallel/
// vocab_sharded_arena.h, and the token ids the backends hand the model). Shard p holds the
// vocabulary's rows p, p + P, p + 2P, ..., dealt out in turn, so that the ids a tokenizer uses
// most, which cluster, spread over the shards and every rank does its share of the per-token
// work (embedding rows and their gradient, the targets' corrections). In that order shard p's
// rows are the contiguous ids [v0, v0 + V_local) of vocab_shard(V, P, p), which is what the
// head and the model see (and the loss's ignore_index where it is a vocabulary id); one part is
// the identity.

// The vocabulary row of shard `index`'s local row j.
inline int64_t vocab_row_of_shard(int parts, int index, int64_t j) {
    return int64_t(index) + j * parts;
}
// Token id y in shard order: v0 of shard y mod P, plus y / P. Ids outside [0, V) (ignored
// targets) are kept. (A step's ids: VocabShardedArena::in_shard_order.)
int32_t shard_order_id(int32_t y, int64_t V, int parts);

template <typename T>
class VocabParallelHead {
  public:
    // hidden [N, C]: this rank's rows; W [V_local, C]: this rank's shard of the LM head (row i
    // is id v0 + i of the ids given, vocab_shard(V, group size, group rank)); dW: its gradient
    // (added into). targets [N]. grad_output:
    // a scalar, or per row (this rank's N) for reduction none. dhidden [N, C] is written (null:
    // loss only, no gradients). rows: this rank's per-row outputs (optional).
    // Returns this rank's rows' sums; with reduction mean the gradient and `loss` divide by the
    // group's valid rows, so the group's `loss` values add up to the group's mean.
    CrossEntropySummary run(Communicator& group, const T* hidden, const int32_t* targets, int64_t N,
                            int64_t C, const T* W, T* dW, int64_t V,
                            const CrossEntropyOptions& opts, GradOutput grad_output, T* dhidden,
                            CrossEntropyRows rows = {});
    // Bytes of the buffers this rank holds for the head (logits, gathered hidden states, ...).
    size_t buffer_bytes() const;

  private:
    std::vector<T> h_all_, logits_, dh_all_;
    std::vector<int64_t> y64_, y64_all_;
    std::vector<int32_t> y_all_;
    std::vector<RowStats> stats_, gathered_;
    std::vector<double> lse_, row_grad_, g_all_;
};

extern template class VocabParallelHead<float>;
extern template class VocabParallelHead<double>;

}  // namespace zgpt

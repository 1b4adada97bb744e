// The token embedding of a table split by vocabulary rows across a group of ranks (vocab
// parallel, on the CPU reference ops): the companion of train/vocab_parallel/vocab_parallel_head.h
// when the table is tied to the LM head, or when an untied wte is split the same way.
//   forward: all-gather the group's tokens -> each rank writes the rows its shard holds and zeros
//   elsewhere, for every token of the group -> reduce-scatter (sum): each rank gets its own
//   tokens' rows. Each sum is one row plus zeros, so the result is exact.
//   backward: all-gather the group's row gradients -> each rank adds those of the tokens its
//   shard holds into its rows of dwte, in the group's token order.
#pragma once
#include <cstdint>
#include <vector>

#include "train/dist/comm.h"
#include "train/vocab_parallel/vocab_parallel_head.h"

namespace zgpt {

template <typename T>
class VocabParallelEmbedding {
  public:
    // rows [N, C]: this rank's tokens' rows of the whole table. table: this shard's rows
    // (row i is id shard.v0 + i of the ids given: the trainer's shard order).
    void forward(Communicator& group, const int32_t* tokens, int64_t N, int64_t C, const T* table,
                 VocabShard shard, T* rows);
    // drows [N, C]: the gradient of forward's rows on this rank; adds into dtable (the shard's).
    // Uses the tokens of the last forward.
    void backward(Communicator& group, const T* drows, int64_t N, int64_t C, T* dtable,
                  VocabShard shard);

  private:
    std::vector<int64_t> tokens_, tokens_all_;
    std::vector<T> rows_all_;
};

extern template class VocabParallelEmbedding<float>;
extern template class VocabParallelEmbedding<double>;

}  // namespace zgpt

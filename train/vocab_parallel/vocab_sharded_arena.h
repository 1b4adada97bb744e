// How a vocab-parallel rank stores the model. Its arena has the whole model's tensors in the same
// order, except the vocabulary tables (wte, and lm_head when untied): of those it holds only its
// shard's rows, in shard order (vocabulary rows index, index + parts, ...: vocab_row_of_shard in
// train/vocab_parallel/vocab_parallel_head.h), in tables of vocab_table_rows(c, parts) rows, the
// same on every rank of the group. The rest of the arena is replicated.
//   gradients: the replicated spans are summed over all ranks; the vocabulary spans over the
//   ranks that hold the same rows (one per vocab-parallel group), since each shard's gradient
//   already holds its whole group's tokens.
//   checkpoints: always the whole model (take_shard / gather convert), so a run resumes on any
//   rank count and vocab_parallel setting.
#pragma once
#include <cstdint>
#include <vector>

#include "model/parameters.h"
#include "train/dist/comm.h"
#include "train/vocab_parallel/vocab_parallel_head.h"

namespace zgpt {

class VocabShardedArena {
  public:
    VocabShardedArena(const ModelConfig& c, int parts, int index);

    int parts() const { return parts_; }
    VocabShard shard() const { return shard_; }
    const GptLayout& whole() const { return whole_; }
    const GptLayout& local() const { return local_; }
    // [lo, hi) spans of the local arena: the vocabulary tables, and everything else.
    const std::vector<ArenaSlice>& vocab_spans() const { return vocab_; }
    const std::vector<ArenaSlice>& replicated_spans() const { return replicated_; }

    // This rank's local arena from a whole one (padding rows zero; with one part, a copy).
    std::vector<float> take_shard(const std::vector<float>& whole) const;
    // The same values without the copy where there is one part and the whole's padding rows are
    // zero (a 1558M model is 6 GB): `whole`'s data then, else take_shard's, kept in `scratch`.
    const float* shard_of(const std::vector<float>& whole, std::vector<float>& scratch) const;
    // Copies the vocabulary rows of shard p from rank p's local arena into a whole one; with
    // `replicated`, also the other tensors.
    void put(const float* local, int p, bool replicated, std::vector<float>& whole) const;
    // Token ids (inputs or targets) as the split model takes them: in shard order (kept in
    // `scratch`); with one part, `ids` themselves.
    const int32_t* in_shard_order(const int32_t* ids, int64_t n,
                                  std::vector<int32_t>& scratch) const;
    // The loss's options for targets in shard order: an ignore_index that is a vocabulary id
    // (any id may be) maps with them.
    CrossEntropyOptions in_shard_order(CrossEntropyOptions o) const;
    // The whole arena from each rank's local one (`local`: this rank's). Collective over the
    // vocab-parallel group (its ranks, in shard order); with one part, a copy (group unused).
    std::vector<float> gather(Communicator* group, const float* local) const;

  private:
    bool is_vocab_table(int idx) const;

    int parts_, index_;
    int64_t vocab_size_;
    VocabShard shard_;
    GptLayout whole_, local_;
    std::vector<int32_t> shard_order_;  // id -> shard_order_id (more than one part)
    std::vector<ArenaSlice> vocab_, replicated_;
};

}  // namespace zgpt

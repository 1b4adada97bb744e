#include "train/vocab_parallel/vocab_sharded_arena.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace zgpt {

VocabShardedArena::VocabShardedArena(const ModelConfig& c, int parts, int index)
    : parts_(parts),
      index_(index),
      vocab_size_(c.vocab_size),
      shard_(vocab_shard(c.vocab_size, parts, index)),
      whole_(make_gpt_layout(c)),
      local_(make_gpt_layout(c, parts)) {
    if (parts_ > 1) {  // every id's place in shard order, looked up per token (a step's ids)
        shard_order_.resize(size_t(vocab_size_));
        for (int64_t y = 0; y < vocab_size_; y++)
            shard_order_[y] = shard_order_id(int32_t(y), vocab_size_, parts_);
    }
    const auto& specs = local_.table.specs();
    for (size_t i = 0; i < specs.size(); i++) {
        std::vector<ArenaSlice>& to = is_vocab_table(int(i)) ? vocab_ : replicated_;
        const int64_t lo = specs[i].offset, hi = lo + specs[i].numel;
        if (!to.empty() && to.back().hi == lo)
            to.back().hi = hi;  // runs of neighbours: one collective each
        else
            to.push_back({lo, hi});
    }
}

bool VocabShardedArena::is_vocab_table(int idx) const {
    return idx == local_.wte || idx == local_.lm_head;
}

std::vector<float> VocabShardedArena::take_shard(const std::vector<float>& whole) const {
    ZG_CHECK(int64_t(whole.size()) == whole_.table.total(),
             "take_shard: the arena has " + std::to_string(whole.size()) + " elements, the model " +
                 std::to_string(whole_.table.total()));
    std::vector<float> local(local_.table.total(), 0.0f);
    for (size_t i = 0; i < local_.table.specs().size(); i++) {
        const ParamSpec& l = local_.table[int(i)];
        const ParamSpec& w = whole_.table[int(i)];
        if (is_vocab_table(int(i))) {
            const int64_t C = l.shape[1];
            for (int64_t j = 0; j < shard_.V_local; j++)
                std::copy_n(whole.begin() + w.offset + vocab_row_of_shard(parts_, index_, j) * C, C,
                            local.begin() + l.offset + j * C);
        } else {
            std::copy_n(whole.begin() + w.offset, w.numel, local.begin() + l.offset);
        }
    }
    return local;
}

const float* VocabShardedArena::shard_of(const std::vector<float>& whole,
                                         std::vector<float>& scratch) const {
    if (parts_ == 1 && int64_t(whole.size()) == whole_.table.total()) {
        bool padding_zero = true;
        for (int idx : {whole_.wte, whole_.lm_head}) {
            const ParamSpec& w = whole_.table[idx];
            const auto pad = whole.begin() + w.offset + shard_.V_local * w.shape[1];
            padding_zero = padding_zero && std::all_of(pad, whole.begin() + w.offset + w.numel,
                                                       [](float x) { return x == 0.0f; });
        }
        if (padding_zero) return whole.data();
    }
    scratch = take_shard(whole);
    return scratch.data();
}

void VocabShardedArena::put(const float* local, int p, bool replicated,
                            std::vector<float>& whole) const {
    ZG_CHECK(int64_t(whole.size()) == whole_.table.total(),
             "put: the whole arena has the wrong size");
    const VocabShard s = vocab_shard(vocab_size_, parts_, p);
    for (size_t i = 0; i < local_.table.specs().size(); i++) {
        const ParamSpec& l = local_.table[int(i)];
        const ParamSpec& w = whole_.table[int(i)];
        if (is_vocab_table(int(i))) {
            const int64_t C = l.shape[1];
            for (int64_t j = 0; j < s.V_local; j++)
                std::copy_n(local + l.offset + j * C, C,
                            whole.begin() + w.offset + vocab_row_of_shard(parts_, p, j) * C);
        } else if (replicated) {
            std::copy_n(local + l.offset, l.numel, whole.begin() + w.offset);
        }
    }
}

const int32_t* VocabShardedArena::in_shard_order(const int32_t* ids, int64_t n,
                                                 std::vector<int32_t>& scratch) const {
    if (parts_ == 1) return ids;
    scratch.resize(size_t(n));
    for (int64_t i = 0; i < n; i++) {
        const int32_t y = ids[i];
        scratch[i] = y >= 0 && y < vocab_size_ ? shard_order_[y] : y;  // (others kept)
    }
    return scratch.data();
}

CrossEntropyOptions VocabShardedArena::in_shard_order(CrossEntropyOptions o) const {
    if (o.ignore_index >= 0 && o.ignore_index < vocab_size_)
        o.ignore_index = shard_order_id(int32_t(o.ignore_index), vocab_size_, parts_);
    return o;
}

std::vector<float> VocabShardedArena::gather(Communicator* group, const float* local) const {
    const int64_t n = local_.table.total();
    if (parts_ == 1) return std::vector<float>(local, local + n);  // the local arena is whole
    ZG_CHECK(group && group->size() == parts_,
             "gather: the arena has " + std::to_string(parts_) + " parts and the group " +
                 std::to_string(group ? group->size() : 0) + " ranks");
    std::vector<float> all(size_t(n) * parts_);
    group->all_gather(local, all.data(), n, CommType::f32);
    // the whole table's padding rows (past the vocabulary) stay zero; the replicated tensors are
    // the same on every rank
    std::vector<float> whole(whole_.table.total(), 0.0f);
    for (int p = 0; p < parts_; p++) put(all.data() + int64_t(p) * n, p, p == 0, whole);
    return whole;
}

}  // namespace zgpt

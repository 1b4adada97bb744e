// B x T training windows from token shards.
//
// An epoch cuts every shard into non-overlapping windows of T + 1 tokens (inputs and the targets
// shifted by one), starting at a phase in [0, T) drawn per shard and epoch when shuffling (0
// otherwise), and orders all windows randomly (shuffle) or in file order. Batch k of rank r takes
// windows [(k * world + r) * B, ... + B): ranks read disjoint windows. Everything is a function of
// (seed, epoch, batch), so a position is two integers and resuming is exact.
//
// Sampling::random is nanoGPT's sampler instead: every window starts at a uniformly random token
// offset, drawn with replacement from a stream seeded by (seed, batch, rank). Ranks draw
// independently (not disjoint); it is there to compare with nanoGPT on equal terms.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"
#include "kernels/core/rng.h"

namespace zgpt {

enum class Sampling { epochs, random };

struct LoaderOptions {
    int64_t batch_size = 1;  // B
    int64_t seq_len = 1;     // T
    bool shuffle = true;     // epochs: shuffled windows (else file order)
    Sampling sampling = Sampling::epochs;
    uint64_t seed = 0;
    int rank = 0, world_size = 1;
    int64_t vocab_size = 0;  // > 0: every token is checked at load
};

struct LoaderPosition {
    int64_t epoch = 0;
    int64_t batch = 0;  // batches this rank has taken in the epoch
};

class DataLoader {
  public:
    DataLoader(const std::string& pattern, const LoaderOptions& opts);

    // Fills B x T inputs and targets.
    void next_batch(int32_t* inputs, int32_t* targets);

    LoaderPosition position() const { return pos_; }
    void set_position(const LoaderPosition& p);
    void reset() { set_position({}); }
    int64_t batches_per_epoch() const { return batches_per_epoch_; }
    int64_t num_tokens() const { return n_tokens_; }
    size_t num_shards() const { return shards_.size(); }

  private:
    struct Window {
        int32_t shard;
        int64_t start;
    };
    void build_epoch(int64_t epoch);
    Window random_window(Rng& rng) const;

    LoaderOptions opts_;
    std::vector<TokenShard> shards_;
    int64_t n_tokens_ = 0;
    int64_t n_starts_ = 0;  // valid window starts (random sampling)
    int64_t batches_per_epoch_ = 0;
    LoaderPosition pos_;
    int64_t built_epoch_ = -1;
    std::vector<Window> windows_;
};

}  // namespace zgpt

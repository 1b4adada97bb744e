#include "data/loader.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace zgpt {

DataLoader::DataLoader(const std::string& pattern, const LoaderOptions& opts) : opts_(opts) {
    ZG_CHECK(opts.batch_size > 0 && opts.seq_len > 0, "loader: batch_size and seq_len must be > 0");
    ZG_CHECK(opts.world_size > 0 && opts.rank >= 0 && opts.rank < opts.world_size,
             "loader: rank must be in [0, world_size)");
    for (const std::string& p : glob_paths(pattern)) {
        shards_.emplace_back(p);
        if (opts.vocab_size > 0) shards_.back().check_vocab(opts.vocab_size);
        n_tokens_ += shards_.back().size();
        n_starts_ += std::max<int64_t>(0, shards_.back().size() - opts.seq_len);
    }
    // Every epoch uses the window count of the worst phase (T - 1), so all epochs have the same
    // number of batches; windows beyond it (a shuffled few) wait for another epoch.
    int64_t windows = 0;
    for (const TokenShard& s : shards_)
        windows += s.size() >= 2 * opts.seq_len ? (s.size() - opts.seq_len) / opts.seq_len : 0;
    const int64_t per_batch = opts.batch_size * opts.world_size;
    batches_per_epoch_ = windows / per_batch;
    ZG_CHECK(batches_per_epoch_ > 0,
             "'" + pattern + "' holds " + std::to_string(n_tokens_) + " tokens: " +
                 std::to_string(windows) + " windows of " + std::to_string(opts.seq_len + 1) +
                 " tokens, fewer than one batch needs (" + std::to_string(per_batch) + ")");
}

void DataLoader::build_epoch(int64_t epoch) {
    const int64_t T = opts_.seq_len;
    Rng rng(opts_.seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch) + 1);
    windows_.clear();
    for (size_t s = 0; s < shards_.size(); s++) {
        const int64_t n = shards_[s].size();
        if (n <= T) continue;
        const int64_t phase = opts_.shuffle ? int64_t(rng.below(uint64_t(T))) : 0;
        for (int64_t start = phase; start + T + 1 <= n; start += T)
            windows_.push_back({int32_t(s), start});
    }
    if (opts_.shuffle) {
        for (size_t i = windows_.size(); i > 1; i--)
            std::swap(windows_[i - 1], windows_[rng.below(i)]);
    }
    built_epoch_ = epoch;
}

void DataLoader::set_position(const LoaderPosition& p) {
    ZG_CHECK(p.epoch >= 0 && p.batch >= 0 && p.batch <= batches_per_epoch_,
             "loader: invalid position");
    pos_ = p;
}

DataLoader::Window DataLoader::random_window(Rng& rng) const {
    // A uniform start over all valid offsets of all shards (T + 1 tokens must fit).
    const int64_t T = opts_.seq_len;
    int64_t k = int64_t(rng.below(uint64_t(n_starts_)));
    for (size_t s = 0; s < shards_.size(); s++) {
        const int64_t starts = std::max<int64_t>(0, shards_[s].size() - T);
        if (k < starts) return {int32_t(s), k};
        k -= starts;
    }
    throw Error("loader: random window out of range");  // unreachable: k < n_starts_
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
    if (pos_.batch >= batches_per_epoch_) pos_ = {pos_.epoch + 1, 0};
    const bool random = opts_.sampling == Sampling::random;
    if (!random && built_epoch_ != pos_.epoch) build_epoch(pos_.epoch);
    const int64_t B = opts_.batch_size, T = opts_.seq_len;
    const int64_t first = (pos_.batch * opts_.world_size + opts_.rank) * B;
    Rng rng(opts_.seed ^
            (0xD1B54A32D192ED03ull * uint64_t(pos_.epoch * batches_per_epoch_ + pos_.batch + 1)) ^
            (uint64_t(opts_.rank) << 48));
    for (int64_t b = 0; b < B; b++) {
        const Window w = random ? random_window(rng) : windows_[first + b];
        const TokenShard& s = shards_[w.shard];
        for (int64_t t = 0; t < T; t++) {
            inputs[b * T + t] = int32_t(s[w.start + t]);
            targets[b * T + t] = int32_t(s[w.start + t + 1]);
        }
    }
    pos_.batch++;
}

}  // namespace zgpt

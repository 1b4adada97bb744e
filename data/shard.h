// Token shards in llm.c's .bin layout.
//
//   header: 256 little-endian int32: [0] magic 20240520, [1] version, [2] token count, rest 0
//   body:   version 1: uint16 tokens (llm.c's format, vocabularies up to 65,536)
//           version 2: uint32 tokens (ours, for larger vocabularies)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zgpt {

constexpr int32_t kShardMagic = 20240520;
constexpr int kShardHeaderInts = 256;

// Writes tokens atomically (temporary file, then rename); version 1 when every id fits uint16.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens);

// A read-only, memory-mapped shard. Construction checks magic, version and size and throws
// zgpt::Error naming the file otherwise.
class TokenShard {
  public:
    explicit TokenShard(const std::string& path);
    ~TokenShard();
    TokenShard(TokenShard&& o) noexcept;
    TokenShard(const TokenShard&) = delete;
    TokenShard& operator=(const TokenShard&) = delete;
    TokenShard& operator=(TokenShard&&) = delete;

    const std::string& path() const { return path_; }
    int version() const { return version_; }
    int64_t size() const { return n_tokens_; }
    uint32_t operator[](int64_t i) const {
        return version_ == 1 ? reinterpret_cast<const uint16_t*>(body_)[i]
                             : reinterpret_cast<const uint32_t*>(body_)[i];
    }
    // Throws naming the file and position of the first token id >= vocab_size.
    void check_vocab(int64_t vocab_size) const;

  private:
    std::string path_;
    void* map_ = nullptr;
    size_t map_bytes_ = 0;
    const unsigned char* body_ = nullptr;
    int version_ = 0;
    int64_t n_tokens_ = 0;
};

// Paths matching a glob pattern, sorted; throws when nothing matches.
std::vector<std::string> glob_paths(const std::string& pattern);

}  // namespace zgpt

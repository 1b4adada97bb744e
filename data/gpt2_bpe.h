// GPT-2's byte-level BPE, from OpenAI's encoder.json + vocab.bpe (the user supplies them).
//
// Text is split by GPT-2's pre-tokenizer regex (PCRE2 with Unicode letter / number classes), each
// piece's UTF-8 bytes are merged by the ranked merge list, and the result is looked up in the
// vocabulary. Bytes that are not valid UTF-8 never reach the regex: each becomes its own byte
// token, so every byte string round-trips exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zgpt {

class Gpt2Bpe {
  public:
    // Throws zgpt::Error naming the file when a file is missing or malformed.
    static std::shared_ptr<const Gpt2Bpe> load(const std::string& encoder_json,
                                               const std::string& vocab_bpe);
    ~Gpt2Bpe();

    // Ordinary text: "<|endoftext|>" in the text is encoded as text, not as the special token.
    std::vector<uint32_t> encode(std::string_view text) const;
    // Large inputs: split at safe points (a newline followed by a non-space) and encoded on all
    // threads; the result equals encode(text).
    std::vector<uint32_t> encode_parallel(std::string_view text) const;
    std::string decode(const std::vector<uint32_t>& ids) const;

    int64_t vocab_size() const { return int64_t(bytes_of_.size()); }
    uint32_t end_of_text() const { return eot_; }

    struct Regex;  // PCRE2 pattern (private; defined in the .cpp)

  private:
    Gpt2Bpe() = default;
    // Encodes text[begin, end) as part of the whole text (lookaheads see past `end`).
    void encode_into(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out,
                     std::unordered_map<std::string, std::vector<uint32_t>>& cache) const;
    void encode_piece(std::string_view piece, std::vector<uint32_t>& out,
                      std::unordered_map<std::string, std::vector<uint32_t>>& cache) const;

    std::vector<std::string> bytes_of_;                // id -> raw bytes
    std::unordered_map<std::string, uint32_t> id_of_;  // raw bytes -> id
    std::unordered_map<std::string, int> rank_;        // merge pair key -> rank
    uint32_t byte_id_[256] = {};                       // the single-byte tokens
    uint32_t eot_ = 0;
    std::unique_ptr<Regex> regex_;
};

}  // namespace zgpt

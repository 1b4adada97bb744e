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

// GPT-2's pre-tokenizer: splits text into the pieces BPE works on. Invalid UTF-8 bytes come out
// as pieces of one byte each (flagged), never through the regex.
class Gpt2PreTokenizer {
  public:
    Gpt2PreTokenizer();
    ~Gpt2PreTokenizer();
    Gpt2PreTokenizer(const Gpt2PreTokenizer&) = delete;
    Gpt2PreTokenizer& operator=(const Gpt2PreTokenizer&) = delete;
    // Calls f(piece, is_invalid_byte) for the pieces of text[begin, end), as part of the whole
    // text (lookaheads see past `end`).
    template <typename F>
    void split(std::string_view text, size_t begin, size_t end, F&& f) const;

    struct Regex;  // PCRE2 pattern (private; defined in the .cpp)
    // Next piece from pos within a valid UTF-8 run ending at run_end (subject_end >= run_end):
    // returns the end of the piece.
    size_t next_piece(const unsigned char* p, size_t pos, size_t run_end, size_t subject_end,
                      void* match_data) const;
    void* new_match_data() const;
    static void free_match_data(void* md);
    static size_t valid_utf8_length(const unsigned char* p, size_t n);  // 0 when invalid

  private:
    std::unique_ptr<Regex> regex_;
};

template <typename F>
void Gpt2PreTokenizer::split(std::string_view text, size_t begin, size_t end, F&& f) const {
    void* md = new_match_data();
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t i = begin;
    while (i < end) {
        size_t j = i;  // the valid UTF-8 run starting at i, within [begin, end)
        while (j < end) {
            const size_t len = valid_utf8_length(p + j, text.size() - j);
            if (len == 0) break;
            j += len;
        }
        size_t subject = j;  // let the whitespace lookahead see the character after `end`
        if (j == end && end < text.size()) subject += valid_utf8_length(p + end, text.size() - end);
        for (size_t pos = i; pos < j;) {
            const size_t e = next_piece(p, pos, j, subject, md);
            f(text.substr(pos, e - pos), false);
            pos = e;
        }
        if (j < end) f(text.substr(j, 1), true);  // an invalid byte
        i = j < end ? j + 1 : j;
    }
    free_match_data(md);
}

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
    Gpt2PreTokenizer pre_;
};

// GPT-2 stores each byte as a printable code point (the printable Latin-1 bytes as themselves,
// the other 68 as 256, 257, ...): the alphabet of encoder.json and vocab.bpe.
std::vector<uint32_t> gpt2_byte_to_code_point();

}  // namespace zgpt

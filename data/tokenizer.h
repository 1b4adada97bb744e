// Tokenizers for text -> shards: `char` (vocabulary = the text's distinct Unicode characters,
// sorted, like nanoGPT's shakespeare_char), `byte` (256 ids) and `gpt2` (OpenAI's byte-level BPE,
// data/gpt2_bpe.h; its encoder.json and vocab.bpe are copied beside the shards). A tokenizer is
// saved as tokenizer.json beside the shards; the trainer reads vocab_size from it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zgpt {

class Gpt2Bpe;

class Tokenizer {
  public:
    static Tokenizer byte_level();
    // GPT-2 BPE from encoder.json + vocab.bpe in `dir`; save() copies them beside tokenizer.json.
    static Tokenizer gpt2(const std::string& dir);
    static Tokenizer char_level_from_text(std::string_view utf8_text);
    static Tokenizer load(const std::string& json_path);
    void save(const std::string& json_path) const;

    const std::string& type() const { return type_; }
    int64_t vocab_size() const;
    std::vector<uint32_t> encode(std::string_view text) const;
    // gpt2: the id of <|endoftext|>, which starts each document; -1 for the others
    int64_t document_separator() const;
    // What generation starts from when no prompt is given: <|endoftext|>, else a newline, else 0.
    std::vector<uint32_t> default_prompt() const;
    std::string decode(const std::vector<uint32_t>& ids) const;

  private:
    std::string type_;                    // "byte", "char" or "gpt2"
    std::shared_ptr<const Gpt2Bpe> bpe_;  // gpt2
    std::string bpe_dir_;                 // gpt2: where its files are
    std::vector<uint32_t> chars_;         // char: id -> code point
    std::vector<int32_t> id_of_char_;     // char: code point -> id, -1 if absent
};

}  // namespace zgpt

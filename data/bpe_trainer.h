// Trains a byte-level BPE vocabulary of a chosen size on your own text, in GPT-2's format
// (encoder.json + vocab.bpe, <|endoftext|> last), so Gpt2Bpe and `prepare_data --tokenizer gpt2
// --gpt2-dir DIR` use it unchanged. Pieces come from GPT-2's pre-tokenizer; the most frequent
// adjacent pair (ties: the lowest pair of ids) is merged until the vocabulary is full.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zgpt {

struct BpeTrainResult {
    int64_t vocab_size = 0;  // tokens written, <|endoftext|> included
    int64_t merges = 0;
};

// texts: the training documents; writes out_dir/encoder.json and out_dir/vocab.bpe.
BpeTrainResult train_bpe(const std::vector<std::string>& texts, int64_t vocab_size,
                         const std::string& out_dir);

}  // namespace zgpt

// train_bpe: a byte-level BPE vocabulary of a chosen size from your own text, in GPT-2's format.
//   train_bpe --input corpus.txt --vocab-size 8192 --out my_bpe
//   prepare_data --input corpus.txt --out shards --tokenizer gpt2 --gpt2-dir my_bpe
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "data/bpe_trainer.h"
#include "kernels/core/check.h"
#include "train/cli.h"

int main(int argc, char** argv) {
    CLI::App app{"Train a byte-level BPE vocabulary (GPT-2 format: encoder.json + vocab.bpe)."};
    zgpt::report_cli_errors(app);
    std::vector<std::string> inputs;
    std::string out;
    int64_t vocab_size = 8192;
    app.add_option("-i,--input", inputs, "text file (repeatable)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("-v,--vocab-size", vocab_size, "tokens, <|endoftext|> included")
        ->check(CLI::Range(int64_t(257), int64_t(1) << 31))
        ->capture_default_str();
    app.add_option("-o,--out", out, "output directory")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::string> texts;
        for (const auto& path : inputs) {
            std::ifstream f(path, std::ios::binary);
            std::stringstream ss;
            ss << f.rdbuf();
            ZG_CHECK(f.good() || f.eof(), "cannot read " + path);
            texts.push_back(ss.str());
            // nothing to learn from: a vocabulary of the 256 bytes alone is not what was asked
            ZG_CHECK(!texts.back().empty(), path + " is empty");
        }
        const zgpt::BpeTrainResult r = zgpt::train_bpe(texts, vocab_size, out);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf(
            "%lld merges, vocabulary %lld (asked %lld) in %.1f s -> %s/encoder.json, "
            "%s/vocab.bpe\n",
            (long long)r.merges, (long long)r.vocab_size, (long long)vocab_size, s, out.c_str(),
            out.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

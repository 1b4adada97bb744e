// prepare_data: text file(s) -> train/val token shards + tokenizer.json.
//   prepare_data --input kjv.txt --out data/shards/kjv --tokenizer char --val-fraction 0.1
//   prepare_data --input a.txt --input b.txt --out data/shards/gpt2 --tokenizer gpt2 --gpt2-dir DIR
// The last val-fraction of the tokens is held out for validation, as nanoGPT does. With gpt2,
// each input file is one document and starts with <|endoftext|>.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/shard.h"
#include "data/tokenizer.h"
#include "kernels/core/check.h"
#include "train/cli.h"

namespace fs = std::filesystem;

namespace {

void write_split(const std::vector<uint32_t>& ids, size_t begin, size_t end, const fs::path& dir,
                 const std::string& split, int64_t shard_tokens) {
    int index = 0;
    for (size_t s = begin; s < end; s += size_t(shard_tokens), index++) {
        const size_t e = std::min(end, s + size_t(shard_tokens));
        char name[64];
        std::snprintf(name, sizeof name, "%s_%06d.bin", split.c_str(), index);
        zgpt::write_shard((dir / name).string(),
                          std::vector<uint32_t>(ids.begin() + s, ids.begin() + e));
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Turn a text file into train/val token shards (llm.c .bin layout)."};
    zgpt::report_cli_errors(app);
    std::vector<std::string> inputs;
    std::string out, tokenizer = "char", gpt2_dir;
    double val_fraction = 0.1;
    int64_t shard_tokens = 100'000'000;
    app.add_option("-i,--input", inputs, "text file (repeatable: one document each)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("-o,--out", out, "output directory")->required();
    app.add_option("-t,--tokenizer", tokenizer, "char | byte | gpt2")
        ->check(CLI::IsMember({"char", "byte", "gpt2"}))
        ->capture_default_str();
    app.add_option("--gpt2-dir", gpt2_dir,
                   "directory with OpenAI's encoder.json and vocab.bpe (gpt2)")
        ->check(CLI::ExistingDirectory);
    app.add_option("--val-fraction", val_fraction, "share of the text held out for validation")
        ->check(CLI::Range(0.0, 0.5))
        ->capture_default_str();
    app.add_option("--shard-tokens", shard_tokens, "tokens per shard file")
        ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        // CLI::Range lets NaN through (every comparison with it is false): refuse it here.
        ZG_CHECK(val_fraction >= 0.0 && val_fraction <= 0.5,
                 "--val-fraction must be in [0, 0.5], not " + std::to_string(val_fraction));
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::string> texts;
        size_t bytes = 0;
        for (const std::string& input : inputs) {
            std::ifstream f(input, std::ios::binary);
            std::stringstream ss;
            ss << f.rdbuf();
            texts.push_back(ss.str());
            ZG_CHECK(!texts.back().empty(), input + " is empty");
            bytes += texts.back().size();
        }
        ZG_CHECK(tokenizer != "gpt2" || !gpt2_dir.empty(), "--tokenizer gpt2 needs --gpt2-dir");
        // text that a tokenizer cannot read is reported with its file
        auto in_file = [&](size_t i, const auto& fn) {
            try {
                return fn();
            } catch (const std::exception& e) {
                throw zgpt::Error(inputs[i] + ": " + e.what());
            }
        };
        auto char_level = [&] {
            std::string all;
            for (const auto& t : texts) all += t;
            try {
                return zgpt::Tokenizer::char_level_from_text(all);
            } catch (const std::exception&) {  // only then: which file it cannot read
                for (size_t i = 0; i < texts.size(); i++)
                    in_file(i, [&] { return zgpt::Tokenizer::char_level_from_text(texts[i]); });
                throw;
            }
        };
        zgpt::Tokenizer tok = tokenizer == "byte"   ? zgpt::Tokenizer::byte_level()
                              : tokenizer == "gpt2" ? zgpt::Tokenizer::gpt2(gpt2_dir)
                                                    : char_level();
        std::vector<uint32_t> ids;
        for (size_t i = 0; i < texts.size(); i++) {
            if (tok.document_separator() >= 0) ids.push_back(uint32_t(tok.document_separator()));
            const std::vector<uint32_t> doc = in_file(i, [&] { return tok.encode(texts[i]); });
            ids.insert(ids.end(), doc.begin(), doc.end());
        }
        const size_t n_val = size_t(double(ids.size()) * val_fraction);
        const size_t n_train = ids.size() - n_val;
        fs::create_directories(out);
        write_split(ids, 0, n_train, out, "train", shard_tokens);
        if (n_val > 0) write_split(ids, n_train, ids.size(), out, "val", shard_tokens);
        tok.save((fs::path(out) / "tokenizer.json").string());
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf(
            "%zu file(s), %zu bytes -> %zu tokens (%s, vocab %lld): %zu train, %zu val, in %.2f s "
            "-> "
            "%s\n",
            inputs.size(), bytes, ids.size(), tok.type().c_str(), (long long)tok.vocab_size(),
            n_train, n_val, secs, out.c_str());
    } catch (const std::exception& e) {  // ours, and the libraries' (filesystem, JSON)
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

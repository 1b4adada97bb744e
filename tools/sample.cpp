// sample: generates text from a trained checkpoint.
//   sample --run runs/kjv-char-... --prompt "And God said" --tokens 200 --temperature 0.8 --top-k
//   40
// The model shape comes from the config saved in the checkpoint, the tokenizer from tokenizer.json
// beside the run's training shards (or --tokenizer).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "kernels/core/check.h"
#include "kernels/gemm/cpu_blas.h"
#include "model/sample.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/run_dir.h"

int main(int argc, char** argv) {
    zgpt::cpu::ensure_blas_kernel(argv);  // first: it may restart the program
    CLI::App app{"Generate text from a trained checkpoint."};
    zgpt::report_cli_errors(app);
    std::string run_dir, checkpoint, tokenizer_path, prompt, logits_out;
    zgpt::SampleOptions o;
    uint64_t seed = 1337;
    app.add_option("--run", run_dir, "run directory: its newest valid checkpoint is used")
        ->check(CLI::ExistingDirectory);
    app.add_option("--checkpoint", checkpoint, "a checkpoint file instead of --run")
        ->check(CLI::ExistingFile);
    app.add_option("--tokenizer", tokenizer_path, "tokenizer.json (default: beside data.train)");
    app.add_option("-p,--prompt", prompt, "text to continue (default: a newline / <|endoftext|>)");
    app.add_option("-n,--tokens", o.max_new_tokens, "tokens to generate")
        ->check(CLI::Range(1, 1 << 24))
        ->capture_default_str();
    app.add_option("-t,--temperature", o.temperature, "0: greedy")
        ->check(CLI::Range(0.0, 100.0))
        ->capture_default_str();
    app.add_option("-k,--top-k", o.top_k, "sample among the k most likely (0: all; 1: greedy)")
        ->check(CLI::Range(0, 1 << 30))
        ->capture_default_str();
    app.add_option("-s,--seed", seed, "seed of the sampler")->capture_default_str();
    app.add_option("--logits-out", logits_out,
                   "also write the prompt ids and the next-token logits after it as JSON (for "
                   "comparisons with other implementations, e.g. tools/dev/hf_check.py)");
    CLI11_PARSE(app, argc, argv);
    try {
        ZG_CHECK(run_dir.empty() != checkpoint.empty(),
                 "give exactly one of --run or --checkpoint");
        zgpt::RunCheckpoint ckpt = zgpt::load_run_checkpoint(run_dir, checkpoint);
        const zgpt::Config& cfg = ckpt.config;
        zgpt::GPT<float> model(cfg.model);
        model.params = std::move(ckpt.state.params);
        if (tokenizer_path.empty())
            tokenizer_path =
                (std::filesystem::path(cfg.data.train).parent_path() / "tokenizer.json").string();
        const zgpt::Tokenizer tok = zgpt::Tokenizer::load(tokenizer_path);
        ZG_CHECK(tok.vocab_size() == cfg.model.vocab_size,
                 tokenizer_path + ": " + std::to_string(tok.vocab_size()) +
                     " tokens, but the model has vocab_size " +
                     std::to_string(cfg.model.vocab_size) + ": not the model's tokenizer");
        const std::vector<uint32_t> p = prompt.empty() ? tok.default_prompt() : tok.encode(prompt);
        if (!logits_out.empty()) {
            std::vector<int32_t> ids(p.begin(), p.end());
            model.forward(ids.data(), 1, int64_t(ids.size()));
            const float* last = model.logits() + (ids.size() - 1) * model.padded_vocab();
            const nlohmann::json j{
                {"prompt_ids", ids},
                {"logits", std::vector<float>(last, last + cfg.model.vocab_size)}};
            zgpt::write_text_file(logits_out, j.dump() + "\n");  // a failed write is an error
        }
        zgpt::Rng rng(seed);
        o.stop_token = tok.document_separator();
        const std::vector<int32_t> out =
            zgpt::generate(model, std::vector<int32_t>(p.begin(), p.end()), o, rng);
        std::fprintf(stderr, "%s (step %lld), seed %llu:\n", ckpt.path.c_str(),
                     (long long)ckpt.state.step, (unsigned long long)seed);
        std::printf("%s\n", tok.decode(std::vector<uint32_t>(out.begin(), out.end())).c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

// export_hf: a checkpoint -> Hugging Face GPT-2 (model.safetensors + config.json), loadable by
// transformers' GPT2LMHeadModel.from_pretrained(DIR). Only GPT-2-compatible models (tied
// embeddings, biases, no qk_norm), or Llama-style ones that LlamaForCausalLM expresses (rmsnorm,
// rope, swiglu, no qk_norm; docs/llama.md). Start training from such a file with model.init_from.
//   export_hf --run runs/my-run --out exported/my-run
#include <CLI/CLI.hpp>
#include <cstdio>

#include "kernels/core/check.h"
#include "model/hf_gpt2.h"
#include "train/checkpoint.h"
#include "train/cli.h"

int main(int argc, char** argv) {
    CLI::App app{"Export a checkpoint as a Hugging Face GPT-2 model (safetensors + config.json)."};
    zgpt::report_cli_errors(app);
    std::string run_dir, checkpoint, out;
    app.add_option("--run", run_dir, "run directory: its newest valid checkpoint")
        ->check(CLI::ExistingDirectory);
    app.add_option("--checkpoint", checkpoint, "a checkpoint file instead of --run")
        ->check(CLI::ExistingFile);
    app.add_option("-o,--out", out, "output directory")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        zgpt::RunCheckpoint ckpt = zgpt::load_run_checkpoint(run_dir, checkpoint);
        zgpt::GPT<float> model(ckpt.config.model);
        model.params = std::move(ckpt.state.params);
        zgpt::export_hf_gpt2(model, out);
        std::printf("%s (step %lld) -> %s/model.safetensors, %s/config.json\n", ckpt.path.c_str(),
                    (long long)ckpt.state.step, out.c_str(), out.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

// The Llama-style oracles (tools/dev/llama_oracle.py writes llama_tiny*.safetensors into
// $ZGPT_ORACLES, or ../shared/data/oracles): tiny Hugging Face LlamaForCausalLM models in float64
// (RMSNorm, rotary positions, SwiGLU, grouped-query attention). The CPU model, loaded through the
// Hugging Face importer, reproduces its logits, loss and every parameter gradient.
#include <doctest/doctest.h>

#include <filesystem>

#include "data/safetensors.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "tests/helpers.h"
#include "tests/oracle_check.h"

using namespace zgpt;
using namespace zgpt::test;

namespace {

// llama_tiny: Llama's choices (no biases, untied, 2 of 4 heads for keys and values);
// llama_tiny_bias: biases on every projection, tied LM head, one key/value head.
const std::vector<std::string> kCases = {"llama_tiny", "llama_tiny_bias"};
std::string oracle_file(const std::string& name) {
    return oracle_dir() + "/" + name + ".safetensors";
}

const bool kHaveOracle = [] {
    for (const std::string& name : kCases)
        if (!std::filesystem::exists(oracle_file(name)))
            skip_binary(oracle_file(name) +
                        " not found: make it with tools/dev/llama_oracle.py --out " +
                        "DIR (torch and transformers from PyPI) and set ZGPT_ORACLES=DIR");
    return true;
}();

}  // namespace

TEST_CASE("tiny Llamas reproduce llama_tiny*.safetensors: logits, loss and every gradient") {
    for (const std::string& name : kCases) {
        CAPTURE(name);
        const std::string kFile = oracle_file(name);
        const SafeTensors st = SafeTensors::load(kFile);
        const auto cfg = nlohmann::json::parse(st.metadata().at("config").get<std::string>());
        const ModelConfig mc = oracle_model_config(st);
        CrossEntropyOptions o;
        o.z_loss_weight = cfg.at("z_loss_weight");
        o.ignore_index = cfg.at("ignore_index");
        auto run = [&](auto& model, double rtol, double atol_scale) {
            const int tensors = check_model_against_oracle(model, st, kFile, o, rtol, atol_scale);
            int grads = 0;  // every tensor of the oracle is one of ours
            for (const std::string& key : st.names()) grads += key.rfind("grad.", 0) == 0;
            CHECK(tensors == grads);
            CHECK(tensors == 2 + !mc.tie_embeddings + (mc.bias ? 16 : 9) * mc.n_layer);
        };
        // double: the same math as transformers' in float64; what is left is rounding in a
        // different order (about 1e-15 relative per op), far inside 1e-6.
        SUBCASE("double: to 1e-6, and in fact to rounding") {
            GPT<double> m(mc);
            run(m, 1e-6, 1e-9);
        }
        // float: our fp32 training arithmetic; the GPT-2 oracle's bar (about 1e-5 of each tensor's
        // scale).
        SUBCASE("float (the CPU fp32 reference): about 1e-5 relative") {
            GPT<float> m(mc);
            run(m, 1e-5, 1e-5);
        }
    }
}

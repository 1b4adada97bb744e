// The Llama-style oracles (tools/llama_oracle.py writes llama_tiny*.safetensors into
// $ZGPT_ORACLES, or ../shared/data/oracles): tiny Hugging Face LlamaForCausalLM models in float64
// (RMSNorm, rotary positions, SwiGLU, grouped-query attention). The CPU model, loaded through the
// Hugging Face importer, reproduces its logits, loss and every parameter gradient.
#include <doctest/doctest.h>

#include <filesystem>

#include "data/safetensors.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "tests/helpers.h"

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
                        " not found: make it with tools/llama_oracle.py --out " +
                        "DIR (torch and transformers from PyPI) and set ZGPT_ORACLES=DIR");
    return true;
}();

std::vector<int32_t> as_int32(const std::vector<double>& v) {
    return std::vector<int32_t>(v.begin(), v.end());
}

void check_all(const std::string& what, const std::vector<double>& got,
               const std::vector<double>& want, double rtol, double atol) {
    REQUIRE(got.size() == want.size());
    const MaxError e = compare(got.data(), want.data(), int64_t(got.size()), rtol, atol);
    INFO(what << ": max abs err " << e.abs << ", max rel err " << e.rel << " (worst index "
              << e.worst << ")");
    MESSAGE(what << ": max abs err " << e.abs << ", max rel err " << e.rel);
    CHECK(e.ok);
}

double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

ModelConfig llama_oracle_config(const SafeTensors& st) {
    const auto j = nlohmann::json::parse(st.metadata().at("config").get<std::string>());
    ModelConfig c;
    c.n_layer = j.at("n_layer");
    c.n_head = j.at("n_head");
    c.n_kv_head = j.at("n_kv_head");
    c.n_embd = j.at("n_embd");
    c.block_size = j.at("block_size");
    c.vocab_size = j.at("vocab_size");
    c.mlp_hidden = j.at("mlp_hidden");
    c.tie_embeddings = j.at("tie_embeddings");
    c.bias = j.at("bias");
    c.ln_eps = j.at("rms_norm_eps");
    c.rope_theta = j.at("rope_theta");
    c.norm = "rmsnorm";
    c.position = "rope";
    c.mlp = "swiglu";
    return c;
}

}  // namespace

TEST_CASE("tiny Llamas reproduce llama_tiny*.safetensors: logits, loss and every gradient") {
    for (const std::string& name : kCases) {
        CAPTURE(name);
        const std::string kFile = oracle_file(name);
        const SafeTensors st = SafeTensors::load(kFile);
        const auto cfg = nlohmann::json::parse(st.metadata().at("config").get<std::string>());
        const ModelConfig mc = llama_oracle_config(st);
        const std::vector<int64_t> shape = st.info("input_ids").shape;
        const int64_t B = shape[0], T = shape[1], V = mc.vocab_size;
        const std::vector<int32_t> ids = as_int32(st.as_double("input_ids"));
        const std::vector<int32_t> targets = as_int32(st.as_double("targets"));
        CrossEntropyOptions o;
        o.z_loss_weight = cfg.at("z_loss_weight");
        o.ignore_index = cfg.at("ignore_index");

        auto run = [&](auto& model, double rtol, double atol_scale) {
            import_hf_gpt2(model, kFile, "param.");
            model.zero_grad();
            model.forward(ids.data(), B, T);
            std::vector<double> logits(B * T * V);
            for (int64_t i = 0; i < B * T; i++)
                for (int64_t j = 0; j < V; j++)
                    logits[i * V + j] = model.logits()[i * model.padded_vocab() + j];
            const std::vector<double> want_logits = st.as_double("logits");
            check_all("logits", logits, want_logits, rtol, atol_scale * max_abs(want_logits));
            const double one = 1.0;
            const CrossEntropySummary s = model.loss(targets.data(), o, {&one, false}, true);
            model.backward();
            const double n = double(s.n_valid);
            check_all("loss", {s.loss}, st.as_double("loss"), rtol, 0);
            check_all("ce", {s.sum_ce / n}, st.as_double("ce"), rtol, 0);
            check_all("z_loss", {s.sum_z_loss / n}, st.as_double("z_loss"), rtol, 0);
            int tensors = 0;
            for (const ParamSpec& s2 : model.layout().table.specs()) {
                CAPTURE(s2.name);
                const std::vector<double> want = st.as_double("grad." + s2.name);
                const auto g = to_hf_layout(s2, model.grads.data() + s2.offset, V);
                check_all("grad " + s2.name, std::vector<double>(g.begin(), g.end()), want, rtol,
                          atol_scale * max_abs(want));
                tensors++;
            }
            int grads = 0;  // every tensor of the oracle is one of ours
            for (const std::string& key : st.names()) grads += key.rfind("grad.", 0) == 0;
            CHECK(tensors == grads);
            CHECK(tensors == 2 + !mc.tie_embeddings + (mc.bias ? 16 : 9) * mc.n_layer);
        };
        // double: the same math as transformers' in float64; what is left is rounding in a
        // different order (about 1e-15 relative per op), far inside 1e-6.
        SUBCASE("double: to 1e-6 (the issue's bar), and in fact to rounding") {
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

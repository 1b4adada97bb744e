// Hugging Face GPT-2 export / import: exact round trip, a valid safetensors header in HF's layout,
// refusals for incompatible options; checked with Python's safetensors where it is installed.
// (The import is also what the gpt2_tiny oracle test uses to load Hugging Face's own weights.)
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/safetensors.h"
#include "kernels/core/check.h"
#include "model/hf_gpt2.h"
#include "tests/helpers.h"

using namespace zgpt;
namespace fs = std::filesystem;

namespace {
ModelConfig gpt2_like() {
    ModelConfig c;
    c.n_layer = 2;
    c.n_head = 3;
    c.n_embd = 24;
    c.block_size = 16;
    c.vocab_size = 101;  // padded to 128 inside, 101 rows in the export
    return c;
}
}  // namespace

TEST_CASE("export then import gives identical weights; the file is HF-shaped safetensors") {
    GPT<float> m(gpt2_like());
    m.init_weights(7);
    Rng rng(3);  // make biases and LayerNorm parameters non-trivial too
    for (float& p : m.params) p += float(0.01 * rng.normal());
    for (int64_t i = 101 * 24; i < 128 * 24; i++) m.param(m.layout().wte)[i] = 0.0f;  // padding
    const fs::path dir = fs::temp_directory_path() / "zgpt_hf_export";
    fs::remove_all(dir);
    export_hf_gpt2(m, dir.string());
    GPT<float> back(gpt2_like());
    import_hf_gpt2(back, (dir / "model.safetensors").string());
    CHECK(back.params == m.params);  // bit for bit

    const SafeTensors st = SafeTensors::load((dir / "model.safetensors").string());
    CHECK(st.names().size() == m.layout().table.specs().size());
    CHECK(st.info("transformer.wte.weight").shape == std::vector<int64_t>{101, 24});
    CHECK(st.info("transformer.h.1.attn.c_attn.weight").shape == std::vector<int64_t>{24, 72});
    CHECK(st.info("transformer.h.0.mlp.c_proj.weight").shape == std::vector<int64_t>{96, 24});
    CHECK(st.info("transformer.h.0.mlp.c_fc.weight").dtype == "F32");
    CHECK(st.metadata()["format"] == "pt");
    const auto cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    CHECK(cfg["model_type"] == "gpt2");
    CHECK(cfg["n_positions"] == 16);
    CHECK(cfg["activation_function"] == "gelu_new");
    const ModelConfig rc = read_hf_config((dir / "config.json").string());
    CHECK(rc.vocab_size == 101);
    CHECK(rc.n_head == 3);

    // Python's safetensors, where installed, reads the same names, shapes and values
    const std::string py =
        "python3 -c \"import sys; from safetensors.numpy import load_file; "
        "t = load_file(sys.argv[1]); w = t['transformer.h.1.attn.c_attn.weight']; "
        "assert w.shape == (24, 72) and len(t) == " +
        std::to_string(st.names().size()) + "; print(repr(float(w[5, 40])))\" " +
        (dir / "model.safetensors").string() + " 2>/dev/null";
    if (std::system("python3 -c 'import safetensors.numpy' 2>/dev/null") != 0) {
        MESSAGE("Python's safetensors is not installed here: the cross-check with it is skipped");
    } else {
        FILE* p = popen(py.c_str(), "r");
        char buf[128] = {};
        const bool ok = p && fgets(buf, sizeof buf, p);
        const int rc2 = p ? pclose(p) : -1;
        REQUIRE(ok);
        CHECK(rc2 == 0);
        // c_attn.weight[5, 40] is our qkv weight [40, 5]
        CHECK(std::stod(buf) == double(m.param(m.layout().blocks[1].qkv_w)[40 * 24 + 5]));
    }
}

TEST_CASE("export refuses models Hugging Face GPT-2 cannot express; import checks shapes") {
    for (int which = 0; which < 3; which++) {
        ModelConfig c = gpt2_like();
        if (which == 0) c.tie_embeddings = false;
        if (which == 1) c.bias = false;
        if (which == 2) c.qk_norm = true;
        GPT<float> m(c);
        CHECK_THROWS_AS(export_hf_gpt2(m, (fs::temp_directory_path() / "zgpt_hf_bad").string()),
                        Error);
    }
    GPT<float> m(gpt2_like());
    m.init_weights(1);
    const fs::path dir = fs::temp_directory_path() / "zgpt_hf_shape";
    export_hf_gpt2(m, dir.string());
    ModelConfig other = gpt2_like();
    other.block_size = 32;
    GPT<float> o(other);
    CHECK_THROWS_WITH_AS(import_hf_gpt2(o, (dir / "model.safetensors").string()),
                         doctest::Contains("transformer.wpe.weight has another shape"), Error);
}

TEST_CASE("Llama-style export then import: identical weights, LlamaForCausalLM's config") {
    ModelConfig c = gpt2_like();
    c.n_head = 4;
    c.n_kv_head = 2;
    c.norm = "rmsnorm";
    c.position = "rope";
    c.mlp = "swiglu";
    c.rope_theta = 500000;
    c.mlp_multiple_of = 16;  // 2/3 of 96 = 64
    c.tie_embeddings = false;
    c.bias = false;
    GPT<float> m(c);
    m.init_weights(5);
    const fs::path dir = fs::temp_directory_path() / "zgpt_hf_llama";
    fs::remove_all(dir);
    export_hf_gpt2(m, dir.string());
    const SafeTensors st = SafeTensors::load((dir / "model.safetensors").string());
    CHECK(st.names().size() == m.layout().table.specs().size());
    CHECK(st.info("model.embed_tokens.weight").shape == std::vector<int64_t>{101, 24});
    CHECK(st.info("lm_head.weight").shape == std::vector<int64_t>{101, 24});
    CHECK(st.info("model.layers.1.self_attn.k_proj.weight").shape == std::vector<int64_t>{12, 24});
    CHECK(st.info("model.layers.0.mlp.down_proj.weight").shape == std::vector<int64_t>{24, 64});
    const auto cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    CHECK(cfg["model_type"] == "llama");
    CHECK(cfg["num_key_value_heads"] == 2);
    CHECK(cfg["intermediate_size"] == 64);
    const ModelConfig rc = read_hf_config((dir / "config.json").string());
    CHECK(rc.n_kv_head == 2);
    CHECK(rc.mlp_hidden == 64);
    CHECK(rc.rope_theta == 500000);
    CHECK(llama_style(rc));
    GPT<float> back(rc);
    import_hf_gpt2(back, (dir / "model.safetensors").string());
    CHECK(back.params == m.params);  // bit for bit, padded vocabulary rows zero in both
    // a Llama-style model Hugging Face Llama cannot express is refused, naming the option
    c.qk_norm = true;
    GPT<float> q(c);
    CHECK_THROWS_WITH_AS(export_hf_gpt2(q, dir.string()), doctest::Contains("qk_norm"), Error);
    c.qk_norm = false;
    c.position = "learned";
    GPT<float> l(c);
    CHECK_THROWS_WITH_AS(export_hf_gpt2(l, dir.string()), doctest::Contains("model.position"),
                         Error);
}

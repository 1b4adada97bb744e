#include "model/hf_gpt2.h"

#include <cmath>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/file_read.h"
#include "data/safetensors.h"
#include "kernels/core/check.h"

namespace zgpt {

namespace {

bool is_conv1d(const std::string& name) {
    for (const char* s :
         {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
        if (name.size() > std::string(s).size() &&
            name.rfind(s) == name.size() - std::string(s).size())
            return true;
    return false;
}

}  // namespace

std::vector<int64_t> hf_shape(const ParamSpec& s, int64_t vocab) {
    if (is_conv1d(s.name)) return {s.shape[1], s.shape[0]};
    if (s.name == "transformer.wte.weight" || s.name == "model.embed_tokens.weight" ||
        s.name == "lm_head.weight")
        return {vocab, s.shape[1]};
    return s.shape;
}

template <typename T>
std::vector<T> to_hf_layout(const ParamSpec& s, const T* p, int64_t vocab) {
    int64_t n = 1;
    for (int64_t d : hf_shape(s, vocab)) n *= d;
    std::vector<T> t(static_cast<size_t>(n));
    if (is_conv1d(s.name)) {
        for (int64_t o = 0; o < s.shape[0]; o++)
            for (int64_t i = 0; i < s.shape[1]; i++) t[i * s.shape[0] + o] = p[o * s.shape[1] + i];
    } else {
        std::copy(p, p + n, t.begin());  // wte: its first vocab_size rows
    }
    return t;
}

void check_hf_llama_compatible(const ModelConfig& c) {
    ZG_CHECK(c.norm == "rmsnorm", "Hugging Face Llama needs model.norm: rmsnorm");
    ZG_CHECK(c.position == "rope", "Hugging Face Llama needs model.position: rope");
    ZG_CHECK(c.mlp == "swiglu", "Hugging Face Llama needs model.mlp: swiglu");
    ZG_CHECK(!c.qk_norm, "Hugging Face Llama has no qk_norm (model.qk_norm must be false)");
}

void check_hf_compatible(const ModelConfig& c) {
    if (llama_style(c)) return check_hf_llama_compatible(c);
    ZG_CHECK(c.tie_embeddings, "Hugging Face GPT-2 export needs model.tie_embeddings: true");
    ZG_CHECK(c.bias, "Hugging Face GPT-2 export needs model.bias: true");
    ZG_CHECK(!c.qk_norm, "Hugging Face GPT-2 has no qk_norm (model.qk_norm must be false)");
}

void export_hf_gpt2(GPT<float>& model, const std::string& dir) {
    const ModelConfig& c = model.config();
    check_hf_compatible(c);
    std::vector<std::vector<float>> storage;
    std::vector<TensorToWrite> tensors;
    for (const ParamSpec& s : model.layout().table.specs()) {
        storage.push_back(to_hf_layout(s, model.params.data() + s.offset, int64_t(c.vocab_size)));
        tensors.push_back({s.name, hf_shape(s, c.vocab_size), storage.back().data()});
    }
    std::filesystem::create_directories(dir);
    write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
    if (llama_style(c)) {
        const nlohmann::json cfg{{"architectures", {"LlamaForCausalLM"}},
                                 {"model_type", "llama"},
                                 {"vocab_size", c.vocab_size},
                                 {"max_position_embeddings", c.block_size},
                                 {"hidden_size", c.n_embd},
                                 {"intermediate_size", mlp_hidden_size(c)},
                                 {"num_hidden_layers", c.n_layer},
                                 {"num_attention_heads", c.n_head},
                                 {"num_key_value_heads", kv_heads(c)},
                                 {"hidden_act", "silu"},
                                 {"rms_norm_eps", c.ln_eps},
                                 {"rope_theta", c.rope_theta},
                                 {"attention_bias", c.bias},
                                 {"mlp_bias", c.bias},
                                 {"initializer_range", c.init_std},
                                 {"tie_word_embeddings", c.tie_embeddings},
                                 {"torch_dtype", "float32"}};
        std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
        return;
    }
    const nlohmann::json cfg{
        {"architectures", {"GPT2LMHeadModel"}},
        {"model_type", "gpt2"},
        {"vocab_size", c.vocab_size},
        {"n_positions", c.block_size},
        {"n_ctx", c.block_size},
        {"n_embd", c.n_embd},
        {"n_layer", c.n_layer},
        {"n_head", c.n_head},
        {"n_inner", nullptr},
        {"activation_function", "gelu_new"},
        {"layer_norm_epsilon", c.ln_eps},
        {"initializer_range", c.init_std},
        {"resid_pdrop", 0.0},
        {"embd_pdrop", 0.0},
        {"attn_pdrop", 0.0},
        {"tie_word_embeddings", true},
        // <|endoftext|> only exists in a GPT-2 vocabulary
        {"bos_token_id", c.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json()},
        {"eos_token_id", c.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json()},
        {"torch_dtype", "float32"}};
    std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
}

template <typename T>
void import_hf_gpt2(GPT<T>& model, const std::string& path, const std::string& prefix) {
    const ModelConfig& c = model.config();
    check_hf_compatible(c);
    // Larger than the model's weights in float64 with a generous header and extras (a sparse
    // file) is not read whole to find that out.
    const uint64_t most =
        8 + (uint64_t(1) << 27) + 8 * uint64_t(model.layout().table.total()) + (uint64_t(1) << 30);
    const SafeTensors st = SafeTensors::load(path, most);
    for (const ParamSpec& s : model.layout().table.specs()) {
        const std::string key = prefix + s.name;
        ZG_CHECK(st.has(key), path + ": no tensor " + key);
        const std::vector<int64_t> want = hf_shape(s, c.vocab_size);
        ZG_CHECK(st.info(key).shape == want,
                 path + ": " + key + " has another shape than the model's");
        const std::vector<double> w = st.as_double(key);
        for (size_t i = 0; i < w.size(); i++)
            ZG_CHECK(std::isfinite(w[i]), path + ": " + key + " element " + std::to_string(i) +
                                              " is not finite (" + std::to_string(w[i]) + ")");
        T* p = model.params.data() + s.offset;
        std::fill(p, p + s.numel, T(0));  // wte's padded rows stay zero
        if (is_conv1d(s.name)) {
            for (int64_t i = 0; i < want[0]; i++)
                for (int64_t o = 0; o < want[1]; o++) p[o * want[0] + i] = T(w[i * want[1] + o]);
        } else {
            for (size_t i = 0; i < w.size(); i++) p[i] = T(w[i]);
        }
    }
}

ModelConfig read_hf_config(const std::string& path) {
    const nlohmann::json j = nlohmann::json::parse(read_regular_file(path, "config.json"));
    ModelConfig c;
    if (j.value("model_type", "") == "llama") {
        c.vocab_size = j.at("vocab_size");
        c.block_size = j.at("max_position_embeddings");
        c.n_embd = j.at("hidden_size");
        c.mlp_hidden = j.at("intermediate_size");
        c.n_layer = j.at("num_hidden_layers");
        c.n_head = j.at("num_attention_heads");
        c.n_kv_head = j.value("num_key_value_heads", c.n_head);
        c.ln_eps = j.value("rms_norm_eps", 1e-6);
        c.rope_theta = j.value("rope_theta", 10000.0);
        c.bias = j.value("attention_bias", false);
        ZG_CHECK(c.bias == j.value("mlp_bias", false),
                 path + ": attention_bias and mlp_bias differ (model.bias sets both)");
        c.tie_embeddings = j.value("tie_word_embeddings", false);
        c.norm = "rmsnorm";
        c.position = "rope";
        c.mlp = "swiglu";
        return c;
    }
    c.vocab_size = j.at("vocab_size");
    c.block_size = j.at("n_positions");
    c.n_embd = j.at("n_embd");
    c.n_layer = j.at("n_layer");
    c.n_head = j.at("n_head");
    c.ln_eps = j.value("layer_norm_epsilon", 1e-5);
    c.tie_embeddings = j.value("tie_word_embeddings", true);
    return c;
}

template std::vector<float> to_hf_layout<float>(const ParamSpec&, const float*, int64_t);
template std::vector<double> to_hf_layout<double>(const ParamSpec&, const double*, int64_t);
template void import_hf_gpt2<float>(GPT<float>&, const std::string&, const std::string&);
template void import_hf_gpt2<double>(GPT<double>&, const std::string&, const std::string&);

}  // namespace zgpt

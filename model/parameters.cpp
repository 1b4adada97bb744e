#include "model/parameters.h"

#include <cmath>

#include "kernels/core/check.h"

namespace zgpt {

int64_t padded_vocab_size(int64_t v) {
    return (v + 127) / 128 * 128;
}

cuda::LinearCrossEntropyTuning linear_ce_tuning(const KernelChoice& k) {
    cuda::LinearCrossEntropyTuning t;
    t.vocab_chunk = k.linear_ce_vocab_chunk;
    t.row_block = k.linear_ce_row_block;
    t.chunk_mb = k.linear_ce_chunk_mb;
    t.rows_outer = k.linear_ce_rows_outer;
    t.wgmma_epilogue = variant_traits("cross_entropy", k.cross_entropy).ce_in_gemm_epilogue;
    t.wgmma_cluster = k.linear_ce_wgmma_cluster;
    t.filter_eps = float(k.linear_ce_filter_eps);
    return t;
}

cuda::LinearCrossEntropyTuning model_linear_ce_tuning(const KernelChoice& k) {
    cuda::LinearCrossEntropyTuning t = linear_ce_tuning(k);
    if (is_whole_rows_linear_cross_entropy(k.cross_entropy)) {
        // its own default (8192 rows) is the trainer's; the model passes dweight_acc
        t.fp32_dweight_only = true;
    } else {
        if (t.row_block == 0) t.row_block = kModelLinearCeRowBlock;
        if (t.chunk_mb == 0) t.chunk_mb = kModelLinearCeChunkMb;
    }
    t.gemm_search = k.matmul_search;  // the head's cuBLASLt products, as the layers' GEMMs
    return t;
}

int kv_heads(const ModelConfig& c) {
    return c.n_kv_head == 0 ? c.n_head : c.n_kv_head;
}

int64_t mlp_hidden_size(const ModelConfig& c) {
    if (c.mlp_hidden > 0) return c.mlp_hidden;
    if (c.mlp != "swiglu") return 4 * int64_t(c.n_embd);
    const int64_t h = 2 * 4 * int64_t(c.n_embd) / 3, m = c.mlp_multiple_of;
    return (h + m - 1) / m * m;
}

bool llama_style(const ModelConfig& c) {
    return c.norm != "layernorm" || c.position != "learned" || c.mlp != "gelu" ||
           kv_heads(c) != c.n_head || c.mlp_hidden != 0;
}

void validate(const ModelConfig& c) {
    ZG_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0,
             "model sizes must be positive");
    ZG_CHECK(c.vocab_size > 0, "model.vocab_size must be set (> 0)");
    ZG_CHECK(c.n_embd % c.n_head == 0, "model.n_embd (" + std::to_string(c.n_embd) +
                                           ") must be divisible by model.n_head (" +
                                           std::to_string(c.n_head) + ")");
    ZG_CHECK(c.norm == "layernorm" || c.norm == "rmsnorm",
             "model.norm: '" + c.norm + "' is not one of: layernorm, rmsnorm");
    ZG_CHECK(c.position == "learned" || c.position == "rope",
             "model.position: '" + c.position + "' is not one of: learned, rope");
    ZG_CHECK(c.mlp == "gelu" || c.mlp == "swiglu",
             "model.mlp: '" + c.mlp + "' is not one of: gelu, swiglu");
    ZG_CHECK(c.n_kv_head >= 0 && c.n_kv_head <= c.n_head && c.n_head % kv_heads(c) == 0,
             "model.n_kv_head (" + std::to_string(c.n_kv_head) + ") must divide model.n_head (" +
                 std::to_string(c.n_head) + "); 0: n_head");
    ZG_CHECK(c.position != "rope" || (c.n_embd / c.n_head) % 2 == 0,
             "model.position: rope rotates pairs of channels: the head size model.n_embd / "
             "model.n_head (" +
                 std::to_string(c.n_embd / c.n_head) + ") must be even");
    ZG_CHECK(c.position != "rope" || (std::isfinite(c.rope_theta) && c.rope_theta > 1),
             "model.rope_theta must be finite and > 1");
    ZG_CHECK(c.mlp_hidden >= 0, "model.mlp_hidden must be >= 0 (0: derived)");
    ZG_CHECK(c.mlp_multiple_of >= 1, "model.mlp_multiple_of must be >= 1");
}

int ParameterTable::add(const std::string& name, std::vector<int64_t> shape, Init init) {
    ParamSpec s;
    s.name = name;
    s.numel = 1;
    for (int64_t d : shape) s.numel *= d;
    s.shape = std::move(shape);
    s.offset = total_;
    s.init = init;
    s.decay = s.shape.size() >= 2;
    total_ += s.numel;
    specs_.push_back(std::move(s));
    return int(specs_.size()) - 1;
}

int ParameterTable::find(const std::string& name) const {
    for (size_t i = 0; i < specs_.size(); i++)
        if (specs_[i].name == name) return int(i);
    return -1;
}

int64_t vocab_table_rows(const ModelConfig& c, int vocab_parts) {
    ZG_CHECK(vocab_parts >= 1 && vocab_parts <= c.vocab_size,
             "the vocabulary cannot be split in " + std::to_string(vocab_parts) + " parts");
    if (vocab_parts == 1) return padded_vocab_size(c.vocab_size);
    // A shard's GEMMs take its V_local rows, never the padding: 8 rows keep the next tensor's
    // offset a multiple of 8 elements.
    return ((int64_t(c.vocab_size) + vocab_parts - 1) / vocab_parts + 7) / 8 * 8;
}

namespace {

// Hugging Face Llama's names (LlamaForCausalLM; q_norm / k_norm as Qwen3's, embed_positions for
// learned positions, up_proj alone for a GELU MLP). q, k and v follow each other, and gate and
// up, so that each group is one matrix (BlockParams).
GptLayout make_llama_layout(const ModelConfig& c, int vocab_parts) {
    GptLayout g;
    ParameterTable& t = g.table;
    const int64_t C = c.n_embd, Vp = vocab_table_rows(c, vocab_parts), hs = C / c.n_head;
    const int64_t KVC = kv_heads(c) * hs, H = mlp_hidden_size(c);
    const bool ln_bias = c.bias && c.norm == "layernorm";
    g.wte = t.add("model.embed_tokens.weight", {Vp, C}, Init::normal);
    if (c.position == "learned")
        g.wpe = t.add("model.embed_positions.weight", {c.block_size, C}, Init::normal);
    auto follows = [&](int a, int b) {
        ZG_CHECK(t[a].offset + t[a].numel == t[b].offset,
                 "parameter table: " + t[b].name + " must follow " + t[a].name);
    };
    for (int l = 0; l < c.n_layer; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        BlockParams b;
        b.ln1_w = t.add(p + "input_layernorm.weight", {C}, Init::ones);
        if (ln_bias) b.ln1_b = t.add(p + "input_layernorm.bias", {C}, Init::zeros);
        b.qkv_w = t.add(p + "self_attn.q_proj.weight", {C, C}, Init::normal);
        b.k_w = t.add(p + "self_attn.k_proj.weight", {KVC, C}, Init::normal);
        b.v_w = t.add(p + "self_attn.v_proj.weight", {KVC, C}, Init::normal);
        follows(b.qkv_w, b.k_w);
        follows(b.k_w, b.v_w);
        if (c.bias) {
            b.qkv_b = t.add(p + "self_attn.q_proj.bias", {C}, Init::zeros);
            b.k_b = t.add(p + "self_attn.k_proj.bias", {KVC}, Init::zeros);
            b.v_b = t.add(p + "self_attn.v_proj.bias", {KVC}, Init::zeros);
            follows(b.qkv_b, b.k_b);
            follows(b.k_b, b.v_b);
        }
        if (c.qk_norm) {
            b.q_norm_w = t.add(p + "self_attn.q_norm.weight", {hs}, Init::ones);
            if (ln_bias) b.q_norm_b = t.add(p + "self_attn.q_norm.bias", {hs}, Init::zeros);
            b.k_norm_w = t.add(p + "self_attn.k_norm.weight", {hs}, Init::ones);
            if (ln_bias) b.k_norm_b = t.add(p + "self_attn.k_norm.bias", {hs}, Init::zeros);
        }
        b.proj_w = t.add(p + "self_attn.o_proj.weight", {C, C}, Init::residual_normal);
        if (c.bias) b.proj_b = t.add(p + "self_attn.o_proj.bias", {C}, Init::zeros);
        b.ln2_w = t.add(p + "post_attention_layernorm.weight", {C}, Init::ones);
        if (ln_bias) b.ln2_b = t.add(p + "post_attention_layernorm.bias", {C}, Init::zeros);
        if (c.mlp == "swiglu") {
            b.fc_w = t.add(p + "mlp.gate_proj.weight", {H, C}, Init::normal);
            b.up_w = t.add(p + "mlp.up_proj.weight", {H, C}, Init::normal);
            follows(b.fc_w, b.up_w);
            if (c.bias) {
                b.fc_b = t.add(p + "mlp.gate_proj.bias", {H}, Init::zeros);
                b.up_b = t.add(p + "mlp.up_proj.bias", {H}, Init::zeros);
                follows(b.fc_b, b.up_b);
            }
        } else {
            b.fc_w = t.add(p + "mlp.up_proj.weight", {H, C}, Init::normal);
            if (c.bias) b.fc_b = t.add(p + "mlp.up_proj.bias", {H}, Init::zeros);
        }
        b.fcproj_w = t.add(p + "mlp.down_proj.weight", {C, H}, Init::residual_normal);
        if (c.bias) b.fcproj_b = t.add(p + "mlp.down_proj.bias", {C}, Init::zeros);
        g.blocks.push_back(b);
    }
    g.lnf_w = t.add("model.norm.weight", {C}, Init::ones);
    if (ln_bias) g.lnf_b = t.add("model.norm.bias", {C}, Init::zeros);
    g.lm_head = c.tie_embeddings ? g.wte : t.add("lm_head.weight", {Vp, C}, Init::normal);
    return g;
}

}  // namespace

GptLayout make_gpt_layout(const ModelConfig& c, int vocab_parts) {
    validate(c);
    if (llama_style(c)) return make_llama_layout(c, vocab_parts);
    GptLayout g;
    ParameterTable& t = g.table;
    const int64_t C = c.n_embd, Vp = vocab_table_rows(c, vocab_parts), hs = C / c.n_head;
    g.wte = t.add("transformer.wte.weight", {Vp, C}, Init::normal);
    g.wpe = t.add("transformer.wpe.weight", {c.block_size, C}, Init::normal);
    for (int l = 0; l < c.n_layer; l++) {
        const std::string p = "transformer.h." + std::to_string(l) + ".";
        BlockParams b;
        b.ln1_w = t.add(p + "ln_1.weight", {C}, Init::ones);
        if (c.bias) b.ln1_b = t.add(p + "ln_1.bias", {C}, Init::zeros);
        b.qkv_w = t.add(p + "attn.c_attn.weight", {3 * C, C}, Init::normal);
        if (c.bias) b.qkv_b = t.add(p + "attn.c_attn.bias", {3 * C}, Init::zeros);
        if (c.qk_norm) {
            b.q_norm_w = t.add(p + "attn.q_norm.weight", {hs}, Init::ones);
            if (c.bias) b.q_norm_b = t.add(p + "attn.q_norm.bias", {hs}, Init::zeros);
            b.k_norm_w = t.add(p + "attn.k_norm.weight", {hs}, Init::ones);
            if (c.bias) b.k_norm_b = t.add(p + "attn.k_norm.bias", {hs}, Init::zeros);
        }
        b.proj_w = t.add(p + "attn.c_proj.weight", {C, C}, Init::residual_normal);
        if (c.bias) b.proj_b = t.add(p + "attn.c_proj.bias", {C}, Init::zeros);
        b.ln2_w = t.add(p + "ln_2.weight", {C}, Init::ones);
        if (c.bias) b.ln2_b = t.add(p + "ln_2.bias", {C}, Init::zeros);
        b.fc_w = t.add(p + "mlp.c_fc.weight", {4 * C, C}, Init::normal);
        if (c.bias) b.fc_b = t.add(p + "mlp.c_fc.bias", {4 * C}, Init::zeros);
        b.fcproj_w = t.add(p + "mlp.c_proj.weight", {C, 4 * C}, Init::residual_normal);
        if (c.bias) b.fcproj_b = t.add(p + "mlp.c_proj.bias", {C}, Init::zeros);
        g.blocks.push_back(b);
    }
    g.lnf_w = t.add("transformer.ln_f.weight", {C}, Init::ones);
    if (c.bias) g.lnf_b = t.add("transformer.ln_f.bias", {C}, Init::zeros);
    g.lm_head = c.tie_embeddings ? g.wte : t.add("lm_head.weight", {Vp, C}, Init::normal);
    return g;
}

double training_flops_per_token(const ModelConfig& c, int64_t Tn) {
    const GptLayout l = make_gpt_layout(c);
    const double n = double(l.table.total()) - (l.wpe < 0 ? 0.0 : double(l.table[l.wpe].numel));
    return 6.0 * n + 12.0 * c.n_layer * double(c.n_embd) * double(Tn);
}

}  // namespace zgpt

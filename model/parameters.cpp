#include "model/parameters.h"

#include <cmath>

#include "kernels/check.h"

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

void validate(const ModelConfig& c) {
    ZG_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0,
             "model sizes must be positive");
    ZG_CHECK(c.vocab_size > 0, "model.vocab_size must be set (> 0)");
    ZG_CHECK(c.n_embd % c.n_head == 0, "model.n_embd (" + std::to_string(c.n_embd) +
                                           ") must be divisible by model.n_head (" +
                                           std::to_string(c.n_head) + ")");
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

GptLayout make_gpt_layout(const ModelConfig& c, int vocab_parts) {
    validate(c);
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
    const double n = double(l.table.total()) - double(l.table[l.wpe].numel);
    return 6.0 * n + 12.0 * c.n_layer * double(c.n_embd) * double(Tn);
}

}  // namespace zgpt

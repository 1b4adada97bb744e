// The parameter table: one description of every tensor. It yields the arena size, each tensor's
// offset and shape, its name (Hugging Face GPT-2 names; our matrices are [out, in]), its
// initialisation and whether weight decay applies. Checkpoints, export and the optimizer all walk
// this one table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt_config.h"

namespace zgpt {

enum class Init { normal, residual_normal, zeros, ones };

struct ParamSpec {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0;
    int64_t numel = 0;
    Init init = Init::zeros;
    bool decay = false;  // weight decay on matrices only
};

class ParameterTable {
  public:
    int add(const std::string& name, std::vector<int64_t> shape, Init init);
    const std::vector<ParamSpec>& specs() const { return specs_; }
    const ParamSpec& operator[](int i) const { return specs_.at(i); }
    int find(const std::string& name) const;  // -1 when absent
    int64_t total() const { return total_; }

  private:
    std::vector<ParamSpec> specs_;
    int64_t total_ = 0;
};

// Indices into the table of one transformer block's tensors; -1 where the config has none.
// Llama-style tables (llama_style) hold q, k and v as three tensors, one after another, so
// qkv_w (q_proj) starts the [C + 2 KVC, C] matrix of all three (qkv_b likewise), and SwiGLU's
// gate and up the same way: fc_w (gate_proj) starts the [2 H, C] matrix of both.
struct BlockParams {
    int ln1_w = -1, ln1_b = -1;
    int qkv_w = -1, qkv_b = -1;
    int k_w = -1, v_w = -1, k_b = -1, v_b = -1;  // Llama-style tables only
    int up_w = -1, up_b = -1;                    // swiglu only (up_proj; fc_w is gate_proj)
    int q_norm_w = -1, q_norm_b = -1, k_norm_w = -1, k_norm_b = -1;
    int proj_w = -1, proj_b = -1;
    int ln2_w = -1, ln2_b = -1;
    int fc_w = -1, fc_b = -1;
    int fcproj_w = -1, fcproj_b = -1;
};

struct GptLayout {
    ParameterTable table;
    int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1;
    int lm_head = -1;  // == wte when embeddings are tied
    std::vector<BlockParams> blocks;
};

// The rows of a vocabulary table (wte; lm_head when untied). One part: the vocabulary padded to
// a multiple of 128. Split by rows over `vocab_parts` vocab-parallel ranks: each rank's table
// holds its shard (train/vocab_parallel/vocab_parallel_head.h says which rows) in the rows of the
// largest shard rounded up to a multiple of 8, so that every rank of the group has the same arena
// layout.
int64_t vocab_table_rows(const ModelConfig& c, int vocab_parts = 1);

GptLayout make_gpt_layout(const ModelConfig& c, int vocab_parts = 1);

// Model FLOPs per token of one training step (forward + backward) at sequence length Tn, as
// nanoGPT and llm.c count them for MFU: 6 N (N without the position table) + 12 L C Tn (the
// attention's scores and P V: q has n_head heads of C / n_head under grouped-query attention too).
double training_flops_per_token(const ModelConfig& c, int64_t Tn);

}  // namespace zgpt

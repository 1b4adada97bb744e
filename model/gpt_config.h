// Shape and options of a GPT model.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/core/check.h"
#include "kernels/core/registry.h"
#include "kernels/loss_head/cross_entropy.h"

namespace zgpt {

struct ModelConfig {
    int n_layer = 12;
    int n_head = 12;
    int n_embd = 768;
    int block_size = 1024;  // maximum context
    int vocab_size = 0;     // 0: taken from the data's tokenizer.json
    bool tie_embeddings = true;
    bool bias = true;      // biases in linear layers and LayerNorms
    bool qk_norm = false;  // model.norm on each head's q and k
    double init_std = 0.02;
    // Each initial weight times (1 + init_jitter x a normal draw of seed init_jitter_seed):
    // another, equally valid start on the same batches, to measure how far two runs spread (0:
    // none)
    double init_jitter = 0;
    int init_jitter_seed = 1;
    double ln_eps = 1e-5;   // epsilon of every norm (LayerNorm or RMSNorm)
    std::string init_from;  // a Hugging Face GPT-2 or Llama model.safetensors; "": random init
    // Llama-style options (docs/llama.md); the defaults are GPT-2's block.
    std::string norm = "layernorm";    // layernorm | rmsnorm (RMSNorm has a weight and no bias)
    std::string position = "learned";  // learned (wpe) | rope (rotary, on q and k)
    double rope_theta = 10000.0;       // rope: the base of the rotation frequencies
    std::string mlp = "gelu";          // gelu: fc, GELU, proj | swiglu: down(silu(gate) * up)
    int mlp_hidden = 0;                // hidden width; 0: 4 C (gelu), Llama's rule (swiglu)
    int mlp_multiple_of = 256;         // swiglu, mlp_hidden 0: 2/3 of 4 C rounded up to this
    int n_kv_head = 0;                 // key/value heads (grouped-query attention); 0: n_head
};

// The key/value heads (n_kv_head, or n_head when 0).
int kv_heads(const ModelConfig& c);
// The MLP's hidden width: mlp_hidden, else 4 C (gelu) or 2/3 of 4 C rounded up to a multiple of
// mlp_multiple_of (swiglu, as Llama).
int64_t mlp_hidden_size(const ModelConfig& c);
// True when any Llama-style option is away from GPT-2's default: the parameter table then takes
// Hugging Face Llama's names (model/parameters.cpp).
bool llama_style(const ModelConfig& c);

// The kernel variant chosen for each op family on the GPU (the config's `kernels:` section; the
// CPU backend has one reference implementation of each and records the choice only).
struct KernelChoice {
    // a variant name of each family of kernels/core/registry.h, its default there
    std::string attention = kernel_family("attention").default_variant;
    std::string cross_entropy = kernel_family("cross_entropy").default_variant;
    std::string layernorm = kernel_family("layernorm").default_variant;
    std::string matmul = kernel_family("matmul").default_variant;
    // fused_linear's schedule (LinearCrossEntropyArgs in kernels/loss_head/cross_entropy.h); 0: its
    // default
    int linear_ce_row_block = 0;        // rows per tile; 0: 8192
    int linear_ce_vocab_chunk = 0;      // vocabulary columns per tile; 0: a 48 MB tile of logits
    bool linear_ce_rows_outer = false;  // each row block's whole head before the next block
    int linear_ce_chunk_mb = 0;         // MB of bf16 logits per tile (vocab_chunk 0); 0: 48
    int linear_ce_wgmma_cluster = 0;    // fused_linear_wgmma: CTAs per cluster, 1 or 2; 0: 1
    // fused_linear_rows_filtered: the filter's threshold (LinearCrossEntropyTuning::filter_eps)
    double linear_ce_filter_eps = 0x1p-12;
    // cuBLASLt candidates timed at the first use of each GEMM shape, the fastest kept (Gemm::search
    // in kernels/gemm/matmul.h); 0: the heuristic's first choice
    int matmul_search = 0;
    // The `wgmma` matmul's schedule (WgmmaSchedule in kernels/gemm/matmul_wgmma.h): "cooperative"
    // (both consumer warpgroups on each 128 x 256 tile) or "pingpong" (alternate 128 x 128 tiles)
    std::string matmul_wgmma_schedule = "cooperative";
    // The `wgmma` matmul with a Llama-style op in its epilogue (kernels/gemm/matmul_wgmma.h): the
    // rotary rotation behind the qkv GEMM, SwiGLU behind the gate-and-up GEMM; false: the plain
    // GEMM, then the op's own pass. SwiGLU's is off by default: slower on an H200 (docs/llama.md)
    bool matmul_wgmma_rope = true;
    bool matmul_wgmma_swiglu = false;
    // The attention and MLP projections' bias gradients as column sums inside the LayerNorm
    // backward that writes their output gradient (kernels/norms/layernorm.h), not a pass of their
    // own
    bool layernorm_bias_sums = true;
    // The norms' backward above 1280 columns two warps a row, each with its half's weight-gradient
    // sums in registers; false: one warp a row with them in shared memory (faster at C = 1600 on
    // an H200: docs/experiments/ablate-1558m)
    bool layernorm_split_rows = false;
    // fc's bias gradient as one more column of its weight-gradient GEMM: ln2 is stored with a
    // column of ones beside its rows (8 columns wider), so the GEMM's last column is the column
    // sums of dfch and no pass of its own reads dfch again (matmul: fused_epilogue with biases)
    bool fc_bias_in_dw = true;
    // With fc_bias_in_dw: ln2's rows are C + 1 rounded up to a multiple of this many elements
    // apart, 8 (16-byte bf16 rows) or 64 (128-byte rows, which cuBLASLt's kernels may load
    // faster)
    int fc_ones_align = 8;
    // GELU's derivative in the epilogue of fcproj's input-gradient GEMM (cuBLASLt's DGELU, matmul:
    // fused_epilogue or wgmma); false: the plain GEMM, then gelu_backward's own pass
    bool gelu_backward_in_gemm = true;
    // How often the vocab-parallel head reads a shard's logits. "two": statistics, exchange,
    // then a second read for the gradient. "one": the loss head's variant (fast or online) runs
    // once over the shard with local targets and writes the local softmax in place, and per-row
    // factors after the statistics' exchange make it the gradient
    // (kernels/loss_head/shard_one_read.h). "auto": one read with fast where a shard's row of
    // logits is longer than kOneReadMinRowBytes (where fast runs its own kernels), two below
    // (docs/parallel.md has the measurements).
    std::string split_head_reads = "auto";
    // Row chunks of the loss head (logits GEMM, cross-entropy, dlnf GEMM), pipelined over two
    // streams; 1 runs it in one piece. At most kMaxHeadChunks, and chunks of at least 1024 rows.
    // The vocab-parallel head takes as many chunks of its group's rows.
    int head_chunks = 4;
    // The kernels' tuning knobs (kernels.cross_entropy_tuning.*, kernels.attention_tuning.*); the
    // defaults are the kernels' own choices.
    cuda::CrossEntropyTuning cross_entropy_tuning;
    cuda::AttentionTuning attention_tuning;
};

// The most row chunks the loss head takes (KernelChoice::head_chunks).
constexpr int kMaxHeadChunks = 8;

// The choice of a registered family (kernels/core/registry.h), by its name.
inline std::string& kernel_choice(KernelChoice& k, const std::string& family) {
    if (family == "attention") return k.attention;
    if (family == "cross_entropy") return k.cross_entropy;
    if (family == "layernorm") return k.layernorm;
    if (family == "matmul") return k.matmul;
    throw Error("no kernel family '" + family + "' in KernelChoice");
}
inline const std::string& kernel_choice(const KernelChoice& k, const std::string& family) {
    return kernel_choice(const_cast<KernelChoice&>(k), family);
}

// fused_linear's schedule from the linear_ce_* choices (keys left 0: the kernels' defaults, 8192
// rows and 48 MB tiles, sized for bench_ce's memory targets).
cuda::LinearCrossEntropyTuning linear_ce_tuning(const KernelChoice& k);
// The model's schedule: the same, with keys left 0 taking the trainer's tiles, 16384 rows of
// 192 MB. They gave the fused heads 3-4% more tokens/s than 8192 x 48 MB (GPT-2 124M, B = 64,
// T = 1024, H100 and H200) for about 0.2 GB more, within the trainer's memory target.
// fused_linear_rows keeps its own default (8192 rows) and gets fp32_dweight_only: the model
// always passes its fp32 gradient as dweight_acc.
constexpr int kModelLinearCeRowBlock = 16384, kModelLinearCeChunkMb = 192;
cuda::LinearCrossEntropyTuning model_linear_ce_tuning(const KernelChoice& k);

// The vocabulary rounded up to a multiple of 128 (padded logits are masked out of the loss).
int64_t padded_vocab_size(int64_t vocab_size);

// Throws zgpt::Error on an inconsistent shape (n_embd % n_head, sizes <= 0) or option (names the
// key: n_head % n_kv_head, an odd head size with rope, an unknown norm / position / mlp).
void validate(const ModelConfig& c);

}  // namespace zgpt

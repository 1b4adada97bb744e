// The GPU kernel variants of every op family, by name: the one list that config validation,
// `train --help`, `train --list-kernels` (tools/ablate.py), the CUDA model, the bench tools and the
// tests read. Plain C++: CPU-only builds validate configs too. The CUDA implementations keep their
// entries under these names (attention_variants(), cross_entropy_variants(),
// linear_cross_entropy_variants()); test_gpu_model checks that every name here has one and that
// they hold no other.
#pragma once
#include <string>
#include <vector>

namespace zgpt {

// What a variant is, as data: config validation and the model read these properties instead of
// comparing names, so a new variant is an entry here and its kernels (docs/architecture.md says
// which files).
struct VariantTraits {
    std::string name;
    bool takes_hidden = false;  // cross_entropy: from hidden states and the LM-head weight, not
                                // logits (bf16 only; the kernels.linear_ce_* keys)
    bool whole_rows = false;    // cross_entropy: blocks of whole rows on one GPU (no vocabulary
                                // chunks, no vocab-parallel shards)
    bool ce_in_gemm_epilogue = false;  // cross_entropy: the statistics in our GEMM's epilogue
    bool sm90_kernels = false;  // has kernels for compute capability 9.0 (elsewhere a fallback)
    std::vector<std::string> reads;  // the tuning keys (kernels.<key>) it reads
};

struct KernelFamily {
    std::string name;                   // the config key: kernels.<name>
    std::string help;                   // what --help says
    std::vector<std::string> variants;  // a variant's id is its index
    std::string default_variant;
    std::vector<VariantTraits> traits;  // one per variant, in the same order
};

// attention, cross_entropy, layernorm, matmul
const std::vector<KernelFamily>& kernel_families();
// Throws zgpt::Error for a family that is not registered.
const KernelFamily& kernel_family(const std::string& name);
// nullptr for a name that is not a registered family.
const KernelFamily* find_kernel_family(const std::string& name);
// The id of `variant` in `family`; throws zgpt::Error "kernels.<family>: unknown variant 'x'
// (known: a, b, c)".
int kernel_variant(const std::string& family, const std::string& variant);

// The properties of a registered variant; throws zgpt::Error as kernel_variant does.
const VariantTraits& variant_traits(const std::string& family, const std::string& variant);
// The variants of `family` that read tuning key `key`, as "a, b or c".
std::string variants_reading(const std::string& family, const std::string& key);

// The cross_entropy variants that take hidden states and the LM-head weight instead of logits
// (linear_cross_entropy_variants(); bf16 only, the kernels.linear_ce_* keys apply to them).
bool is_linear_cross_entropy(const std::string& variant);
// Blocks of whole rows on one GPU (no vocabulary chunks, no loop order, no vocab-parallel
// shards).
bool is_whole_rows_linear_cross_entropy(const std::string& variant);

// The ids the CUDA model branches on, resolved once from the names (never compared per step).
// residual_in_matmul: the attention and MLP projections add the residual stream in their GEMM's
// epilogue (cuBLASLt's C operand), so the LayerNorm after them reads one tensor, not two.
enum class LayernormVariant { fused_residual, separate, residual_in_matmul };
enum class MatmulVariant { fused_epilogue, separate, wgmma };

}  // namespace zgpt

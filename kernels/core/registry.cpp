#include "kernels/core/registry.h"

#include "kernels/core/check.h"

namespace zgpt {

namespace {
KernelFamily family(std::string name, std::string help, std::vector<VariantTraits> traits,
                    std::string default_variant) {
    KernelFamily f{
        std::move(name), std::move(help), {}, std::move(default_variant), std::move(traits)};
    for (const VariantTraits& t : f.traits) f.variants.push_back(t.name);
    return f;
}

// The tuning keys, by the variants that read them.
const std::vector<std::string> kLinearCe = {"linear_ce_row_block", "linear_ce_chunk_mb"};
const std::vector<std::string> kLinearCeTiles = {"linear_ce_row_block", "linear_ce_chunk_mb",
                                                 "linear_ce_vocab_chunk", "linear_ce_rows_outer"};
const std::vector<std::string> kFastBoth = {
    "cross_entropy_tuning.cluster", "cross_entropy_tuning.threads", "cross_entropy_tuning.smem_kb",
    "cross_entropy_tuning.min_stages"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}
}  // namespace

const std::vector<KernelFamily>& kernel_families() {
    // Each list's order is the ids' (LayernormVariant, MatmulVariant); the first help words say
    // what a variant trades.
    static const std::vector<KernelFamily> families = {
        family("attention", "causal attention variant (GPU)",
               {{"flash",
                 false,
                 false,
                 false,
                 true,
                 {"attention_tuning.fwd_m_tiles", "attention_tuning.wgmma_fwd",
                  "attention_tuning.wgmma_bwd", "attention_tuning.wgmma_fwd_pipeline",
                  "attention_tuning.wgmma_dq_tile", "attention_tuning.wgmma_dkdv_tile",
                  "attention_tuning.wgmma_dkdv_wgs", "attention_tuning.wgmma_dkdv_tma",
                  "attention_tuning.wgmma_dq_tma", "attention_tuning.wgmma_fwd_tma",
                  "attention_tuning.wgmma_fwd_keys", "attention_tuning.unrounded_dsum"}},
                {"flash_mma",
                 false,
                 false,
                 false,
                 false,
                 {"attention_tuning.fwd_m_tiles", "attention_tuning.unrounded_dsum"}},
                {"naive", false, false, false, false, {}},
                {"flash_fwd_naive_bwd", false, false, false, true, {}},
                {"naive_fwd_flash_bwd", false, false, false, true, {}}},
               "flash"),
        family(
            "cross_entropy", "loss-head variant (GPU)",
            {{"naive", false, false, false, false, {}},
             {"online", false, false, false, false, {}},
             {"fast", false, false, false, false,
              kFastBoth +
                  std::vector<std::string>{
                      "cross_entropy_tuning.groups", "cross_entropy_tuning.parts",
                      "cross_entropy_tuning.helper_parts", "cross_entropy_tuning.helper_weight",
                      "cross_entropy_tuning.stats_sweeps", "cross_entropy_tuning.l2_evict_last"}},
             {"fast_lockstep", false, false, false, false, kFastBoth},
             {"fused_linear", true, false, false, false, kLinearCeTiles},
             {"fused_linear_wgmma", true, false, true, true,
              kLinearCeTiles + std::vector<std::string>{"linear_ce_wgmma_cluster"}},
             {"fused_linear_rows", true, true, false, false, kLinearCe},
             {"fused_linear_rows_filtered", true, true, false, false,
              kLinearCe + std::vector<std::string>{"linear_ce_filter_eps"}}},
            "fast"),
        family("layernorm",
               "LayerNorm with the residual add fused, or separate, or the add in the projection "
               "GEMM's epilogue (GPU)",
               {{"fused_residual"}, {"separate"}, {"residual_in_matmul"}}, "residual_in_matmul"),
        family("matmul",
               "bias and GELU in the cuBLASLt epilogue, or separate passes, or the forward GEMMs "
               "on our Hopper kernel, which can take RoPE and SwiGLU in its epilogue (GPU)",
               {{"fused_epilogue"},
                {"separate"},
                {"wgmma",
                 false,
                 false,
                 false,
                 true,
                 {"matmul_wgmma_schedule", "matmul_wgmma_rope", "matmul_wgmma_swiglu"}}},
               "fused_epilogue"),
    };
    return families;
}

const KernelFamily* find_kernel_family(const std::string& name) {
    for (const KernelFamily& f : kernel_families())
        if (f.name == name) return &f;
    return nullptr;
}

const KernelFamily& kernel_family(const std::string& name) {
    if (const KernelFamily* f = find_kernel_family(name)) return *f;
    throw Error("no kernel family '" + name + "'");
}

int kernel_variant(const std::string& family, const std::string& variant) {
    const KernelFamily& f = kernel_family(family);
    std::string known;
    for (size_t i = 0; i < f.variants.size(); i++) {
        if (f.variants[i] == variant) return int(i);
        known += (i ? ", " : "") + f.variants[i];
    }
    throw Error("kernels." + family + ": unknown variant '" + variant + "' (known: " + known + ")");
}

const VariantTraits& variant_traits(const std::string& family, const std::string& variant) {
    return kernel_family(family).traits[size_t(kernel_variant(family, variant))];
}

std::string variants_reading(const std::string& family, const std::string& key) {
    std::vector<std::string> names;
    for (const VariantTraits& t : kernel_family(family).traits)
        for (const std::string& k : t.reads)
            if (k == key) names.push_back(t.name);
    std::string s;
    for (size_t i = 0; i < names.size(); i++)
        s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return s.empty() ? "(none)" : s;
}

bool is_linear_cross_entropy(const std::string& variant) {
    return variant_traits("cross_entropy", variant).takes_hidden;
}

bool is_whole_rows_linear_cross_entropy(const std::string& variant) {
    return variant_traits("cross_entropy", variant).whole_rows;
}

}  // namespace zgpt

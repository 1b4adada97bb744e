#include "kernels/registry.h"

#include "kernels/check.h"

namespace zgpt {

const std::vector<KernelFamily>& kernel_families() {
    // Each list's order is the ids' (LayernormVariant, MatmulVariant); the first help words say
    // what a variant trades.
    static const std::vector<KernelFamily> families = {
        {"attention", "causal attention variant (GPU)", {"flash", "flash_mma", "naive"}, "flash"},
        {"cross_entropy",
         "loss-head variant (GPU)",
         {"naive", "online", "fast", "fast_lockstep", "fused_linear", "fused_linear_wgmma",
          "fused_linear_rows", "fused_linear_rows_filtered"},
         "fast"},
        {"layernorm",
         "LayerNorm with the residual add fused, or separate, or the add in the projection "
         "GEMM's epilogue (GPU)",
         {"fused_residual", "separate", "residual_in_matmul"},
         "residual_in_matmul"},
        {"matmul",
         "bias and GELU in the cuBLASLt epilogue, or separate passes, or the forward GEMMs on "
         "our Hopper kernel (GPU)",
         {"fused_epilogue", "separate", "wgmma"},
         "fused_epilogue"},
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

bool is_linear_cross_entropy(const std::string& variant) {
    return variant == "fused_linear" || variant == "fused_linear_wgmma" ||
           is_whole_rows_linear_cross_entropy(variant);
}

bool is_whole_rows_linear_cross_entropy(const std::string& variant) {
    return variant == "fused_linear_rows" || variant == "fused_linear_rows_filtered";
}

}  // namespace zgpt

// The attention variants' registry on the GPU (kernels/attention/attention.h): flash and flash_mma
// (flash.cu, with the tensor-core kernels of mma.cu and wgmma.cu), naive (naive.cu), and the
// ablations that pair flash's forward with naive's backward and the reverse (hybrid.cu).
#include "kernels/attention/scalar.cuh"
#include "kernels/core/check.h"

namespace zgpt::cuda {

const std::vector<AttentionVariant>& attention_variants() {
    static const std::vector<AttentionVariant> v = {
        flash_attention_entry(true), flash_attention_entry(false), naive_attention_entry(),
        hybrid_attention_entry(true), hybrid_attention_entry(false)};
    return v;
}

const AttentionVariant& find_attention_variant(const std::string& name) {
    std::string known;
    for (const AttentionVariant& a : attention_variants()) {
        if (name == a.name) return a;
        known += std::string(known.empty() ? "" : ", ") + a.name;
    }
    throw Error("unknown attention variant '" + name + "' (known: " + known + ")");
}

}  // namespace zgpt::cuda

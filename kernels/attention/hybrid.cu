// Two ablation variants that pair one variant's forward with another's backward. They separate
// the rounding of flash's forward (bf16 probabilities into P V) from the rounding of its backward
// (bf16 P into dV, bf16 dS into dQ and dK, D from the bf16 output) when a run trains differently
// with flash than with naive (fp32 inside):
//   flash_fwd_naive_bwd  flash's output; naive's backward, over the probabilities that naive's
//                        forward, run beside flash's, saved
//   naive_fwd_flash_bwd  naive's output; flash's backward, over the lse of flash's forward, run
//                        beside naive's
// Each forward runs both forwards (the first one's output is overwritten), so these variants cost
// more time and memory than either parent. They exist to measure training, not speed.
#include "kernels/attention/scalar.cuh"
#include "kernels/core/workspace.h"

namespace zgpt::cuda {

namespace {

const AttentionVariant& flash_parent() {
    static const AttentionVariant v = flash_attention_entry(true);
    return v;
}
const AttentionVariant& naive_parent() {
    static const AttentionVariant v = naive_attention_entry();
    return v;
}

// flash at its default tuning (the config gives the ablations no tuning keys), so without its
// output residual: the output its backward reads may be naive's
AttentionShape flash_shape(const AttentionShape& s) {
    AttentionShape f = s;
    f.tuning = AttentionTuning{};
    return f;
}

// The saved buffer: naive's probabilities, then flash's lse, each from a 256-byte boundary. On a
// null buffer it only measures (hybrid_saved_bytes), so the size and the layout are one code.
struct HybridSaved {
    void* naive;
    void* flash;
    size_t bytes;
};
HybridSaved hybrid_saved(void* saved, const AttentionShape& s) {
    WorkspaceLayout w(saved);
    void* naive = w.take<unsigned char>(naive_parent().saved_bytes(s));
    void* flash = w.take<unsigned char>(flash_parent().saved_bytes(flash_shape(s)));
    return {naive, flash, w.bytes()};
}
size_t hybrid_saved_bytes(const AttentionShape& s) {
    return hybrid_saved(nullptr, s).bytes;
}
void* naive_saved(void* saved, const AttentionShape& s) {
    return hybrid_saved(saved, s).naive;
}
void* flash_saved(void* saved, const AttentionShape& s) {
    return hybrid_saved(saved, s).flash;
}

// flash_fwd_naive_bwd
size_t flash_fwd_scratch_bytes(const AttentionShape& s) {
    return naive_parent().scratch_bytes(s);
}
void flash_fwd_forward(void* out, void* saved, const void* qkv, const AttentionShape& s, DType t,
                       CUstream_st* st) {
    // naive's probabilities for the backward, then flash's output over naive's
    naive_parent().forward(out, naive_saved(saved, s), qkv, s, t, st);
    flash_parent().forward(out, flash_saved(saved, s), qkv, flash_shape(s), t, st);
}
int64_t flash_fwd_colsum_rows(const AttentionShape& s, DType t) {
    return naive_parent().colsum_rows(s, t);
}
void flash_fwd_backward(void* dqkv, const void* dout, const void* qkv, const void* out, void* saved,
                        void* scratch, float* dqkv_colsums, const AttentionShape& s, DType t,
                        CUstream_st* st) {
    naive_parent().backward(dqkv, dout, qkv, out, naive_saved(saved, s), scratch, dqkv_colsums, s,
                            t, st);
}

// naive_fwd_flash_bwd
size_t naive_fwd_scratch_bytes(const AttentionShape& s) {
    return flash_parent().scratch_bytes(flash_shape(s));
}
void naive_fwd_forward(void* out, void* saved, const void* qkv, const AttentionShape& s, DType t,
                       CUstream_st* st) {
    flash_parent().forward(out, flash_saved(saved, s), qkv, flash_shape(s), t, st);  // the lse
    naive_parent().forward(out, naive_saved(saved, s), qkv, s, t, st);               // the output
}
int64_t naive_fwd_colsum_rows(const AttentionShape& s, DType t) {
    return flash_parent().colsum_rows(flash_shape(s), t);
}
void naive_fwd_backward(void* dqkv, const void* dout, const void* qkv, const void* out, void* saved,
                        void* scratch, float* dqkv_colsums, const AttentionShape& s, DType t,
                        CUstream_st* st) {
    flash_parent().backward(dqkv, dout, qkv, out, flash_saved(saved, s), scratch, dqkv_colsums,
                            flash_shape(s), t, st);
}

}  // namespace

AttentionVariant hybrid_attention_entry(bool flash_forward) {
    if (flash_forward)
        return {"flash_fwd_naive_bwd",
                "ablation: flash's forward (bf16 probabilities), naive's backward (fp32)",
                hybrid_saved_bytes,
                flash_fwd_scratch_bytes,
                flash_fwd_forward,
                flash_fwd_colsum_rows,
                flash_fwd_backward};
    return {
        "naive_fwd_flash_bwd", "ablation: naive's forward (fp32), flash's backward (bf16 P and dS)",
        hybrid_saved_bytes,    naive_fwd_scratch_bytes,
        naive_fwd_forward,     naive_fwd_colsum_rows,
        naive_fwd_backward};
}

}  // namespace zgpt::cuda

// The CUDA loss head's test scaffolding, shared by test_gpu (the head's special cases) and
// test_kernels (every variant in the kernel table): problems with hard rows, the CPU reference in
// double, a variant's run on device buffers, and the checks.
//
// Tolerances, argued from the arithmetic:
// - fp32 logits: the GPU works in fp32 (the reference in fp64). p_j = exp((x_j - max) - log d):
//   the fp32 argument t = x_j - lse is rounded to 2^-24 |t| and __expf scales it by log2(e) before
//   ex2, so p_j carries a relative error up to about 2^-22 |t| (1.5e-5 at |t| = 60) on top of a
//   few ulps. Each element is held to (base + 2.4e-7 |x_j - lse_i|) relative, base 1e-6 for the
//   oracle and 1e-5 for random inputs (the fp32 sums of ~V terms), plus an absolute 1e-6 of the
//   largest gradient (cancellation in p (1 + 2 z lse) - eps / V).
// - bf16 logits: the reference reads the same bf16 values, so the loss is held to fp32 precision;
//   dlogits are rounded once to bf16: half an ulp is 2^-9 relative, so 2^-8 + 1e-5 relative.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/loss_head/cross_entropy.h"
#include "tests/gpu_helpers.h"
#include "tests/helpers.h"

namespace zgpt::test {

using cuda::LogitsType;

// Host logits stored as the device type; returns the values the device will actually see.
std::vector<float> to_device_values(const std::vector<float>& x, LogitsType t);

// Host values to the device as type t (bf16: rounded to nearest even), and back.
void upload(void* dst, const std::vector<float>& x, LogitsType t);
std::vector<float> download(const void* src, size_t n, LogitsType t);

// Rows of V values at stride ld >= V, the padding filled with `pad`.
std::vector<float> pad_rows(const std::vector<float>& x, int64_t N, int64_t V, int64_t ld,
                            float pad);

// A loss-head problem: host logits, targets, options and how the device holds them.
struct Case {
    int64_t N = 5, V = 100;
    LogitsType type = LogitsType::f32;
    CrossEntropyOptions opts;
    std::vector<float> logits;  // N x V, host
    std::vector<int32_t> targets;
    std::vector<float> grad_output = {1.0f};
    bool in_place = true;
    int64_t ld = 0;  // row stride on the GPU; 0: V. Padding columns hold NaN and must stay so.
};

struct Result {
    std::vector<float> dlogits, loss, ce, z, lse;
    cuda::LossSummaryF summary;
    bool padding_written = false;
};

// The CPU head (kernels/loss_head/cross_entropy.cpp, in double) on the values the device sees.
struct Reference {
    std::vector<double> dlogits, loss, ce, z, lse;
    CrossEntropySummary summary;
};

Reference reference(const Case& c);

// A variant's arguments for whole rows of V values at stride ld: rows holds the per-row loss, ce,
// z-loss and lse (N floats each, in that order).
cuda::CrossEntropyArgs ce_args(void* logits, void* dlogits, LogitsType t, int64_t ld, int64_t N,
                               int64_t V, const Dev& targets, const Dev& go, const Dev& rows,
                               const Dev& summary);

// The per-row loss, ce, z-loss and lse (rows: N floats each, in that order) and the summary,
// from the device into r.
void read_rows(Result& r, const Dev& rows, const Dev& summary, int64_t N);

// Runs a registered variant on c (poisoned outputs: every one must be written) and reads it back.
Result run_variant(const cuda::CrossEntropyVariant& v, const Case& c,
                   const cuda::CrossEntropyTuning& tuning = {});

// dlogits against the reference with the per-element bound argued at the top of this file.
MaxError compare_dlogits(const std::vector<float>& got, const std::vector<double>& want,
                         const std::vector<float>& seen_logits, const std::vector<double>& lse,
                         int64_t V, double base_rtol);

// Every output against the reference, with the bounds argued at the top of this file.
void check_result(const Result& got, const Reference& want, const Case& c);

// Random logits with hard rows mixed in: peaked (p -> 1), large magnitude, -inf entries.
Case make_case(uint64_t seed, int64_t N, int64_t V, LogitsType t, double z, double eps, Reduction r,
               int ignored);

// "f32" or "bf16".
std::string type_name(LogitsType t);

// fused_linear's schedules (LinearCrossEntropyTuning: row_block, rows_outer; dweight_acc).
struct Schedule {
    const char* name;
    int64_t row_block;
    bool rows_outer, fp32_dw;
};
inline constexpr Schedule kSchedules[] = {
    {"one row block, bf16 dW", 0, false, false},
    {"one row block, fp32 dW accumulator", 0, false, true},
    {"16-row blocks inside, bf16 dW", 16, false, false},
    {"16-row blocks inside, fp32 dW accumulator", 16, false, true},
    {"16-row blocks outside, fp32 dW accumulator", 16, true, true},
};

// fused_linear's arguments over device buffers: h [N, C], W [V, C], targets, grad_output; outputs
// dh, dW (bf16, or added to the fp32 dW_acc, as the schedule says), per-row loss and the summary;
// vocabulary chunks of 384 columns (several, the last one ragged for the sizes the tests use).
cuda::LinearCrossEntropyArgs linear_ce_args(const Dev& h, const Dev& W, const Dev& targets,
                                            const Dev& go, const Dev& dh, const Dev& dW,
                                            const Dev& dW_acc, const Dev& rows, const Dev& summary,
                                            int64_t N, int64_t C, int64_t V, const Schedule& sc);

// fused_linear on a CE case through an identity weight: h = the case's logits (bf16), C = V and
// W = I, so that h W^T is exactly the bf16 logits and dh = dlogits W is exactly the bf16 dlogits
// the head computed. The result reads like a CE variant's, with dh as its dlogits. Hidden states
// are finite, so -inf logits cannot be made this way (-inf x 0 is NaN): cases must not have them.
// `variant`: a linear_cross_entropy_variants() name.
Result run_linear_identity(const Case& c, const Schedule& sc,
                           const std::string& variant = "fused_linear");

}  // namespace zgpt::test

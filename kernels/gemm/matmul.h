// Matmul with optional bias: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC]. CPU reference.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zgpt::cpu {

// bias may be null.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC);

// Adds into dinp, dweight and dbias; any of them may be null (not needed).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC);

}  // namespace zgpt::cpu

// CUDA matmul through cuBLASLt (kernels/gemm/matmul.cu; CUDA builds only). Row-major operands,
// fp32 accumulation:
//   D[M, N] = epilogue(alpha * op(A) @ op(B) + beta * C), C = D unless Gemm::C is given
// with A stored [M, K] (or [K, M] when trans_a) and B stored [K, N] (or [N, K] when trans_b).
// A and B are both bf16 or both fp32 (fp32 runs without TF32, for parity checks); D is bf16 or
// fp32. One handle per thread and one workspace per stream (GEMMs on two streams may run at
// once; release_gemm_workspace frees one); algorithms cached per shape, type, epilogue and
// pointer alignment.
#include <initializer_list>
#include <string>

#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

using MatType = DType;

enum class Epilogue {
    none,
    bias,           // + bias[N] (type of D)
    gelu_aux_bias,  // GELU(x + bias); x + bias stored to aux [M, N] (type of D) for backward
    gelu_aux,       // GELU(x); x stored to aux
    dgelu,          // x * GELU'(aux): aux [M, N] holds the pre-activation (backward of GELU)
    bias_grad,      // bias[M] = sum over k of op(A)[m, k], written (type of D); the GEMM as usual
    // dgelu, and bias[N] = the column sums of its result over the M rows, written (type of D;
    // cuBLASLt sums in fp32 and offers no fp32 bias beside a bf16 D): the gradient of the bias
    // that fed the GELU (cuBLASLt's DGELU_BGRAD)
    dgelu_bias_grad,
    // SwiGLU (the wgmma kernel only, kernels/gemm/matmul_wgmma.h; cuBLASLt refuses it): B [N, K]
    // is gate (rows < N / 2) then up; the product (+ bias[N]) is stored to aux [M, N] (type of
    // D), and D [M, N / 2] = silu(gate) * up of the stored values
    swiglu_aux,
    swiglu_aux_bias,
};

struct Gemm {
    void* D = nullptr;
    DType d_type = DType::bf16;
    const void* A = nullptr;
    bool trans_a = false;
    const void* B = nullptr;
    bool trans_b = false;
    DType ab_type = DType::bf16;
    int64_t M = 0, N = 0, K = 0;
    // Row strides in elements of A, B and D as stored (row-major); 0: rows stored back to back.
    // A padded stride keeps every row 16-byte aligned where the row length would not (a
    // vocabulary shard of odd length), which cuBLASLt's fast kernels need.
    int64_t lda = 0, ldb = 0, ldd = 0;
    float alpha = 1, beta = 0;
    // With beta != 0, beta * C is added instead of beta * D: C has D's type and row stride and
    // is only read (the residual stream added in a projection's epilogue). Null: C is D.
    const void* C = nullptr;
    Epilogue epilogue = Epilogue::none;
    const void* bias = nullptr;
    void* aux = nullptr;
    // RoPE on D's columns [0, rope_cols) after the bias (the wgmma kernel only; cuBLASLt refuses
    // it): heads of rope_hs channels in Hugging Face's rotate_half layout, row m at position
    // m % rope_Tn, angles from rope_table (kernels/ops/rope.h's cuda::rope_table(rope_Tn, rope_hs,
    // theta) on the device). Null: none.
    const float* rope_table = nullptr;
    int64_t rope_Tn = 0, rope_hs = 0, rope_cols = 0;
    // Candidate algorithms to time at the first use of this shape (types, epilogue, alignment):
    // the fastest of cuBLASLt's first `search` is kept for the process. 0: the heuristic's first.
    int search = 0;
};
// The three products of a linear layer y[M, N] = x[M, K] W[N, K]^T (row-major, operands of type
// t, no epilogue, no search), as the trainer, the tests and bench_gemm run them:
// out[M, N] = inp[M, K] W^T; dinp[M, K] = dout[M, N] W (D of type t); dW[N, K] += dout^T inp in
// fp32 (beta = 1).
inline Gemm linear_forward_gemm(void* out, const void* inp, const void* W, int64_t M, int64_t K,
                                int64_t N, DType t) {
    Gemm g;
    g.D = out;
    g.d_type = g.ab_type = t;
    g.A = inp;
    g.B = W;
    g.trans_b = true;
    g.M = M, g.N = N, g.K = K;
    return g;
}
inline Gemm linear_input_grad_gemm(void* dinp, const void* dout, const void* W, int64_t M,
                                   int64_t K, int64_t N, DType t) {
    Gemm g;
    g.D = dinp;
    g.d_type = g.ab_type = t;
    g.A = dout;
    g.B = W;
    g.M = M, g.N = K, g.K = N;
    return g;
}
inline Gemm linear_weight_grad_gemm(float* dW, const void* dout, const void* inp, int64_t M,
                                    int64_t K, int64_t N, DType t) {
    Gemm g;
    g.D = dW;
    g.d_type = DType::f32;
    g.ab_type = t;
    g.A = dout;
    g.trans_a = true;
    g.B = inp;
    g.M = N, g.N = K, g.K = M;
    g.beta = 1.0f;
    return g;
}

void gemm(const Gemm& g, CUstream_st* stream);
// The same, but false (nothing launched) when cuBLASLt has no algorithm for this epilogue and
// these types, so the caller can fall back to separate kernels.
bool try_gemm(const Gemm& g, CUstream_st* stream);

// cuBLASLt's other candidate algorithms for g's shape, types, epilogue and alignment: its
// heuristic's list (at most 32), best guess first; gemm() runs candidate 0. For measuring the
// choice (tools/bench_gemm); each candidate is deterministic on its own.
int gemm_candidates(const Gemm& g);
// "algo 66 tile 31 stages 20 splitk 1 ...": the candidate's configuration, for reports.
std::string gemm_candidate_name(const Gemm& g, int index);
// Runs candidate index of g; false (nothing launched) when there is no such candidate.
bool try_gemm_candidate(const Gemm& g, int index, CUstream_st* stream);
// Configurations beyond the heuristic's list, for measuring (tools/bench_gemm --configs): each
// algorithm id cuBLASLt has for g's types, with each tile and stages count its capabilities list
// and the cluster shapes auto, 1x1, 2x1 and 1x2, without split-K, that cublasLtMatmulAlgoCheck
// accepts within the workspace. try_gemm_config returns false when there is no such
// configuration or cuBLASLt refuses to launch it.
int gemm_configs(const Gemm& g);
std::string gemm_config_name(const Gemm& g, int index);
bool try_gemm_config(const Gemm& g, int index, CUstream_st* stream);

// The candidates Gemm::search chose in this thread (and those set_gemm_choices gave it for shapes
// it has not run), as text: a first line naming the cuBLASLt version and the GPU (model, SMs),
// then one line per shape (its key and the candidate's index).
// set_gemm_choices makes another thread or process run the same ones (a resumed run, the other
// ranks, the next run), re-choosing shapes already run with another; it returns false and changes
// nothing when the text is for another cuBLASLt or GPU (the indices are into cuBLASLt's heuristic
// list, which is the same for one version and GPU model).
std::string gemm_choices();
bool set_gemm_choices(const std::string& choices);

// search: Gemm::search
void gemm_bf16(void* D, MatType d_type, const void* A, bool trans_a, const void* B, bool trans_b,
               int64_t M, int64_t N, int64_t K, float alpha, float beta, CUstream_st* stream,
               int search = 0);

// Bytes of the cuBLASLt workspaces alive: one per stream that has run a GEMM (counted as extra
// memory by the benchmarks); or of those of the streams given.
size_t gemm_workspace_bytes();
size_t gemm_workspace_bytes(std::initializer_list<CUstream_st*> streams);
size_t gemm_workspace_bytes_per_stream();  // what a stream's first GEMM allocates
// Frees the workspace of `stream`, if it has one, once its work is done: for an owner that
// destroys the stream (a model's streams), so that its 32 MB do not outlive it.
void release_gemm_workspace(CUstream_st* stream) noexcept;

// out[N, OC] += bias[OC] (both type t): the bias as its own pass (the `separate` matmul variant).
void add_bias(void* out, const void* bias, int64_t N, int64_t OC, DType t, CUstream_st* stream);

// dbias[OC] += column sums of dout [N, OC] (type t), in a fixed order (no atomics).
size_t bias_backward_scratch_bytes(int64_t N, int64_t OC);
void bias_backward(float* dbias, const void* dout, int64_t N, int64_t OC, DType t, void* scratch,
                   CUstream_st* stream);
// dbias[OC] += the column sums of parts [rows, OC] (partial column sums that another kernel wrote
// beside dout, such as the attention backward's), in a fixed order.
void bias_backward_from_partials(float* dbias, const float* parts, int64_t rows, int64_t OC,
                                 CUstream_st* stream);
// dW[N, K] += P[n, :K] and dbias[N] += P[n, K] for P [N, ldp] fp32 (ldp > K): the result of a
// weight-gradient GEMM whose input carried a column of ones after its K columns, so that the
// GEMM's column K is the bias gradient (the trainer's fc layer: no pass of its own over dout).
// add false: dW = P[n, :K] and dbias = P[n, K], written without reading them.
void add_weight_and_bias_grad(float* dW, float* dbias, const float* P, int64_t N, int64_t K,
                              int64_t ldp, CUstream_st* stream, bool add = true);

}  // namespace zgpt::cuda

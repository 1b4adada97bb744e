#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/core/column_sums.cuh"
#include "kernels/core/cuda_common.cuh"
#include "kernels/core/cuda_device.h"
#include "kernels/gemm/matmul.h"

namespace zgpt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kMaxCandidates = 32;

#define ZG_CUBLAS_CHECK(expr)                                                              \
    do {                                                                                   \
        const cublasStatus_t st_ = (expr);                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                  \
            ::zgpt::fail_check(#expr, __FILE__, __LINE__,                                  \
                               std::string("cuBLASLt error ") + std::to_string(int(st_))); \
    } while (0)

using AlgoKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, uint32_t, int>;

struct Context {
    cublasLtHandle_t handle = nullptr;
    std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
    // the heuristic's longer lists (gemm_candidates), up to kMaxCandidates each
    std::map<AlgoKey, std::vector<cublasLtMatmulHeuristicResult_t>> candidates;
    // Gemm::search: the candidate each searched shape runs, and the ones given by
    // set_gemm_choices for shapes not yet run
    std::map<AlgoKey, int> chosen, preset;
    // gemm_configs: every configuration cuBLASLt accepts beyond its heuristic's list
    std::map<AlgoKey, std::vector<cublasLtMatmulAlgo_t>> configs;
    Context() { ZG_CUBLAS_CHECK(cublasLtCreate(&handle)); }
};

Context& context() {
    // one per host thread, until the thread ends (its handle is not freed then)
    static thread_local Context c;
    return c;
}

// One workspace per stream, whichever thread enqueues: GEMMs on two streams may run at once (the
// model overlaps the weight gradients with the input gradients), and a shared workspace would be
// a race; one stream runs its GEMMs one after another. Freed by release_gemm_workspace when the
// stream's owner destroys it (a model's streams), else kept to the end of the process.
struct Workspaces {
    std::mutex m;
    std::map<CUstream_st*, void*> by_stream;
};
Workspaces& workspaces() {
    static Workspaces* w = new Workspaces;  // never destroyed: streams may outlive static exit
    return *w;
}
void* workspace(CUstream_st* stream) {
    Workspaces& w = workspaces();
    std::lock_guard<std::mutex> lock(w.m);
    auto it = w.by_stream.find(stream);
    if (it != w.by_stream.end()) return it->second;
    void* p = nullptr;  // registered once allocated: a failed cudaMalloc leaves no entry
    ZG_CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes));
    w.by_stream[stream] = p;
    return p;
}

// The largest power of two (up to 256) dividing the address: cuBLASLt picks vectorised kernels
// only when told the operands allow them.
uint32_t alignment(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t r = 256;
    while (r > 1 && a % r) r /= 2;
    return r;
}

cudaDataType_t cuda_type(DType t) {
    return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
}

}  // namespace

size_t gemm_workspace_bytes() {
    Workspaces& w = workspaces();
    std::lock_guard<std::mutex> lock(w.m);
    return kWorkspaceBytes * w.by_stream.size();
}

size_t gemm_workspace_bytes_per_stream() {
    return kWorkspaceBytes;
}

size_t gemm_workspace_bytes(std::initializer_list<CUstream_st*> streams) {
    Workspaces& w = workspaces();
    std::lock_guard<std::mutex> lock(w.m);
    size_t n = 0;
    for (CUstream_st* s : streams) n += w.by_stream.count(s);
    return kWorkspaceBytes * n;
}

void release_gemm_workspace(CUstream_st* stream) noexcept {
    void* p = nullptr;
    {
        Workspaces& w = workspaces();
        std::lock_guard<std::mutex> lock(w.m);
        auto it = w.by_stream.find(stream);
        if (it == w.by_stream.end()) return;
        p = it->second;
        w.by_stream.erase(it);
    }
    cudaStreamSynchronize(stream);  // its GEMMs are done with it (errors: the caller's to see)
    cudaFree(p);
}

void gemm(const Gemm& g, CUstream_st* stream) {
    ZG_CHECK(try_gemm(g, stream), "cuBLASLt found no algorithm for a " + std::to_string(g.M) + "x" +
                                      std::to_string(g.N) + "x" + std::to_string(g.K) + " matmul");
}

namespace {

// The cuBLASLt descriptors of one product and the key its algorithms are cached under.
struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    uint32_t al_a = 0, al_b = 0, al_d = 0;
    AlgoKey key;
    explicit Plan(const Gemm& g);
    ~Plan() {
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
    }
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    // Up to `count` algorithms from cuBLASLt's heuristic for this product, its best guess first.
    std::vector<cublasLtMatmulHeuristicResult_t> heuristic(int count) const;
    // g with `algo` on stream; run() fails on an error, launch() returns it
    cublasStatus_t launch(const Gemm& g, const cublasLtMatmulAlgo_t& algo,
                          CUstream_st* stream) const;
    void run(const Gemm& g, const cublasLtMatmulAlgo_t& algo, CUstream_st* stream) const {
        ZG_CUBLAS_CHECK(launch(g, algo, stream));
    }
};

Plan::Plan(const Gemm& g) {
    ZG_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "gemm: sizes must be positive");
    const bool needs_bias = g.epilogue == Epilogue::bias || g.epilogue == Epilogue::gelu_aux_bias ||
                            g.epilogue == Epilogue::bias_grad ||
                            g.epilogue == Epilogue::dgelu_bias_grad;
    const bool needs_aux = g.epilogue == Epilogue::gelu_aux ||
                           g.epilogue == Epilogue::gelu_aux_bias || g.epilogue == Epilogue::dgelu ||
                           g.epilogue == Epilogue::dgelu_bias_grad;
    ZG_CHECK(!needs_bias || g.bias, "gemm: this epilogue needs a bias");
    ZG_CHECK(!needs_aux || g.aux, "gemm: a GELU epilogue needs the aux buffer");
    ZG_CHECK(g.epilogue != Epilogue::swiglu_aux && g.epilogue != Epilogue::swiglu_aux_bias &&
                 !g.rope_table,
             "gemm: cuBLASLt has no SwiGLU or RoPE epilogue (only try_gemm_wgmma takes them; "
             "run the separate kernels where it returns false)");
    // Row-major D[M,N] = op(A) op(B) is column-major D^T[N,M] = op(B)^T op(A)^T: cuBLASLt's A is
    // our B and its B is our A, with m = N, n = M.
    const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint64_t m = uint64_t(g.N), n = uint64_t(g.M), k = uint64_t(g.K);
    ZG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ZG_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    ZG_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (collective_sms() > 0) {  // leave those SMs to the NCCL kernels running beside it
        const int32_t sms = compute_sm_count();
        ZG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                       &sms, sizeof sms));
    }
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    switch (g.epilogue) {
        case Epilogue::none:
            break;
        case Epilogue::bias:
            epi = CUBLASLT_EPILOGUE_BIAS;
            break;
        case Epilogue::gelu_aux_bias:
            epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
            break;
        case Epilogue::gelu_aux:
            epi = CUBLASLT_EPILOGUE_GELU_AUX;
            break;
        case Epilogue::dgelu:
            epi = CUBLASLT_EPILOGUE_DGELU;
            break;
        case Epilogue::dgelu_bias_grad:  // D^T's rows are our columns: the sums are over our M
            epi = CUBLASLT_EPILOGUE_DGELU_BGRAD;
            break;
        case Epilogue::bias_grad:  // cuBLASLt's B is our A (see the swap above)
            epi = CUBLASLT_EPILOGUE_BGRADB;
            break;
        case Epilogue::swiglu_aux:  // refused above
        case Epilogue::swiglu_aux_bias:
            break;
    }
    const cudaDataType_t dt = cuda_type(g.d_type), abt = cuda_type(g.ab_type);
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        ZG_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (g.bias) {
            ZG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &g.bias, sizeof g.bias));
            ZG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                           &dt, sizeof dt));
        }
        if (g.aux) {
            const int64_t ld_aux = g.N;
            ZG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
            ZG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                           &ld_aux, sizeof ld_aux));
            ZG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &dt, sizeof dt));
        }
    }
    // column-major stored shapes: A (m x k or k x m), B (k x n or n x k), D (m x n); a row-major
    // row stride is the column-major leading dimension
    const uint64_t row_a = ta == CUBLAS_OP_N ? m : k, row_b = tb == CUBLAS_OP_N ? k : n;
    const uint64_t ld_a = g.ldb ? uint64_t(g.ldb) : row_a, ld_b = g.lda ? uint64_t(g.lda) : row_b,
                   ld_d = g.ldd ? uint64_t(g.ldd) : m;
    ZG_CHECK(ld_a >= row_a && ld_b >= row_b && ld_d >= m,
             "gemm: a row stride shorter than its row");
    ZG_CHECK(!g.aux || !g.ldd, "gemm: the GELU epilogues take rows stored back to back");
    ZG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, abt, row_a, ta == CUBLAS_OP_N ? k : m, ld_a));
    ZG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, abt, row_b, tb == CUBLAS_OP_N ? n : k, ld_b));
    ZG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ld_d));
    // Every row's start, not only the first: the pointer's alignment and the stride's in bytes.
    // (A stride that is not given is left out, as before: the key of shapes stored back to back
    // is unchanged, and the GEMM choices saved with it still apply.)
    const auto row_align = [](const void* p, int64_t stride, DType type) {
        const uint32_t a = alignment(p);
        if (!stride) return a;
        const uint64_t bytes = uint64_t(stride) * (type == DType::f32 ? 4 : 2);
        return uint32_t(std::min<uint64_t>(a, bytes & (~bytes + 1)));  // its lowest set bit
    };
    al_a = row_align(g.B, g.ldb, g.ab_type);
    al_b = row_align(g.A, g.lda, g.ab_type);
    al_d = row_align(g.D, g.ldd, g.d_type);
    if (g.C) al_d = std::min(al_d, row_align(g.C, g.ldd, g.d_type));  // one alignment for C and D
    const uint32_t al_aux = g.aux ? alignment(g.aux) : 256,
                   al_bias = g.bias ? alignment(g.bias) : 256;
    // the four alignments (powers of two, 1 to 256) as their exponents, a hex digit each
    const auto log2 = [](uint32_t a) { return uint32_t(__builtin_ctz(a)); };
    // above them, the SMs left to collectives (collective_sms; 0, as before, when none): the
    // heuristic's and the search's choices for fewer SMs are kept apart from the others
    const uint32_t al_key = uint32_t(std::min(collective_sms(), 255)) << 16 | log2(al_a) << 12 |
                            log2(al_b) << 8 | log2(al_d) << 4 | log2(std::min(al_aux, al_bias));
    key = AlgoKey{g.M,
                  g.N,
                  g.K,
                  g.trans_a,
                  g.trans_b,
                  int(g.d_type),
                  int(g.ab_type),
                  int(g.epilogue),
                  al_key,
                  std::max(0, std::min(g.search, kMaxCandidates))};
}

std::vector<cublasLtMatmulHeuristicResult_t> Plan::heuristic(int count) const {
    cublasLtMatmulPreference_t pref;
    ZG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    ZG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes, sizeof kWorkspaceBytes));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d}};
    for (const auto& [attr, v] : aligns)
        ZG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v));
    std::vector<cublasLtMatmulHeuristicResult_t> h(size_t(std::max(count, 1)));
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(context().handle, op, la, lb, ld, ld,
                                                             pref, int(h.size()), h.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // a combination cuBLASLt does not offer (an epilogue with these types) has no algorithm
    if (st == CUBLAS_STATUS_INVALID_VALUE || st == CUBLAS_STATUS_NOT_SUPPORTED)
        found = 0;
    else
        ZG_CUBLAS_CHECK(st);
    h.resize(size_t(found));
    return h;
}

cublasStatus_t Plan::launch(const Gemm& g, const cublasLtMatmulAlgo_t& algo,
                            CUstream_st* stream) const {
    Context& ctx = context();
    return cublasLtMatmul(ctx.handle, op, &g.alpha, g.B, la, g.A, lb, &g.beta, g.C ? g.C : g.D, ld,
                          g.D, ld, &algo, workspace(stream), kWorkspaceBytes, stream);
}

const std::vector<cublasLtMatmulHeuristicResult_t>& candidate_list(const Plan& plan) {
    auto& c = context().candidates;
    auto it = c.find(plan.key);
    if (it == c.end()) it = c.emplace(plan.key, plan.heuristic(kMaxCandidates)).first;
    return it->second;
}

// The fastest of the first g.search candidates for g's shape, timed on the device alone (the
// device is synchronised first: this runs once per shape). Every candidate runs once to warm up
// and once more to size the samples: a sample is as many back-to-back runs (the same count for
// every candidate, at most 64) as take the fastest candidate about kSampleMs. Then kRounds rounds
// each time one sample of every candidate, the order reversed every other round; a candidate's
// time is its median sample. Why interleave: the GPU heats up and slows down under the search,
// as it does in the step (which runs at its power cap), so timing the candidates one after
// another gives the early ones a cooler GPU's clock; with three single runs each, two runs with
// the same GEMM code took the LM head's logits GEMM in 6.29 and 7.41 ms a step. Candidate 0 (the
// heuristic's choice) is kept unless another is more than 2% faster, so that timing noise does
// not swap near-equal algorithms. A candidate cuBLASLt refuses to launch is left out. D is
// overwritten by the runs; when it is also the C that beta scales, it is saved first and restored.
int search_candidates(const Plan& plan, const Gemm& g, CUstream_st* stream) {
    constexpr int kRounds = 5, kMaxReps = 64;
    constexpr float kSampleMs = 1.0f;
    const auto& list = candidate_list(plan);
    const int n = std::min<int>(int(list.size()), g.search);
    if (n <= 1) return 0;
    ZG_CUDA_CHECK(cudaDeviceSynchronize());
    // D's span: M rows, ldd apart when a stride is given (what lies between the rows is saved
    // and restored with them)
    const size_t d_bytes =
        (size_t(g.M - 1) * size_t(g.ldd ? g.ldd : g.N) + size_t(g.N)) * dtype_bytes(g.d_type);
    void* saved = nullptr;
    if (g.beta != 0 && (!g.C || g.C == g.D)) {
        ZG_CUDA_CHECK(cudaMalloc(&saved, d_bytes));
        ZG_CUDA_CHECK(cudaMemcpyAsync(saved, g.D, d_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    cudaEvent_t e0, e1;
    ZG_CUDA_CHECK(cudaEventCreate(&e0));
    ZG_CUDA_CHECK(cudaEventCreate(&e1));
    // One sample of candidate i: `reps` runs back to back, ms per run; -1 if a launch was refused.
    const auto sample = [&](int i, int reps) {
        bool launched = true;
        ZG_CUDA_CHECK(cudaEventRecord(e0, stream));
        for (int r = 0; r < reps; r++)
            launched &= plan.launch(g, list[size_t(i)].algo, stream) == CUBLAS_STATUS_SUCCESS;
        ZG_CUDA_CHECK(cudaEventRecord(e1, stream));
        ZG_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        ZG_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return launched ? ms / float(reps) : -1.0f;
    };
    std::vector<bool> usable(static_cast<size_t>(n), false);
    float fastest = 0;
    for (int i = 0; i < n; i++) {
        // the first launch pays lazy set-up; the second sizes the samples
        if (plan.launch(g, list[size_t(i)].algo, stream) != CUBLAS_STATUS_SUCCESS) continue;
        const float once = sample(i, 1);
        if (once < 0) continue;
        usable[size_t(i)] = true;
        if (fastest == 0 || once < fastest) fastest = once;
    }
    const int reps = std::clamp(int(kSampleMs / std::max(fastest, 1e-3f)), 1, kMaxReps);
    std::vector<std::vector<float>> times(static_cast<size_t>(n));
    for (int round = 0; round < kRounds; round++)
        for (int j = 0; j < n; j++) {
            const int i = round % 2 ? n - 1 - j : j;
            if (!usable[size_t(i)]) continue;
            const float t = sample(i, reps);
            if (t < 0)
                usable[size_t(i)] = false;  // refused after all: not a candidate
            else
                times[size_t(i)].push_back(t);
        }
    ZG_CUDA_CHECK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    int best = -1;
    float best_ms = 0;
    for (int i = 0; i < n; i++) {
        if (!usable[size_t(i)]) continue;  // a usable candidate has kRounds samples
        auto& m = times[size_t(i)];
        std::nth_element(m.begin(), m.begin() + m.size() / 2, m.end());
        const float med = m[m.size() / 2];
        if (best < 0 || med < (best == 0 ? 0.98f : 1.0f) * best_ms) best = i, best_ms = med;
    }
    if (saved) {
        ZG_CUDA_CHECK(cudaMemcpyAsync(g.D, saved, d_bytes, cudaMemcpyDeviceToDevice, stream));
        ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
        ZG_CUDA_CHECK(cudaFree(saved));
    }
    return std::max(best, 0);
}

}  // namespace

bool try_gemm(const Gemm& g, CUstream_st* stream) {
    const Plan plan(g);
    Context& ctx = context();
    auto it = ctx.algos.find(plan.key);
    if (it == ctx.algos.end()) {
        if (g.search > 1) {
            const auto& list = candidate_list(plan);
            if (list.empty()) return false;
            const auto p = ctx.preset.find(plan.key);
            const int i = p != ctx.preset.end() && p->second < int(list.size())
                              ? p->second
                              : search_candidates(plan, g, stream);
            ctx.chosen[plan.key] = i;
            it = ctx.algos.emplace(plan.key, list[size_t(i)].algo).first;
        } else {
            const auto h = plan.heuristic(1);
            if (h.empty()) return false;
            it = ctx.algos.emplace(plan.key, h[0].algo).first;
        }
    }
    plan.run(g, it->second, stream);
    return true;
}

namespace {
// The first line of gemm_choices(): the candidate lists are cuBLASLt's for this version and GPU
std::string choices_context() {
    int dev = 0;
    cudaDeviceProp prop{};
    ZG_CUDA_CHECK(cudaGetDevice(&dev));
    ZG_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return "# cuBLASLt " + std::to_string(cublasLtGetVersion()) + ", " + prop.name + ", " +
           std::to_string(prop.multiProcessorCount) + " SMs";
}
}  // namespace

std::string gemm_choices() {
    // what this thread chose, and what it was given for shapes it has not run (yet): given
    // choices must survive a checkpoint taken on a rank that never runs their shapes
    std::map<AlgoKey, int> all = context().chosen;
    all.insert(context().preset.begin(), context().preset.end());  // chosen ones kept
    if (all.empty()) return "";
    std::string r = choices_context() + "\n";
    for (const auto& [k, i] : all) {
        const auto& [M, N, K, ta, tb, dt, abt, epi, al, search] = k;
        for (int64_t v : {M, N, K, int64_t(ta), int64_t(tb), int64_t(dt), int64_t(abt),
                          int64_t(epi), int64_t(al), int64_t(search), int64_t(i)})
            r += std::to_string(v) + " ";
        r.back() = '\n';
    }
    return r;
}

bool set_gemm_choices(const std::string& text) {
    Context& ctx = context();
    std::istringstream in(text);
    std::string line;
    if (!std::getline(in, line) || line != choices_context()) return false;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        std::istringstream f(line);
        int64_t v[11];
        for (int64_t& x : v)
            ZG_CHECK(bool(f >> x), "set_gemm_choices: a line of 11 integers expected: " + line);
        const AlgoKey key{v[0],      v[1],      v[2],      v[3] != 0,      v[4] != 0,
                          int(v[5]), int(v[6]), int(v[7]), uint32_t(v[8]), int(v[9])};
        ctx.preset[key] = int(v[10]);
        // a shape already run with another choice switches at its next use
        const auto c = ctx.chosen.find(key);
        if (c != ctx.chosen.end() && c->second != int(v[10])) {
            ctx.algos.erase(key);
            ctx.chosen.erase(c);
        }
    }
    return true;
}

namespace {

// "algo 66 tile 31 stages 20 splitk 1 ...": a configuration, for reports.
std::string config_name(const cublasLtMatmulAlgo_t& a) {
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
        size_t size = 0;  // the attribute's width (16, 32 or 64 bits), then its value
        cublasLtMatmulAlgoConfigGetAttribute(&a, attr, nullptr, 0, &size);
        unsigned char buf[8] = {};
        if (size == 0 || size > sizeof buf ||
            cublasLtMatmulAlgoConfigGetAttribute(&a, attr, buf, size, &size) !=
                CUBLAS_STATUS_SUCCESS)
            return std::string("?");
        uint64_t v = 0;
        for (size_t i = 0; i < size; i++) v |= uint64_t(buf[i]) << (8 * i);
        return std::to_string(v);
    };
    return "algo " + get(CUBLASLT_ALGO_CONFIG_ID) + " tile " + get(CUBLASLT_ALGO_CONFIG_TILE_ID) +
           " stages " + get(CUBLASLT_ALGO_CONFIG_STAGES_ID) + " splitk " +
           get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM) + " reduction " +
           get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) + " swizzle " +
           get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) + " custom " +
           get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) + " cluster " +
           get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
}

}  // namespace

int gemm_candidates(const Gemm& g) {
    return int(candidate_list(Plan(g)).size());
}

std::string gemm_candidate_name(const Gemm& g, int index) {
    const auto& h = candidate_list(Plan(g));
    ZG_CHECK(index >= 0 && index < int(h.size()), "gemm_candidate_name: no such candidate");
    char waves[32];
    std::snprintf(waves, sizeof waves, "%.2f", h[size_t(index)].wavesCount);
    return config_name(h[size_t(index)].algo) + " waves " + waves;
}

namespace {

// A capability of `algo` that is an array of 32-bit ids (tiles, stages), empty if none.
std::vector<uint32_t> cap_ids(const cublasLtMatmulAlgo_t& algo,
                              cublasLtMatmulAlgoCapAttributes_t a) {
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, a, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS ||
        bytes == 0)
        return {};
    std::vector<uint32_t> ids(bytes / 4);
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, a, ids.data(), bytes, &bytes) !=
        CUBLAS_STATUS_SUCCESS)
        return {};
    return ids;
}

const std::vector<cublasLtMatmulAlgo_t>& config_list(const Gemm& g, const Plan& plan) {
    Context& ctx = context();
    auto it = ctx.configs.find(plan.key);
    if (it != ctx.configs.end()) return it->second;
    const cudaDataType_t abt = cuda_type(g.ab_type), dt = cuda_type(g.d_type);
    std::vector<int> ids(256);
    int n = 0;
    ZG_CUBLAS_CHECK(cublasLtMatmulAlgoGetIds(ctx.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, abt, abt,
                                             dt, dt, int(ids.size()), ids.data(), &n));
    ids.resize(size_t(n));
    // clusters: cuBLASLt's own choice, one CTA, and pairs along either dimension
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1};
    std::vector<cublasLtMatmulAlgo_t> out;
    for (int id : ids) {
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(ctx.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, abt, abt, dt, dt, id,
                                   &algo) != CUBLAS_STATUS_SUCCESS)
            continue;
        std::vector<uint32_t> tiles = cap_ids(algo, CUBLASLT_ALGO_CAP_TILE_IDS),
                              stages = cap_ids(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
        if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
        if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
        const int32_t splitk = 1;
        for (uint32_t tile : tiles)
            for (uint32_t st : stages)
                for (uint16_t cl : clusters) {
                    cublasLtMatmulAlgo_t a = algo;
                    const bool set = cublasLtMatmulAlgoConfigSetAttribute(
                                         &a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) ==
                                         CUBLAS_STATUS_SUCCESS &&
                                     cublasLtMatmulAlgoConfigSetAttribute(
                                         &a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &st, sizeof st) ==
                                         CUBLAS_STATUS_SUCCESS &&
                                     cublasLtMatmulAlgoConfigSetAttribute(
                                         &a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof splitk) == CUBLAS_STATUS_SUCCESS;
                    if (!set) continue;
                    uint16_t c16 = cl;  // older algorithms have no cluster attribute: skip theirs
                    if (cl != CUBLASLT_CLUSTER_SHAPE_AUTO &&
                        cublasLtMatmulAlgoConfigSetAttribute(
                            &a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c16, sizeof c16) !=
                            CUBLAS_STATUS_SUCCESS)
                        continue;
                    cublasLtMatmulHeuristicResult_t r{};
                    if (cublasLtMatmulAlgoCheck(ctx.handle, plan.op, plan.la, plan.lb, plan.ld,
                                                plan.ld, &a, &r) == CUBLAS_STATUS_SUCCESS &&
                        r.workspaceSize <= kWorkspaceBytes)
                        out.push_back(a);
                }
    }
    return ctx.configs.emplace(plan.key, std::move(out)).first->second;
}

}  // namespace

int gemm_configs(const Gemm& g) {
    const Plan plan(g);
    return int(config_list(g, plan).size());
}

std::string gemm_config_name(const Gemm& g, int index) {
    const Plan plan(g);
    const auto& c = config_list(g, plan);
    ZG_CHECK(index >= 0 && index < int(c.size()), "gemm_config_name: no such configuration");
    return config_name(c[size_t(index)]);
}

bool try_gemm_config(const Gemm& g, int index, CUstream_st* stream) {
    const Plan plan(g);
    const auto& c = config_list(g, plan);
    if (index < 0 || index >= int(c.size())) return false;
    return plan.launch(g, c[size_t(index)], stream) == CUBLAS_STATUS_SUCCESS;
}

bool try_gemm_candidate(const Gemm& g, int index, CUstream_st* stream) {
    const Plan plan(g);
    const auto& h = candidate_list(plan);
    if (index < 0 || index >= int(h.size())) return false;
    plan.run(g, h[size_t(index)].algo, stream);
    return true;
}

void gemm_bf16(void* D, MatType d_type, const void* A, bool trans_a, const void* B, bool trans_b,
               int64_t M, int64_t N, int64_t K, float alpha, float beta, CUstream_st* stream,
               int search) {
    Gemm g;
    g.D = D;
    g.d_type = d_type;
    g.A = A;
    g.trans_a = trans_a;
    g.B = B;
    g.trans_b = trans_b;
    g.M = M;
    g.N = N;
    g.K = K;
    g.alpha = alpha;
    g.beta = beta;
    g.search = search;
    gemm(g, stream);
}

namespace {

constexpr int kBiasCols = 32, kBiasRowThreads = 8, kBiasRowChunks = 32;

// Block (32 columns x 8 row lanes) over one row chunk: a fixed reduction order.
template <typename T>
__global__ void bias_partial_kernel(float* part, const T* dout, int64_t N, int64_t OC) {
    __shared__ float shm[kBiasRowThreads][kBiasCols];
    const int64_t c = int64_t(blockIdx.x) * kBiasCols + threadIdx.x;
    const int64_t rows = (N + gridDim.y - 1) / gridDim.y;
    const int64_t r0 = blockIdx.y * rows, r1 = std::min<int64_t>(N, r0 + rows);
    float acc = 0;
    if (c < OC)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kBiasRowThreads)
            acc += to_f(dout[r * OC + c]);
    shm[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float s = 0;
        for (int k = 0; k < kBiasRowThreads; k++) s += shm[k][threadIdx.x];
        part[blockIdx.y * OC + c] = s;
    }
}

// bf16 rows with OC a multiple of 8: a lane owns 8 adjacent columns (one 16-byte load per row), a
// warp 256; the block's 8 row lanes are summed in shared memory in a fixed order. The rows are cut
// into as many chunks as make the grid one full wave (vec_bias_chunks).
__global__ void bias_partial_vec_kernel(float* part, const bf16* dout, int64_t N, int64_t OC) {
    __shared__ float shm[kBiasRowThreads][kBiasCols * 8];
    const int64_t c = (int64_t(blockIdx.x) * kBiasCols + threadIdx.x) * 8;
    const int64_t rows = (N + gridDim.y - 1) / gridDim.y;
    const int64_t r0 = blockIdx.y * rows, r1 = std::min<int64_t>(N, r0 + rows);
    float acc[8] = {};
    if (c < OC) {
        int64_t r = r0 + threadIdx.y;
        for (; r + kBiasRowThreads < r1; r += 2 * kBiasRowThreads) {  // two loads in flight
            const uint4 u0 = ld16(dout + r * OC + c),
                        u1 = ld16(dout + (r + kBiasRowThreads) * OC + c);
            float v0[8], v1[8];
            unpack8(u0, v0);
            unpack8(u1, v1);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += v0[k] + v1[k];
        }
        if (r < r1) {
            float v[8];
            unpack8(ld16(dout + r * OC + c), v);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += v[k];
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) shm[threadIdx.y][threadIdx.x * 8 + k] = acc[k];
    __syncthreads();
    for (int i = threadIdx.y * kBiasCols + threadIdx.x; i < kBiasCols * 8;
         i += kBiasCols * kBiasRowThreads) {
        const int64_t col = int64_t(blockIdx.x) * kBiasCols * 8 + i;
        if (col >= OC) continue;
        float s = 0;
        for (int k = 0; k < kBiasRowThreads; k++) s += shm[k][i];
        part[blockIdx.y * OC + col] = s;
    }
}

// Blocks of bias_partial_vec_kernel resident on the GPU at once.
int vec_bias_wave() {
    static const int wave =
        std::max(1, resident_blocks(bias_partial_vec_kernel, kBiasCols * kBiasRowThreads));
    return wave;
}

// Row chunks for the vectorised column sums: the grid (column blocks x chunks) fills one wave.
// With a fixed 128 chunks it was 1.09 waves for OC = 2304 and 1.45 for 3072, so the second wave
// ran nearly empty. At least 16 rows per chunk. chunks x OC <= wave x 256 floats of scratch.
int vec_bias_chunks(int64_t N, int64_t OC) {
    const int64_t col_blocks = (OC / 8 + kBiasCols - 1) / kBiasCols;
    const int64_t by_rows = (N + 2 * kBiasRowThreads - 1) / (2 * kBiasRowThreads);
    return int(std::max<int64_t>(1, std::min<int64_t>(vec_bias_wave() / col_blocks, by_rows)));
}

template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t N, int64_t OC) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * OC; i += stride)
        out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % OC]));
}

}  // namespace

void add_bias(void* out, const void* bias, int64_t N, int64_t OC, DType t, CUstream_st* stream) {
    ZG_DISPATCH(t, T,
                add_bias_kernel<T><<<grid_for(N * OC, 256, 1 << 20), 256, 0, stream>>>(
                    static_cast<T*>(out), static_cast<const T*>(bias), N, OC));
    ZG_LAUNCH_CHECK();
}

size_t bias_backward_scratch_bytes(int64_t /*N*/, int64_t OC) {
    // vec_bias_chunks' bound holds for every OC, so one scratch serves all layers
    return std::max(size_t(kBiasRowChunks) * OC, size_t(vec_bias_wave()) * kBiasCols * 8) *
           sizeof(float);
}

void bias_backward(float* dbias, const void* dout, int64_t N, int64_t OC, DType t, void* scratch,
                   CUstream_st* stream) {
    ZG_CHECK(N > 0 && OC > 0 && dbias && scratch, "bias_backward: bad arguments");
    auto* part = static_cast<float*>(scratch);
    if (t == DType::bf16 && OC % 8 == 0 && is_aligned(dout)) {
        const int chunks = vec_bias_chunks(N, OC);
        const dim3 grid(unsigned((OC / 8 + kBiasCols - 1) / kBiasCols), unsigned(chunks));
        bias_partial_vec_kernel<<<grid, dim3(kBiasCols, kBiasRowThreads), 0, stream>>>(
            part, static_cast<const bf16*>(dout), N, OC);
        ZG_LAUNCH_CHECK();
        add_partial_column_sums(dbias, part, nullptr, nullptr, chunks, OC, stream);
        return;
    }
    const dim3 grid(unsigned((OC + kBiasCols - 1) / kBiasCols), kBiasRowChunks);
    const dim3 block(kBiasCols, kBiasRowThreads);
    ZG_DISPATCH(t, T,
                bias_partial_kernel<T>
                <<<grid, block, 0, stream>>>(part, static_cast<const T*>(dout), N, OC));
    ZG_LAUNCH_CHECK();
    add_partial_column_sums(dbias, part, nullptr, nullptr, kBiasRowChunks, OC, stream);
}

namespace {
// VEC: rows of whole, 16-byte aligned float4s (K and ldp multiples of 4), 4 columns a load.
// Without `add` the outputs are written, not read (the step's first pass over a fresh gradient).
template <bool VEC>
__global__ void add_weight_and_bias_grad_kernel(float* dW, float* dbias, const float* P, int64_t K,
                                                int64_t ldp, bool add) {
    const int64_t n = blockIdx.x;  // one row a block
    if constexpr (VEC) {
        float4* w = reinterpret_cast<float4*>(dW + n * K);
        const float4* p = reinterpret_cast<const float4*>(P + n * ldp);
        for (int64_t k = threadIdx.x; k < K / 4; k += blockDim.x) {
            float4 a = add ? w[k] : make_float4(0, 0, 0, 0);
            const float4 b = p[k];
            a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
            w[k] = a;
        }
    } else {
        for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
            dW[n * K + k] = (add ? dW[n * K + k] : 0.0f) + P[n * ldp + k];
    }
    if (threadIdx.x == 0) dbias[n] = (add ? dbias[n] : 0.0f) + P[n * ldp + K];
}
}  // namespace

void add_weight_and_bias_grad(float* dW, float* dbias, const float* P, int64_t N, int64_t K,
                              int64_t ldp, CUstream_st* stream, bool add) {
    ZG_CHECK(dW && dbias && P && N > 0 && N <= INT32_MAX && K > 0 && ldp > K,
             "add_weight_and_bias_grad: bad arguments");
    const bool vec = K % 4 == 0 && ldp % 4 == 0 && reinterpret_cast<uintptr_t>(dW) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(P) % 16 == 0;
    if (vec)
        add_weight_and_bias_grad_kernel<true>
            <<<unsigned(N), 128, 0, stream>>>(dW, dbias, P, K, ldp, add);
    else
        add_weight_and_bias_grad_kernel<false>
            <<<unsigned(N), 256, 0, stream>>>(dW, dbias, P, K, ldp, add);
    ZG_LAUNCH_CHECK();
}

void bias_backward_from_partials(float* dbias, const float* parts, int64_t rows, int64_t OC,
                                 CUstream_st* stream) {
    ZG_CHECK(dbias && parts && rows > 0 && rows <= INT32_MAX && OC > 0,
             "bias_backward_from_partials: bad arguments");
    add_partial_column_sums(dbias, parts, nullptr, nullptr, int(rows), OC, stream);
}

}  // namespace zgpt::cuda

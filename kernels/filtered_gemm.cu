// The filtered GEMM (kernels/filtered_gemm.h): mma.sync tensor cores (m16n8k16, bf16 in, fp32
// accumulators), a ring of cp.async stages, and a skip per warp and k16 step.
//
// Tiles: a CTA of 8 warps computes a 128 x 128 block of D over k steps of 32; warp (wm, wn) owns
// rows wm * 64 .. + 64 and columns wn * 32 .. + 32 (4 x 4 products of 16 x 8 per k16 step).
// Shared-memory rows are padded by 8 values so that ldmatrix reads no bank twice. A comes in as
// [m][k] (ldmatrix) or, transposed in memory, as [k][m] (ldmatrix.trans gives the same
// fragments); B as [k][n] (ldmatrix.trans).
//
// The skip: once a warp holds its A fragments of a k16 step (64 rows x 16 k), it compares every
// |value| with the threshold (bf16 bit patterns of non-negative values order like the values,
// so two halves compare at once as unsigned integers); if all 32 lanes find theirs below it, the
// warp neither reads its B fragments nor issues its 16 products. The decision depends on the
// data only, and each output is summed in k order by one thread: deterministic.
#include "kernels/filtered_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <mutex>

#include "kernels/check.h"
#include "kernels/cuda_check.h"

namespace zgpt::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4, kThreads = 256;
constexpr int kLdA = kBK + 8;   // A stored [m][k]
constexpr int kLdAT = kBM + 8;  // A stored [k][m]
constexpr int kLdB = kBN + 8;   // B stored [k][n]
constexpr int kAStage = kBM * kLdA > kBK* kLdAT ? kBM* kLdA : kBK* kLdAT;
constexpr int kBStage = kBK * kLdB;
constexpr int kSmemBytes = kStages * (kAStage + kBStage) * int(sizeof(bf16));

struct Params {
    const bf16* A;
    const bf16* B;
    void* D;
    int64_t lda, ldb, ldd, M, N, K;
    int64_t Ma, Ka;  // M and K rounded up to 8: how far a 16-byte piece of A may reach
    const float* threshold;
    bool d_fp32;
    float beta;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void copy16(bf16* dst, const bf16* src, bool in) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(in ? 16 : 0));
}
__device__ __forceinline__ void commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One k step's A and B tiles into stage buffers; pieces past the operands are zero-filled.
template <bool kAT>
__device__ __forceinline__ void load_stage(bf16* As, bf16* Bs, const Params& p, int64_t m0,
                                           int64_t n0, int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; i++) {  // 512 pieces of 16 bytes per operand, 2 per thread
        const int c = threadIdx.x + i * kThreads;
        if (!kAT) {  // [m][k]: 128 rows of 4 pieces
            const int r = c / 4, kc = c % 4 * 8;
            const int64_t m = m0 + r, k = k0 + kc;
            const bool in = m < p.M && k < p.Ka;
            copy16(As + r * kLdA + kc, in ? p.A + m * p.lda + k : p.A, in);
        } else {  // [k][m]: 32 rows of 16 pieces
            const int r = c / 16, mc = c % 16 * 8;
            const int64_t k = k0 + r, m = m0 + mc;
            const bool in = k < p.K && m < p.Ma;
            copy16(As + r * kLdAT + mc, in ? p.A + k * p.lda + m : p.A, in);
        }
        const int r = c / 16, nc = c % 16 * 8;
        const int64_t k = k0 + r, n = n0 + nc;
        const bool in = k < p.K && n < p.N;
        copy16(Bs + r * kLdB + nc, in ? p.B + k * p.ldb + n : p.B, in);
    }
}

template <bool kAT>
__global__ void __launch_bounds__(kThreads) filtered_gemm_kernel(const Params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* As = reinterpret_cast<bf16*>(smem);
    bf16* Bs = As + kStages * kAStage;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
    const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
    // the threshold as bf16 bits in both halves, rounded toward zero: a skipped value is below
    // the float threshold too
    const uint32_t tb = __bfloat16_as_ushort(__float2bfloat16_rz(*p.threshold));
    const uint32_t thr2 = tb | (tb << 16);

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    const int64_t KT = (p.K + kBK - 1) / kBK;
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < KT) load_stage<kAT>(As + s * kAStage, Bs + s * kBStage, p, m0, n0, s * kBK);
        commit();
    }
    for (int64_t kt = 0; kt < KT; kt++) {
        wait_group<kStages - 2>();  // step kt's copies are in
        __syncthreads();            // and every warp is done with step kt - 1's stage
        const int64_t nk = kt + kStages - 1;
        if (nk < KT) {
            const int s = int(nk % kStages);
            load_stage<kAT>(As + s * kAStage, Bs + s * kBStage, p, m0, n0, nk * kBK);
        }
        commit();
        const int s = int(kt % kStages);
        const bf16* a_s = As + s * kAStage;
        const bf16* b_s = Bs + s * kBStage;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            uint32_t a[4][4];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const int mr = wm * 64 + mt * 16;
                if (!kAT)
                    ldmatrix_x4(a[mt], a_s + (mr + lane % 8 + (lane / 8) % 2 * 8) * kLdA + kk +
                                           lane / 16 * 8);
                else
                    ldmatrix_x4_trans(a[mt], a_s + (kk + lane / 16 * 8 + lane % 8) * kLdAT + mr +
                                                 (lane / 8) % 2 * 8);
            }
            uint32_t small = 0xffffffffu;
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++) small &= __vcmpltu2(a[mt][j] & 0x7fff7fffu, thr2);
            if (__all_sync(0xffffffffu, small == 0xffffffffu)) continue;
            uint32_t b[2][4];
#pragma unroll
            for (int np = 0; np < 2; np++)
                ldmatrix_x4_trans(
                    b[np], b_s + (kk + lane % 16) * kLdB + wn * 32 + np * 16 + lane / 16 * 8);
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    mma(acc[mt][nt], a[mt], b[nt / 2][nt % 2 * 2], b[nt / 2][nt % 2 * 2 + 1]);
        }
    }
    wait_group<0>();

    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t m = m0 + wm * 64 + mt * 16 + g + h * 8;
                const int64_t n = n0 + wn * 32 + nt * 8 + c * 2;
                if (m >= p.M || n >= p.N) continue;  // N % 8 == 0: n + 1 < N too
                float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
                if (p.d_fp32) {
                    float2* d = reinterpret_cast<float2*>(static_cast<float*>(p.D) + m * p.ldd + n);
                    if (p.beta != 0.0f) {
                        const float2 o = *d;
                        v0 += o.x;
                        v1 += o.y;
                    }
                    *d = make_float2(v0, v1);
                } else {
                    *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.D) + m * p.ldd + n) =
                        __floats2bfloat162_rn(v0, v1);
                }
            }
}

__global__ void threshold_kernel(float* out, const float* g, int64_t n, float eps) {
    __shared__ float red[32];
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(g[i]));
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x / 32); w++) m = fmaxf(m, red[w]);
        *out = eps * m;
    }
}

bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

bool device_has_mma_bf16() {
    static const bool ok = [] {
        int dev = 0, major = 0;
        return cudaGetDevice(&dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                   cudaSuccess &&
               major >= 8;
    }();
    return ok;
}

}  // namespace

bool filtered_gemm_usable(const FilteredGemm& g) {
    return g.A && g.B && g.D && g.threshold && g.M > 0 && g.N > 0 && g.K > 0 && g.lda % 8 == 0 &&
           g.ldb % 8 == 0 && g.ldd % 8 == 0 && g.N % 8 == 0 && g.ldb >= g.N && g.ldd >= g.N &&
           g.lda >= (g.a_transposed ? g.M : g.K) && aligned16(g.A) && aligned16(g.B) &&
           aligned16(g.D) && (g.d_fp32 || g.beta == 0.0f) && (g.M + kBM - 1) / kBM < INT32_MAX &&
           device_has_mma_bf16();
}

void filtered_gemm(const FilteredGemm& g, CUstream_st* stream) {
    ZG_CHECK(filtered_gemm_usable(g),
             "filtered_gemm: needs lda, ldb, ldd and N multiples of 8, 16-byte aligned operands, "
             "bf16 D only with beta 0, and a device of compute capability 8.0 or more");
    static std::once_flag once;
    std::call_once(once, [] {
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            filtered_gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
        ZG_CUDA_CHECK(cudaFuncSetAttribute(
            filtered_gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    });
    Params p;
    p.A = static_cast<const bf16*>(g.A);
    p.B = static_cast<const bf16*>(g.B);
    p.D = g.D;
    p.lda = g.lda;
    p.ldb = g.ldb;
    p.ldd = g.ldd;
    p.M = g.M;
    p.N = g.N;
    p.K = g.K;
    p.Ma = (g.M + 7) / 8 * 8;
    p.Ka = (g.K + 7) / 8 * 8;
    p.threshold = g.threshold;
    p.d_fp32 = g.d_fp32;
    p.beta = g.beta;
    const dim3 grid(unsigned((g.M + kBM - 1) / kBM), unsigned((g.N + kBN - 1) / kBN));
    if (g.a_transposed)
        filtered_gemm_kernel<true><<<grid, kThreads, kSmemBytes, stream>>>(p);
    else
        filtered_gemm_kernel<false><<<grid, kThreads, kSmemBytes, stream>>>(p);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void filter_threshold(float* threshold, const float* g, int64_t n, float eps, CUstream_st* stream) {
    ZG_CHECK(threshold && g && n > 0 && eps >= 0.0f,
             "filter_threshold: needs an output, n > 0 values and eps >= 0");
    threshold_kernel<<<1, 256, 0, stream>>>(threshold, g, n, eps);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zgpt::cuda

// The filtered GEMM (kernels/gemm/filtered_gemm.h): mma.sync tensor cores (m16n8k16, bf16 in, fp32
// accumulators), a ring of cp.async stages, and each CTA's list of the k steps it runs.
//
// Tiles: a CTA of 8 warps computes a 128 x 128 block of D over k steps of 32 (with filter_blocks'
// flags, only the k steps whose piece of A holds a value above the threshold); warp (wm, wn) owns
// rows wm * 64 .. + 64 and columns wn * 32 .. + 32 (4 x 4 products of 16 x 8 per k16 step).
// Shared-memory rows are padded by 8 values so that ldmatrix reads no bank twice. A comes in as
// [m][k] (ldmatrix) or, transposed in memory, as [k][m] (ldmatrix.trans gives the same
// fragments); B as [k][n] (ldmatrix.trans).
//
// The skip: filter_blocks' flags say which 32 x 32 blocks of A hold a value at or above the
// threshold; before its main loop each CTA lists the k steps whose 128 x 32 piece of A holds such
// a block, and loads and multiplies only those. The list depends on the data only, and each output
// is summed in k order by one thread: deterministic. (A per-warp test of each 64 x 16 fragment was
// tried first: ncu showed its integer compares making the ALU the busiest pipe, 60%, while the
// products ran at a third of the rate; the CTA-level list costs one pass of warp 0 over the
// flags.)
#include "kernels/gemm/filtered_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <mutex>

#include "kernels/core/check.h"
#include "kernels/core/cuda_check.h"
#include "kernels/gemm/mma_sync.cuh"

namespace zgpt::cuda {

namespace {

using bf16 = __nv_bfloat16;
using namespace mma_sync;

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4, kThreads = 256;
constexpr int kLdA = kBK + 8;   // A stored [m][k]
constexpr int kLdAT = kBM + 8;  // A stored [k][m]
constexpr int kLdB = kBN + 8;   // B stored [k][n]
constexpr int kAStage = kBM * kLdA > kBK* kLdAT ? kBM* kLdA : kBK* kLdAT;
constexpr int kBStage = kBK * kLdB;
// The CTA's list of k steps to run (int16), built from filter_blocks' flags; a problem with more
// k steps (K above 262,144) runs them all, unfiltered.
constexpr int kMaxSteps = 8192;
constexpr int kSmemBytes =
    kStages * (kAStage + kBStage) * int(sizeof(bf16)) + kMaxSteps * int(sizeof(int16_t));

struct Params {
    const bf16* A;
    const bf16* B;
    void* D;
    int64_t lda, ldb, ldd, M, N, K;
    int64_t Ma, Ka;             // M and K rounded up to 8: how far a 16-byte piece of A may reach
    const unsigned char* keep;  // filter_blocks' flags of A's storage, or null
    int64_t keep_ld, keep_rows;
    bool d_fp32;
    float beta;
};

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
            cp_async16(As + r * kLdA + kc, in ? p.A + m * p.lda + k : p.A, in);
        } else {  // [k][m]: 32 rows of 16 pieces
            const int r = c / 16, mc = c % 16 * 8;
            const int64_t k = k0 + r, m = m0 + mc;
            const bool in = k < p.K && m < p.Ma;
            cp_async16(As + r * kLdAT + mc, in ? p.A + k * p.lda + m : p.A, in);
        }
        const int r = c / 16, nc = c % 16 * 8;
        const int64_t k = k0 + r, n = n0 + nc;
        const bool in = k < p.K && n < p.N;
        cp_async16(Bs + r * kLdB + nc, in ? p.B + k * p.ldb + n : p.B, in);
    }
}

template <bool kAT>
__global__ void __launch_bounds__(kThreads) filtered_gemm_kernel(const Params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* As = reinterpret_cast<bf16*>(smem);
    bf16* Bs = As + kStages * kAStage;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
    // column tiles fastest: the CTAs that share a row tile of A (N is the model width, a few
    // tiles) run together, so A crosses DRAM once
    const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    // The k steps this CTA runs: with the flags, those whose 128 x 32 piece of A holds a flagged
    // 32 x 32 block (rows m0 / 32 .. + 3 of A's blocks, k step kt one block), listed in order by
    // warp 0; without them, all.
    const int64_t KT = (p.K + kBK - 1) / kBK;
    const bool listed = p.keep && KT <= kMaxSteps;
    int16_t* steps = reinterpret_cast<int16_t*>(Bs + kStages * kBStage);
    __shared__ int n_listed;
    int64_t n_steps = KT;
    if (listed) {
        if (warp == 0) {
            int n = 0;
            const int64_t b0 = m0 / 32;
            for (int64_t base = 0; base < KT; base += 32) {
                const int64_t kt = base + lane;
                bool keep = false;
                if (kt < KT)
#pragma unroll
                    for (int i = 0; i < kBM / 32; i++) {
                        const int64_t b = b0 + i;
                        if (!kAT)
                            keep |= b < p.keep_rows && p.keep[b * p.keep_ld + kt];
                        else
                            keep |= b < p.keep_ld && p.keep[kt * p.keep_ld + b];
                    }
                const unsigned mask = __ballot_sync(0xffffffffu, keep);
                if (keep) steps[n + __popc(mask & ((1u << lane) - 1u))] = int16_t(kt);
                n += __popc(mask);
            }
            if (lane == 0) n_listed = n;
        }
        __syncthreads();
        n_steps = n_listed;
    }
    auto k0_of = [&](int64_t i) { return (listed ? int64_t(steps[i]) : i) * kBK; };
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < n_steps) load_stage<kAT>(As + s * kAStage, Bs + s * kBStage, p, m0, n0, k0_of(s));
        cp_async_commit();
    }
    for (int64_t kt = 0; kt < n_steps; kt++) {
        cp_async_wait<kStages - 2>();  // step kt's copies are in
        __syncthreads();               // and every warp is done with step kt - 1's stage
        const int64_t nk = kt + kStages - 1;
        if (nk < n_steps) {
            const int s = int(nk % kStages);
            load_stage<kAT>(As + s * kAStage, Bs + s * kBStage, p, m0, n0, k0_of(nk));
        }
        cp_async_commit();
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
    cp_async_wait<0>();

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

// One warp per 32 x 32 block of X: lane l reads row 32 rb + l's four 16-byte pieces.
__global__ void blocks_kernel(unsigned char* keep, const bf16* X, int64_t ldx, int64_t rows,
                              int64_t cols, int64_t n_rb, int64_t n_cb, const float* threshold) {
    const int lane = threadIdx.x % 32;
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (blk >= n_rb * n_cb) return;  // a whole warp
    const int64_t rb = blk / n_cb, cb = blk % n_cb, r = rb * 32 + lane;
    const uint32_t tb = __bfloat16_as_ushort(__float2bfloat16_rz(*threshold));
    const uint32_t thr2 = tb | (tb << 16);
    bool big = false;
    if (r < rows)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t c = cb * 32 + j * 8;
            if (c >= cols) break;
            const uint4 v = *reinterpret_cast<const uint4*>(X + r * ldx + c);
            const uint32_t small =
                __vcmpltu2(v.x & 0x7fff7fffu, thr2) & __vcmpltu2(v.y & 0x7fff7fffu, thr2) &
                __vcmpltu2(v.z & 0x7fff7fffu, thr2) & __vcmpltu2(v.w & 0x7fff7fffu, thr2);
            big |= small != 0xffffffffu;
        }
    const bool any = __any_sync(0xffffffffu, big);
    if (lane == 0) keep[blk] = any ? 1 : 0;
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
    return g.A && g.B && g.D && g.M > 0 && g.N > 0 && g.K > 0 && g.lda % 8 == 0 && g.ldb % 8 == 0 &&
           g.ldd % 8 == 0 && g.N % 8 == 0 && g.ldb >= g.N && g.ldd >= g.N &&
           g.lda >= (g.a_transposed ? g.M : g.K) && aligned16(g.A) && aligned16(g.B) &&
           aligned16(g.D) && (g.beta == 0.0f || (g.d_fp32 && g.beta == 1.0f)) &&
           (g.M + kBM - 1) / kBM < 65536 && (g.N + kBN - 1) / kBN < INT32_MAX &&
           device_has_mma_bf16();
}

void filtered_gemm(const FilteredGemm& g, CUstream_st* stream) {
    ZG_CHECK(filtered_gemm_usable(g),
             "filtered_gemm: needs lda, ldb, ldd and N multiples of 8, 16-byte aligned operands, "
             "beta 0 (or 1 with an fp32 D), and a device of compute capability 8.0 or more");
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
    p.keep = g.keep;
    // A's storage: [M][K] (blocks of rows of M, columns of K rounded up to 8) or [K][M]
    p.keep_ld = ((g.a_transposed ? p.Ma : p.Ka) + 31) / 32;
    p.keep_rows = ((g.a_transposed ? g.K : g.M) + 31) / 32;
    p.d_fp32 = g.d_fp32;
    p.beta = g.beta;
    const dim3 grid(unsigned((g.N + kBN - 1) / kBN), unsigned((g.M + kBM - 1) / kBM));
    if (g.a_transposed)
        filtered_gemm_kernel<true><<<grid, kThreads, kSmemBytes, stream>>>(p);
    else
        filtered_gemm_kernel<false><<<grid, kThreads, kSmemBytes, stream>>>(p);
    ZG_CUDA_CHECK(cudaGetLastError());
}

int64_t filter_blocks_bytes(int64_t rows, int64_t cols) {
    return (rows + 31) / 32 * ((cols + 31) / 32);
}

void filter_blocks(unsigned char* keep, const void* X, int64_t ldx, int64_t rows, int64_t cols,
                   const float* threshold, CUstream_st* stream) {
    ZG_CHECK(keep && X && threshold && rows > 0 && cols > 0 && cols % 8 == 0 && ldx >= cols &&
                 ldx % 8 == 0 && aligned16(X),
             "filter_blocks: needs a 16-byte aligned X, cols and ldx multiples of 8, ldx >= cols");
    const int64_t n_rb = (rows + 31) / 32, n_cb = (cols + 31) / 32, warps = 8;
    const int64_t grid = (n_rb * n_cb + warps - 1) / warps;
    ZG_CHECK(grid < INT32_MAX, "filter_blocks: too many blocks");
    blocks_kernel<<<unsigned(grid), 32 * warps, 0, stream>>>(keep, static_cast<const bf16*>(X), ldx,
                                                             rows, cols, n_rb, n_cb, threshold);
    ZG_CUDA_CHECK(cudaGetLastError());
}

void filter_threshold(float* threshold, const float* g, int64_t n, float eps, CUstream_st* stream) {
    ZG_CHECK(threshold && g && n > 0 && eps >= 0.0f,
             "filter_threshold: needs an output, n > 0 values and eps >= 0");
    threshold_kernel<<<1, 256, 0, stream>>>(threshold, g, n, eps);
    ZG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zgpt::cuda

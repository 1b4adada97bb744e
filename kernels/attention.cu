// Causal attention on the GPU.
//
// flash: one thread per query row, key/value tiles staged in shared memory and read by the whole
// block (broadcast); online softmax with one rescale per tile. Backward recomputes the
// probabilities from the saved lse: one kernel per key tile for dK/dV and one per query tile for
// dQ, so every output has exactly one writer (deterministic, no atomics). fp32 arithmetic for
// both storage types. bf16 with head size 64 runs the tensor-core kernels of namespace tc.
//
// naive: the textbook form with the [T, T] probabilities in memory, for ablation.
#include <cmath>

#include "kernels/attention.h"
#include "kernels/cuda_common.cuh"

namespace zgpt::cuda {

namespace {

constexpr int kBQ = 64, kBK = 32;

struct Geo {  // strides of one head inside qkv / out
    int64_t Tn, C, NH, hs;
    float scale;
};

Geo geometry(const AttentionShape& s) {
    const int64_t hs = s.C / s.NH;
    return {s.Tn, s.C, s.NH, hs, float(1.0 / std::sqrt(double(hs)))};
}

template <typename T>
__device__ __forceinline__ const T* q_row(const T* qkv, const Geo& g, int64_t b, int64_t h,
                                          int64_t t) {
    return qkv + (b * g.Tn + t) * 3 * g.C + h * g.hs;
}

// ---------------------------------------------------------------- flash forward
template <typename T, int HS>
__global__ void flash_forward_kernel(T* out, float* lse, const T* qkv, Geo g) {
    __shared__ float Ks[kBK][HS], Vs[kBK][HS];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(blockIdx.x) * kBQ, i = q0 + threadIdx.x;
    const int hs = int(g.hs);
    float q[HS], o[HS];
    const bool active = i < g.Tn;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = active && d < hs ? to_f(q_row(qkv, g, b, h, i)[d]) : 0.0f;
        o[d] = 0;
    }
    float m = -INFINITY, l = 0;
    const int64_t kend = min(g.Tn, q0 + kBQ);
    for (int64_t k0 = 0; k0 < kend; k0 += kBK) {
        __syncthreads();
        for (int e = threadIdx.x; e < kBK * HS; e += blockDim.x) {
            const int j = e / HS, d = e % HS;
            const bool in = k0 + j < g.Tn && d < hs;
            const T* kr = q_row(qkv, g, b, h, k0 + j) + g.C;
            Ks[j][d] = in ? to_f(kr[d]) : 0.0f;
            Vs[j][d] = in ? to_f(kr[g.C + d]) : 0.0f;
        }
        __syncthreads();
        if (!active || k0 > i) continue;
        float s[kBK];
        float mt = m;
#pragma unroll
        for (int j = 0; j < kBK; j++) {
            float acc = 0;
#pragma unroll
            for (int d = 0; d < HS; d++) acc += q[d] * Ks[j][d];
            s[j] = k0 + j <= i ? acc * g.scale : -INFINITY;
            mt = fmaxf(mt, s[j]);
        }
        const float corr = __expf(m - mt);
        l *= corr;
#pragma unroll
        for (int d = 0; d < HS; d++) o[d] *= corr;
#pragma unroll
        for (int j = 0; j < kBK; j++) {
            const float p = __expf(s[j] - mt);
            l += p;
#pragma unroll
            for (int d = 0; d < HS; d++) o[d] += p * Vs[j][d];
        }
        m = mt;
    }
    if (!active) return;
    T* y = out + (b * g.Tn + i) * g.C + h * g.hs;
    const float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) y[d] = from_f<T>(o[d] * inv);
    lse[bh * g.Tn + i] = m + logf(l);
}

// ---------------------------------------------------------------- flash backward
// Dsum[b, h, t] = sum_d dout * out: the softmax-backward term of each row.
template <typename T>
__global__ void row_dot_kernel(float* dsum, const T* dout, const T* out, int64_t B, Geo g) {
    const int64_t n = B * g.NH * g.Tn;
    for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
         r += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
        const int64_t off = (b * g.Tn + t) * g.C + h * g.hs;
        float acc = 0;
        for (int64_t d = 0; d < g.hs; d++) acc += to_f(dout[off + d]) * to_f(out[off + d]);
        dsum[r] = acc;
    }
}

constexpr int kBQ2 = 16;

// One thread per key row j: dK_j and dV_j summed over the query tiles in order.
template <typename T, int HS>
__global__ void flash_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                  const float* dsum, Geo g) {
    __shared__ float Qs[kBQ2][HS], dOs[kBQ2][HS], Ls[kBQ2], Ds[kBQ2];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t k0 = int64_t(blockIdx.x) * kBQ, j = k0 + threadIdx.x;
    const int hs = int(g.hs);
    const bool active = j < g.Tn;
    float k[HS], v[HS], dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        const T* kr = q_row(qkv, g, b, h, active ? j : 0) + g.C;
        k[d] = active && d < hs ? to_f(kr[d]) : 0.0f;
        v[d] = active && d < hs ? to_f(kr[g.C + d]) : 0.0f;
        dk[d] = dv[d] = 0;
    }
    for (int64_t i0 = k0; i0 < g.Tn; i0 += kBQ2) {
        __syncthreads();
        for (int e = threadIdx.x; e < kBQ2 * HS; e += blockDim.x) {
            const int r = e / HS, d = e % HS;
            const bool in = i0 + r < g.Tn && d < hs;
            Qs[r][d] = in ? to_f(q_row(qkv, g, b, h, i0 + r)[d]) : 0.0f;
            dOs[r][d] = in ? to_f(dout[(b * g.Tn + i0 + r) * g.C + h * g.hs + d]) : 0.0f;
        }
        for (int r = threadIdx.x; r < kBQ2; r += blockDim.x) {
            const bool in = i0 + r < g.Tn;
            Ls[r] = in ? lse[bh * g.Tn + i0 + r] : 0.0f;
            Ds[r] = in ? dsum[bh * g.Tn + i0 + r] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        for (int r = 0; r < kBQ2; r++) {
            const int64_t i = i0 + r;
            if (i < j || i >= g.Tn) continue;
            float s = 0, dp = 0;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                s += Qs[r][d] * k[d];
                dp += dOs[r][d] * v[d];
            }
            const float p = __expf(s * g.scale - Ls[r]);
            const float ds = p * (dp - Ds[r]) * g.scale;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                dv[d] += p * dOs[r][d];
                dk[d] += ds * Qs[r][d];
            }
        }
    }
    if (!active) return;
    T* dkr = dqkv + (b * g.Tn + j) * 3 * g.C + g.C + h * g.hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) {
            dkr[d] = from_f<T>(dk[d]);
            dkr[g.C + d] = from_f<T>(dv[d]);
        }
}

// One thread per query row i: dQ_i summed over the key tiles in order.
template <typename T, int HS>
__global__ void flash_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                const float* dsum, Geo g) {
    __shared__ float Ks[kBK][HS], Vs[kBK][HS];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(blockIdx.x) * kBQ, i = q0 + threadIdx.x;
    const int hs = int(g.hs);
    const bool active = i < g.Tn;
    float q[HS], dy[HS], dq[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = active && d < hs ? to_f(q_row(qkv, g, b, h, i)[d]) : 0.0f;
        dy[d] = active && d < hs ? to_f(dout[(b * g.Tn + i) * g.C + h * g.hs + d]) : 0.0f;
        dq[d] = 0;
    }
    const float L = active ? lse[bh * g.Tn + i] : 0.0f, D = active ? dsum[bh * g.Tn + i] : 0.0f;
    const int64_t kend = min(g.Tn, q0 + kBQ);
    for (int64_t k0 = 0; k0 < kend; k0 += kBK) {
        __syncthreads();
        for (int e = threadIdx.x; e < kBK * HS; e += blockDim.x) {
            const int jj = e / HS, d = e % HS;
            const bool in = k0 + jj < g.Tn && d < hs;
            const T* kr = q_row(qkv, g, b, h, k0 + jj) + g.C;
            Ks[jj][d] = in ? to_f(kr[d]) : 0.0f;
            Vs[jj][d] = in ? to_f(kr[g.C + d]) : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        for (int jj = 0; jj < kBK; jj++) {
            if (k0 + jj > i) break;
            float s = 0, dp = 0;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                s += q[d] * Ks[jj][d];
                dp += dy[d] * Vs[jj][d];
            }
            const float p = __expf(s * g.scale - L);
            const float ds = p * (dp - D) * g.scale;
#pragma unroll
            for (int d = 0; d < HS; d++) dq[d] += ds * Ks[jj][d];
        }
    }
    if (!active) return;
    T* dqr = dqkv + (b * g.Tn + i) * 3 * g.C + h * g.hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) dqr[d] = from_f<T>(dq[d]);
}

// ---------------------------------------------------------------- flash on tensor cores (bf16)
// FlashAttention-2's schedule with mma.sync m16n8k16 (bf16 in, fp32 accumulate): 4 warps per
// block, 16 query (or key) rows per warp, 64-wide tiles staged in shared memory (rows padded by
// 8 elements against bank conflicts). The S accumulator's register layout is exactly the A
// operand layout of the next product, so P (and dS) never leave registers. Backward: one kernel
// per key tile for dK/dV and one per query tile for dQ: every output has one writer.
namespace tc {

constexpr int kTile = 64, kThreads = 128;

__device__ __forceinline__ uint32_t ld32(const bf16* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Fragments come from shared memory through ldmatrix (each lane names one 16-byte row).
__device__ __forceinline__ uint32_t smem_addr(const bf16* p) {
    return uint32_t(__cvta_generic_to_shared(p));
}
// A fragment (16 x 16) of a row-major matrix at (r0, k0), row stride ld.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* m, int ld, int r0, int k0) {
    const int l = threadIdx.x % 32;
    const uint32_t p = smem_addr(m + (r0 + (l % 8) + ((l / 8) % 2) * 8) * ld + k0 + (l / 16) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(p));
}
// B fragment (16 x 8) at (k0, n0) from a matrix stored [n][k] (row stride ld).
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf16* m, int ld, int n0,
                                       int k0) {
    const int l = threadIdx.x % 16;
    const uint32_t p = smem_addr(m + (n0 + l % 8) * ld + k0 + (l / 8) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(b0), "=r"(b1)
                 : "r"(p));
}
// B fragment (16 x 8) at (k0, n0) from a matrix stored [k][n] (row stride ld): ldmatrix.trans,
// so V, Q, dO and K serve as right operands without a transposed copy.
__device__ __forceinline__ void load_bt(uint32_t& b0, uint32_t& b1, const bf16* m, int ld, int k0,
                                        int n0) {
    const int l = threadIdx.x % 16;
    const uint32_t p = smem_addr(m + (k0 + l) * ld + n0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(b0), "=r"(b1)
                 : "r"(p));
}
// An accumulator pair of n-tiles (2kk, 2kk+1) as the A fragment of the next product.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
    a[0] = pack(lo[0], lo[1]);
    a[1] = pack(lo[2], lo[3]);
    a[2] = pack(hi[0], hi[1]);
    a[3] = pack(hi[2], hi[3]);
}

// Stages rows [r0, r0 + 64) of one head's slice (rows of `stride` elements from base) into smem
// row-major (ld D + 8); rows past Tn are zero.
template <int D>
__device__ void stage(bf16* rows, const bf16* base, int64_t stride, int64_t r0, int64_t Tn) {
    constexpr int LD = D + 8, CH = D / 8;
    for (int c = threadIdx.x; c < kTile * CH; c += kThreads) {
        const int r = c / CH, col = (c % CH) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < Tn) v = *reinterpret_cast<const uint4*>(base + (r0 + r) * stride + col);
        if (rows) *reinterpret_cast<uint4*>(rows + r * LD + col) = v;
    }
}

// The same rows copied with cp.async (16 bytes each, rows past Tn zero-filled), so the next tile
// streams in while the current one is computed: the kernels below double-buffer K/V (forward,
// dQ) and Q/dO (dK/dV). Call commit() after issuing a tile's copies and wait_prev() before using
// the tile issued one commit earlier.
template <int D>
__device__ void stage_async(bf16* rows, const bf16* base, int64_t stride, int64_t r0, int64_t Tn) {
    constexpr int LD = D + 8, CH = D / 8;
    for (int c = threadIdx.x; c < kTile * CH; c += kThreads) {
        const int r = c / CH, col = (c % CH) * 8;
        const bool in = r0 + r < Tn;
        const bf16* src = in ? base + (r0 + r) * stride + col : base;
        asm volatile(
            "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(rows + r * LD + col)),
            "l"(src), "r"(in ? 16 : 0));
    }
}
__device__ __forceinline__ void commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void wait_prev() {
    asm volatile("cp.async.wait_group 1;\n" ::);
}
// The K and V tiles of keys [k0, k0 + 64) of one head (qkv rows from qbase, the head's q) into
// one buffer pair, as one cp.async group: what the forward and dQ kernels stream.
template <int D>
__device__ void stage_kv_async(bf16* Ks, bf16* Vs, const bf16* qbase, int64_t stride, int64_t k0,
                               Geo g) {
    stage_async<D>(Ks, qbase + g.C, stride, k0, g.Tn);
    stage_async<D>(Vs, qbase + 2 * g.C, stride, k0, g.Tn);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(bf16* out, float* lse, const bf16* qkv, Geo g) {
    constexpr int LD = D + 8;
    __shared__ __align__(16) bf16 Qs[kTile * LD], Ks[2][kTile * LD], Vs[2][kTile * LD];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTile;  // heaviest tiles first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
    const int64_t stride = 3 * g.C;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    stage<D>(Qs, qbase, stride, q0, g.Tn);
    __syncthreads();
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) load_a(qa[kk], Qs, LD, warp * 16, kk * 16);
    float o[D / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
    const int64_t row[2] = {q0 + warp * 16 + gq, q0 + warp * 16 + gq + 8};
    const int64_t tiles = q0 / kTile + 1;  // key tiles 0..q0 (q0 < Tn)
    stage_kv_async<D>(Ks[0], Vs[0], qbase, stride, 0, g);
    commit();
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t k0 = t * kTile;
        if (t + 1 < tiles)
            stage_kv_async<D>(Ks[(t + 1) & 1], Vs[(t + 1) & 1], qbase, stride, k0 + kTile, g);
        commit();
        wait_prev();
        __syncthreads();
        const bf16* Kt = Ks[t & 1];
        const bf16* Vt = Vs[t & 1];
        float s[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int n = 0; n < kTile / 8; n++) {
                uint32_t b0, b1;
                load_b(b0, b1, Kt, LD, n * 8, kk * 16);
                mma(s[n], qa[kk], b0, b1);
            }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = k0 + n * 8 + 2 * tq + (e & 1);
                const float v = key <= row[e >> 1] ? s[n][e] * g.scale : -INFINITY;
                s[n][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            corr[r] = __expf(m[r] - mn);
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = __expf(s[n][e] - m[e >> 1]);
                s[n][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[n][e] *= corr[e >> 1];
#pragma unroll
        for (int kk = 0; kk < kTile / 16; kk++) {
            uint32_t pa[4];
            acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                uint32_t b0, b1;
                load_bt(b0, b1, Vt, LD, kk * 16, n * 8);
                mma(o[n], pa, b0, b1);
            }
        }
        __syncthreads();  // this buffer is refilled two tiles on
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= g.Tn) continue;
        const float inv = 1.0f / l[r];
        bf16* y = out + (b * g.Tn + row[r]) * g.C + h * g.hs;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<uint32_t*>(y + n * 8 + 2 * tq) =
                pack(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (tq == 0) lse[bh * g.Tn + row[r]] = m[r] + logf(l[r]);
    }
}

// A fragments of 16 rows (r0..) of one head's slice straight from global memory.
template <int D>
__device__ void load_a_global(uint32_t (&a)[D / 16][4], const bf16* base, int64_t stride,
                              int64_t r0, int64_t Tn) {
    const int gq = (threadIdx.x % 32) >> 2, tq = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t r = r0 + gq + (j & 1) * 8;
            const int col = kk * 16 + (j >> 1) * 8 + 2 * tq;
            a[kk][j] = r < Tn ? ld32(base + r * stride + col) : 0u;
        }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dsum,
                Geo g) {
    constexpr int LD = D + 8;
    __shared__ __align__(16) bf16 Qs[2][kTile * LD], dOs[2][kTile * LD];
    __shared__ float Ls[2][kTile], Ds[2][kTile];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t k0 = int64_t(blockIdx.x) * kTile;  // early keys see the most queries: first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
    const int64_t stride = 3 * g.C;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
    uint32_t ka[D / 16][4], va[D / 16][4];
    load_a_global<D>(ka, qbase + g.C, stride, k0 + warp * 16, g.Tn);
    load_a_global<D>(va, qbase + 2 * g.C, stride, k0 + warp * 16, g.Tn);
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    const int64_t key[2] = {k0 + warp * 16 + gq, k0 + warp * 16 + gq + 8};
    auto issue = [&](int64_t i0, int buf) {
        stage_async<D>(Qs[buf], qbase, stride, i0, g.Tn);
        stage_async<D>(dOs[buf], obase, g.C, i0, g.Tn);
        for (int r = threadIdx.x; r < kTile; r += kThreads) {
            const bool in = i0 + r < g.Tn;
            Ls[buf][r] = in ? lse[bh * g.Tn + i0 + r] : INFINITY;  // rows past the end: P = 0
            Ds[buf][r] = in ? dsum[bh * g.Tn + i0 + r] : 0.0f;
        }
        commit();
    };
    issue(k0, 0);
    for (int64_t i0 = k0, t = 0; i0 < g.Tn; i0 += kTile, t++) {
        if (i0 + kTile < g.Tn)
            issue(i0 + kTile, (t + 1) & 1);
        else
            commit();  // an empty group keeps wait_prev() counting right
        wait_prev();
        __syncthreads();
        const bf16* Qt = Qs[t & 1];
        const bf16* dOt = dOs[t & 1];
        const float* Lt = Ls[t & 1];
        const float* Dt = Ds[t & 1];
        float p[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int n = 0; n < kTile / 8; n++) {
                uint32_t b0, b1;
                load_b(b0, b1, Qt, LD, n * 8, kk * 16);
                mma(p[n], ka[kk], b0, b1);
                load_b(b0, b1, dOt, LD, n * 8, kk * 16);
                mma(dp[n], va[kk], b0, b1);
            }
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = n * 8 + 2 * tq + (e & 1);
                const float pv = i0 + c >= key[e >> 1] ? __expf(p[n][e] * g.scale - Lt[c]) : 0.0f;
                p[n][e] = pv;
                dp[n][e] = pv * (dp[n][e] - Dt[c]);  // dS^T (unscaled)
            }
#pragma unroll
        for (int kk = 0; kk < kTile / 16; kk++) {
            uint32_t pa[4], sa[4];
            acc_to_a(pa, p[2 * kk], p[2 * kk + 1]);
            acc_to_a(sa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                uint32_t b0, b1;
                load_bt(b0, b1, dOt, LD, kk * 16, n * 8);
                mma(dv[n], pa, b0, b1);
                load_bt(b0, b1, Qt, LD, kk * 16, n * 8);
                mma(dk[n], sa, b0, b1);
            }
        }
        __syncthreads();  // this buffer is refilled two tiles on
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= g.Tn) continue;
        bf16* dkr = dqkv + (b * g.Tn + key[r]) * stride + g.C + h * g.hs;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<uint32_t*>(dkr + n * 8 + 2 * tq) =
                pack(dk[n][2 * r] * g.scale, dk[n][2 * r + 1] * g.scale);
            *reinterpret_cast<uint32_t*>(dkr + g.C + n * 8 + 2 * tq) =
                pack(dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                      const float* lse, const float* dsum, Geo g) {
    constexpr int LD = D + 8;
    __shared__ __align__(16) bf16 Ks[2][kTile * LD], Vs[2][kTile * LD];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
    const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTile;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
    const int64_t stride = 3 * g.C;
    const bf16* qbase = qkv + b * g.Tn * stride + h * g.hs;
    const bf16* obase = dout + b * g.Tn * g.C + h * g.hs;
    uint32_t qa[D / 16][4], oa[D / 16][4];
    load_a_global<D>(qa, qbase, stride, q0 + warp * 16, g.Tn);
    load_a_global<D>(oa, obase, g.C, q0 + warp * 16, g.Tn);
    const int64_t row[2] = {q0 + warp * 16 + gq, q0 + warp * 16 + gq + 8};
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        L[r] = row[r] < g.Tn ? lse[bh * g.Tn + row[r]] : INFINITY;
        Dr[r] = row[r] < g.Tn ? dsum[bh * g.Tn + row[r]] : 0.0f;
    }
    float dq[D / 8][4] = {};
    const int64_t tiles = q0 / kTile + 1;
    stage_kv_async<D>(Ks[0], Vs[0], qbase, stride, 0, g);
    commit();
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t k0 = t * kTile;
        if (t + 1 < tiles)
            stage_kv_async<D>(Ks[(t + 1) & 1], Vs[(t + 1) & 1], qbase, stride, k0 + kTile, g);
        commit();
        wait_prev();
        __syncthreads();
        const bf16* Kt = Ks[t & 1];
        const bf16* Vt = Vs[t & 1];
        float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int n = 0; n < kTile / 8; n++) {
                uint32_t b0, b1;
                load_b(b0, b1, Kt, LD, n * 8, kk * 16);
                mma(s[n], qa[kk], b0, b1);
                load_b(b0, b1, Vt, LD, n * 8, kk * 16);
                mma(dp[n], oa[kk], b0, b1);
            }
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = k0 + n * 8 + 2 * tq + (e & 1);
                const float pv = key <= row[e >> 1] ? __expf(s[n][e] * g.scale - L[e >> 1]) : 0.0f;
                s[n][e] = pv * (dp[n][e] - Dr[e >> 1]);  // dS (unscaled)
            }
#pragma unroll
        for (int kk = 0; kk < kTile / 16; kk++) {
            uint32_t sa[4];
            acc_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                uint32_t b0, b1;
                load_bt(b0, b1, Kt, LD, kk * 16, n * 8);
                mma(dq[n], sa, b0, b1);
            }
        }
        __syncthreads();  // this buffer is refilled two tiles on
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= g.Tn) continue;
        bf16* dqr = dqkv + (b * g.Tn + row[r]) * stride + h * g.hs;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<uint32_t*>(dqr + n * 8 + 2 * tq) =
                pack(dq[n][2 * r] * g.scale, dq[n][2 * r + 1] * g.scale);
    }
}

// Dsum for head size 64 in bf16: 8 lanes per row, 16-byte loads (coalesced, unlike one thread
// per row).
__global__ void row_dot64_kernel(float* dsum, const bf16* dout, const bf16* out, int64_t B, Geo g) {
    const int64_t n = B * g.NH * g.Tn;
    const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
    const int part = threadIdx.x % 8;
    float acc = 0;
    if (r < n) {
        const int64_t t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
        const int64_t off = (b * g.Tn + t) * g.C + h * 64 + part * 8;
        const uint4 x = *reinterpret_cast<const uint4*>(dout + off);
        const uint4 y = *reinterpret_cast<const uint4*>(out + off);
        const bf16* xe = reinterpret_cast<const bf16*>(&x);
        const bf16* ye = reinterpret_cast<const bf16*>(&y);
#pragma unroll
        for (int j = 0; j < 8; j++) acc += __bfloat162float(xe[j]) * __bfloat162float(ye[j]);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    if (r < n && part == 0) dsum[r] = acc;
}

// The tensor-core path covers bf16 with head size 64 and 16-byte aligned rows.
bool usable(const AttentionShape& s, DType t) {
    return t == DType::bf16 && s.C / s.NH == 64 && s.C % 8 == 0;
}

}  // namespace tc

template <typename F>
void with_head_size(int64_t hs, F&& f) {
    ZG_CHECK(hs >= 1 && hs <= 128,
             "attention: head size " + std::to_string(hs) + " is outside [1, 128]");
    if (hs <= 16)
        f(std::integral_constant<int, 16>{});
    else if (hs <= 32)
        f(std::integral_constant<int, 32>{});
    else if (hs <= 64)
        f(std::integral_constant<int, 64>{});
    else
        f(std::integral_constant<int, 128>{});
}

void check_shape(const AttentionShape& s) {
    ZG_CHECK(s.B > 0 && s.Tn > 0 && s.C > 0 && s.NH > 0 && s.C % s.NH == 0, "attention: bad shape");
    ZG_CHECK(s.B * s.NH <= 65535, "attention: B * n_head must be <= 65535");
}

size_t flash_saved_bytes(const AttentionShape& s) {
    return size_t(s.B * s.NH * s.Tn) * sizeof(float);
}
size_t flash_scratch_bytes(const AttentionShape& s) {
    return size_t(s.B * s.NH * s.Tn) * sizeof(float);
}

void flash_forward(void* out, void* saved, const void* qkv, const AttentionShape& s, DType t,
                   CUstream_st* st) {
    check_shape(s);
    const Geo g = geometry(s);
    const dim3 grid(unsigned((s.Tn + kBQ - 1) / kBQ), unsigned(s.B * s.NH));
    if (tc::usable(s, t)) {
        tc::forward_kernel<64><<<grid, tc::kThreads, 0, st>>>(
            static_cast<bf16*>(out), static_cast<float*>(saved), static_cast<const bf16*>(qkv), g);
        ZG_LAUNCH_CHECK();
        return;
    }
    with_head_size(g.hs, [&](auto HS) {
        ZG_DISPATCH(t, T,
                    flash_forward_kernel<T, HS.value>
                    <<<grid, kBQ, 0, st>>>(static_cast<T*>(out), static_cast<float*>(saved),
                                           static_cast<const T*>(qkv), g));
    });
    ZG_LAUNCH_CHECK();
}

void flash_backward(void* dqkv, const void* dout, const void* qkv, const void* out, void* saved,
                    void* scratch, const AttentionShape& s, DType t, CUstream_st* st) {
    check_shape(s);
    const Geo g = geometry(s);
    auto* dsum = static_cast<float*>(scratch);
    const auto* lse = static_cast<const float*>(saved);
    const dim3 grid(unsigned((s.Tn + kBQ - 1) / kBQ), unsigned(s.B * s.NH));
    if (tc::usable(s, t)) {
        const auto* dy = static_cast<const bf16*>(dout);
        const auto* x = static_cast<const bf16*>(qkv);
        auto* dx = static_cast<bf16*>(dqkv);
        tc::row_dot64_kernel<<<unsigned((s.B * s.NH * s.Tn * 8 + 255) / 256), 256, 0, st>>>(
            dsum, dy, static_cast<const bf16*>(out), s.B, g);
        tc::dkdv_kernel<64><<<grid, tc::kThreads, 0, st>>>(dx, dy, x, lse, dsum, g);
        tc::dq_kernel<64><<<grid, tc::kThreads, 0, st>>>(dx, dy, x, lse, dsum, g);
        ZG_LAUNCH_CHECK();
        return;
    }
    with_head_size(g.hs, [&](auto HS) {
        ZG_DISPATCH(t, T, {
            const auto* dy = static_cast<const T*>(dout);
            const auto* x = static_cast<const T*>(qkv);
            auto* dx = static_cast<T*>(dqkv);
            row_dot_kernel<T><<<grid_for(s.B * s.NH * s.Tn, 256), 256, 0, st>>>(
                dsum, dy, static_cast<const T*>(out), s.B, g);
            flash_dkdv_kernel<T, HS.value><<<grid, kBQ, 0, st>>>(dx, dy, x, lse, dsum, g);
            flash_dq_kernel<T, HS.value><<<grid, kBQ, 0, st>>>(dx, dy, x, lse, dsum, g);
        });
    });
    ZG_LAUNCH_CHECK();
}

// ---------------------------------------------------------------- naive
// One block per query row: scores into shared memory, softmax, probabilities saved, then out.
template <typename T>
__global__ void naive_forward_kernel(T* out, float* att, const T* qkv, Geo g) {
    extern __shared__ float row[];
    __shared__ float red[32];
    const int64_t r = blockIdx.x, t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
    const T* q = q_row(qkv, g, b, h, t);
    float mx = -INFINITY;
    for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const T* k = q_row(qkv, g, b, h, t2) + g.C;
        float acc = 0;
        for (int64_t d = 0; d < g.hs; d++) acc += to_f(q[d]) * to_f(k[d]);
        row[t2] = acc * g.scale;
        mx = fmaxf(mx, row[t2]);
    }
    // block max, then block sum (fixed tree: warp shuffles, then warp 0 over the warp results)
    mx = warp_max(mx);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : -INFINITY;
        v = warp_max(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    mx = red[0];
    __syncthreads();
    float sum = 0;
    for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        row[t2] = __expf(row[t2] - mx);
        sum += row[t2];
    }
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float inv = 1.0f / red[0];
    float* a = att + r * g.Tn;
    for (int64_t t2 = threadIdx.x; t2 < g.Tn; t2 += blockDim.x) {
        const float p = t2 <= t ? row[t2] * inv : 0.0f;
        if (t2 <= t) row[t2] = p;
        a[t2] = p;
    }
    __syncthreads();
    T* y = out + (b * g.Tn + t) * g.C + h * g.hs;
    for (int64_t d = threadIdx.x; d < g.hs; d += blockDim.x) {
        float acc = 0;
        for (int64_t t2 = 0; t2 <= t; t2++)
            acc += row[t2] * to_f(q_row(qkv, g, b, h, t2)[2 * g.C + d]);
        y[d] = from_f<T>(acc);
    }
}

// One block per key row t2: dV[t2] = sum_{t >= t2} att[t, t2] dout[t].
template <typename T>
__global__ void naive_dv_kernel(T* dqkv, const T* dout, const float* att, Geo g) {
    const int64_t r = blockIdx.x, t2 = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
    for (int64_t d = threadIdx.x; d < g.hs; d += blockDim.x) {
        float acc = 0;
        for (int64_t t = t2; t < g.Tn; t++)
            acc +=
                att[(bh * g.Tn + t) * g.Tn + t2] * to_f(dout[(b * g.Tn + t) * g.C + h * g.hs + d]);
        dqkv[(b * g.Tn + t2) * 3 * g.C + 2 * g.C + h * g.hs + d] = from_f<T>(acc);
    }
}

// One block per query row: dS = P (dP - sum P dP) scale, written over the probabilities; dQ.
template <typename T>
__global__ void naive_ds_dq_kernel(T* dqkv, const T* dout, const T* qkv, float* att, Geo g) {
    extern __shared__ float dp[];
    __shared__ float red[32];
    const int64_t r = blockIdx.x, t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
    const T* dy = dout + (b * g.Tn + t) * g.C + h * g.hs;
    float* a = att + r * g.Tn;
    float dot = 0;
    for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const T* v = q_row(qkv, g, b, h, t2) + 2 * g.C;
        float acc = 0;
        for (int64_t d = 0; d < g.hs; d++) acc += to_f(dy[d]) * to_f(v[d]);
        dp[t2] = acc;
        dot += acc * a[t2];
    }
    dot = warp_sum(dot);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = dot;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    dot = red[0];
    for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const float ds = a[t2] * (dp[t2] - dot) * g.scale;
        dp[t2] = ds;
        a[t2] = ds;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < g.hs; d += blockDim.x) {
        float acc = 0;
        for (int64_t t2 = 0; t2 <= t; t2++) acc += dp[t2] * to_f(q_row(qkv, g, b, h, t2)[g.C + d]);
        dqkv[(b * g.Tn + t) * 3 * g.C + h * g.hs + d] = from_f<T>(acc);
    }
}

// One block per key row t2: dK[t2] = sum_{t >= t2} dS[t, t2] q[t].
template <typename T>
__global__ void naive_dk_kernel(T* dqkv, const T* qkv, const float* ds, Geo g) {
    const int64_t r = blockIdx.x, t2 = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
    for (int64_t d = threadIdx.x; d < g.hs; d += blockDim.x) {
        float acc = 0;
        for (int64_t t = t2; t < g.Tn; t++)
            acc += ds[(bh * g.Tn + t) * g.Tn + t2] * to_f(q_row(qkv, g, b, h, t)[d]);
        dqkv[(b * g.Tn + t2) * 3 * g.C + g.C + h * g.hs + d] = from_f<T>(acc);
    }
}

size_t naive_saved_bytes(const AttentionShape& s) {
    return size_t(s.B * s.NH * s.Tn) * size_t(s.Tn) * sizeof(float);
}
size_t naive_scratch_bytes(const AttentionShape&) {
    return 0;
}

void naive_smem_check(const AttentionShape& s) {
    ZG_CHECK(s.Tn * 4 <= 48 * 1024, "naive attention: sequence length over 12288");
}

void naive_forward(void* out, void* saved, const void* qkv, const AttentionShape& s, DType t,
                   CUstream_st* st) {
    check_shape(s);
    naive_smem_check(s);
    const Geo g = geometry(s);
    const int64_t rows = s.B * s.NH * s.Tn;
    ZG_DISPATCH(
        t, T,
        naive_forward_kernel<T><<<unsigned(rows), 128, s.Tn * 4, st>>>(
            static_cast<T*>(out), static_cast<float*>(saved), static_cast<const T*>(qkv), g));
    ZG_LAUNCH_CHECK();
}

void naive_backward(void* dqkv, const void* dout, const void* qkv, const void*, void* saved, void*,
                    const AttentionShape& s, DType t, CUstream_st* st) {
    check_shape(s);
    naive_smem_check(s);
    const Geo g = geometry(s);
    const int64_t rows = s.B * s.NH * s.Tn;
    auto* att = static_cast<float*>(saved);
    ZG_DISPATCH(t, T, {
        auto* dx = static_cast<T*>(dqkv);
        const auto* dy = static_cast<const T*>(dout);
        const auto* x = static_cast<const T*>(qkv);
        naive_dv_kernel<T><<<unsigned(rows), 64, 0, st>>>(dx, dy, att, g);
        naive_ds_dq_kernel<T><<<unsigned(rows), 128, s.Tn * 4, st>>>(dx, dy, x, att, g);
        naive_dk_kernel<T><<<unsigned(rows), 64, 0, st>>>(dx, x, att, g);
    });
    ZG_LAUNCH_CHECK();
}

}  // namespace

const std::vector<AttentionVariant>& attention_variants() {
    static const std::vector<AttentionVariant> v = {
        {"flash", "online softmax over key tiles; lse saved, scores never stored",
         flash_saved_bytes, flash_scratch_bytes, flash_forward, flash_backward},
        {"naive", "T x T probabilities materialised (fp32) and saved for backward",
         naive_saved_bytes, naive_scratch_bytes, naive_forward, naive_backward},
    };
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

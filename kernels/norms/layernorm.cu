// LayerNorm on the GPU: one warp per row, fp32 statistics. The backward pass sums the weight
// gradients per warp in shared memory, per block into a scratch row, then over blocks in a fixed
// order, so results do not depend on scheduling.
//
// Types: activations (out, dout) are T; the residual stream (inp, res, a, dinp) is R. R = T, or
// bf16 activations over an fp32 residual stream (PyTorch autocast's layer_norm). The forward pass
// reads the fp32 master weights whatever R is, as autocast does: read as bf16, a weight near 1
// moves in steps of 2^-8 below 1 and 2^-7 above, so smaller updates would not reach the output
// until they add up (a lag the parity runs against PyTorch measured). The backward pass reads
// them in R.
#include <string>
#include <type_traits>

#include "kernels/core/column_sums.cuh"
#include "kernels/core/cuda_common.cuh"
#include "kernels/norms/layernorm.h"

namespace zgpt::cuda {

namespace {

constexpr int kWarps = 4;

__device__ __forceinline__ int64_t row_offset(RowMap m, int64_t r, int64_t C) {
    return (r / m.group) * m.ld + (r % m.group) * C;
}

// Mean and rstd of one row (whole warp), two passes over the row for a stable variance. RMS
// (RMSNorm): the mean is taken as 0, so rstd is 1 / sqrt(mean of squares + eps).
template <bool RMS, typename T>
__device__ void row_stats(const T* x, int64_t C, float eps, float& mean, float& rstd) {
    mean = 0;
    if (!RMS) {
        float s = 0;
        for (int64_t c = threadIdx.x % 32; c < C; c += 32) s += to_f(x[c]);
        mean = warp_sum(s) / float(C);
    }
    float v = 0;
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) {
        const float d = to_f(x[c]) - mean;
        v += d * d;
    }
    rstd = rsqrtf(warp_sum(v) / float(C) + eps);
}

template <typename T, typename R, bool RMS>
__global__ void layernorm_forward_kernel(T* out, RowMap out_map, float* mean, float* rstd,
                                         const R* inp, RowMap in_map, const float* w,
                                         const float* b, int64_t N, int64_t C, float eps) {
    const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= N) return;
    const R* x = inp + row_offset(in_map, r, C);
    T* y = out + row_offset(out_map, r, C);
    float m, rs;
    row_stats<RMS>(x, C, eps, m, rs);
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) {
        const float n = (to_f(x[c]) - m) * rs;
        y[c] = from_f<T>(n * to_f(w[c]) + (b ? to_f(b[c]) : 0.0f));
    }
    if (threadIdx.x % 32 == 0) {
        if (!RMS) mean[r] = m;
        rstd[r] = rs;
    }
}

template <typename T, typename R, bool RMS>
__global__ void residual_layernorm_forward_kernel(R* res, T* out, float* mean, float* rstd,
                                                  const R* a, const T* bb, const float* w,
                                                  const float* b, int64_t N, int64_t C,
                                                  int64_t out_ld, float eps) {
    const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= N) return;
    R* x = res + r * C;
    for (int64_t c = threadIdx.x % 32; c < C; c += 32)
        x[c] = from_f<R>(to_f(a[r * C + c]) + to_f(bb[r * C + c]));
    __syncwarp();
    float m, rs;
    row_stats<RMS>(x, C, eps, m, rs);
    for (int64_t c = threadIdx.x % 32; c < C; c += 32) {
        const float n = (to_f(x[c]) - m) * rs;
        out[r * out_ld + c] = from_f<T>(n * to_f(w[c]) + (b ? to_f(b[c]) : 0.0f));
    }
    if (threadIdx.x % 32 == 0) {
        if (!RMS) mean[r] = m;
        rstd[r] = rs;
    }
}

int backward_blocks(int64_t N) {
    return int(std::min<int64_t>((N + kWarps - 1) / kWarps, 256));
}

// Rows r = warp_global, warp_global + stride, ...: each warp owns a fixed set of rows. RMS: the
// mean is 0 and the gradient has no mean term (RMSNorm's backward).
template <typename T, typename R, bool RMS>
__global__ void layernorm_backward_kernel(R* dinp, RowMap dinp_map, bool accumulate, float* part_w,
                                          float* part_b, float* part_d, const T* dout,
                                          RowMap dout_map, const R* inp, RowMap in_map, const R* w,
                                          const float* mean, const float* rstd, int64_t N,
                                          int64_t C) {
    extern __shared__ float smem[];  // [kWarps][C] dw, [kWarps][C] db, [kWarps][C] dinp sums
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* sw = smem + warp * C;
    float* sb = smem + (kWarps + warp) * C;
    float* sd = part_d ? smem + (2 * kWarps + warp) * C : nullptr;
    for (int64_t c = lane; c < C; c += 32) {
        sw[c] = sb[c] = 0;
        if (sd) sd[c] = 0;
    }
    const int64_t stride = int64_t(gridDim.x) * kWarps;
    for (int64_t r = int64_t(blockIdx.x) * kWarps + warp; r < N; r += stride) {
        const T* dy = dout + row_offset(dout_map, r, C);
        const R* x = inp + row_offset(in_map, r, C);
        R* dx = dinp + row_offset(dinp_map, r, C);
        const float m = RMS ? 0.0f : mean[r], rs = rstd[r];
        float s1 = 0, s2 = 0;  // mean of dy*w and of dy*w*xhat
        for (int64_t c = lane; c < C; c += 32) {
            const float g = to_f(dy[c]), xh = (to_f(x[c]) - m) * rs, gw = g * to_f(w[c]);
            if (!RMS) s1 += gw;
            s2 += gw * xh;
            sw[c] += g * xh;
            sb[c] += g;
        }
        s1 = warp_sum(s1) / float(C);
        s2 = warp_sum(s2) / float(C);
        for (int64_t c = lane; c < C; c += 32) {
            const float xh = (to_f(x[c]) - m) * rs;
            float d = rs * (to_f(dy[c]) * to_f(w[c]) - s1 - xh * s2);
            if (accumulate) d += to_f(dx[c]);
            dx[c] = from_f<R>(d);
            if (sd) sd[c] += to_f(from_f<T>(from_f<R>(d)));  // as the matmuls read it
        }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float aw = 0, ab = 0, ad = 0;
        for (int k = 0; k < kWarps; k++) {
            aw += smem[k * C + c];
            ab += smem[(kWarps + k) * C + c];
            if (part_d) ad += smem[(2 * kWarps + k) * C + c];
        }
        part_w[blockIdx.x * C + c] = aw;
        part_b[blockIdx.x * C + c] = ab;
        if (part_d) part_d[blockIdx.x * C + c] = ad;
    }
}

// The bf16 fast paths for plain rows with C a multiple of 8 up to 2048: one warp per row, each
// lane owns 8 adjacent columns per 256 (16-byte loads and stores) and keeps them in registers.
// NV = ceil(C / 256) chunks; where C is not a multiple of 256 (GPT-2 1558M's 1600) the last chunk
// is partly empty: its dead lanes load zeros and store nothing (`live`).
// The residual stream and weights (R) may be fp32: 8 of them are two 16-byte words.
constexpr int kVecWarps = 4, kVecMaxBlocks = 1056;

// Whether this lane's 8 columns of chunk j lie inside the row (only the last chunk can end early).
template <int NV>
__device__ __forceinline__ bool live(int j, int lane, int C) {
    return j < NV - 1 || j * 256 + lane * 8 < C;
}

using cuda::unpack8;  // the uint4 form, beside the Pack8 overloads below
template <typename R>
struct Pack8;  // 8 values of type R as loaded, unpacked to fp32 when used
template <>
struct Pack8<bf16> {
    uint4 u;
};
template <>
struct Pack8<float> {
    float4 lo, hi;
};
__device__ __forceinline__ Pack8<bf16> load8(const bf16* p) {
    return {ld16(p)};
}
__device__ __forceinline__ Pack8<float> load8(const float* p) {
    const float4* q = reinterpret_cast<const float4*>(p);
    return {q[0], q[1]};
}
__device__ __forceinline__ void unpack8(const Pack8<bf16>& p, float (&v)[8]) {
    unpack8(p.u, v);
}
__device__ __forceinline__ void unpack8(const Pack8<float>& p, float (&v)[8]) {
    v[0] = p.lo.x, v[1] = p.lo.y, v[2] = p.lo.z, v[3] = p.lo.w;
    v[4] = p.hi.x, v[5] = p.hi.y, v[6] = p.hi.z, v[7] = p.hi.w;
}
__device__ __forceinline__ void store8(bf16* p, const float (&v)[8]) {
    *reinterpret_cast<uint4*>(p) = pack8(v);
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
    float4* q = reinterpret_cast<float4*>(p);
    q[0] = make_float4(v[0], v[1], v[2], v[3]);
    q[1] = make_float4(v[4], v[5], v[6], v[7]);
}
// 8 values as R packs them (bf16: rounded; exact for values that are already bf16)
template <typename R>
__device__ __forceinline__ Pack8<R> pack_as(const float (&v)[8]) {
    if constexpr (std::is_same_v<R, bf16>)
        return {pack8(v)};
    else
        return {make_float4(v[0], v[1], v[2], v[3]), make_float4(v[4], v[5], v[6], v[7])};
}

// Forward, optionally with the residual add fused (res = a + b rounded to bf16 as stored, then the
// statistics of the stored values, as the scalar kernels compute them). Two-pass variance. The row
// stays in registers as loaded (R, packed: at bf16 half the registers of fp32) and is unpacked
// again in each pass, so that more rows are in flight an SM for this memory-bound kernel.
template <int NV, bool RESIDUAL, typename R, bool RMS>
__global__ void __launch_bounds__(32 * kVecWarps)
    layernorm_forward_vec_kernel(R* res, bf16* out, int64_t out_ld, float* mean, float* rstd,
                                 const R* a, const bf16* bb, const float* w, const float* b,
                                 int64_t N, int C, float eps) {
    const int64_t r = int64_t(blockIdx.x) * kVecWarps + threadIdx.x / 32;
    if (r >= N) return;
    const int lane = threadIdx.x % 32;
    Pack8<R> xa[NV] = {};
    uint4 ub[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        if (!live<NV>(j, lane, C)) continue;
        xa[j] = load8(a + r * C + j * 256 + lane * 8);
        if (RESIDUAL) ub[j] = ld16(bb + r * C + j * 256 + lane * 8);
    }
    float sum = 0;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        if (!live<NV>(j, lane, C)) continue;
        float x[8];
        unpack8(xa[j], x);
        if (RESIDUAL) {
            float y[8];
            unpack8(ub[j], y);
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = to_f(from_f<R>(x[k] + y[k]));
            store8(res + r * C + j * 256 + lane * 8, x);
            xa[j] = pack_as<R>(x);  // exact: x holds values of R
        }
#pragma unroll
        for (int k = 0; k < 8; k++) sum += x[k];
    }
    const float m = RMS ? 0.0f : warp_sum(sum) / float(C);
    float var = 0;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        if (!live<NV>(j, lane, C)) continue;
        float x[8];
        unpack8(xa[j], x);
#pragma unroll
        for (int k = 0; k < 8; k++) var += (x[k] - m) * (x[k] - m);
    }
    const float rs = rsqrtf(warp_sum(var) / float(C) + eps);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        if (!live<NV>(j, lane, C)) continue;
        float x[8], wv[8], bv[8] = {};
        unpack8(xa[j], x);
        unpack8(load8(w + j * 256 + lane * 8), wv);
        if (b) unpack8(load8(b + j * 256 + lane * 8), bv);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = (x[k] - m) * rs * wv[k] + bv[k];
        *reinterpret_cast<uint4*>(out + r * out_ld + j * 256 + lane * 8) = pack8(x);
    }
    if (lane == 0) {
        if (!RMS) mean[r] = m;
        rstd[r] = rs;
    }
}

// Backward: a persistent grid; each warp owns rows r, r + stride, ... and loads the next row's
// dout and input while it works on this one (the kernel is memory-bound, so bytes in flight are
// what counts). Weight-gradient sums stay in registers up to C = 1280; the block's warps add
// theirs into shared memory one warp after another (a fixed order). Wider rows keep them in
// dynamic shared memory instead, one row per warp (kSmemSums: in registers they spilled, and at
// C = 1600 the kernel ran at 5x its memory floor); the same sums in the same order. SUMS: the
// column sums of dinp as well, of its values rounded to bf16 (what the matmuls read), for the bias
// gradient of the projection whose output gradient dinp is; each warp adds its rows into its own
// row of shared memory.
//
// Shared-memory sums are stored lane-interleaved: a lane's 8 columns of chunk j (j * 256 + lane * 8
// + 4h + e) sit at j * 256 + 128h + lane * 4 + e, so a warp's float4 access covers 512 contiguous
// bytes (no bank conflicts; stored by column, lanes 32 bytes apart, every access was a 2-way
// conflict). Only where the sums are kept changes, not their order.
template <int NV>
constexpr bool kSmemSums = NV > 5;
// Where column c's sum is kept in a warp's row of shared-memory sums.
__device__ __forceinline__ int sum_slot(int c) {
    return (c & ~255) + ((c & 4) << 5) + ((c & 255) >> 3) * 4 + (c & 3);
}
// The float4 holding this lane's columns 4h .. 4h + 3 of chunk j.
__device__ __forceinline__ float4* sum_quad(float* row, int j, int lane, int h) {
    return reinterpret_cast<float4*>(row + j * 256 + h * 128 + lane * 4);
}
// One lane's 8 columns of a row in the backward's first pass: dy and xhat unpacked for the
// weight-gradient sums, and their terms added to the row's sums of dy*w (s1) and dy*w*xhat (s2).
template <typename R, bool RMS>
__device__ __forceinline__ void chunk_row_terms(float (&dy)[8], float (&xh)[8], uint4 dyv,
                                                const Pack8<R>& xv, const Pack8<R>& wraw, float m,
                                                float rs, float& s1, float& s2) {
    float wv[8];
    unpack8(dyv, dy);
    unpack8(xv, xh);
    unpack8(wraw, wv);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        xh[k] = (xh[k] - m) * rs;
        const float gw = dy[k] * wv[k];
        if (!RMS) s1 += gw;
        s2 += gw * xh[k];
    }
}
// The same 8 columns of dinp: (accumulate ? old : 0) + rs (dy w - s1 - xhat rs s2), with s1 and
// s2 the row's means.
template <typename R>
__device__ __forceinline__ void chunk_dinp(float (&d)[8], uint4 dyv, const Pack8<R>& xv,
                                           const Pack8<R>& wraw, const Pack8<R>& old,
                                           bool accumulate, float m, float rs, float s1, float s2) {
    float dy[8], xh[8], wv[8], o[8] = {};
    unpack8(dyv, dy);
    unpack8(xv, xh);
    unpack8(wraw, wv);
    if (accumulate) unpack8(old, o);
#pragma unroll
    for (int k = 0; k < 8; k++) d[k] = o[k] + rs * (dy[k] * wv[k] - s1 - (xh[k] - m) * rs * s2);
}
// dinp's column sums (the bias gradient of the projection before the norm): d's 8 values, rounded
// to bf16 as the matmuls read them, added into this lane's quads of chunk j of a warp's row.
__device__ __forceinline__ void add_rounded_sums(float* row, int j, int lane, const float (&d)[8]) {
    float4 *plo = sum_quad(row, j, lane, 0), *phi = sum_quad(row, j, lane, 1);
    float4 lo = *plo, hi = *phi;
    lo.x += to_f(from_f<bf16>(d[0])), lo.y += to_f(from_f<bf16>(d[1]));
    lo.z += to_f(from_f<bf16>(d[2])), lo.w += to_f(from_f<bf16>(d[3]));
    hi.x += to_f(from_f<bf16>(d[4])), hi.y += to_f(from_f<bf16>(d[5]));
    hi.z += to_f(from_f<bf16>(d[6])), hi.w += to_f(from_f<bf16>(d[7]));
    *plo = lo, *phi = hi;
}
template <int NV>
constexpr size_t vec_backward_smem() {
    return kSmemSums<NV> ? size_t(2) * kVecWarps * NV * 256 * sizeof(float) : 0;
}

template <int NV, bool SUMS, typename R, bool RMS>
__global__ void __launch_bounds__(32 * kVecWarps)
    layernorm_backward_vec_kernel(R* dinp, bool accumulate, float* part_w, float* part_b,
                                  float* part_d, const bf16* dout, const R* inp, const R* w,
                                  const float* mean, const float* rstd, int64_t N, int C) {
    constexpr int CP = NV * 256;  // the row rounded up to whole chunks
    __shared__ float bw[CP], bb[CP];
    // dinp's column sums, per warp in shared memory rather than registers: that keeps the
    // registers, and so the blocks per SM and the weight gradients' partials, of the kernel
    // without them (two blocks per SM instead of three at C = 768 with them in registers)
    __shared__ __align__(16) float wd[SUMS ? kVecWarps * CP : 4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t stride = int64_t(gridDim.x) * kVecWarps;
    constexpr bool kSmem = kSmemSums<NV>;
    float aw[kSmem ? 1 : NV][8] = {}, ab[kSmem ? 1 : NV][8] = {};
    extern __shared__ __align__(16) float sums[];  // kSmem: [kVecWarps][CP] dw, then db
    if constexpr (kSmem)
        for (int c = lane * 4; c < CP; c += 128) {
            *reinterpret_cast<float4*>(sums + warp * CP + c) = make_float4(0, 0, 0, 0);
            *reinterpret_cast<float4*>(sums + (kVecWarps + warp) * CP + c) =
                make_float4(0, 0, 0, 0);
        }
    if constexpr (SUMS)  // each lane owns the columns it loads (no other lane touches them)
#pragma unroll
        for (int j = 0; j < NV; j++)
            *sum_quad(wd + warp * CP, j, lane, 0) = *sum_quad(wd + warp * CP, j, lane, 1) =
                make_float4(0, 0, 0, 0);
    // dead columns stay zero: dy = 0 adds nothing to the row's sums or the weight gradients
    Pack8<R> wraw[NV] = {}, xv[NV] = {};
    uint4 dyv[NV] = {};
#pragma unroll
    for (int j = 0; j < NV; j++)
        if (live<NV>(j, lane, C)) wraw[j] = load8(w + j * 256 + lane * 8);
    int64_t r = int64_t(blockIdx.x) * kVecWarps + warp;
    // the row's statistics come with its dout and input, a row ahead (not a dependent load at
    // the start of each row)
    float m = 0.0f, rs = 0.0f;
    if (r < N) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            if (!live<NV>(j, lane, C)) continue;
            dyv[j] = ld16(dout + r * C + j * 256 + lane * 8);
            xv[j] = load8(inp + r * C + j * 256 + lane * 8);
        }
        m = RMS ? 0.0f : mean[r];
        rs = rstd[r];
    }
    for (; r < N; r += stride) {
        const int64_t rn = r + stride;
        Pack8<R> old[NV] = {}, nx[NV] = {};
        uint4 ndy[NV] = {};
        float nm = 0.0f, nrs = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            if (!live<NV>(j, lane, C)) continue;
            if (accumulate) old[j] = load8(dinp + r * C + j * 256 + lane * 8);
            if (rn < N) {
                ndy[j] = ld16(dout + rn * C + j * 256 + lane * 8);
                nx[j] = load8(inp + rn * C + j * 256 + lane * 8);
            }
        }
        if (rn < N) {
            nm = RMS ? 0.0f : mean[rn];
            nrs = rstd[rn];
        }
        float s1 = 0, s2 = 0;  // sums of dy*w and of dy*w*xhat
#pragma unroll
        for (int j = 0; j < NV; j++) {
            float dy[8], xh[8];
            chunk_row_terms<R, RMS>(dy, xh, dyv[j], xv[j], wraw[j], m, rs, s1, s2);
            if constexpr (!kSmem)
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    aw[j][k] += dy[k] * xh[k];
                    ab[j][k] += dy[k];
                }
            if constexpr (kSmem) {  // this lane's own columns: no other lane touches them
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float4* pw = sum_quad(sums + warp * CP, j, lane, h);
                    float4* pb = sum_quad(sums + (kVecWarps + warp) * CP, j, lane, h);
                    float4 w4 = *pw, b4 = *pb;
                    w4.x += dy[4 * h] * xh[4 * h], w4.y += dy[4 * h + 1] * xh[4 * h + 1];
                    w4.z += dy[4 * h + 2] * xh[4 * h + 2], w4.w += dy[4 * h + 3] * xh[4 * h + 3];
                    b4.x += dy[4 * h], b4.y += dy[4 * h + 1];
                    b4.z += dy[4 * h + 2], b4.w += dy[4 * h + 3];
                    *pw = w4;
                    *pb = b4;
                }
            }
        }
        s1 = warp_sum(s1) / float(C);
        s2 = warp_sum(s2) / float(C);
#pragma unroll
        for (int j = 0; j < NV; j++) {
            float d[8];
            chunk_dinp<R>(d, dyv[j], xv[j], wraw[j], old[j], accumulate, m, rs, s1, s2);
            dyv[j] = ndy[j];
            xv[j] = nx[j];
            if (!live<NV>(j, lane, C)) continue;
            store8(dinp + r * C + j * 256 + lane * 8, d);
            if constexpr (SUMS) add_rounded_sums(wd + warp * CP, j, lane, d);
        }
        m = nm;
        rs = nrs;
    }
    for (int c = threadIdx.x; c < CP; c += blockDim.x) bw[c] = bb[c] = 0;
    __syncthreads();
    for (int k = 0; k < kVecWarps; k++) {
        if constexpr (kSmem) {  // the warps in order, as below
            for (int c = threadIdx.x; c < CP; c += blockDim.x) {
                bw[c] += sums[k * CP + sum_slot(c)];
                bb[c] += sums[(kVecWarps + k) * CP + sum_slot(c)];
            }
        } else if (warp == k)
#pragma unroll
            for (int j = 0; j < NV; j++)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    bw[j * 256 + lane * 8 + e] += aw[j][e];
                    bb[j * 256 + lane * 8 + e] += ab[j][e];
                }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        part_w[int64_t(blockIdx.x) * C + c] = bw[c];
        part_b[int64_t(blockIdx.x) * C + c] = bb[c];
        if constexpr (SUMS) {
            float ad = 0;
            for (int k = 0; k < kVecWarps; k++) ad += wd[k * CP + sum_slot(c)];  // warps in order
            part_d[int64_t(blockIdx.x) * C + c] = ad;
        }
    }
}

// Backward for the widest rows (NV > 5 chunks, C above 1280), two warps a row: the row's first
// H = ceil(NV / 2) chunks to the pair's first warp, the rest to its second, so each warp keeps the
// weight-gradient sums of its own columns in registers, as the narrower rows do, where
// layernorm_backward_vec_kernel keeps them in shared memory (read and written once a row: about
// 26 KB of shared-memory traffic a row at C = 1600). The row's two sums (of dy*w and dy*w*xhat)
// meet through shared memory: each warp's partial, then the first warp's plus the second's, in
// that order on both (named barrier 1 + the pair's index; two slots by row parity, so one barrier
// a row). kernels.layernorm_split_rows chooses it. The sums of dy*w are then in another order than
// the one-warp kernel's (per warp, then the two halves), so its dinp may differ in the last bit.
template <int NV, bool SUMS, typename R, bool RMS>
__global__ void __launch_bounds__(32 * kVecWarps)
    layernorm_backward_split_kernel(R* dinp, bool accumulate, float* part_w, float* part_b,
                                    float* part_d, const bf16* dout, const R* inp, const R* w,
                                    const float* mean, const float* rstd, int64_t N, int C) {
    static_assert(kVecWarps == 4, "two pairs of warps (named barriers 1 and 2)");
    constexpr int CP = NV * 256, H = (NV + 1) / 2;  // H: chunks a warp
    constexpr int kPairs = kVecWarps / 2;
    __shared__ float bw[CP], bb[CP];
    __shared__ float partial[2][kPairs][2][2];  // [row parity][pair][warp of the pair][s1, s2]
    // dinp's column sums: each warp's own H chunks (lane-interleaved as sum_slot's)
    __shared__ __align__(16) float wd[SUMS ? kVecWarps * H * 256 : 4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pair = warp / 2, half = warp % 2;
    const int j0 = half * H;  // this warp's first chunk
    const int64_t stride = int64_t(gridDim.x) * kPairs;
    float aw[H][8] = {}, ab[H][8] = {};
    float* const wrow = wd + (SUMS ? warp * H * 256 : 0);
    if constexpr (SUMS)
#pragma unroll
        for (int jj = 0; jj < H; jj++)
            *sum_quad(wrow, jj, lane, 0) = *sum_quad(wrow, jj, lane, 1) = make_float4(0, 0, 0, 0);
    auto on = [&](int jj) { return j0 + jj < NV && live<NV>(j0 + jj, lane, C); };
    auto col = [&](int jj) { return (j0 + jj) * 256 + lane * 8; };
    // dead columns stay zero: dy = 0 adds nothing to the row's sums or the weight gradients
    Pack8<R> wraw[H] = {}, xv[H] = {};
    uint4 dyv[H] = {};
#pragma unroll
    for (int jj = 0; jj < H; jj++)
        if (on(jj)) wraw[jj] = load8(w + col(jj));
    int64_t r = int64_t(blockIdx.x) * kPairs + pair;
    if (r < N)
#pragma unroll
        for (int jj = 0; jj < H; jj++) {
            if (!on(jj)) continue;
            dyv[jj] = ld16(dout + r * C + col(jj));
            xv[jj] = load8(inp + r * C + col(jj));
        }
    for (int parity = 0; r < N; r += stride, parity ^= 1) {
        const int64_t rn = r + stride;
        Pack8<R> old[H] = {}, nx[H] = {};
        uint4 ndy[H] = {};
#pragma unroll
        for (int jj = 0; jj < H; jj++) {
            if (!on(jj)) continue;
            if (accumulate) old[jj] = load8(dinp + r * C + col(jj));
            if (rn < N) {
                ndy[jj] = ld16(dout + rn * C + col(jj));
                nx[jj] = load8(inp + rn * C + col(jj));
            }
        }
        const float m = RMS ? 0.0f : mean[r], rs = rstd[r];
        float s1 = 0, s2 = 0;  // this warp's sums of dy*w and of dy*w*xhat
#pragma unroll
        for (int jj = 0; jj < H; jj++) {
            float dy[8], xh[8];
            chunk_row_terms<R, RMS>(dy, xh, dyv[jj], xv[jj], wraw[jj], m, rs, s1, s2);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                aw[jj][k] += dy[k] * xh[k];
                ab[jj][k] += dy[k];
            }
        }
        s1 = warp_sum(s1);
        s2 = warp_sum(s2);
        float(&slot)[2][2] = partial[parity][pair];
        if (lane == 0) slot[half][0] = s1, slot[half][1] = s2;
        if (pair == 0)  // barrier ids as immediates: a register id reserves all sixteen
            asm volatile("bar.sync 1, 64;\n" ::: "memory");
        else
            asm volatile("bar.sync 2, 64;\n" ::: "memory");
        s1 = (slot[0][0] + slot[1][0]) / float(C);
        s2 = (slot[0][1] + slot[1][1]) / float(C);
#pragma unroll
        for (int jj = 0; jj < H; jj++) {
            float d[8];
            chunk_dinp<R>(d, dyv[jj], xv[jj], wraw[jj], old[jj], accumulate, m, rs, s1, s2);
            dyv[jj] = ndy[jj];
            xv[jj] = nx[jj];
            if (!on(jj)) continue;
            store8(dinp + r * C + col(jj), d);
            if constexpr (SUMS) add_rounded_sums(wrow, jj, lane, d);
        }
    }
    for (int c = threadIdx.x; c < CP; c += blockDim.x) bw[c] = bb[c] = 0;
    __syncthreads();
    for (int k = 0; k < kVecWarps; k++) {  // the warps in order; each adds its own columns
        if (warp == k)
#pragma unroll
            for (int jj = 0; jj < H; jj++)
                if (j0 + jj < NV)
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        bw[col(jj) + e] += aw[jj][e];
                        bb[col(jj) + e] += ab[jj][e];
                    }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        part_w[int64_t(blockIdx.x) * C + c] = bw[c];
        part_b[int64_t(blockIdx.x) * C + c] = bb[c];
        if constexpr (SUMS) {  // the two warps that own column c, in order
            const int h = c / 256 >= H, slot = sum_slot(c - h * H * 256);
            float ad = 0;
            for (int k = h; k < kVecWarps; k += 2) ad += wd[k * H * 256 + slot];
            part_d[int64_t(blockIdx.x) * C + c] = ad;
        }
    }
}

// Calls f(NV) for the vectorised kernels' chunk count: C a multiple of 8 (16-byte rows) up to 2048.
template <typename F>
bool with_vec_width(int64_t C, F&& f) {
    if (C % 8 != 0 || C > 2048) return false;
    switch ((C + 255) / 256) {
        case 1:
            f(std::integral_constant<int, 1>{});
            return true;
        case 2:
            f(std::integral_constant<int, 2>{});
            return true;
        case 3:
            f(std::integral_constant<int, 3>{});
            return true;
        case 4:
            f(std::integral_constant<int, 4>{});
            return true;
        case 5:
            f(std::integral_constant<int, 5>{});
            return true;
        case 6:
            f(std::integral_constant<int, 6>{});
            return true;
        case 7:
            f(std::integral_constant<int, 7>{});
            return true;
        default:
            f(std::integral_constant<int, 8>{});
            return true;
    }
}

RowMap plain(RowMap m, int64_t C) {
    if (m.ld == 0) m.ld = m.group * C;
    return m;
}

// Enough blocks of the backward fast path to fill every SM once (a persistent grid).
template <int NV, bool SUMS, typename R, bool RMS>
int vec_backward_blocks() {
    static const int blocks = [] {
        auto kernel = layernorm_backward_vec_kernel<NV, SUMS, R, RMS>;
        constexpr size_t smem = vec_backward_smem<NV>();
        if (smem > 0)
            ZG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               int(smem)));
        return std::clamp(resident_blocks(kernel, 32 * kVecWarps, smem), 1, kVecMaxBlocks);
    }();
    return blocks;
}

template <int NV, bool SUMS, typename R, bool RMS>
int split_backward_blocks() {
    static const int blocks = std::clamp(
        resident_blocks(layernorm_backward_split_kernel<NV, SUMS, R, RMS>, 32 * kVecWarps, 0), 1,
        kVecMaxBlocks);
    return blocks;
}

template <typename T>
struct Type {
    using type = T;
};
// Calls f(Type<T>, Type<R>) for the activation type t over the residual type r: (f32, f32),
// (bf16, bf16) or (bf16, f32).
template <typename F>
void dispatch_pair(DType t, DType r, const char* who, F&& f) {
    ZG_CHECK(t == r || (t == DType::bf16 && r == DType::f32),
             std::string(who) + ": an fp32 residual stream takes bf16 activations only");
    if (t == DType::f32)
        f(Type<float>{}, Type<float>{});
    else if (r == DType::bf16)
        f(Type<bf16>{}, Type<bf16>{});
    else
        f(Type<bf16>{}, Type<float>{});
}

template <bool RMS>
void norm_forward(void* out, RowMap out_map, float* mean, float* rstd, const void* inp,
                  RowMap in_map, const float* weight, const float* bias, int64_t N, int64_t C,
                  double eps, DType t, DType in_t, CUstream_st* s) {
    ZG_CHECK(N > 0 && C > 0 && weight && (mean || RMS),
             "layernorm_forward: sizes must be positive, weight and mean set");
    out_map = plain(out_map, C);
    in_map = plain(in_map, C);
    ZG_CHECK((out_map.group > 1 || out_map.ld >= C) && (in_map.group > 1 || in_map.ld >= C),
             "layernorm_forward: a row stride shorter than its row");
    // the vectorised kernel: plain input rows; output rows C apart or further, 16-byte aligned
    const bool rows_plain =
        out_map.group == 1 && in_map.group == 1 && out_map.ld % 8 == 0 && in_map.ld == C;
    dispatch_pair(t, in_t, "layernorm_forward", [&](auto tt, auto rr) {
        using T = typename decltype(tt)::type;
        using R = typename decltype(rr)::type;
        if constexpr (std::is_same_v<T, bf16>) {
            if (rows_plain && is_aligned({out, inp, weight, bias})) {
                const bool done = with_vec_width(C, [&](auto NV) {
                    layernorm_forward_vec_kernel<NV.value, false, R, RMS>
                        <<<unsigned((N + kVecWarps - 1) / kVecWarps), 32 * kVecWarps, 0, s>>>(
                            nullptr, static_cast<bf16*>(out), out_map.ld, mean, rstd,
                            static_cast<const R*>(inp), nullptr, weight, bias, N, int(C),
                            float(eps));
                });
                if (done) return;
            }
        }
        const int blocks = int((N + kWarps - 1) / kWarps);
        layernorm_forward_kernel<T, R, RMS><<<blocks, 32 * kWarps, 0, s>>>(
            static_cast<T*>(out), out_map, mean, rstd, static_cast<const R*>(inp), in_map, weight,
            bias, N, C, float(eps));
    });
    ZG_LAUNCH_CHECK();
}

template <bool RMS>
void residual_norm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                           const void* b, const float* weight, const float* bias, int64_t N,
                           int64_t C, double eps, DType t, DType res_t, CUstream_st* s,
                           int64_t out_ld) {
    if (out_ld == 0) out_ld = C;
    ZG_CHECK(N > 0 && C > 0 && weight && (mean || RMS) && out_ld >= C,
             "residual_layernorm_forward: bad arguments");
    dispatch_pair(t, res_t, "residual_layernorm_forward", [&](auto tt, auto rr) {
        using T = typename decltype(tt)::type;
        using R = typename decltype(rr)::type;
        if constexpr (std::is_same_v<T, bf16>) {
            if (out_ld % 8 == 0 && is_aligned({res, out, a, b, weight, bias})) {
                const bool done = with_vec_width(C, [&](auto NV) {
                    layernorm_forward_vec_kernel<NV.value, true, R, RMS>
                        <<<unsigned((N + kVecWarps - 1) / kVecWarps), 32 * kVecWarps, 0, s>>>(
                            static_cast<R*>(res), static_cast<bf16*>(out), out_ld, mean, rstd,
                            static_cast<const R*>(a), static_cast<const bf16*>(b), weight, bias, N,
                            int(C), float(eps));
                });
                if (done) return;
            }
        }
        const int blocks = int((N + kWarps - 1) / kWarps);
        residual_layernorm_forward_kernel<T, R, RMS><<<blocks, 32 * kWarps, 0, s>>>(
            static_cast<R*>(res), static_cast<T*>(out), mean, rstd, static_cast<const R*>(a),
            static_cast<const T*>(b), weight, bias, N, C, out_ld, float(eps));
    });
    ZG_LAUNCH_CHECK();
}

template <bool RMS>
void norm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight, float* dbias,
                   const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                   const void* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                   void* scratch, DType t, DType in_t, CUstream_st* s, ColumnSumParts* dinp_sums,
                   bool split_rows) {
    ZG_CHECK(N > 0 && C > 0 && weight && dweight && scratch && (mean || RMS),
             "layernorm_backward: bad arguments");
    dinp_map = plain(dinp_map, C);
    dout_map = plain(dout_map, C);
    in_map = plain(in_map, C);
    const bool rows_plain = dinp_map.group == 1 && dout_map.group == 1 && in_map.group == 1 &&
                            dinp_map.ld == C && dout_map.ld == C && in_map.ld == C;
    float* part_d = dinp_sums ? dinp_sums->parts : nullptr;
    ZG_CHECK(!dinp_sums || (part_d && dinp_map.group == 1 && dinp_map.ld == C),
             "layernorm_backward: dinp's column sums need a buffer and plain rows");
    dispatch_pair(t, in_t, "layernorm_backward", [&](auto tt, auto rr) {
        using T = typename decltype(tt)::type;
        using R = typename decltype(rr)::type;
        if constexpr (std::is_same_v<T, bf16>) {
            if (rows_plain && is_aligned({dinp, dout, inp, weight})) {
                float* pw = static_cast<float*>(scratch);
                float* pb = pw + size_t(kVecMaxBlocks) * C;
                int blocks = 0;
                const bool done = with_vec_width(C, [&](auto NV) {
                    auto launch = [&](auto sums) {
                        if constexpr (NV.value > 5) {
                            if (split_rows) {
                                blocks = split_backward_blocks<NV.value, sums.value, R, RMS>();
                                layernorm_backward_split_kernel<NV.value, sums.value, R, RMS>
                                    <<<blocks, 32 * kVecWarps, 0, s>>>(
                                        static_cast<R*>(dinp), accumulate, pw, pb, part_d,
                                        static_cast<const bf16*>(dout), static_cast<const R*>(inp),
                                        static_cast<const R*>(weight), mean, rstd, N, int(C));
                                return;
                            }
                        }
                        blocks = vec_backward_blocks<NV.value, sums.value, R, RMS>();
                        layernorm_backward_vec_kernel<NV.value, sums.value, R, RMS>
                            <<<blocks, 32 * kVecWarps, vec_backward_smem<NV.value>(), s>>>(
                                static_cast<R*>(dinp), accumulate, pw, pb, part_d,
                                static_cast<const bf16*>(dout), static_cast<const R*>(inp),
                                static_cast<const R*>(weight), mean, rstd, N, int(C));
                    };
                    if (part_d)
                        launch(std::true_type{});
                    else
                        launch(std::false_type{});
                });
                if (done) {
                    ZG_LAUNCH_CHECK();
                    add_partial_column_sums(dweight, pw, dbias, pb, blocks, C, s);
                    if (dinp_sums) dinp_sums->rows = blocks;
                    return;
                }
            }
        }
        const int blocks = backward_blocks(N);
        constexpr size_t kMaxSmem = 200 * 1024;
        // dinp's sums need a third [kWarps][C] of shared memory; where that does not fit (C above
        // about 4266) they are not computed and rows stays 0: the caller sums dinp itself
        if (part_d && size_t(3) * kWarps * C * sizeof(float) > kMaxSmem) part_d = nullptr;
        const size_t smem = size_t(part_d ? 3 : 2) * kWarps * C * sizeof(float);
        ZG_CHECK(smem <= kMaxSmem, "layernorm_backward: C too large for the shared-memory sums");
        float* part_w = static_cast<float*>(scratch);
        float* part_b = part_w + size_t(blocks) * C;
        auto kernel = layernorm_backward_kernel<T, R, RMS>;
        if (smem > 48 * 1024)
            ZG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               int(smem)));
        kernel<<<blocks, 32 * kWarps, smem, s>>>(
            static_cast<R*>(dinp), dinp_map, accumulate, part_w, part_b, part_d,
            static_cast<const T*>(dout), dout_map, static_cast<const R*>(inp), in_map,
            static_cast<const R*>(weight), mean, rstd, N, C);
        ZG_LAUNCH_CHECK();
        add_partial_column_sums(dweight, part_w, dbias, part_b, blocks, C, s);
        if (dinp_sums) dinp_sums->rows = part_d ? blocks : 0;
    });
    ZG_LAUNCH_CHECK();
}

}  // namespace

size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C) {
    return size_t(2) * layernorm_backward_sums_bytes(N, C);
}

size_t layernorm_backward_sums_bytes(int64_t N, int64_t C) {
    return size_t(std::max(backward_blocks(N), kVecMaxBlocks)) * C * sizeof(float);
}

void layernorm_forward(void* out, RowMap out_map, float* mean, float* rstd, const void* inp,
                       RowMap in_map, const float* weight, const float* bias, int64_t N, int64_t C,
                       double eps, DType t, DType in_t, CUstream_st* s) {
    norm_forward<false>(out, out_map, mean, rstd, inp, in_map, weight, bias, N, C, eps, t, in_t, s);
}

void rmsnorm_forward(void* out, RowMap out_map, float* rstd, const void* inp, RowMap in_map,
                     const float* weight, int64_t N, int64_t C, double eps, DType t, DType in_t,
                     CUstream_st* s) {
    norm_forward<true>(out, out_map, nullptr, rstd, inp, in_map, weight, nullptr, N, C, eps, t,
                       in_t, s);
}

void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                const void* b, const float* weight, const float* bias, int64_t N,
                                int64_t C, double eps, DType t, DType res_t, CUstream_st* s,
                                int64_t out_ld) {
    residual_norm_forward<false>(res, out, mean, rstd, a, b, weight, bias, N, C, eps, t, res_t, s,
                                 out_ld);
}

void residual_rmsnorm_forward(void* res, void* out, float* rstd, const void* a, const void* b,
                              const float* weight, int64_t N, int64_t C, double eps, DType t,
                              DType res_t, CUstream_st* s, int64_t out_ld) {
    residual_norm_forward<true>(res, out, nullptr, rstd, a, b, weight, nullptr, N, C, eps, t, res_t,
                                s, out_ld);
}

void layernorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight, float* dbias,
                        const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                        const void* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, void* scratch, DType t, DType in_t, CUstream_st* s,
                        ColumnSumParts* dinp_sums, bool split_rows) {
    norm_backward<false>(dinp, dinp_map, accumulate, dweight, dbias, dout, dout_map, inp, in_map,
                         weight, mean, rstd, N, C, scratch, t, in_t, s, dinp_sums, split_rows);
}

void rmsnorm_backward(void* dinp, RowMap dinp_map, bool accumulate, float* dweight,
                      const void* dout, RowMap dout_map, const void* inp, RowMap in_map,
                      const void* weight, const float* rstd, int64_t N, int64_t C, void* scratch,
                      DType t, DType in_t, CUstream_st* s, ColumnSumParts* dinp_sums,
                      bool split_rows) {
    norm_backward<true>(dinp, dinp_map, accumulate, dweight, nullptr, dout, dout_map, inp, in_map,
                        weight, nullptr, rstd, N, C, scratch, t, in_t, s, dinp_sums, split_rows);
}

}  // namespace zgpt::cuda

// flash attention on the GPU: one thread per query row, key/value tiles staged in shared memory
// and read by the whole block (broadcast); online softmax with one rescale per tile. Backward
// recomputes the probabilities from the saved lse: one kernel per key tile for dK/dV and one per
// query tile for dQ, so every output has exactly one writer (deterministic, no atomics). With
// grouped-query attention a dK/dV block owns a key/value head's keys and walks its group's query
// heads in order, summing in registers (every kernel here, the tensor-core ones too). fp32
// arithmetic for both storage types. bf16 with head size 64 runs tensor-core kernels: wgmma ones
// (attention/wgmma.cu) on Hopper, the mma.sync ones of attention/mma.cu elsewhere. flash_mma is
// flash with the mma.sync kernels everywhere, to measure what the Hopper kernels gain.
#include <cmath>
#include <type_traits>

#include "kernels/attention/mma.h"
#include "kernels/attention/scalar.cuh"
#include "kernels/attention/wgmma.h"

namespace zgpt::cuda {

namespace {

size_t lse_bytes(const AttentionShape& s) {
    return size_t(s.B * s.NH * s.Tn) * sizeof(float);
}
size_t residual_offset(const AttentionShape& s) {  // the lse's end, up to 256 bytes
    return (lse_bytes(s) + 255) / 256 * 256;
}

}  // namespace

size_t flash_saved_bytes(const AttentionShape& s) {
    return s.tuning.unrounded_dsum ? residual_offset(s) + size_t(s.B * s.Tn * s.C) * 2
                                   : lse_bytes(s);
}

void* flash_out_residual(void* saved, const AttentionShape& s) {
    return s.tuning.unrounded_dsum ? static_cast<char*>(saved) + residual_offset(s) : nullptr;
}

namespace {

constexpr int kBQ = 64, kBK = 32;

// ---------------------------------------------------------------- flash forward
// ores (bf16 only, or null): out's rounding residual, as tuning.unrounded_dsum keeps it.
template <typename T, int HS>
__global__ void flash_forward_kernel(T* out, float* lse, T* ores, const T* qkv, Geo g) {
    __shared__ float Ks[kBK][HS], Vs[kBK][HS];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH, kvh = h / g.group;
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
            Ks[j][d] = in ? to_f(k_row(qkv, g, b, kvh, k0 + j)[d]) : 0.0f;
            Vs[j][d] = in ? to_f(v_row(qkv, g, b, kvh, k0 + j)[d]) : 0.0f;
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
            // the product rounded on its own, as the backward's (no fused exponent: tc.cuh's
            // scaled_score)
            s[j] = k0 + j <= i ? __fmul_rn(acc, g.scale) : -INFINITY;
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
    const int64_t at = (b * g.Tn + i) * g.C + h * g.hs;
    const float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) {
            const float v = o[d] * inv;
            const T y = from_f<T>(v);
            out[at + d] = y;
            if (ores) ores[at + d] = from_f<T>(v - to_f(y));
        }
    lse[bh * g.Tn + i] = m + logf(l);
}

// ---------------------------------------------------------------- flash backward
// Dsum[b, h, t] = sum_d dout * out: the softmax-backward term of each row (out plus its rounding
// residual ores when given).
template <typename T>
__global__ void row_dot_kernel(float* dsum, const T* dout, const T* out, const T* ores, int64_t B,
                               Geo g) {
    const int64_t n = B * g.NH * g.Tn;
    for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
         r += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
        const int64_t off = (b * g.Tn + t) * g.C + h * g.hs;
        float acc = 0;
        for (int64_t d = 0; d < g.hs; d++) acc += to_f(dout[off + d]) * to_f(out[off + d]);
        if (ores)
            for (int64_t d = 0; d < g.hs; d++) acc += to_f(dout[off + d]) * to_f(ores[off + d]);
        dsum[r] = acc;
    }
}

constexpr int kBQ2 = 16;

// One thread per key row j of a key/value head: dK_j and dV_j summed over its group's query heads
// in order, and for each over the query tiles in order.
template <typename T, int HS>
__global__ void flash_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                  const float* dsum, Geo g) {
    __shared__ float Qs[kBQ2][HS], dOs[kBQ2][HS], Ls[kBQ2], Ds[kBQ2];
    const int64_t b = blockIdx.y / g.NKV, kvh = blockIdx.y % g.NKV;
    const int64_t k0 = int64_t(blockIdx.x) * kBQ, j = k0 + threadIdx.x;
    const int hs = int(g.hs);
    const bool active = j < g.Tn;
    float k[HS], v[HS], dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        k[d] = active && d < hs ? to_f(k_row(qkv, g, b, kvh, j)[d]) : 0.0f;
        v[d] = active && d < hs ? to_f(v_row(qkv, g, b, kvh, j)[d]) : 0.0f;
        dk[d] = dv[d] = 0;
    }
    for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; h++) {
        const int64_t bh = b * g.NH + h;
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
                const float p = __expf(__fmul_rn(s, g.scale) - Ls[r]);
                const float ds = p * (dp - Ds[r]) * g.scale;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    dv[d] += p * dOs[r][d];
                    dk[d] += ds * Qs[r][d];
                }
            }
        }
    }
    if (!active) return;
    T* dkr = dqkv + (b * g.Tn + j) * g.ld + g.k_col(kvh);
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) {
            dkr[d] = from_f<T>(dk[d]);
            dkr[g.KVC + d] = from_f<T>(dv[d]);
        }
}

// One thread per query row i: dQ_i summed over the key tiles in order.
template <typename T, int HS>
__global__ void flash_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                const float* dsum, Geo g) {
    __shared__ float Ks[kBK][HS], Vs[kBK][HS];
    const int64_t bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH, kvh = h / g.group;
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
            Ks[jj][d] = in ? to_f(k_row(qkv, g, b, kvh, k0 + jj)[d]) : 0.0f;
            Vs[jj][d] = in ? to_f(v_row(qkv, g, b, kvh, k0 + jj)[d]) : 0.0f;
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
            const float p = __expf(__fmul_rn(s, g.scale) - L);
            const float ds = p * (dp - D) * g.scale;
#pragma unroll
            for (int d = 0; d < HS; d++) dq[d] += ds * Ks[jj][d];
        }
    }
    if (!active) return;
    T* dqr = dqkv + (b * g.Tn + i) * g.ld + h * g.hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) dqr[d] = from_f<T>(dq[d]);
}

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

size_t flash_scratch_bytes(const AttentionShape& s) {
    return size_t(s.B * s.NH * s.Tn) * sizeof(float);
}

// The tensor-core paths of flash (bf16, head size 64). hopper: may the wgmma kernels run.
bool wgmma_forward(const AttentionShape& s, DType t, bool hopper) {
    return hopper && attention_wgmma::usable_forward(s, t);
}
bool wgmma_backward(const AttentionShape& s, DType t, bool hopper) {
    return hopper && attention_wgmma::usable_backward(s, t);
}

// The output's rounding residual in saved, as T: none in fp32 (nothing is rounded).
template <typename T>
T* out_residual(void* saved, const AttentionShape& s) {
    return std::is_same_v<T, float> ? nullptr : static_cast<T*>(flash_out_residual(saved, s));
}

template <bool Hopper>
void flash_forward(void* out, void* saved, const void* qkv, const AttentionShape& s, DType t,
                   CUstream_st* st) {
    check_shape(s);
    const Geo g = attention_geometry(s);
    const dim3 grid(unsigned((s.Tn + kBQ - 1) / kBQ), unsigned(s.B * s.NH));
    auto* lse = static_cast<float*>(saved);
    if (wgmma_forward(s, t, Hopper)) {
        attention_wgmma::forward(out, lse, flash_out_residual(saved, s), qkv, s, st);
        return;
    }
    if (attention_mma::usable(s, t)) {
        attention_mma::forward(out, lse, flash_out_residual(saved, s), qkv, s, st);
        return;
    }
    with_head_size(g.hs, [&](auto HS) {
        ZG_DISPATCH(t, T,
                    flash_forward_kernel<T, HS.value>
                    <<<grid, kBQ, 0, st>>>(static_cast<T*>(out), lse, out_residual<T>(saved, s),
                                           static_cast<const T*>(qkv), g));
    });
    ZG_LAUNCH_CHECK();
}

template <bool Hopper>
int64_t flash_colsum_rows(const AttentionShape& s, DType t) {
    if (wgmma_backward(s, t, Hopper)) return attention_wgmma::colsum_rows(s);
    return attention_mma::usable(s, t) ? attention_mma::colsum_rows(s) : 0;
}

template <bool Hopper>
void flash_backward(void* dqkv, const void* dout, const void* qkv, const void* out, void* saved,
                    void* scratch, float* dqkv_colsums, const AttentionShape& s, DType t,
                    CUstream_st* st) {
    check_shape(s);
    ZG_CHECK(!dqkv_colsums || flash_colsum_rows<Hopper>(s, t) > 0,
             "flash attention: column sums only on the tensor-core path");
    ZG_CHECK(!dqkv_colsums || !s.rope_table,
             "flash attention: no column sums with rotary positions (they would be of the "
             "rotated gradient)");
    const Geo g = attention_geometry(s);
    auto* dsum = static_cast<float*>(scratch);
    const auto* lse = static_cast<const float*>(saved);
    const dim3 grid(unsigned((s.Tn + kBQ - 1) / kBQ), unsigned(s.B * s.NH));
    const dim3 kv_grid(grid.x, unsigned(s.B * g.NKV));  // dK/dV: one block row per key/value head
    const void* ores = flash_out_residual(saved, s);
    if (wgmma_backward(s, t, Hopper)) {
        attention_wgmma::backward(dqkv, dout, qkv, out, ores, lse, dsum, dqkv_colsums, s, st);
        return;
    }
    if (attention_mma::usable(s, t)) {
        attention_mma::backward(dqkv, dout, qkv, out, ores, lse, dsum, dqkv_colsums, s, st);
        unrotate_dqk(dqkv, s, t, st);
        return;
    }
    with_head_size(g.hs, [&](auto HS) {
        ZG_DISPATCH(t, T, {
            const auto* dy = static_cast<const T*>(dout);
            const auto* x = static_cast<const T*>(qkv);
            auto* dx = static_cast<T*>(dqkv);
            row_dot_kernel<T><<<grid_for(s.B * s.NH * s.Tn, 256), 256, 0, st>>>(
                dsum, dy, static_cast<const T*>(out), out_residual<T>(saved, s), s.B, g);
            flash_dkdv_kernel<T, HS.value><<<kv_grid, kBQ, 0, st>>>(dx, dy, x, lse, dsum, g);
            flash_dq_kernel<T, HS.value><<<grid, kBQ, 0, st>>>(dx, dy, x, lse, dsum, g);
        });
    });
    ZG_LAUNCH_CHECK();
    unrotate_dqk(dqkv, s, t, st);
}

}  // namespace

AttentionVariant flash_attention_entry(bool hopper) {
    if (hopper)
        return {"flash",
                "online softmax over key tiles; lse saved, scores never stored",
                flash_saved_bytes,
                flash_scratch_bytes,
                flash_forward<true>,
                flash_colsum_rows<true>,
                flash_backward<true>};
    return {"flash_mma",
            "flash without the Hopper (wgmma) kernels: mma.sync tensor-core kernels",
            flash_saved_bytes,
            flash_scratch_bytes,
            flash_forward<false>,
            flash_colsum_rows<false>,
            flash_backward<false>};
}

}  // namespace zgpt::cuda

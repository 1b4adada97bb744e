#include "kernels/core/check.h"
#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/adamw.h"
#include "kernels/ops/global_norm.h"

namespace zgpt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = kThreads * 4 * 8;  // elements a block updates: 8 float4 per thread
constexpr int kSpans = 128;               // spans a launch takes in its parameters (< 4 KB)

// The bias corrections' reciprocals come from the host: a division in double is a long
// instruction sequence, and the kernel is meant to run at the memory's rate.
struct Coefs {
    double lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, inv_bc1, inv_bc2,
        grad_scale;
};

// Block b updates chunk b - first_block[s] of span s.
struct SpanTable {
    int count;
    int first_block[kSpans + 1];
    int64_t begin[kSpans], end[kSpans];
    unsigned char decay[kSpans];
};

// Double arithmetic, like the CPU reference, so fp32 runs track it to rounding.
__device__ __forceinline__ void update(float& p, float g, float& m, float& v, double decay,
                                       const Coefs& c) {
    const double gi = double(g) * c.grad_scale;
    const double mi = c.beta1 * m + c.one_minus_beta1 * gi;
    const double vi = c.beta2 * v + c.one_minus_beta2 * gi * gi;
    m = float(mi);
    v = float(vi);
    const double step = (mi * c.inv_bc1) / (sqrt(vi * c.inv_bc2) + c.eps);
    p = float(double(p) * decay - c.lr * step);
}

__device__ __forceinline__ void update_one(float* p, bf16* p16, const float* g, float* m, float* v,
                                           int64_t i, int64_t base, double decay, const Coefs& c) {
    float pi = p[i], mi = m[i - base], vi = v[i - base];
    update(pi, g[i], mi, vi, decay, c);
    p[i] = pi;
    m[i - base] = mi;
    v[i - base] = vi;
    if (p16) p16[i] = __float2bfloat16_rn(pi);
}

// `vec`: the host checked that a multiple-of-4 element is 16-byte aligned in every array.
__global__ void __launch_bounds__(kThreads)
    adamw_spans_kernel(float* p, bf16* p16, const float* g, float* m, float* v, int64_t base,
                       bool vec, SpanTable t, Coefs c, AdamWClip clip) {
    if (clip.sum_of_squares)
        c.grad_scale *= cpu::clip_scale(sqrt(*clip.sum_of_squares), clip.max_norm);
    int s = 0;  // the last span whose first block is at or before this one (uniform per block)
    for (int lo = 0, hi = t.count - 1; lo < hi;) {
        const int mid = (lo + hi + 1) / 2;
        if (t.first_block[mid] <= int(blockIdx.x)) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
        s = lo;
    }
    const int64_t a = t.begin[s] + int64_t(blockIdx.x - t.first_block[s]) * kChunk;
    const int64_t b = std::min<int64_t>(a + kChunk, t.end[s]);
    const double decay = t.decay[s] ? c.decay : 1.0;
    const int64_t va = vec ? std::min<int64_t>(b, (a + 3) & ~int64_t(3)) : b;
    const int64_t vb = va + ((b - va) & ~int64_t(3));
    // the scalar head and tail (the whole chunk where `vec` is false)
    for (int64_t i = a + threadIdx.x; i < va; i += kThreads)
        update_one(p, p16, g, m, v, i, base, decay, c);
    for (int64_t i = vb + threadIdx.x; i < b; i += kThreads)
        update_one(p, p16, g, m, v, i, base, decay, c);
#pragma unroll 2
    for (int64_t i = va + 4 * int64_t(threadIdx.x); i < vb; i += 4 * kThreads) {
        float4 pp = *reinterpret_cast<const float4*>(p + i);
        const float4 gg = *reinterpret_cast<const float4*>(g + i);
        float4 mm = *reinterpret_cast<const float4*>(m + (i - base));
        float4 vv = *reinterpret_cast<const float4*>(v + (i - base));
        update(pp.x, gg.x, mm.x, vv.x, decay, c);
        update(pp.y, gg.y, mm.y, vv.y, decay, c);
        update(pp.z, gg.z, mm.z, vv.z, decay, c);
        update(pp.w, gg.w, mm.w, vv.w, decay, c);
        *reinterpret_cast<float4*>(p + i) = pp;
        *reinterpret_cast<float4*>(m + (i - base)) = mm;
        *reinterpret_cast<float4*>(v + (i - base)) = vv;
        if (p16) {
            struct alignas(8) Four {
                __nv_bfloat162 lo, hi;
            };
            *reinterpret_cast<Four*>(p16 + i) =
                Four{__floats2bfloat162_rn(pp.x, pp.y), __floats2bfloat162_rn(pp.z, pp.w)};
        }
    }
}

}  // namespace

void adamw_update(float* params, void* params_bf16, const float* grads, float* m, float* v,
                  int64_t base, const std::vector<AdamWSpan>& spans, const cpu::AdamWStep& s,
                  CUstream_st* stream, AdamWClip clip) {
    const double bc1 = 1.0 - std::pow(s.beta1, double(s.t));
    const double bc2 = 1.0 - std::pow(s.beta2, double(s.t));
    const Coefs c{s.lr,
                  s.beta1,
                  1.0 - s.beta1,
                  s.beta2,
                  1.0 - s.beta2,
                  s.eps,
                  1.0 - s.lr * s.weight_decay,
                  1.0 / bc1,
                  1.0 / bc2,
                  s.grad_scale};
    bf16* p16 = static_cast<bf16*>(params_bf16);
    const bool vec =
        base % 4 == 0 && is_aligned({params, grads, m, v}) && (!p16 || is_aligned(p16, 8));
    SpanTable t{};
    auto launch = [&] {
        if (t.count == 0) return;
        adamw_spans_kernel<<<t.first_block[t.count], kThreads, 0, stream>>>(
            params, p16, grads, m, v, base, vec, t, c, clip);
        ZG_LAUNCH_CHECK();
        t = SpanTable{};
    };
    for (const AdamWSpan& sp : spans) {
        ZG_CHECK(base <= sp.begin && sp.begin <= sp.end, "adamw_update: span before the base");
        if (sp.begin == sp.end) continue;
        const int64_t blocks = (sp.end - sp.begin + kChunk - 1) / kChunk;
        ZG_CHECK(t.first_block[t.count] + blocks < (int64_t(1) << 31), "adamw_update: too large");
        t.begin[t.count] = sp.begin;
        t.end[t.count] = sp.end;
        t.decay[t.count] = sp.decay;
        t.first_block[t.count + 1] = t.first_block[t.count] + int(blocks);
        if (++t.count == kSpans) launch();
    }
    launch();
}

void adamw_update(float* params, void* params_bf16, const float* grads, float* m, float* v,
                  int64_t n, const cpu::AdamWStep& s, CUstream_st* stream) {
    if (n <= 0) return;
    adamw_update(params, params_bf16, grads, m, v, 0, {{0, n, true}}, s, stream);
}

}  // namespace zgpt::cuda

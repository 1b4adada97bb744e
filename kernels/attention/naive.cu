// naive attention on the GPU: the textbook form with the [T, T] probabilities in memory, for
// ablation.
#include "kernels/attention/scalar.cuh"

namespace zgpt::cuda {

namespace {

// ---------------------------------------------------------------- naive
// One block per query row: scores into shared memory, softmax, probabilities saved, then out.
template <typename T>
__global__ void naive_forward_kernel(T* out, float* att, const T* qkv, Geo g) {
    extern __shared__ float row[];
    __shared__ float red[32];
    const int64_t r = blockIdx.x, t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
    const int64_t kvh = h / g.group;
    const T* q = q_row(qkv, g, b, h, t);
    float mx = -INFINITY;
    for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const T* k = k_row(qkv, g, b, kvh, t2);
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
        for (int64_t t2 = 0; t2 <= t; t2++) acc += row[t2] * to_f(v_row(qkv, g, b, kvh, t2)[d]);
        y[d] = from_f<T>(acc);
    }
}

// One block per key row t2 of a key/value head: dV[t2] = sum over the group's query heads h (in
// order) of sum_{t >= t2} att[h, t, t2] dout[h, t].
template <typename T>
__global__ void naive_dv_kernel(T* dqkv, const T* dout, const float* att, Geo g) {
    const int64_t r = blockIdx.x, t2 = r % g.Tn, bkv = r / g.Tn, b = bkv / g.NKV, kvh = bkv % g.NKV;
    for (int64_t d = threadIdx.x; d < g.hs; d += blockDim.x) {
        float acc = 0;
        for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; h++) {
            const int64_t bh = b * g.NH + h;
            for (int64_t t = t2; t < g.Tn; t++)
                acc += att[(bh * g.Tn + t) * g.Tn + t2] *
                       to_f(dout[(b * g.Tn + t) * g.C + h * g.hs + d]);
        }
        dqkv[(b * g.Tn + t2) * g.ld + g.v_col(kvh) + d] = from_f<T>(acc);
    }
}

// One block per query row: dS = P (dP - sum P dP) scale, written over the probabilities; dQ.
template <typename T>
__global__ void naive_ds_dq_kernel(T* dqkv, const T* dout, const T* qkv, float* att, Geo g) {
    extern __shared__ float dp[];
    __shared__ float red[32];
    const int64_t r = blockIdx.x, t = r % g.Tn, bh = r / g.Tn, b = bh / g.NH, h = bh % g.NH;
    const int64_t kvh = h / g.group;
    const T* dy = dout + (b * g.Tn + t) * g.C + h * g.hs;
    float* a = att + r * g.Tn;
    float dot = 0;
    for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const T* v = v_row(qkv, g, b, kvh, t2);
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
        for (int64_t t2 = 0; t2 <= t; t2++) acc += dp[t2] * to_f(k_row(qkv, g, b, kvh, t2)[d]);
        dqkv[(b * g.Tn + t) * g.ld + h * g.hs + d] = from_f<T>(acc);
    }
}

// One block per key row t2 of a key/value head: dK[t2] = sum over the group's query heads h (in
// order) of sum_{t >= t2} dS[h, t, t2] q[h, t].
template <typename T>
__global__ void naive_dk_kernel(T* dqkv, const T* qkv, const float* ds, Geo g) {
    const int64_t r = blockIdx.x, t2 = r % g.Tn, bkv = r / g.Tn, b = bkv / g.NKV, kvh = bkv % g.NKV;
    for (int64_t d = threadIdx.x; d < g.hs; d += blockDim.x) {
        float acc = 0;
        for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; h++) {
            const int64_t bh = b * g.NH + h;
            for (int64_t t = t2; t < g.Tn; t++)
                acc += ds[(bh * g.Tn + t) * g.Tn + t2] * to_f(q_row(qkv, g, b, h, t)[d]);
        }
        dqkv[(b * g.Tn + t2) * g.ld + g.k_col(kvh) + d] = from_f<T>(acc);
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
    const Geo g = attention_geometry(s);
    const int64_t rows = s.B * s.NH * s.Tn;
    ZG_DISPATCH(
        t, T,
        naive_forward_kernel<T><<<unsigned(rows), 128, s.Tn * 4, st>>>(
            static_cast<T*>(out), static_cast<float*>(saved), static_cast<const T*>(qkv), g));
    ZG_LAUNCH_CHECK();
}

int64_t naive_colsum_rows(const AttentionShape&, DType) {
    return 0;
}

void naive_backward(void* dqkv, const void* dout, const void* qkv, const void*, void* saved, void*,
                    float* dqkv_colsums, const AttentionShape& s, DType t, CUstream_st* st) {
    check_shape(s);
    ZG_CHECK(!dqkv_colsums, "naive attention: no column sums");
    naive_smem_check(s);
    const Geo g = attention_geometry(s);
    const int64_t rows = s.B * s.NH * s.Tn, kv_rows = s.B * g.NKV * s.Tn;
    auto* att = static_cast<float*>(saved);
    ZG_DISPATCH(t, T, {
        auto* dx = static_cast<T*>(dqkv);
        const auto* dy = static_cast<const T*>(dout);
        const auto* x = static_cast<const T*>(qkv);
        naive_dv_kernel<T><<<unsigned(kv_rows), 64, 0, st>>>(dx, dy, att, g);
        naive_ds_dq_kernel<T><<<unsigned(rows), 128, s.Tn * 4, st>>>(dx, dy, x, att, g);
        naive_dk_kernel<T><<<unsigned(kv_rows), 64, 0, st>>>(dx, x, att, g);
    });
    ZG_LAUNCH_CHECK();
    unrotate_dqk(dqkv, s, t, st);
}

}  // namespace

AttentionVariant naive_attention_entry() {
    return {"naive",           "T x T probabilities materialised (fp32) and saved for backward",
            naive_saved_bytes, naive_scratch_bytes,
            naive_forward,     naive_colsum_rows,
            naive_backward};
}

}  // namespace zgpt::cuda

#include "kernels/core/cuda_common.cuh"
#include "kernels/ops/copy_spans.h"

namespace zgpt::cuda {

namespace {

// blockIdx.y: the span; the x blocks stride over its floats.
__global__ void copy_spans_kernel(float* dst, const float* src, const CopySpan* spans) {
    const CopySpan s = spans[blockIdx.y];
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < s.len; i += stride)
        dst[s.to + i] = src[s.from + i];
}

__global__ void zero_spans_kernel(float* dst, const FloatSpan* spans) {
    const FloatSpan s = spans[blockIdx.y];
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < s.len; i += stride)
        dst[s.at + i] = 0.0f;
}

}  // namespace

void copy_spans(float* dst, const float* src, const CopySpan* spans, int count, CUstream_st* s) {
    ZG_CHECK(count >= 0 && count <= 65535 && (count == 0 || (dst && src && spans)),
             "copy_spans: 0 to 65535 spans and their buffers");
    if (count == 0) return;
    copy_spans_kernel<<<dim3(32, unsigned(count)), 256, 0, s>>>(dst, src, spans);
    ZG_LAUNCH_CHECK();
}

void zero_spans(float* dst, const FloatSpan* spans, int count, CUstream_st* s) {
    ZG_CHECK(count >= 0 && count <= 65535 && (count == 0 || (dst && spans)),
             "zero_spans: 0 to 65535 spans and their buffer");
    if (count == 0) return;
    zero_spans_kernel<<<dim3(32, unsigned(count)), 256, 0, s>>>(dst, spans);
    ZG_LAUNCH_CHECK();
}

}  // namespace zgpt::cuda

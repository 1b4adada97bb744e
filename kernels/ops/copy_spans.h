// Many small copies inside device memory as one launch: a list of spans, each `len` floats from
// src + from to dst + to. ZeRO-1 packs the fp32 weights the passes read (the norms') from their
// places in the arena into one buffer for a single all-gather, and unpacks the other ranks' back.
// zero_spans clears many small spans in one launch the same way (the gradient arena's biases and
// norms between the weight matrices at the start of a step).
#pragma once
#include <cstdint>

struct CUstream_st;
namespace zgpt::cuda {

struct CopySpan {
    int64_t from, to, len;  // in floats
};

// spans: a device array of `count` spans (CUDA builds only: kernels/ops/copy_spans.cu). The
// destinations must not overlap each other or any source.
void copy_spans(float* dst, const float* src, const CopySpan* spans, int count, CUstream_st* s);

struct FloatSpan {
    int64_t at, len;  // in floats
};
// dst + at .. + len set to zero for each of the `count` spans of the device array `spans`.
void zero_spans(float* dst, const FloatSpan* spans, int count, CUstream_st* s);

}  // namespace zgpt::cuda

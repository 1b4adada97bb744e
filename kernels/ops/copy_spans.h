// Many small copies inside device memory as one launch: a list of spans, each `len` floats from
// src + from to dst + to. ZeRO-1 packs the fp32 weights the passes read (the norms') from their
// places in the arena into one buffer for a single all-gather, and unpacks the other ranks' back.
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

}  // namespace zgpt::cuda

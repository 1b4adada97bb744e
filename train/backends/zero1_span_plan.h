// How ZeRO-1 gathers a few spans of the fp32 weights in one all-gather (zero1_weight_gather.h):
// each rank's pieces of the spans, those inside its equal chunk of the arena, packed in arena
// order into that rank's block of a staging buffer of ranks x block floats. Host code, so that
// the CPU tests check the plan; the GPU runs it with cuda::copy_spans.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/ops/copy_spans.h"

namespace zgpt {

struct Zero1SpanPlan {
    int64_t block = 0;                   // floats a rank's block holds (the most any rank packs)
    std::vector<cuda::CopySpan> pack;    // this rank's pieces: arena -> its block of the staging
    std::vector<cuda::CopySpan> unpack;  // every other rank's: its block -> the arena
};

// spans: sorted, disjoint [lo, hi) of an arena of n floats cut into chunks of `chunk` (rank r's:
// [r chunk, min(n, (r + 1) chunk))).
Zero1SpanPlan plan_span_gather(const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t n,
                               int ranks, int rank, int64_t chunk);

}  // namespace zgpt

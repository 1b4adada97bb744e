// How fast_pingpong_kernel splits a CTA's slice of 16-byte chunks into the parts it copies on
// separate mbarriers: the parts' size and bounds, and the chunks of a part a thread takes in the
// statistics pass. Host and device code, so the assignment is tested on the CPU
// (tests/test_cross_entropy.cpp).
#pragma once

#include <algorithm>

#include "kernels/core/host_device.h"

namespace zgpt::cuda {

// Chunks per part when `chunks` chunks are copied in `parts` parts (at least 1).
ZG_HOST_DEVICE constexpr int part_size(int chunks, int parts) {
    return chunks > 0 ? (chunks + parts - 1) / parts : 1;
}

// Part p of `parts`, `size` chunks each, covers the whole chunks [part_lo, part_hi) of nv; the
// parts tile [0, nv).
ZG_HOST_DEVICE constexpr int part_lo(int nv, int p, int size) {
    return p == 0 ? 0 : std::min(nv, p * size);
}
ZG_HOST_DEVICE constexpr int part_hi(int nv, int p, int parts, int size) {
    return p == parts - 1 ? nv : std::min(nv, (p + 1) * size);
}

// The first chunk c >= lo with c = tid (mod threads), threads a power of two, so that a thread
// takes the same chunks whether it walks the slice whole (from tid) or part by part. (Starting
// each part at lo + tid gave a thread chunks in the sum pass its max pass had not seen.)
ZG_HOST_DEVICE constexpr int part_first(int lo, int tid, int threads) {
    return lo + ((tid - lo) & (threads - 1));
}

}  // namespace zgpt::cuda

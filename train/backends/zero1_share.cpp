#include "train/backends/zero1_share.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace zgpt {

std::vector<Zero1Share::Cut> Zero1Share::cuts(const VocabShardedArena& arena) {
    const int64_t n = arena.local().table.total();
    if (arena.parts() == 1) return {{{0, n}, true}};
    std::vector<Cut> c;
    for (const ArenaSlice& s : arena.replicated_spans()) c.push_back({s, true});
    for (const ArenaSlice& s : arena.vocab_spans()) c.push_back({s, false});
    // arena order: every rank then meets the pieces' collectives in one order
    std::sort(c.begin(), c.end(), [](const Cut& a, const Cut& b) { return a.span.lo < b.span.lo; });
    return c;
}

Zero1Share::Zero1Share(const VocabShardedArena& arena, Communicator* world, Communicator* peers) {
    const int64_t n = arena.local().table.total();
    if (!world) {
        pieces_.push_back({{0, n}, {0, n}, nullptr, 0});
        size_ = n;
        return;
    }
    for (const Cut& cut : cuts(arena)) {
        Communicator* comm = cut.world ? world : peers;
        if (comm && comm->size() < 2) comm = nullptr;
        Zero1Piece p{cut.span, cut.span, comm, size_};
        if (comm) {
            const ArenaSlice s = arena_slice(cut.span.hi - cut.span.lo, comm->size(), comm->rank());
            p.mine = {cut.span.lo + s.lo, cut.span.lo + s.hi};
        }
        size_ += p.mine.hi - p.mine.lo;
        pieces_.push_back(p);
    }
}

int64_t Zero1Share::largest_share(const VocabShardedArena& arena, int world_ranks) {
    if (world_ranks < 2) return arena.local().table.total();
    ZG_CHECK(world_ranks % arena.parts() == 0, "ZeRO-1: " + std::to_string(arena.parts()) +
                                                   " vocabulary parts do not divide " +
                                                   std::to_string(world_ranks) + " ranks");
    int64_t n = 0;
    for (const Cut& cut : cuts(arena)) {  // rank 0's slices are the largest
        const ArenaSlice s = arena_slice(cut.span.hi - cut.span.lo,
                                         cut.world ? world_ranks : world_ranks / arena.parts(), 0);
        n += s.hi - s.lo;
    }
    return n;
}

bool Zero1Share::sharded() const {
    return std::any_of(pieces_.begin(), pieces_.end(),
                       [](const Zero1Piece& p) { return p.comm != nullptr; });
}

std::vector<ArenaSlice> Zero1Share::ranges() const {
    std::vector<ArenaSlice> r;
    for (const Zero1Piece& p : pieces_) r.push_back(p.mine);
    return r;
}

std::vector<float> Zero1Share::take(const std::vector<float>& stored) const {
    std::vector<float> mine;
    mine.reserve(size_t(size_));
    for (const Zero1Piece& p : pieces_) {
        ZG_CHECK(p.mine.hi <= int64_t(stored.size()), "ZeRO-1: the arena is too small");
        mine.insert(mine.end(), stored.begin() + p.mine.lo, stored.begin() + p.mine.hi);
    }
    return mine;
}

std::vector<float> Zero1Share::gather(const float* mine, int64_t n) const {
    std::vector<float> stored(size_t(n), 0.0f);
    for (const Zero1Piece& p : pieces_) {
        const int64_t len = p.span.hi - p.span.lo;
        if (!p.comm) {
            std::copy_n(mine + p.offset, len, stored.begin() + p.span.lo);
            continue;
        }
        const std::vector<float> all = all_gather_slices(*p.comm, mine + p.offset, len);
        std::copy(all.begin(), all.end(), stored.begin() + p.span.lo);
    }
    return stored;
}

void Zero1Share::gather_in_place(float* stored) const {
    for (const Zero1Piece& p : pieces_) {
        if (!p.comm) continue;
        const std::vector<float> all =
            all_gather_slices(*p.comm, stored + p.mine.lo, p.span.hi - p.span.lo);
        std::copy(all.begin(), all.end(), stored + p.span.lo);
    }
}

}  // namespace zgpt

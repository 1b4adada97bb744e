// ZeRO-1 (parallel.zero1), shared by the backends: the AdamW moments a rank keeps, as pieces of
// its stored arena, each with the ranks that share it. Without a split vocabulary the whole arena
// is cut over the world. With one, the replicated spans (VocabShardedArena) are cut over the
// world, since every rank stores them, and the vocabulary spans over the peers, the ranks that
// store the same rows; a rank without peers (vocab_parallel equal to the rank count) keeps its
// vocabulary spans' moments whole. Each rank updates its slices, then the weights are gathered
// piece by piece. AdamW is elementwise, so the weights are bit-identical to replicated AdamW.
#pragma once
#include <cstdint>
#include <vector>

#include "train/dist/comm.h"
#include "train/vocab_parallel/vocab_sharded_arena.h"

namespace zgpt {

struct Zero1Piece {
    ArenaSlice span;               // of the stored arena, the same on every rank of comm
    ArenaSlice mine;               // this rank's slice of it: arena_slice of the span over comm
    Communicator* comm = nullptr;  // the ranks that share the span; null: this rank keeps it all
    int64_t offset = 0;            // where mine's moments start in this rank's moment arrays
};

class Zero1Share {
  public:
    // `world` null: no ZeRO-1, one piece, the whole stored arena. Otherwise the pieces above;
    // `peers`: VocabParallel::peers (unused without a split). Every rank of a run builds its own.
    Zero1Share(const VocabShardedArena& arena, Communicator* world, Communicator* peers);
    // The moment elements (of m, and again of v) that the rank keeping the most keeps, with
    // ZeRO-1 over world_ranks ranks (1: none) and the vocabulary split as in `arena`. Counting
    // only: what cuda_rank_bytes adds for the moments.
    static int64_t largest_share(const VocabShardedArena& arena, int world_ranks);

    const std::vector<Zero1Piece>& pieces() const { return pieces_; }
    int64_t size() const { return size_; }   // this rank's moment elements, piece after piece
    bool sharded() const;                    // some piece is shared with other ranks
    std::vector<ArenaSlice> ranges() const;  // mine of each piece

    // This rank's elements of a stored arena, piece after piece (size() of them).
    std::vector<float> take(const std::vector<float>& stored) const;
    // The stored arena of n elements from every rank's elements (`mine`: this rank's, size()).
    // Collective over each piece's ranks.
    std::vector<float> gather(const float* mine, int64_t n) const;
    // A host arena whose pieces' `mine` this rank has updated: every span made whole from its
    // ranks' slices, in place. Collective over each piece's ranks.
    void gather_in_place(float* stored) const;

  private:
    struct Cut {
        ArenaSlice span;
        bool world;  // cut over the world, else over the peers
    };
    static std::vector<Cut> cuts(const VocabShardedArena& arena);

    std::vector<Zero1Piece> pieces_;
    int64_t size_ = 0;
};

}  // namespace zgpt

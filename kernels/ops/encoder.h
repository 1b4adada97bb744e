// Token + position embedding. CPU reference (fp32 in training, double in gradient checks).
#pragma once
#include <cstdint>
#include <vector>

namespace zgpt::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (wpe null: no position table, rotary positions)
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                     int64_t Tn, int64_t C);

// out[b,t,:] = token_rows[b,t,:] + wpe[t,:]: the token rows came from elsewhere (a table split
// over vocab-parallel ranks, train/vocab_parallel/vocab_parallel_embedding.h).
template <typename T>
void add_positions(T* out, const T* token_rows, const T* wpe, int64_t B, int64_t Tn, int64_t C);

// Adds into dwte and dwpe; either may be null (not wanted).
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn,
                      int64_t C);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/ops/encoder.cu; CUDA builds only). Device pointers; `t` is the storage
// type of out/dout, wte and wpe; the weight gradients are fp32. wpe may be null (rotary
// positions: no table), as on the CPU.
#include "kernels/core/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t B,
                     int64_t Tn, int64_t C, DType t, CUstream_st* s);

// The positions of each distinct token of a batch, grouped by token (in position order), so the
// wte gradient is summed in a fixed order: no atomics. A token's positions come in entries of at
// most kBucketSegment, one thread block each: a frequent token (a newline is 12% of Shakespeare's
// GPT-2 tokens, 8,000 of a 65,536-token batch) would otherwise be one block's serial sum and the
// whole pass's tail. A token of several entries has their sums written to rows of partials
// (`slot`), then added into its gradient row in entry order by a second kernel.
constexpr int kBucketSegment = 128;
struct TokenBuckets {
    std::vector<int32_t> token;        // per entry: its token (a split token repeats)
    std::vector<int32_t> offset;       // entry i's positions: position[offset[i] .. offset[i+1])
    std::vector<int32_t> position;     // grouped by token, in position order
    std::vector<int32_t> slot;         // per entry: -1 (the token's only entry) or its partials row
    std::vector<int32_t> merge_token;  // the tokens split over entries
    std::vector<int32_t>
        merge_offset;  // merge_token[j]'s partials rows: [merge_offset[j], merge_offset[j+1])
    int64_t entries() const { return int64_t(token.size()); }
    int64_t merged() const { return int64_t(merge_token.size()); }
};
// Rows of partials that n positions can need: a token of c > kBucketSegment positions takes
// ceil(c / kBucketSegment) < 2 c / kBucketSegment of them.
inline int64_t bucket_partial_rows(int64_t n) {
    return 2 * n / kBucketSegment + 1;
}
// Negative tokens (a vocabulary shard's "not mine") get no entry. Host code, in every build.
TokenBuckets bucket_tokens(const int32_t* tokens, int64_t n);

// out[b,t,:] = token_rows[b,t,:] + wpe[t,:], all of type `t`, summed in fp32 and rounded once:
// the same values as encoder_forward when the rows are wte's (a table split over vocab-parallel
// ranks).
void add_positions(void* out, const void* token_rows, const void* wpe, int64_t B, int64_t Tn,
                   int64_t C, DType t, CUstream_st* s);
// `blocks` blocks of n token rows, block b's tokens at tokens + b * token_stride and its rows at
// out + b * out_stride (elements of `t`): out row i = table[tokens[i] - v0,:] where
// v0 <= tokens[i] < v0 + rows, else zero bits. This rank's share of the token rows of a
// vocab-parallel table, for every rank of the group in one launch.
void lookup_rows_in_shard(void* out, int64_t out_stride, const int32_t* tokens,
                          int64_t token_stride, int64_t blocks, int64_t n, const void* table,
                          int64_t v0, int64_t rows, int64_t C, DType t, CUstream_st* s);

// TokenBuckets' arrays on the device, and the partials (bucket_partial_rows(n) x C floats).
struct DeviceBuckets {
    const int32_t *token = nullptr, *offset = nullptr, *position = nullptr, *slot = nullptr;
    const int32_t *merge_token = nullptr, *merge_offset = nullptr;
    int64_t entries = 0, merged = 0;
    float* partials = nullptr;
};

// Adds into dwte and dwpe (either may be null; dwte needs the buckets of the batch's tokens).
void encoder_backward(float* dwte, float* dwpe, const void* dout, const DeviceBuckets& bk,
                      int64_t B, int64_t Tn, int64_t C, DType t, CUstream_st* s);

}  // namespace zgpt::cuda

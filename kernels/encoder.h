// Token + position embedding. CPU reference (fp32 in training, double in gradient checks).
#pragma once
#include <cstdint>
#include <vector>

namespace zgpt::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                     int64_t Tn, int64_t C);

// out[b,t,:] = token_rows[b,t,:] + wpe[t,:]: the token rows came from elsewhere (a table split
// over vocab-parallel ranks, train/vocab_parallel_embedding.h).
template <typename T>
void add_positions(T* out, const T* token_rows, const T* wpe, int64_t B, int64_t Tn, int64_t C);

// Adds into dwte and dwpe; either may be null (not wanted).
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn,
                      int64_t C);

}  // namespace zgpt::cpu

// CUDA launchers (kernels/encoder.cu; CUDA builds only). Device pointers; `t` is the storage type
// of out/dout, wte and wpe; the weight gradients are fp32.
#include "kernels/dtype.h"
struct CUstream_st;
namespace zgpt::cuda {

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t B,
                     int64_t Tn, int64_t C, DType t, CUstream_st* s);

// The positions of each distinct token of a batch, grouped by token (in position order), so the
// wte gradient is summed by one thread per (token, channel) in a fixed order: no atomics.
struct TokenBuckets {
    std::vector<int32_t> token;   // distinct tokens
    std::vector<int32_t> offset;  // token[i]'s positions are position[offset[i] .. offset[i+1])
    std::vector<int32_t> position;
};
TokenBuckets bucket_tokens(const int32_t* tokens, int64_t n);

// out[b,t,:] = token_rows[b,t,:] (fp32) + wpe[t,:], rounded once to `t`: the same values as
// encoder_forward when the rows are wte's (a table split over vocab-parallel ranks).
void add_positions(void* out, const float* token_rows, const void* wpe, int64_t B, int64_t Tn,
                   int64_t C, DType t, CUstream_st* s);
// out[i,:] = table[tokens[i] - v0,:] (fp32) where v0 <= tokens[i] < v0 + rows, else zeros: this
// rank's share of the token rows of a vocab-parallel table.
void lookup_rows_in_shard(float* out, const int32_t* tokens, int64_t n, const void* table,
                          int64_t v0, int64_t rows, int64_t C, DType t, CUstream_st* s);

// Adds into dwte and dwpe (either may be null). d_token/d_offset/d_position are device copies of
// the buckets.
void encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* d_token,
                      const int32_t* d_offset, const int32_t* d_position, int64_t n_distinct,
                      int64_t B, int64_t Tn, int64_t C, DType t, CUstream_st* s);

}  // namespace zgpt::cuda

// The host generator's normal stream (kernels/core/rng.h) drawn on the GPU: GPT-2 1558M's 1.6G
// initial weights take seconds on the host's cores and milliseconds here. The counter and the
// Box-Muller transform are the host's, in double; the device's log and cos may round the last bit
// of a double differently from the C library's, so a rare value (about one in 10^8) differs from
// the host's in its last float bit.
#pragma once
#include <cstdint>

struct CUstream_st;
namespace zgpt::cuda {

// out[i] = float(stddev * x) for x the (first + i)-th value of Rng(seed).normal()'s stream, i < n
// (out: device memory).
void normal_fill(float* out, int64_t n, uint64_t seed, uint64_t first, double stddev,
                 CUstream_st* s);

// The same into host memory, through a device buffer of at most 256 MB (synchronous).
void normal_fill_host(float* host, int64_t n, uint64_t seed, uint64_t first, double stddev);

}  // namespace zgpt::cuda

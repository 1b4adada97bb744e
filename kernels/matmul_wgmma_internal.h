// What the `wgmma` matmul variant's two schedules share (kernels/matmul_wgmma.cu, the cooperative
// kernel and the dispatch; kernels/matmul_wgmma_pingpong.cu).
#pragma once
#include "kernels/matmul.h"

namespace zgpt::cuda {

inline bool wgmma_has_bias(Epilogue e) {
    return e == Epilogue::bias || e == Epilogue::gelu_aux_bias;
}
// D = GELU(pre), pre stored to aux
inline bool wgmma_has_gelu(Epilogue e) {
    return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias;
}

// Launches g (gemm_wgmma_usable(g) holds) on the ping-pong kernel.
bool gemm_wgmma_pingpong(const Gemm& g, CUstream_st* stream);

}  // namespace zgpt::cuda

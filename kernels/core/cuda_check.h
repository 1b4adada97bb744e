// CUDA error checks with file:line, throwing zgpt::Error (include from .cu files only).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "kernels/core/check.h"

#define ZG_CUDA_CHECK(expr)                                                                \
    do {                                                                                   \
        const cudaError_t zg_err_ = (expr);                                                \
        if (zg_err_ != cudaSuccess)                                                        \
            ::zgpt::fail_check(#expr, __FILE__, __LINE__,                                  \
                               std::string("CUDA error: ") + cudaGetErrorString(zg_err_)); \
    } while (0)

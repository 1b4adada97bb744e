// ZG_HOST_DEVICE: a function compiled for the host and, under nvcc, for the device too, so that
// host and GPU code share one definition (and its bits).
#pragma once

#if defined(__CUDACC__)
#define ZG_HOST_DEVICE __host__ __device__
#else
#define ZG_HOST_DEVICE
#endif

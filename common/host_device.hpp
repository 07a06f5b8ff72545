// host_device.hpp: one macro so scalar math can be written once for both backends.
//
// Under nvcc, BIGBATCH_HD marks a function __host__ __device__; in plain C++ it is
// empty. Use it for small pure functions (activation formulas, fp16 rounding, the RNG)
// that the CPU reference and the CUDA kernels must compute identically.
#pragma once

#if defined(__CUDACC__)
#define BIGBATCH_HD __host__ __device__
#else
#define BIGBATCH_HD
#endif

// cuda_common.cuh: shared pieces of the CUDA backend (only .cu files include this).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/cuda_runtime.hpp"
#include "common/dtype.hpp"

namespace bigbatch {

template <>
struct DTypeOf<__half> {
  static constexpr DType value = DType::f16;
};

namespace cuda {

inline constexpr int kThreadsPerBlock = 256;

/// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads = kThreadsPerBlock) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

/// After every launch: turns a launch error into an exception naming the kernel.
#define BIGBATCH_CHECK_LAUNCH(name) ::bigbatch::cuda_rt::check_last_launch(name)

}  // namespace cuda
}  // namespace bigbatch

// cuda_common.cuh: shared pieces of the CUDA backend (only .cu files include this): launch
// sizes, the dispatch on f32/f16/bf16, element loads and stores, grid-stride loops, block
// reductions and the launch check (the sums over rows, in reduction_order.hpp's orders, are in
// cuda_row_sums.cuh). Write a helper here once instead of again in each .cu file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/cuda_runtime.hpp"
#include "common/dtype.hpp"
#include "common/integer_math.hpp"

namespace bigbatch {

/// __half, the GPU's binary16, is f16.
template <>
struct DTypeOf<__half> {
  /// DType::f16.
  static constexpr DType value = DType::f16;
};

/// __nv_bfloat16, the GPU's bfloat16, is bf16.
template <>
struct DTypeOf<__nv_bfloat16> {
  /// DType::bf16.
  static constexpr DType value = DType::bf16;
};

namespace cuda {

// ---- launch sizes -------------------------------------------------------------------

/// Threads per block of most kernels; a power of two, and the block size block_reduce needs.
inline constexpr int kThreadsPerBlock = 256;

/// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads = kThreadsPerBlock) {
  const std::int64_t blocks = ceil_div(n, std::int64_t{threads});
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

/// Blocks for a one-block-per-row kernel: one per row, at most 65535 (the kernel's loop
/// `for (i = blockIdx.x; i < rows; i += gridDim.x)` covers the rows past the grid).
/// Precondition: rows > 0 (a grid of zero blocks does not launch).
inline unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>(rows < 65535 ? rows : 65535);
}

// ---- f32/f16/bf16 dispatch ------------------------------------------------------------

/// An element type as a value, so that a generic lambda can receive it.
template <class T>
struct ElementType {
  /// The element type itself.
  using type = T;
};

/// Calls f(ElementType<float>{}) for f32, f(ElementType<__half>{}) for f16 and
/// f(ElementType<__nv_bfloat16>{}) for bf16, and returns what f returns. Typical use, with
/// a C++20 template lambda:
/// \code
///   dispatch_floating("layernorm_forward", x.dtype(), [&]<class T>(ElementType<T>) {
///     forward_typed<T>(x, weight, bias, y, mean, rstd, eps);
///   });
/// \endcode
/// The CUDA kernels take f32, f16 and bf16 only (f64 exists only on the CPU; i32 holds
/// labels). Each op's dispatcher has already checked that; any other dtype throws, naming
/// `op`.
template <class F>
decltype(auto) dispatch_floating(const char* op, DType dtype, F&& f) {
  if (dtype == DType::f16) return f(ElementType<__half>{});
  if (dtype == DType::bf16) return f(ElementType<__nv_bfloat16>{});
  if (dtype == DType::f32) return f(ElementType<float>{});
  throw std::invalid_argument(std::string(op) + ": the CUDA kernels take f32, f16 or bf16, got " +
                              std::string(dtype_name(dtype)));
}

// ---- element loads and stores ------------------------------------------------------------
// Kernels compute in float and round on store. to_float widens exactly (every f16 and bf16
// value is a float); from_float<T> rounds to nearest even for __half (__float2half_rn) and
// __nv_bfloat16 (__float2bfloat16_rn, common/bfloat16.hpp's rounding) and is the identity
// for float.

/// v itself.
__device__ inline float to_float(float v) { return v; }
/// v widened to float (exact).
__device__ inline float to_float(__half v) { return __half2float(v); }
/// v widened to float (exact).
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

/// v rounded to T, the element type a kernel stores.
template <class T>
__device__ inline T from_float(float v);
/// v itself.
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
/// v rounded to binary16, to nearest even (__float2half_rn).
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
/// v rounded to bfloat16, to nearest even (__float2bfloat16_rn).
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- grid-stride loops -------------------------------------------------------------------

/// The indices this thread visits in a grid-stride loop over [0, n): its global index
/// (blockIdx.x * blockDim.x + threadIdx.x), then every gridDim.x * blockDim.x after it, in
/// 64-bit arithmetic. Every index in [0, n) is visited by exactly one thread, for any 1-D
/// grid (blockIdx.y and beyond are left to the kernel):
///   for (const std::int64_t i : grid_stride(n)) out[i] = ...;
class GridStride {
 public:
  /// The position in the loop: the current index and the grid's stride.
  class Iterator {
   public:
    /// Starts at `index`; each increment adds `step`.
    __device__ Iterator(std::int64_t index, std::int64_t step) : index_(index), step_(step) {}
    /// The current index.
    __device__ std::int64_t operator*() const { return index_; }
    /// Moves to the next index of this thread: index += step.
    __device__ Iterator& operator++() {
      index_ += step_;
      return *this;
    }
    /// "Not yet at the end" is index < n: the last step may jump past n.
    __device__ bool operator!=(const Iterator& end) const { return index_ < end.index_; }

   private:
    std::int64_t index_;
    std::int64_t step_;
  };

  /// The loop over [0, n).
  __device__ explicit GridStride(std::int64_t n) : n_(n) {}
  /// This thread's first index, blockIdx.x * blockDim.x + threadIdx.x, with the grid's
  /// stride gridDim.x * blockDim.x.
  __device__ Iterator begin() const {
    return {blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x,
            std::int64_t{gridDim.x} * blockDim.x};
  }
  /// The bound n.
  __device__ Iterator end() const { return {n_, 0}; }

 private:
  std::int64_t n_;
};

/// The grid-stride loop over [0, n) for the calling thread (see GridStride).
__device__ inline GridStride grid_stride(std::int64_t n) { return GridStride(n); }

// ---- block reductions --------------------------------------------------------------------

/// Reduces `value` over the block with `combine` (an associative float operation), halving
/// a shared-memory tree in a fixed order: the result depends on the values and the block
/// size only, never on timing or on the grid. Every thread gets the result. The tree's order
/// is not the CPU's sequential one, so a sum differs from the CPU's by rounding.
/// Preconditions: blockDim.x == kThreadsPerBlock (a power of two, so each halving pairs every
/// thread; a smaller block would read unset entries), a 1-D block, and every thread of the
/// block calls it the same number of times (it synchronises the block).
template <class Combine>
__device__ float block_reduce(float value, Combine combine) {
  __shared__ float partial[kThreadsPerBlock];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreadsPerBlock / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      partial[threadIdx.x] = combine(partial[threadIdx.x], partial[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float result = partial[0];
  __syncthreads();  // the next call overwrites `partial`
  return result;
}

/// The sum of `value` over the block (block_reduce's preconditions): plain float additions
/// (each rounds to nearest; with no product feeding them there is nothing to contract).
__device__ inline float block_sum(float value) {
  return block_reduce(value, [](float a, float b) { return a + b; });
}

/// The maximum of `value` over the block (block_reduce's preconditions); exact. fmaxf: a
/// NaN loses to a number.
__device__ inline float block_max(float value) {
  return block_reduce(value, [](float a, float b) { return fmaxf(a, b); });
}

/// After every launch: turns a launch error into an exception naming the kernel; with
/// BIGBATCH_SYNC_AFTER_LAUNCH (Debug builds) also an error while the kernel ran
/// (cuda_rt::check_last_launch).
#define BIGBATCH_CHECK_LAUNCH(name) ::bigbatch::cuda_rt::check_last_launch(name)

}  // namespace cuda
}  // namespace bigbatch

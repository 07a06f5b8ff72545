// cuda_row_sums.cuh: the CUDA backend's deterministic sums over rows, in the orders
// reduction_order.hpp defines (order 1: tiles of rows folded in tile order; order 2: a block's
// lanes, then block_sum's tree). Only the .cu files that sum over rows include it (batchnorm,
// bias, cross_entropy, layernorm), so a change to the order recompiles those and not every
// CUDA file.
#pragma once

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/reduction_order.hpp"

namespace bigbatch {
namespace cuda {

static_assert(reduction_order::kSumLanes == kThreadsPerBlock,
              "a vector sum's lanes are the threads of one block");

/// Order 1's first kernel: partials[(k * tiles + t) * cols + j] = P_t of term k of column j,
/// for k < K, where terms(k, i, j) is term k of row i, column j. One thread per column and
/// tile: blockIdx.x * blockDim.x + threadIdx.x is the column, blockIdx.y (striding by
/// gridDim.y) the tile.
template <int K, class Terms>
__global__ void column_tile_sums_kernel(Terms terms, float* partials, std::int64_t rows,
                                        std::int64_t cols) {
  const std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (j >= cols) return;
  const std::int64_t tiles = reduction_order::tile_count(rows);
  for (std::int64_t t = blockIdx.y; t < tiles; t += gridDim.y) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      partials[(k * tiles + t) * cols + j] =
          reduction_order::tile_sum(t, rows, [&](std::int64_t i) { return terms(k, i, j); });
    }
  }
}

/// Launches column_tile_sums_kernel over a [rows, cols] matrix into `partials` (K * tiles *
/// cols floats); nothing to launch when rows or cols is 0 (then there are no tiles).
template <int K, class Terms>
void launch_column_tile_sums(const char* name, Terms terms, float* partials, std::int64_t rows,
                             std::int64_t cols) {
  const std::int64_t tiles = reduction_order::tile_count(rows);
  if (tiles == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kThreadsPerBlock - 1) / kThreadsPerBlock),
                  static_cast<unsigned>(tiles < 65535 ? tiles : 65535));
  column_tile_sums_kernel<K><<<grid, kThreadsPerBlock>>>(terms, partials, rows, cols);
  BIGBATCH_CHECK_LAUNCH(name);
}

/// Order 1's second step for column j: start + P_0 + P_1 + ... over the `tiles` partials of
/// one term (partials + (k * tiles) * cols for term k), in tile order.
__device__ inline float fold_column_tiles(float start, const float* partials,
                                          std::int64_t tiles, std::int64_t cols,
                                          std::int64_t j) {
  return reduction_order::fold_tiles(start, tiles,
                                     [&](std::int64_t t) { return partials[t * cols + j]; });
}

/// Order 2 for one block: lane threadIdx.x adds values[begin + lane], values[begin + lane +
/// 256], ... below `end`, in order, then block_sum's halving tree; every thread gets the
/// result. block_reduce's preconditions hold.
__device__ inline float lane_tree_sum(const float* values, std::int64_t begin, std::int64_t end,
                                      std::int64_t stride = 1) {
  float lane = 0.0f;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kThreadsPerBlock) {
    lane = __fadd_rn(lane, values[i * stride]);
  }
  return block_sum(lane);
}

}  // namespace cuda
}  // namespace bigbatch

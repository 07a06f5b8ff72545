// reduction_order.hpp: the fixed orders in which the CUDA backend sums over the batch, written
// once for the kernels and for the host code that reproduces them.
//
// A parallel sum is deterministic when the grouping of its additions depends on the sizes
// alone, never on timing, the grid or atomics. The CUDA kernels use two such orders; the
// host functions below compute them step by step, so that a test can demand the GPU's bits
// exactly, and so that the order can be checked on a machine without a GPU.
//
// 1. Column sums over rows (bias, LayerNorm and BatchNorm parameter gradients, BatchNorm's
//    batch statistics): out[j] = start[j] + sum_i term(i, j), with the rows cut into tiles
//    of kTileRows = 32 (the last one short):
//      P_t     = term(32t, j) + term(32t + 1, j) + ...      the tile's rows in order,
//                                                          from the first term
//      out[j]  = (((start[j] + P_0) + P_1) + ...) + P_last  the tiles in order
//    each + one float addition rounded to nearest. The GPU computes every P_t in its own
//    thread (one thread per column and tile: many blocks), writes them to a partials buffer
//    [tiles, N], and a second kernel folds them in tile order. Because out[j] continues
//    from start[j] tile by tile, accumulating micro-batches whose rows are multiples of
//    32 (the last one may be short) gives the very bits of the whole batch, as the
//    row-by-row CPU order does for any split. The CPU reference keeps its row order (so
//    the two backends differ by rounding, bounded in the tests).
//
// 2. Sums of a vector (the cross-entropy loss over rows): the values are cut into chunks
//    of kSumChunk = 4096; in a chunk, lane l of 256 adds elements l, l + 256, ... in
//    order from 0; the lanes then meet in cuda::block_reduce's halving tree (for s = 128,
//    64, ..., 1: lane l < s adds lane l + s). That gives one partial per chunk (many
//    blocks); a second kernel, one block, sums the partials the same way (lane l adds
//    partials l, l + 256, ... in order, then the tree).
//
// This header must compile under nvcc (no half.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "common/host_device.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch::reduction_order {

/// Rows per tile of a column sum.
inline constexpr std::int64_t kTileRows = 32;
/// Lanes of a vector sum (the CUDA block size, cuda::kThreadsPerBlock).
inline constexpr int kSumLanes = 256;
/// Elements per chunk of a vector sum (one CUDA block each).
inline constexpr std::int64_t kSumChunk = 4096;

/// The number of tiles of `rows` rows: ceil(rows / kTileRows), 0 for no rows.
BIGBATCH_HD inline std::int64_t tile_count(std::int64_t rows) {
  return (rows + kTileRows - 1) / kTileRows;
}

// snippet: tile-order
/// P_t: the sum of term(i) over the rows of tile t (of `rows`), in row order, from the
/// first term (one rounded float addition per further row).
template <class Term>
BIGBATCH_HD float tile_sum(std::int64_t tile, std::int64_t rows, Term term) {
  const std::int64_t begin = tile * kTileRows;
  const std::int64_t end = begin + kTileRows < rows ? begin + kTileRows : rows;
  float sum = term(begin);
  for (std::int64_t i = begin + 1; i < end; ++i) sum = scalar_math::add_rn(sum, term(i));
  return sum;
}

/// start + partial(0) + partial(1) + ... + partial(tiles - 1), in that order.
template <class Partial>
BIGBATCH_HD float fold_tiles(float start, std::int64_t tiles, Partial partial) {
  float sum = start;
  for (std::int64_t t = 0; t < tiles; ++t) sum = scalar_math::add_rn(sum, partial(t));
  return sum;
}
// snippet end: tile-order

/// The column sum of order 1 for one column, on the host: start + sum_i term(i) over
/// `rows` rows, tile by tile, exactly as the CUDA kernels add it.
template <class Term>
float tiled_column_sum(float start, std::int64_t rows, Term term) {
  return fold_tiles(start, tile_count(rows),
                    [&](std::int64_t t) { return tile_sum(t, rows, term); });
}

/// cuda::block_reduce's halving tree over kSumLanes lanes, on the host: for s = 128, 64,
/// ..., 1, lane l < s adds lane l + s; returns lane 0. `lanes` is overwritten.
inline float halving_tree_sum(float* lanes) {
  for (int s = kSumLanes / 2; s > 0; s /= 2) {
    for (int l = 0; l < s; ++l) lanes[l] = scalar_math::add_rn(lanes[l], lanes[l + s]);
  }
  return lanes[0];
}

/// One level of order 2 on the host: value(i) for i in [begin, end) spread over the lanes
/// (lane l takes elements begin + l, begin + l + 256, ... in order), then the tree.
template <class Value>
float lane_sum(std::int64_t begin, std::int64_t end, Value value) {
  float lanes[kSumLanes] = {};
  for (std::int64_t i = begin; i < end; ++i) {
    float& lane = lanes[(i - begin) % kSumLanes];
    lane = scalar_math::add_rn(lane, value(i));
  }
  return halving_tree_sum(lanes);
}

/// The vector sum of order 2 on the host: sum of value(i) over [0, n), chunk partials
/// first, then the partials, exactly as the CUDA kernels add it (0 for n == 0).
template <class Value>
float chunked_sum(std::int64_t n, Value value) {
  std::vector<float> partials;
  for (std::int64_t begin = 0; begin < n; begin += kSumChunk) {
    partials.push_back(lane_sum(begin, begin + kSumChunk < n ? begin + kSumChunk : n, value));
  }
  return lane_sum(0, static_cast<std::int64_t>(partials.size()),
                  [&](std::int64_t c) { return partials[static_cast<std::size_t>(c)]; });
}

}  // namespace bigbatch::reduction_order

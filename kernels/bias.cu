#include "kernels/bias.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_row_sums.cuh"

namespace bigbatch::cuda {
namespace {

// y: [rows, cols], bias: [cols]
template <class T>
__global__ void add_bias_kernel(T* y, const float* bias, std::int64_t n, std::int64_t cols) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] = from_float<T>(to_float(y[i]) + bias[i % cols]);
  }
}

// bias_backward in reduction_order.hpp's order 1: the tile sums of dy (many blocks), then
// dbias[j] += the tiles in order (one thread per column).
template <class G>  // dy's element type, float or __half (widened exactly)
struct BiasGradientTerm {
  const G* dy;
  std::int64_t cols;
  __device__ float operator()(int, std::int64_t i, std::int64_t j) const {
    return to_float(dy[i * cols + j]);
  }
};

__global__ void bias_fold_kernel(const float* partials, float* dbias, std::int64_t tiles,
                                 std::int64_t cols) {
  for (const std::int64_t j : grid_stride(cols)) {
    dbias[j] = fold_column_tiles(dbias[j], partials, tiles, cols, j);
  }
}

}  // namespace

void add_bias(const Tensor& y, const Tensor& bias) {
  const std::int64_t n = y.numel();
  if (n == 0) return;
  dispatch_floating("add_bias", y.dtype(), [&]<class T>(ElementType<T>) {
    add_bias_kernel<<<grid_for(n), kThreadsPerBlock>>>(y.data<T>(), bias.data<float>(), n,
                                                       y.dim(1));
  });
  BIGBATCH_CHECK_LAUNCH("add_bias_kernel");
}

void bias_backward(const Tensor& dy, const Tensor& dbias) {
  const std::int64_t rows = dy.dim(0), cols = dy.dim(1);
  if (rows == 0 || cols == 0) return;
  const std::int64_t tiles = reduction_order::tile_count(rows);
  const Tensor partials({tiles, cols}, DType::f32, dy.device(), MemoryCategory::workspace);
  dispatch_floating("bias_backward", dy.dtype(), [&]<class G>(ElementType<G>) {
    launch_column_tile_sums<1>("bias_backward column_tile_sums_kernel",
                               BiasGradientTerm<G>{dy.data<G>(), cols}, partials.data<float>(),
                               rows, cols);
  });
  bias_fold_kernel<<<grid_for(cols), kThreadsPerBlock>>>(partials.data<float>(),
                                                         dbias.data<float>(), tiles, cols);
  BIGBATCH_CHECK_LAUNCH("bias_fold_kernel");
}

}  // namespace bigbatch::cuda

#include "kernels/bias.hpp"

#include <algorithm>

#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch {

void add_bias(const Tensor& y, const Tensor& bias) {
  const Device device = detail::common_device("add_bias", {&y, &bias});
  detail::check_rank("add_bias", "y", y, 2);
  if (y.dtype() == DType::f64 && device.is_cpu()) {
    detail::check_dtype("add_bias", "bias (for an f64 y)", bias, DType::f64);
  } else {
    detail::check_floating("add_bias", "y", y);
    detail::check_dtype("add_bias", "bias", bias, DType::f32);
  }
  detail::check_shape("add_bias", "bias", bias, {y.dim(1)});
  detail::check_same_or_disjoint("add_bias", "y", y, "bias", bias);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("add_bias", cuda::add_bias(y, bias));
  cpu::add_bias(y, bias);
}

void bias_backward(const Tensor& dy, const Tensor& dbias) {
  const Device device = detail::common_device("bias_backward", {&dy, &dbias});
  detail::check_rank("bias_backward", "dy", dy, 2);
  detail::check_floating("bias_backward", "dy", dy);
  // 16-bit gradients (mixed precision) are summed in f32: dbias is a parameter gradient.
  detail::check_dtype("bias_backward", "dbias", dbias,
                      dy.dtype() == DType::f64 ? DType::f64 : DType::f32);
  detail::check_shape("bias_backward", "dbias", dbias, {dy.dim(1)});
  detail::check_same_or_disjoint("bias_backward", "dbias", dbias, "dy", dy);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("bias_backward", cuda::bias_backward(dy, dbias));
  cpu::bias_backward(dy, dbias);
}

namespace cpu {
namespace {

// y: [M, N], bias: [N] (B is float, or double for an f64 y)
template <class T, class B>
void add_bias_typed(const Tensor& y, const Tensor& bias) {
  T* out = y.data<T>();
  const B* b = bias.data<B>();
  const std::int64_t rows = y.dim(0), cols = y.dim(1);
  const std::int64_t grain_rows =
      std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(cols, 1));
  parallel_for(rows, grain_rows, [&](std::int64_t row_begin, std::int64_t row_end) {
    run_vectorized([&] {
      for (std::int64_t i = row_begin; i < row_end; ++i) {
        T* row = out + i * cols;
        for (std::int64_t j = 0; j < cols; ++j) store(row + j, load(row + j) + b[j]);
      }
    });
  });
}

// dy: [M, N], dbias: [N]. Each thread owns a range of columns and walks every row in
// order; the columns of one row are independent additions, which is what vectorises.
// Eight rows at a time go through a register before the running sum is stored again:
// still one addition per row, in row order, but an eighth of the loads and stores.
template <class T, class G = T>  // T: the sums' type; G: dy's (a 16-bit dy widens exactly)
void bias_backward_typed(const Tensor& dy, const Tensor& dbias) {
  const G* grad = dy.data<G>();
  T* sum = dbias.data<T>();
  const std::int64_t rows = dy.dim(0), cols = dy.dim(1);
  constexpr std::int64_t kRowsPerPass = 8;
  // Threads split the columns in groups of one cache line, so that no two threads
  // write the same line of dbias; column blocks of 1024 keep the sums in L1.
  constexpr std::int64_t kGroup = 64 / sizeof(T), kBlock = 1024;
  const std::int64_t groups = (cols + kGroup - 1) / kGroup;
  const std::int64_t grain_groups =
      std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(rows * kGroup, 1));
  parallel_for(groups, grain_groups, [&](std::int64_t group_begin, std::int64_t group_end) {
    const std::int64_t col_begin = group_begin * kGroup;
    const std::int64_t col_end = std::min(group_end * kGroup, cols);
    run_vectorized([&] {
      for (std::int64_t block = col_begin; block < col_end; block += kBlock) {
        const std::int64_t block_end = std::min(block + kBlock, col_end);
        std::int64_t i = 0;
        for (; i + kRowsPerPass <= rows; i += kRowsPerPass) {
          const G* row = grad + i * cols;
          for (std::int64_t j = block; j < block_end; ++j) {
            T running = sum[j];
            for (std::int64_t r = 0; r < kRowsPerPass; ++r) {
              running = running + load(row + r * cols + j);
            }
            sum[j] = running;
          }
        }
        for (; i < rows; ++i) {
          const G* row = grad + i * cols;
          for (std::int64_t j = block; j < block_end; ++j) sum[j] = sum[j] + load(row + j);
        }
      }
    });
  });
}

}  // namespace

void add_bias(const Tensor& y, const Tensor& bias) {
  with_float_type("add_bias", y.dtype(),
                  [&]<class T>(T) { add_bias_typed<T, ComputeType<T>>(y, bias); });
}

void bias_backward(const Tensor& dy, const Tensor& dbias) {
  with_float_type("bias_backward", dy.dtype(),
                  [&]<class G>(G) { bias_backward_typed<ComputeType<G>, G>(dy, dbias); });
}

}  // namespace cpu
}  // namespace bigbatch

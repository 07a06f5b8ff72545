#include "kernels/bias.hpp"
#include "kernels/cuda_common.cuh"

namespace bigbatch::cuda {
namespace {

// y: [rows, cols], bias: [cols]
template <class T>
__global__ void add_bias_kernel(T* y, const float* bias, std::int64_t n, std::int64_t cols) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] = from_float<T>(to_float(y[i]) + bias[i % cols]);
  }
}

// dy: [rows, cols], dbias: [cols]. One thread per column adds the rows in order (the
// contract in bias.hpp); neighbouring threads read neighbouring columns, so each row's
// reads coalesce.
template <class G>  // dy's element type, float or __half (widened exactly)
__global__ void bias_backward_kernel(const G* dy, float* dbias, std::int64_t rows,
                                     std::int64_t cols) {
  for (const std::int64_t j : grid_stride(cols)) {
    float sum = dbias[j];
    for (std::int64_t i = 0; i < rows; ++i) sum = __fadd_rn(sum, to_float(dy[i * cols + j]));
    dbias[j] = sum;
  }
}

}  // namespace

void add_bias(const Tensor& y, const Tensor& bias) {
  const std::int64_t n = y.numel();
  if (n == 0) return;
  dispatch_f16_f32("add_bias", y.dtype(), [&]<class T>(ElementType<T>) {
    add_bias_kernel<<<grid_for(n), kThreadsPerBlock>>>(y.data<T>(), bias.data<float>(), n,
                                                       y.dim(1));
  });
  BIGBATCH_CHECK_LAUNCH("add_bias_kernel");
}

void bias_backward(const Tensor& dy, const Tensor& dbias) {
  const std::int64_t cols = dy.dim(1);
  if (cols == 0) return;
  dispatch_f16_f32("bias_backward", dy.dtype(), [&]<class G>(ElementType<G>) {
    bias_backward_kernel<<<grid_for(cols), kThreadsPerBlock>>>(
        dy.data<G>(), dbias.data<float>(), dy.dim(0), cols);
  });
  BIGBATCH_CHECK_LAUNCH("bias_backward_kernel");
}

}  // namespace bigbatch::cuda

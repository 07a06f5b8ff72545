// batchnorm.cu: BatchNorm over the batch on the GPU (the contract is in batchnorm.hpp).
//
// Every reduction over the batch follows reduction_order.hpp's order 1 (tiles of 32 rows
// summed by many blocks into a partials buffer, then the tiles in order by one thread per
// feature) with unfused float operations (__fmul_rn, __fadd_rn): deterministic, and the
// same terms as the CPU reference, added in another order (rounding differences only). The elementwise parts (y, dx, the running averages) are plain expressions, which nvcc
// may contract into fused multiply-adds: they differ from the CPU by rounding only.
#include "kernels/batchnorm.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_row_sums.cuh"

namespace bigbatch::cuda {
namespace {

/// The statistics' terms for reduction_order.hpp's order 1: x itself while `mean` is null
/// (the first pass), then the squared deviation (x - mean[j])^2.
template <class T>
struct StatisticsTerms {
  const T* x;
  const float* mean;  // nullptr in the first pass
  std::int64_t N;
  __device__ float operator()(int, std::int64_t i, std::int64_t j) const {
    const float value = to_float(x[i * N + j]);
    if (mean == nullptr) return value;
    const float deviation = value - mean[j];
    return __fmul_rn(deviation, deviation);
  }
};

/// Per feature j: mean = (the tiles of x, in order) / M.
__global__ void mean_fold_kernel(const float* partials, float* mean, std::int64_t tiles,
                                 std::int64_t M, std::int64_t N) {
  for (const std::int64_t j : grid_stride(N)) {
    mean[j] = fold_column_tiles(0.0f, partials, tiles, N, j) / static_cast<float>(M);
  }
}

/// Per feature j, from the tiles of the squared deviations: rstd (biased variance) and the
/// running statistics.
__global__ void variance_fold_kernel(const float* partials, const float* mean, float* rstd,
                                     float* running_mean, float* running_var, std::int64_t tiles,
                                     std::int64_t M, std::int64_t N, float momentum, float eps) {
  for (const std::int64_t j : grid_stride(N)) {
    const float squared_deviations = fold_column_tiles(0.0f, partials, tiles, N, j);
    rstd[j] = detail::inverse_std(squared_deviations / static_cast<float>(M), eps);
    running_mean[j] = detail::running_average(running_mean[j], mean[j], momentum);
    running_var[j] = detail::running_average(
        running_var[j], squared_deviations / static_cast<float>(M - 1), momentum);
  }
}

/// Per feature j: rstd = 1 / sqrt(running_var + eps), for evaluation.
__global__ void running_rstd_kernel(const float* running_var, float* rstd, std::int64_t N,
                                    float eps) {
  for (const std::int64_t j : grid_stride(N)) {
    rstd[j] = detail::inverse_std(running_var[j], eps);
  }
}

/// y = xhat * weight + bias, xhat = (x - mean[j]) * rstd[j], over all M * N elements.
template <class T>
__global__ void normalize_kernel(const T* x, const float* weight, const float* bias,
                                 const float* mean, const float* rstd, T* y, std::int64_t M,
                                 std::int64_t N) {
  for (const std::int64_t k : grid_stride(M * N)) {
    const std::int64_t j = k % N;
    const float xhat = detail::normalize(to_float(x[k]), mean[j], rstd[j]);
    y[k] = from_float<T>(xhat * weight[j] + bias[j]);
  }
}

/// The backward's terms for reduction_order.hpp's order 1: k = 0 is dy, k = 1 is
/// dy * xhat.
template <class T>
struct FeatureGradientTerms {
  const T* x;
  const float* mean;
  const float* rstd;
  const T* dy;
  std::int64_t N;
  __device__ float operator()(int k, std::int64_t i, std::int64_t j) const {
    const float g = to_float(dy[i * N + j]);
    if (k == 0) return g;
    return __fmul_rn(g, detail::normalize(to_float(x[i * N + j]), mean[j], rstd[j]));
  }
};

/// Per feature j, the tiles in order: dbias += dy, dweight += dy * xhat, and the batch means
/// of dy and dy * xhat that dx needs (mean_dy, mean_dy_xhat: [N] each).
__global__ void feature_gradient_fold_kernel(const float* partials, float* dweight, float* dbias,
                                             float* mean_dy, float* mean_dy_xhat,
                                             std::int64_t tiles, std::int64_t M,
                                             std::int64_t N) {
  const float* dy_tiles = partials;
  const float* dy_xhat_tiles = partials + tiles * N;
  for (const std::int64_t j : grid_stride(N)) {
    dbias[j] = fold_column_tiles(dbias[j], dy_tiles, tiles, N, j);
    dweight[j] = fold_column_tiles(dweight[j], dy_xhat_tiles, tiles, N, j);
    mean_dy[j] = fold_column_tiles(0.0f, dy_tiles, tiles, N, j) / static_cast<float>(M);
    mean_dy_xhat[j] = fold_column_tiles(0.0f, dy_xhat_tiles, tiles, N, j) / static_cast<float>(M);
  }
}

/// dx = (weight * rstd) * ((dy - mean(dy)) - xhat * mean(dy * xhat)), over all elements.
template <class T>
__global__ void input_gradient_kernel(const T* x, const float* weight, const float* mean,
                                      const float* rstd, const T* dy, const float* mean_dy,
                                      const float* mean_dy_xhat, T* dx, std::int64_t M,
                                      std::int64_t N) {
  for (const std::int64_t k : grid_stride(M * N)) {
    const std::int64_t j = k % N;
    const float xhat = detail::normalize(to_float(x[k]), mean[j], rstd[j]);
    const float centered = (to_float(dy[k]) - mean_dy[j]) - xhat * mean_dy_xhat[j];
    dx[k] = from_float<T>((weight[j] * rstd[j]) * centered);
  }
}

template <class T>
void launch_normalize(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const float* mean, const float* rstd, const Tensor& y) {
  const std::int64_t M = x.dim(0), N = x.dim(1);
  normalize_kernel<T><<<grid_for(M * N), kThreadsPerBlock>>>(
      x.data<T>(), weight.data<float>(), bias.data<float>(), mean, rstd, y.data<T>(), M, N);
  BIGBATCH_CHECK_LAUNCH("batchnorm normalize_kernel");
}

template <class T>
void forward_train_typed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd,
                         const Tensor& running_mean, const Tensor& running_var, float momentum,
                         float eps) {
  const std::int64_t M = x.dim(0), N = x.dim(1);
  if (N == 0) return;
  const std::int64_t tiles = reduction_order::tile_count(M);
  const Tensor partials({tiles, N}, DType::f32, x.device(), MemoryCategory::workspace);
  launch_column_tile_sums<1>("batchnorm column_tile_sums_kernel (mean)",
                             StatisticsTerms<T>{x.data<T>(), nullptr, N}, partials.data<float>(),
                             M, N);
  mean_fold_kernel<<<grid_for(N), kThreadsPerBlock>>>(partials.data<float>(), mean.data<float>(),
                                                      tiles, M, N);
  BIGBATCH_CHECK_LAUNCH("batchnorm mean_fold_kernel");
  launch_column_tile_sums<1>("batchnorm column_tile_sums_kernel (variance)",
                             StatisticsTerms<T>{x.data<T>(), mean.data<float>(), N},
                             partials.data<float>(), M, N);
  variance_fold_kernel<<<grid_for(N), kThreadsPerBlock>>>(
      partials.data<float>(), mean.data<float>(), rstd.data<float>(), running_mean.data<float>(),
      running_var.data<float>(), tiles, M, N, momentum, eps);
  BIGBATCH_CHECK_LAUNCH("batchnorm variance_fold_kernel");
  launch_normalize<T>(x, weight, bias, mean.data<float>(), rstd.data<float>(), y);
}

template <class T>
void forward_eval_typed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                        float eps) {
  const std::int64_t M = x.dim(0), N = x.dim(1);
  if (M == 0 || N == 0) return;
  const Tensor rstd({N}, DType::f32, x.device(), MemoryCategory::workspace);
  running_rstd_kernel<<<grid_for(N), kThreadsPerBlock>>>(running_var.data<float>(),
                                                         rstd.data<float>(), N, eps);
  BIGBATCH_CHECK_LAUNCH("batchnorm running_rstd_kernel");
  launch_normalize<T>(x, weight, bias, running_mean.data<float>(), rstd.data<float>(), y);
}

template <class T>
void backward_typed(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                    const Tensor& dy, const Tensor& dx, const Tensor& dweight,
                    const Tensor& dbias) {
  const std::int64_t M = x.dim(0), N = x.dim(1);
  if (N == 0) return;
  // mean over the batch of dy, and of dy * xhat: [2, N]
  const Tensor batch_means({2, N}, DType::f32, x.device(), MemoryCategory::workspace);
  float* mean_dy = batch_means.data<float>();
  float* mean_dy_xhat = mean_dy + N;
  const std::int64_t tiles = reduction_order::tile_count(M);
  const Tensor partials({2, tiles, N}, DType::f32, x.device(), MemoryCategory::workspace);
  launch_column_tile_sums<2>(
      "batchnorm column_tile_sums_kernel (gradients)",
      FeatureGradientTerms<T>{x.data<T>(), mean.data<float>(), rstd.data<float>(), dy.data<T>(),
                              N},
      partials.data<float>(), M, N);
  feature_gradient_fold_kernel<<<grid_for(N), kThreadsPerBlock>>>(
      partials.data<float>(), dweight.data<float>(), dbias.data<float>(), mean_dy, mean_dy_xhat,
      tiles, M, N);
  BIGBATCH_CHECK_LAUNCH("batchnorm feature_gradient_fold_kernel");
  input_gradient_kernel<T><<<grid_for(M * N), kThreadsPerBlock>>>(
      x.data<T>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<T>(),
      mean_dy, mean_dy_xhat, dx.data<T>(), M, N);
  BIGBATCH_CHECK_LAUNCH("batchnorm input_gradient_kernel");
}

}  // namespace

void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             const Tensor& running_mean, const Tensor& running_var,
                             float momentum, float eps) {
  dispatch_floating("batchnorm_forward_train", x.dtype(), [&]<class T>(ElementType<T>) {
    forward_train_typed<T>(x, weight, bias, y, mean, rstd, running_mean, running_var, momentum,
                           eps);
  });
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps) {
  dispatch_floating("batchnorm_forward_eval", x.dtype(), [&]<class T>(ElementType<T>) {
    forward_eval_typed<T>(x, weight, bias, running_mean, running_var, y, eps);
  });
}

void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  dispatch_floating("batchnorm_backward", x.dtype(), [&]<class T>(ElementType<T>) {
    backward_typed<T>(x, weight, mean, rstd, dy, dx, dweight, dbias);
  });
}

}  // namespace bigbatch::cuda

// batchnorm.cu: BatchNorm over the batch on the GPU (the contract is in batchnorm.hpp).
//
// Every reduction over the batch is one thread per feature walking the rows in order with
// unfused float operations (__fmul_rn, __fadd_rn): the same additions as the CPU reference,
// in the same order, so the batch statistics and parameter gradients are the CPU's bit for
// bit. The elementwise parts (y, dx, the running averages) are plain expressions, which nvcc
// may contract into fused multiply-adds: they differ from the CPU by rounding only.
#include "kernels/batchnorm.hpp"
#include "kernels/cuda_common.cuh"

namespace bigbatch::cuda {
namespace {

/// Per feature j: mean, rstd (biased variance) and the running statistics.
template <class T>
__global__ void statistics_kernel(const T* x, float* mean, float* rstd, float* running_mean,
                                  float* running_var, std::int64_t M, std::int64_t N,
                                  float momentum, float eps) {
  for (const std::int64_t j : grid_stride(N)) {
    float sum = 0.0f;
#pragma unroll 8
    for (std::int64_t i = 0; i < M; ++i) sum += to_float(x[i * N + j]);
    const float mu = sum / static_cast<float>(M);
    float squared_deviations = 0.0f;
#pragma unroll 8
    for (std::int64_t i = 0; i < M; ++i) {
      const float deviation = to_float(x[i * N + j]) - mu;
      squared_deviations = __fadd_rn(squared_deviations, __fmul_rn(deviation, deviation));
    }
    mean[j] = mu;
    rstd[j] = detail::inverse_std(squared_deviations / static_cast<float>(M), eps);
    running_mean[j] = detail::running_average(running_mean[j], mu, momentum);
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

/// Per feature j, rows in order: dbias += dy, dweight += dy * xhat, and the batch means
/// of dy and dy * xhat that dx needs (mean_dy, mean_dy_xhat: [N] each).
template <class T>
__global__ void feature_gradient_kernel(const T* x, const float* mean, const float* rstd,
                                        const T* dy, float* dweight, float* dbias,
                                        float* mean_dy, float* mean_dy_xhat, std::int64_t M,
                                        std::int64_t N) {
  for (const std::int64_t j : grid_stride(N)) {
    const float mu = mean[j], r = rstd[j];
    float sum_g = 0.0f, sum_g_xhat = 0.0f, dw = dweight[j], db = dbias[j];
#pragma unroll 8
    for (std::int64_t i = 0; i < M; ++i) {
      const float g = to_float(dy[i * N + j]);
      const float g_xhat = __fmul_rn(g, detail::normalize(to_float(x[i * N + j]), mu, r));
      sum_g = __fadd_rn(sum_g, g);
      sum_g_xhat = __fadd_rn(sum_g_xhat, g_xhat);
      db = __fadd_rn(db, g);
      dw = __fadd_rn(dw, g_xhat);
    }
    dweight[j] = dw;
    dbias[j] = db;
    mean_dy[j] = sum_g / static_cast<float>(M);
    mean_dy_xhat[j] = sum_g_xhat / static_cast<float>(M);
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
  statistics_kernel<T><<<grid_for(N, kFeatureThreads), kFeatureThreads>>>(
      x.data<T>(), mean.data<float>(), rstd.data<float>(), running_mean.data<float>(),
      running_var.data<float>(), M, N, momentum, eps);
  BIGBATCH_CHECK_LAUNCH("batchnorm statistics_kernel");
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
  feature_gradient_kernel<T><<<grid_for(N, kFeatureThreads), kFeatureThreads>>>(
      x.data<T>(), mean.data<float>(), rstd.data<float>(), dy.data<T>(), dweight.data<float>(),
      dbias.data<float>(), mean_dy, mean_dy_xhat, M, N);
  BIGBATCH_CHECK_LAUNCH("batchnorm feature_gradient_kernel");
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
  dispatch_f16_f32("batchnorm_forward_train", x.dtype(), [&]<class T>(ElementType<T>) {
    forward_train_typed<T>(x, weight, bias, y, mean, rstd, running_mean, running_var, momentum,
                           eps);
  });
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps) {
  dispatch_f16_f32("batchnorm_forward_eval", x.dtype(), [&]<class T>(ElementType<T>) {
    forward_eval_typed<T>(x, weight, bias, running_mean, running_var, y, eps);
  });
}

void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  dispatch_f16_f32("batchnorm_backward", x.dtype(), [&]<class T>(ElementType<T>) {
    backward_typed<T>(x, weight, mean, rstd, dy, dx, dweight, dbias);
  });
}

}  // namespace bigbatch::cuda

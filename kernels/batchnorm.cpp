#include "kernels/batchnorm.hpp"

#include <algorithm>

#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {
namespace {

/// Statistics, parameters and their gradients: f64 next to f64 data, f32 otherwise.
DType statistics_dtype(DType data) { return data == DType::f64 ? DType::f64 : DType::f32; }

void check_data(const char* op, const Tensor& x) {
  detail::check_rank(op, "x", x, 2);
  detail::check_floating(op, "x", x);
  BIGBATCH_CHECK(x.dtype() != DType::f64 || x.device().is_cpu(), op,
                 ": x is f64, which exists only on the CPU: ", x.describe());
}

void check_like_x(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  detail::check_dtype(op, name, t, x.dtype());
  detail::check_shape(op, name, t, x.shape());
}

/// Per-feature tensors: [N] in statistics_dtype(x).
void check_per_feature(const char* op, const Tensor& x,
                       std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, t] : tensors) {
    detail::check_dtype(op, name, *t, statistics_dtype(x.dtype()));
    detail::check_shape(op, name, *t, {x.dim(1)});
  }
}

}  // namespace

void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             const Tensor& running_mean, const Tensor& running_var,
                             float momentum, float eps) {
  constexpr const char* op = "batchnorm_forward_train";
  check_data(op, x);
  BIGBATCH_CHECK(x.dim(0) >= 2, op, ": training needs more than 1 value per feature (the "
                 "unbiased variance of one sample is 0/0; PyTorch refuses it too), got ",
                 x.describe());
  check_like_x(op, "y", y, x);
  check_per_feature(op, x,
                    {{"weight", &weight}, {"bias", &bias}, {"mean", &mean}, {"rstd", &rstd},
                     {"running_mean", &running_mean}, {"running_var", &running_var}});
  BIGBATCH_CHECK(eps >= 0.0f, op, ": eps must be >= 0, got ", eps);
  const Device device = detail::common_device(
      op, {&x, &weight, &bias, &y, &mean, &rstd, &running_mean, &running_var});
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::batchnorm_forward_train(x, weight, bias, y, mean, rstd,
                                                        running_mean, running_var, momentum, eps));
  }
  cpu::batchnorm_forward_train(x, weight, bias, y, mean, rstd, running_mean, running_var,
                               momentum, eps);
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps) {
  constexpr const char* op = "batchnorm_forward_eval";
  check_data(op, x);
  check_like_x(op, "y", y, x);
  check_per_feature(op, x,
                    {{"weight", &weight}, {"bias", &bias}, {"running_mean", &running_mean},
                     {"running_var", &running_var}});
  BIGBATCH_CHECK(eps >= 0.0f, op, ": eps must be >= 0, got ", eps);
  const Device device =
      detail::common_device(op, {&x, &weight, &bias, &running_mean, &running_var, &y});
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::batchnorm_forward_eval(x, weight, bias, running_mean,
                                                       running_var, y, eps));
  }
  cpu::batchnorm_forward_eval(x, weight, bias, running_mean, running_var, y, eps);
}

void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* op = "batchnorm_backward";
  check_data(op, x);
  BIGBATCH_CHECK(x.dim(0) >= 1, op, ": x has no rows: ", x.describe());
  check_like_x(op, "dy", dy, x);
  check_like_x(op, "dx", dx, x);
  check_per_feature(op, x,
                    {{"weight", &weight}, {"mean", &mean}, {"rstd", &rstd},
                     {"dweight", &dweight}, {"dbias", &dbias}});
  const Device device =
      detail::common_device(op, {&x, &weight, &mean, &rstd, &dy, &dx, &dweight, &dbias});
  // LayerNorm's rules hold here too: both backends finish every reduction over the batch
  // (dweight, dbias and the means dx needs) before the elementwise pass that writes dx[k]
  // after reading x[k] and dy[k], so dx may be x or dy itself; other sharing is refused.
  detail::check_normalization_backward_aliasing(op, x, weight, mean, rstd, dy, dx, dweight, dbias);
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::batchnorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias));
  }
  cpu::batchnorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
}

namespace cpu {
namespace {

/// Statistics are computed in double for double data, in float otherwise.
using scalar_math::ComputeType;

/// Parallel chunks of about 32K elements: whole rows, or whole columns (features).
std::int64_t chunk_of(std::int64_t other_dimension) {
  return std::max<std::int64_t>(
      1, (std::int64_t{1} << 15) / std::max<std::int64_t>(other_dimension, 1));
}

/// y = xhat * weight + bias with xhat = (x - mean[j]) * rstd[j]; rows in parallel.
template <class T>
void normalize_features(const T* xs, const Tensor& weight, const Tensor& bias,
                        const ComputeType<T>* means, const ComputeType<T>* rstds, T* ys,
                        std::int64_t M, std::int64_t N) {
  using A = ComputeType<T>;
  const A* w = weight.data<A>();
  const A* b = bias.data<A>();
  parallel_for(M, chunk_of(N), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        const A xhat = detail::normalize(load(xs + (i * N + j)), means[j], rstds[j]);
        store(ys + (i * N + j), xhat * w[j] + b[j]);
      }
    }
  });
}

template <class T>
void forward_train_typed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd,
                         const Tensor& running_mean, const Tensor& running_var, float momentum,
                         float eps) {
  using A = ComputeType<T>;
  const std::int64_t M = x.dim(0), N = x.dim(1);
  const T* xs = x.data<T>();  // [M, N]
  A* means = mean.data<A>();
  A* rstds = rstd.data<A>();
  A* running_means = running_mean.data<A>();
  A* running_vars = running_var.data<A>();
  // Threads split the features; each feature's sums walk the rows in order.
  parallel_for(N, chunk_of(M), [&](std::int64_t first, std::int64_t last) {
    std::fill(means + first, means + last, A(0));
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t j = first; j < last; ++j) means[j] += load(xs + (i * N + j));
    }
    for (std::int64_t j = first; j < last; ++j) means[j] /= static_cast<A>(M);
    // rstd holds the sum of squared deviations until it becomes 1 / sqrt(var + eps).
    std::fill(rstds + first, rstds + last, A(0));
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t j = first; j < last; ++j) {
        const A deviation = load(xs + (i * N + j)) - means[j];
        rstds[j] += deviation * deviation;
      }
    }
    for (std::int64_t j = first; j < last; ++j) {
      const A squared_deviations = rstds[j];
      rstds[j] = detail::inverse_std(squared_deviations / static_cast<A>(M), static_cast<A>(eps));
      running_means[j] =
          detail::running_average(running_means[j], means[j], static_cast<A>(momentum));
      running_vars[j] = detail::running_average(
          running_vars[j], squared_deviations / static_cast<A>(M - 1), static_cast<A>(momentum));
    }
  });
  normalize_features<T>(xs, weight, bias, means, rstds, y.data<T>(), M, N);
}

template <class T>
void forward_eval_typed(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                        float eps) {
  using A = ComputeType<T>;
  const std::int64_t N = x.dim(1);
  const Tensor rstd({N}, DTypeOf<A>::value, Device::cpu(), MemoryCategory::workspace);
  const A* running_vars = running_var.data<A>();
  A* rstds = rstd.data<A>();
  for (std::int64_t j = 0; j < N; ++j) {
    rstds[j] = detail::inverse_std(running_vars[j], static_cast<A>(eps));
  }
  normalize_features<T>(x.data<T>(), weight, bias, running_mean.data<A>(), rstds, y.data<T>(),
                        x.dim(0), N);
}

template <class T>
void backward_typed(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                    const Tensor& dy, const Tensor& dx, const Tensor& dweight,
                    const Tensor& dbias) {
  using A = ComputeType<T>;
  const std::int64_t M = x.dim(0), N = x.dim(1);
  const T* xs = x.data<T>();    // [M, N]
  const T* dys = dy.data<T>();  // [M, N]
  const A* w = weight.data<A>();
  const A* means = mean.data<A>();
  const A* rstds = rstd.data<A>();
  A* dw = dweight.data<A>();
  A* db = dbias.data<A>();
  // mean over the batch of dy, and of dy * xhat: [2, N]
  const Tensor batch_means({2, N}, DTypeOf<A>::value, Device::cpu(), MemoryCategory::workspace);
  A* mean_dy = batch_means.data<A>();
  A* mean_dy_xhat = mean_dy + N;
  parallel_for(N, chunk_of(M), [&](std::int64_t first, std::int64_t last) {
    std::fill(mean_dy + first, mean_dy + last, A(0));
    std::fill(mean_dy_xhat + first, mean_dy_xhat + last, A(0));
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t j = first; j < last; ++j) {
        const A g = load(dys + (i * N + j));
        const A g_xhat = g * detail::normalize(load(xs + (i * N + j)), means[j], rstds[j]);
        mean_dy[j] += g;
        mean_dy_xhat[j] += g_xhat;
        db[j] += g;
        dw[j] += g_xhat;
      }
    }
    for (std::int64_t j = first; j < last; ++j) {
      mean_dy[j] /= static_cast<A>(M);
      mean_dy_xhat[j] /= static_cast<A>(M);
    }
  });
  T* dxs = dx.data<T>();  // [M, N]
  parallel_for(M, chunk_of(N), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        const A g = load(dys + (i * N + j));
        const A xhat = detail::normalize(load(xs + (i * N + j)), means[j], rstds[j]);
        store(dxs + (i * N + j), (w[j] * rstds[j]) * ((g - mean_dy[j]) - xhat * mean_dy_xhat[j]));
      }
    }
  });
}


}  // namespace

void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             const Tensor& running_mean, const Tensor& running_var,
                             float momentum, float eps) {
  with_float_type("batchnorm_forward_train", x.dtype(), [&]<class T>(T) {
    forward_train_typed<T>(x, weight, bias, y, mean, rstd, running_mean, running_var, momentum,
                           eps);
  });
}

void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps) {
  with_float_type("batchnorm_forward_eval", x.dtype(), [&]<class T>(T) {
    forward_eval_typed<T>(x, weight, bias, running_mean, running_var, y, eps);
  });
}

void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  with_float_type("batchnorm_backward", x.dtype(), [&]<class T>(T) {
    backward_typed<T>(x, weight, mean, rstd, dy, dx, dweight, dbias);
  });
}

}  // namespace cpu
}  // namespace bigbatch

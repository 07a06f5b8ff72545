#include "kernels/layernorm.hpp"

#include <algorithm>
#include <utility>

#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {
namespace {

/// Statistics, parameters and their gradients: f64 next to f64 data, f32 otherwise.
DType statistics_dtype(DType data) { return data == DType::f64 ? DType::f64 : DType::f32; }

void check_data(const char* op, const char* name, const Tensor& t) {
  detail::check_rank(op, name, t, 2);
  detail::check_floating(op, name, t);
  BIGBATCH_CHECK(t.dim(1) >= 1, op, ": ", name, " needs at least one feature, got ",
                 t.describe());
  BIGBATCH_CHECK(t.dtype() != DType::f64 || t.device().is_cpu(), op, ": ", name,
                 " is f64, which exists only on the CPU: ", t.describe());
}

/// x: [M, N]; the [N] parameters and [M] statistics in statistics_dtype(x).
void check_parameters_and_statistics(const char* op, const Tensor& x,
                                     std::initializer_list<std::pair<const char*, const Tensor*>>
                                         per_feature,
                                     std::initializer_list<std::pair<const char*, const Tensor*>>
                                         per_row) {
  const DType stats = statistics_dtype(x.dtype());
  for (const auto& [name, t] : per_feature) {
    detail::check_dtype(op, name, *t, stats);
    detail::check_shape(op, name, *t, {x.dim(1)});
  }
  for (const auto& [name, t] : per_row) {
    detail::check_dtype(op, name, *t, stats);
    detail::check_shape(op, name, *t, {x.dim(0)});
  }
}

void check_like_x(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  detail::check_dtype(op, name, t, x.dtype());
  detail::check_shape(op, name, t, x.shape());
}

/// True when a and b are the same memory: the same first byte and the same length.
bool same_memory(const Tensor& a, const Tensor& b) {
  return a.raw_data() == b.raw_data() && a.nbytes() == b.nbytes();
}

}  // namespace

void detail::check_normalization_backward_aliasing(const char* op, const Tensor& x,
                                                   const Tensor& weight, const Tensor& mean,
                                                   const Tensor& rstd, const Tensor& dy,
                                                   const Tensor& dx, const Tensor& dweight,
                                                   const Tensor& dbias) {
  const detail::NamedTensor x_{"x", &x}, weight_{"weight", &weight}, mean_{"mean", &mean},
      rstd_{"rstd", &rstd}, dy_{"dy", &dy}, dx_{"dx", &dx}, dweight_{"dweight", &dweight},
      dbias_{"dbias", &dbias};
  // dx: written once per element after that element's last read; the same memory as x or
  // dy is safe, a partial overlap is not.
  for (const detail::NamedTensor& input : {x_, dy_}) {
    if (same_memory(dx, *input.second)) continue;
    detail::refuse_overlap(op, dx_, input, "dx may be that tensor itself, or apart from it");
  }
  for (const detail::NamedTensor& other : {weight_, mean_, rstd_, dweight_, dbias_}) {
    detail::refuse_overlap(op, dx_, other, "they must be apart");
  }
  // dweight and dbias: read, added to and written while every input is still being read.
  detail::refuse_overlap(op, dweight_, dbias_, "they must be apart");
  for (const detail::NamedTensor& accumulated : {dweight_, dbias_}) {
    for (const detail::NamedTensor& input : {x_, weight_, mean_, rstd_, dy_}) {
      detail::refuse_overlap(op, accumulated, input, "they must be apart");
    }
  }
}

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps) {
  constexpr const char* op = "layernorm_forward";
  check_data(op, "x", x);
  check_like_x(op, "y", y, x);
  check_parameters_and_statistics(op, x, {{"weight", &weight}, {"bias", &bias}},
                                  {{"mean", &mean}, {"rstd", &rstd}});
  BIGBATCH_CHECK(eps >= 0.0f, op, ": eps must be >= 0, got ", eps);
  const Device device = detail::common_device(op, {&x, &weight, &bias, &y, &mean, &rstd});
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::layernorm_forward(x, weight, bias, y, mean, rstd, eps));
  }
  cpu::layernorm_forward(x, weight, bias, y, mean, rstd, eps);
}

void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* op = "layernorm_backward";
  check_data(op, "x", x);
  check_like_x(op, "dy", dy, x);
  check_like_x(op, "dx", dx, x);
  check_parameters_and_statistics(op, x,
                                  {{"weight", &weight}, {"dweight", &dweight}, {"dbias", &dbias}},
                                  {{"mean", &mean}, {"rstd", &rstd}});
  const Device device =
      detail::common_device(op, {&x, &weight, &mean, &rstd, &dy, &dx, &dweight, &dbias});
  detail::check_normalization_backward_aliasing(op, x, weight, mean, rstd, dy, dx, dweight, dbias);
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::layernorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias));
  }
  cpu::layernorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
}

namespace cpu {
namespace {

/// Statistics are computed in double for double data, in float otherwise.
using scalar_math::ComputeType;

/// Rows per parallel chunk: enough elements (about 32K) to pay for a fork.
std::int64_t rows_per_chunk(std::int64_t row_length) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 15) / row_length);
}

template <class T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd, float eps) {
  using A = ComputeType<T>;
  const std::int64_t M = x.dim(0), N = x.dim(1);
  const T* xs = x.data<T>();  // [M, N]
  T* ys = y.data<T>();        // [M, N]
  const A* w = weight.data<A>();
  const A* b = bias.data<A>();
  A* means = mean.data<A>();
  A* rstds = rstd.data<A>();
  parallel_for(M, rows_per_chunk(N), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const T* row = xs + i * N;
      A sum = 0;
      for (std::int64_t j = 0; j < N; ++j) sum += load(row + j);
      const A mu = sum / static_cast<A>(N);
      A squared_deviations = 0;
      for (std::int64_t j = 0; j < N; ++j) {
        const A deviation = load(row + j) - mu;
        squared_deviations += deviation * deviation;
      }
      const A r = detail::inverse_std(squared_deviations / static_cast<A>(N), static_cast<A>(eps));
      T* out = ys + i * N;
      for (std::int64_t j = 0; j < N; ++j) {
        store(out + j, detail::normalize(load(row + j), mu, r) * w[j] + b[j]);
      }
      means[i] = mu;
      rstds[i] = r;
    }
  });
}

/// dx, row by row: with g = dy * weight and xhat the normalised input,
/// dx = rstd * ((g - mean(g)) - xhat * mean(g * xhat)), means over the row.
template <class T>
void input_gradient(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                    const Tensor& dy, const Tensor& dx) {
  using A = ComputeType<T>;
  const std::int64_t M = x.dim(0), N = x.dim(1);
  const T* xs = x.data<T>();    // [M, N]
  const T* dys = dy.data<T>();  // [M, N]
  T* dxs = dx.data<T>();        // [M, N]
  const A* w = weight.data<A>();
  const A* means = mean.data<A>();
  const A* rstds = rstd.data<A>();
  parallel_for(M, rows_per_chunk(N), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const T* x_row = xs + i * N;
      const T* dy_row = dys + i * N;
      const A mu = means[i], r = rstds[i];
      A sum_g = 0, sum_g_xhat = 0;
      for (std::int64_t j = 0; j < N; ++j) {
        const A g = load(dy_row + j) * w[j];
        sum_g += g;
        sum_g_xhat += g * detail::normalize(load(x_row + j), mu, r);
      }
      const A mean_g = sum_g / static_cast<A>(N);
      const A mean_g_xhat = sum_g_xhat / static_cast<A>(N);
      T* dx_row = dxs + i * N;
      for (std::int64_t j = 0; j < N; ++j) {
        const A g = load(dy_row + j) * w[j];
        const A xhat = detail::normalize(load(x_row + j), mu, r);
        store(dx_row + j, r * ((g - mean_g) - xhat * mean_g_xhat));
      }
    }
  });
}

/// dweight += dy * xhat and dbias += dy, row after row (the contract in the header).
/// Threads split the features, never the rows, so every column sees the rows in order.
template <class T>
void parameter_gradients(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dy, const Tensor& dweight, const Tensor& dbias) {
  using A = ComputeType<T>;
  const std::int64_t M = x.dim(0), N = x.dim(1);
  const T* xs = x.data<T>();    // [M, N]
  const T* dys = dy.data<T>();  // [M, N]
  const A* means = mean.data<A>();
  const A* rstds = rstd.data<A>();
  A* dw = dweight.data<A>();
  A* db = dbias.data<A>();
  // Enough columns per chunk that a chunk holds about 32K elements.
  const std::int64_t columns_per_chunk =
      std::max<std::int64_t>(16, (std::int64_t{1} << 15) / std::max<std::int64_t>(M, 1));
  parallel_for(N, columns_per_chunk, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = 0; i < M; ++i) {
      const T* x_row = xs + i * N;
      const T* dy_row = dys + i * N;
      for (std::int64_t j = first; j < last; ++j) {
        const A g = load(dy_row + j);
        dw[j] += g * detail::normalize(load(x_row + j), means[i], rstds[i]);
        db[j] += g;
      }
    }
  });
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps) {
  with_float_type("layernorm_forward", x.dtype(), [&]<class T>(T) {
    forward_typed<T>(x, weight, bias, y, mean, rstd, eps);
  });
}

// The parameter gradients first: dx may be dy or x itself (the header's sharing rules).
void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  with_float_type("layernorm_backward", x.dtype(), [&]<class T>(T) {
    parameter_gradients<T>(x, mean, rstd, dy, dweight, dbias);
    input_gradient<T>(x, weight, mean, rstd, dy, dx);
  });
}

}  // namespace cpu
}  // namespace bigbatch

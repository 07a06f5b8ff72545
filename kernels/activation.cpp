#include "kernels/activation.hpp"

#include "common/half.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch {
namespace {

void check_activation_dtype(const char* op, const Tensor& x) {
  detail::check_floating(op, "x", x);
}

Device check_forward(const char* op, const Tensor& x, const Tensor& y) {
  const Device device = detail::common_device(op, {&x, &y});
  check_activation_dtype(op, x);
  detail::check_dtype(op, "y", y, x.dtype());
  detail::check_shape(op, "y", y, x.shape());
  detail::check_same_or_disjoint(op, "y", y, "x", x);
  return device;
}

Device check_backward(const char* op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const Device device = detail::common_device(op, {&x, &dy, &dx});
  check_activation_dtype(op, x);
  detail::check_dtype(op, "dy", dy, x.dtype());
  detail::check_dtype(op, "dx", dx, x.dtype());
  detail::check_shape(op, "dy", dy, x.shape());
  detail::check_shape(op, "dx", dx, x.shape());
  detail::check_same_or_disjoint(op, "dx", dx, "x", x);
  detail::check_same_or_disjoint(op, "dx", dx, "dy", dy);
  return device;
}

}  // namespace

void gelu_forward(const Tensor& x, const Tensor& y) {
  if (check_forward("gelu_forward", x, y).is_cuda()) {
    BIGBATCH_RUN_CUDA("gelu_forward", cuda::gelu_forward(x, y));
  }
  cpu::gelu_forward(x, y);
}

void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (check_backward("gelu_backward", x, dy, dx).is_cuda()) {
    BIGBATCH_RUN_CUDA("gelu_backward", cuda::gelu_backward(x, dy, dx));
  }
  cpu::gelu_backward(x, dy, dx);
}

void relu_forward(const Tensor& x, const Tensor& y) {
  if (check_forward("relu_forward", x, y).is_cuda()) {
    BIGBATCH_RUN_CUDA("relu_forward", cuda::relu_forward(x, y));
  }
  cpu::relu_forward(x, y);
}

void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (check_backward("relu_backward", x, dy, dx).is_cuda()) {
    BIGBATCH_RUN_CUDA("relu_backward", cuda::relu_backward(x, dy, dx));
  }
  cpu::relu_backward(x, dy, dx);
}

namespace cpu {
namespace {

namespace math = activation_math;

/// y[i] = f(x[i]), computed in ComputeType<T> and rounded once to T.
template <class T, class F>
void map_forward(const Tensor& x, const Tensor& y, const F& f) {
  const T* in = x.data<T>();
  T* out = y.data<T>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) store(out + i, f(load(in + i)));
    });
  });
}

/// dx[i] = f(x[i], dy[i]), computed in ComputeType<T> and rounded once to T.
template <class T, class F>
void map_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const F& f) {
  const T* in = x.data<T>();
  const T* grad_in = dy.data<T>();
  T* grad_out = dx.data<T>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) {
        store(grad_out + i, f(load(in + i), load(grad_in + i)));
      }
    });
  });
}

}  // namespace

void gelu_forward(const Tensor& x, const Tensor& y) {
  with_float_type("gelu_forward", x.dtype(), [&](auto element) {
    using T = decltype(element);
    map_forward<T>(x, y, [](auto v) { return math::gelu(v); });
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  with_float_type("gelu_backward", x.dtype(), [&](auto element) {
    using T = decltype(element);
    map_backward<T>(x, dy, dx, [](auto v, auto g) { return g * math::gelu_derivative(v); });
  });
}

void relu_forward(const Tensor& x, const Tensor& y) {
  with_float_type("relu_forward", x.dtype(), [&](auto element) {
    using T = decltype(element);
    map_forward<T>(x, y, [](auto v) { return math::relu(v); });
  });
}

void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  with_float_type("relu_backward", x.dtype(), [&](auto element) {
    using T = decltype(element);
    map_backward<T>(x, dy, dx, [](auto v, auto g) { return math::relu_backward_of(v, g); });
  });
}

}  // namespace cpu
}  // namespace bigbatch

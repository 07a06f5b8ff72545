#include "kernels/activation.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/cuda_common.cuh"

namespace bigbatch::cuda {
namespace {

namespace math = activation_math;

// The formulas are functors (not lambdas) so that they can be kernel template arguments.
struct Gelu {
  __device__ float operator()(float x) const { return math::gelu(x); }
};
struct GeluGradient {
  __device__ float operator()(float x, float dy) const {
    return math::mul_rn(dy, math::gelu_derivative(x));
  }
};
struct Relu {
  __device__ float operator()(float x) const { return math::relu(x); }
};
struct ReluGradient {
  __device__ float operator()(float x, float dy) const { return math::relu_backward_of(x, dy); }
};

template <class T, class F>
__global__ void forward_kernel(const T* x, T* y, std::int64_t n, F f) {
  for (const std::int64_t i : grid_stride(n)) {
    y[i] = from_float<T>(f(to_float(x[i])));
  }
}

template <class T, class F>
__global__ void backward_kernel(const T* x, const T* dy, T* dx, std::int64_t n, F f) {
  for (const std::int64_t i : grid_stride(n)) {
    dx[i] = from_float<T>(f(to_float(x[i]), to_float(dy[i])));
  }
}

template <class F>
void launch_forward(const char* name, const Tensor& x, const Tensor& y, F f) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  dispatch_floating(name, x.dtype(), [&]<class T>(ElementType<T>) {
    forward_kernel<<<grid_for(n), kThreadsPerBlock>>>(x.data<T>(), y.data<T>(), n, f);
  });
  BIGBATCH_CHECK_LAUNCH(name);
}

template <class F>
void launch_backward(const char* name, const Tensor& x, const Tensor& dy, const Tensor& dx, F f) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  dispatch_floating(name, x.dtype(), [&]<class T>(ElementType<T>) {
    backward_kernel<<<grid_for(n), kThreadsPerBlock>>>(x.data<T>(), dy.data<T>(), dx.data<T>(),
                                                       n, f);
  });
  BIGBATCH_CHECK_LAUNCH(name);
}

}  // namespace

// (The dispatcher has already rejected f64, which exists only on the CPU.)
void gelu_forward(const Tensor& x, const Tensor& y) {
  launch_forward("gelu_forward_kernel", x, y, Gelu{});
}
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  launch_backward("gelu_backward_kernel", x, dy, dx, GeluGradient{});
}
void relu_forward(const Tensor& x, const Tensor& y) {
  launch_forward("relu_forward_kernel", x, y, Relu{});
}
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  launch_backward("relu_backward_kernel", x, dy, dx, ReluGradient{});
}

}  // namespace bigbatch::cuda

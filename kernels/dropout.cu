#include "common/rng.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/dropout.hpp"

namespace bigbatch::cuda {
namespace {

// out[e] = in[e] * (kept ? scale : 0), element e having global index first_index + e:
// the same mask and the same product as the CPU (dropout.hpp). One thread per group of
// four consecutive global indices, whose four random words one Philox evaluation gives
// (common/rng.hpp); the first and last groups may lie partly outside the tensor.
template <class T>
__global__ void dropout_kernel(const T* in, T* out, std::int64_t n, std::uint64_t first_index,
                               std::int64_t groups, std::uint64_t seed, std::uint64_t stream,
                               float p, float scale) {
  const std::uint64_t first_group = first_index / 4;
  for (const std::int64_t g : grid_stride(groups)) {
    const std::uint64_t group = first_group + static_cast<std::uint64_t>(g);
    const Philox4x32 words = random_group(seed, stream, group);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // e is in [-3, n + 3): negative before the tensor, n and up after it
      const auto e =
          static_cast<std::int64_t>(4 * group + static_cast<std::uint64_t>(w) - first_index);
      if (e < 0 || e >= n) continue;
      out[e] = from_float<T>(
          __fmul_rn(to_float(in[e]), uniform_from_bits(words.v[w]) >= p ? scale : 0.0f));
    }
  }
}

void launch_dropout(const char* op, const Tensor& in, const Tensor& out,
                    const DropoutSpec& spec) {
  const std::int64_t n = in.numel();
  if (n == 0) return;
  const std::uint64_t first_index = detail::dropout_first_index(in, spec);
  // the groups holding global indices first_index .. first_index + n - 1
  const auto groups = static_cast<std::int64_t>(
      (first_index + static_cast<std::uint64_t>(n) - 1) / 4 - first_index / 4 + 1);
  const float scale = detail::dropout_keep_scale(spec.p);
  dispatch_f16_f32(op, in.dtype(), [&]<class T>(ElementType<T>) {
    dropout_kernel<<<grid_for(groups), kThreadsPerBlock>>>(in.data<T>(), out.data<T>(), n,
                                                           first_index, groups, spec.seed,
                                                           spec.stream, spec.p, scale);
  });
  BIGBATCH_CHECK_LAUNCH("dropout_kernel");
}

namespace math = activation_math;

/// The value through T and back, as storing it and reading it again would round it.
template <class T>
__device__ float rounded(float value) {
  return to_float(from_float<T>(value));
}

struct GeluPair {
  __device__ void operator()(float v, float g, float& value, float& gradient) const {
    const auto both = math::gelu_and_derivative(v);
    value = both.value;
    gradient = math::mul_rn(g, both.derivative);  // as gelu_backward_kernel
  }
};
struct ReluPair {
  __device__ void operator()(float v, float g, float& value, float& gradient) const {
    value = math::relu(v);
    gradient = math::relu_backward_of(v, g);
  }
};

// One thread per group of four global indices, as dropout_kernel: the mask is drawn once
// for dx and y. y may be null (no recomputed forward output).
template <class T, class Act>
__global__ void activation_dropout_backward_kernel(const T* x, const T* dy, T* dx, T* y,
                                                   std::int64_t n, std::uint64_t first_index,
                                                   std::int64_t groups, std::uint64_t seed,
                                                   std::uint64_t stream, float p, float scale,
                                                   Act act) {
  const std::uint64_t first_group = first_index / 4;
  for (const std::int64_t g : grid_stride(groups)) {
    const std::uint64_t group = first_group + static_cast<std::uint64_t>(g);
    const Philox4x32 words = random_group(seed, stream, group);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const auto e =
          static_cast<std::int64_t>(4 * group + static_cast<std::uint64_t>(w) - first_index);
      if (e < 0 || e >= n) continue;
      const float factor = uniform_from_bits(words.v[w]) >= p ? scale : 0.0f;
      const float dropped = rounded<T>(__fmul_rn(to_float(dy[e]), factor));
      float value = 0.0f, gradient = 0.0f;
      act(to_float(x[e]), dropped, value, gradient);
      dx[e] = from_float<T>(gradient);
      if (y != nullptr) y[e] = from_float<T>(__fmul_rn(rounded<T>(value), factor));
    }
  }
}

}  // namespace

void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec, const Tensor& y) {
  const char* op = "activation_dropout_backward";
  const std::int64_t n = x.numel();
  if (n == 0) return;
  const std::uint64_t first_index = detail::dropout_first_index(x, spec);
  const auto groups = static_cast<std::int64_t>(
      (first_index + static_cast<std::uint64_t>(n) - 1) / 4 - first_index / 4 + 1);
  // p = 0 keeps every element with factor 1 (uniform >= 0 always holds): no dropout.
  const float scale = detail::dropout_keep_scale(spec.p);
  dispatch_f16_f32(op, x.dtype(), [&]<class T>(ElementType<T>) {
    T* y_data = y.defined() ? y.data<T>() : nullptr;
    const auto launch = [&](auto pair) {
      activation_dropout_backward_kernel<<<grid_for(groups), kThreadsPerBlock>>>(
          x.data<T>(), dy.data<T>(), dx.data<T>(), y_data, n, first_index, groups, spec.seed,
          spec.stream, spec.p, scale, pair);
    };
    if (act == PointwiseActivation::gelu) {
      launch(GeluPair{});
    } else {
      launch(ReluPair{});
    }
  });
  BIGBATCH_CHECK_LAUNCH("activation_dropout_backward_kernel");
}

void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  launch_dropout("dropout_forward", x, y, spec);
}

void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec) {
  launch_dropout("dropout_backward", dy, dx, spec);
}

}  // namespace bigbatch::cuda

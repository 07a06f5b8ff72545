#include "common/rng.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/dropout.hpp"

namespace bigbatch::cuda {
namespace {

// The mask of a launch: elements [0, n) of global indices first_index + e, the same mask
// as the CPU's (dropout.hpp). One thread per group of four consecutive global indices,
// whose four random words one Philox evaluation gives (common/rng.hpp); the first and
// last groups may lie partly outside the tensor.
struct MaskLaunch {
  std::int64_t n;
  std::uint64_t first_index;
  std::int64_t groups;  // the groups holding global indices first_index .. first_index + n - 1
  std::uint64_t seed, stream;
  float p, scale;
};

MaskLaunch mask_launch(const Tensor& t, const DropoutSpec& spec) {
  const std::int64_t n = t.numel();
  const std::uint64_t first_index = detail::dropout_first_index(t, spec);
  const auto groups = static_cast<std::int64_t>(
      (first_index + static_cast<std::uint64_t>(n) - 1) / 4 - first_index / 4 + 1);
  return {n, first_index, groups, spec.seed, spec.stream, spec.p,
          detail::dropout_keep_scale(spec.p)};
}

/// Calls f(e, factor) for every element e of this thread's groups: factor is the scale
/// where the element is kept, 0 where it is dropped.
template <class F>
__device__ void for_each_masked(const MaskLaunch& m, F f) {
  const std::uint64_t first_group = m.first_index / 4;
  for (const std::int64_t g : grid_stride(m.groups)) {
    const std::uint64_t group = first_group + static_cast<std::uint64_t>(g);
    const Philox4x32 words = random_group(m.seed, m.stream, group);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // e is in [-3, n + 3): negative before the tensor, n and up after it
      const auto e =
          static_cast<std::int64_t>(4 * group + static_cast<std::uint64_t>(w) - m.first_index);
      if (e < 0 || e >= m.n) continue;
      f(e, uniform_from_bits(words.v[w]) >= m.p ? m.scale : 0.0f);
    }
  }
}

// out[e] = in[e] * (kept ? scale : 0): the same product as the CPU.
template <class T>
__global__ void dropout_kernel(const T* in, T* out, MaskLaunch m) {
  for_each_masked(m, [&](std::int64_t e, float factor) {
    out[e] = from_float<T>(__fmul_rn(to_float(in[e]), factor));
  });
}

void launch_dropout(const char* op, const Tensor& in, const Tensor& out,
                    const DropoutSpec& spec) {
  if (in.numel() == 0) return;
  const MaskLaunch m = mask_launch(in, spec);
  dispatch_floating(op, in.dtype(), [&]<class T>(ElementType<T>) {
    dropout_kernel<<<grid_for(m.groups), kThreadsPerBlock>>>(in.data<T>(), out.data<T>(), m);
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

// dropout_kernel's loop, the mask drawn once for dx and y. y may be null (no recomputed
// forward output).
template <class T, class Act>
__global__ void activation_dropout_backward_kernel(const T* x, const T* dy, T* dx, T* y,
                                                   MaskLaunch m, Act act) {
  for_each_masked(m, [&](std::int64_t e, float factor) {
    const float dropped = rounded<T>(__fmul_rn(to_float(dy[e]), factor));
    float value = 0.0f, gradient = 0.0f;
    act(to_float(x[e]), dropped, value, gradient);
    dx[e] = from_float<T>(gradient);
    if (y != nullptr) y[e] = from_float<T>(__fmul_rn(rounded<T>(value), factor));
  });
}

}  // namespace

void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec, const Tensor& y) {
  const char* op = "activation_dropout_backward";
  if (x.numel() == 0) return;
  // p = 0 keeps every element with factor 1 (uniform >= 0 always holds): no dropout.
  const MaskLaunch m = mask_launch(x, spec);
  dispatch_floating(op, x.dtype(), [&]<class T>(ElementType<T>) {
    T* y_data = y.defined() ? y.data<T>() : nullptr;
    const auto launch = [&](auto pair) {
      activation_dropout_backward_kernel<<<grid_for(m.groups), kThreadsPerBlock>>>(
          x.data<T>(), dy.data<T>(), dx.data<T>(), y_data, m, pair);
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

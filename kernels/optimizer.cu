// optimizer.cu: SGD and AdamW steps on the GPU, one thread per element (grid-stride).
// The arithmetic is optimizer_math.hpp's, with explicitly rounded intrinsics, so every
// element equals the CPU reference bit for bit.
#include "kernels/cuda_common.cuh"
#include "kernels/optimizer.hpp"
#include "kernels/optimizer_math.hpp"

namespace bigbatch::cuda {
namespace {

using optimizer_math::AdamWScalars;
using optimizer_math::SgdScalars;

// momentum_buffer: nullptr without momentum; half_copy (__half or __nv_bfloat16): nullptr
// when not wanted.
template <class Half>
__global__ void sgd_kernel(float* param, const float* grad, float* momentum_buffer,
                           Half* half_copy, std::int64_t n, SgdScalars s) {
  const bool reads_buffer = momentum_buffer != nullptr && !s.first_step;
  for (const std::int64_t i : grid_stride(n)) {
    const auto updated =
        optimizer_math::sgd_update(param[i], grad[i], reads_buffer ? momentum_buffer[i] : 0.0f, s);
    param[i] = updated.param;
    if (momentum_buffer != nullptr) momentum_buffer[i] = updated.momentum_buffer;
    if (half_copy != nullptr) half_copy[i] = from_float<Half>(updated.param);
  }
}

template <class Half>
__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                             Half* half_copy, std::int64_t n, AdamWScalars s) {
  for (const std::int64_t i : grid_stride(n)) {
    const auto updated =
        optimizer_math::adamw_update(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
    param[i] = updated.param;
    exp_avg[i] = updated.exp_avg;
    exp_avg_sq[i] = updated.exp_avg_sq;
    if (half_copy != nullptr) half_copy[i] = from_float<Half>(updated.param);
  }
}

/// Calls f(ElementType<Half>{}) with the working copy's element type (__half when there is
/// none, with a null pointer).
template <class F>
void with_copy_type(const Tensor& half_copy, F&& f) {
  if (half_copy.defined() && half_copy.dtype() == DType::bf16) {
    return f(ElementType<__nv_bfloat16>{});
  }
  f(ElementType<__half>{});
}

template <class Half>
Half* half_pointer(const Tensor& half_copy) {
  return half_copy.defined() ? half_copy.data<Half>() : nullptr;
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdOptions& options, std::int64_t step, const Tensor& half_copy) {
  const std::int64_t n = param.numel();
  if (n == 0) return;
  const SgdScalars s = optimizer_math::sgd_scalars(options, step);
  float* buffer = s.use_momentum ? momentum_buffer.data<float>() : nullptr;
  with_copy_type(half_copy, [&]<class Half>(ElementType<Half>) {
    sgd_kernel<Half><<<grid_for(n), kThreadsPerBlock>>>(param.data<float>(), grad.data<float>(),
                                                        buffer, half_pointer<Half>(half_copy), n,
                                                        s);
  });
  BIGBATCH_CHECK_LAUNCH("sgd_kernel");
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWOptions& options, std::int64_t step,
                const Tensor& half_copy) {
  const std::int64_t n = param.numel();
  if (n == 0) return;
  const AdamWScalars s = optimizer_math::adamw_scalars(options, step);
  with_copy_type(half_copy, [&]<class Half>(ElementType<Half>) {
    adamw_kernel<Half><<<grid_for(n), kThreadsPerBlock>>>(
        param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
        half_pointer<Half>(half_copy), n, s);
  });
  BIGBATCH_CHECK_LAUNCH("adamw_kernel");
}

}  // namespace bigbatch::cuda

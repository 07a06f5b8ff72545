#include "kernels/cuda_common.cuh"
#include "kernels/fill.hpp"

namespace bigbatch::cuda {
namespace {

template <class T>
__global__ void fill_kernel(T* out, std::int64_t n, T value) {
  for (const std::int64_t i : grid_stride(n)) {
    out[i] = value;
  }
}

template <class T>
void launch_fill(const Tensor& out, T value) {
  if (out.numel() == 0) return;
  fill_kernel<<<grid_for(out.numel()), kThreadsPerBlock>>>(out.data<T>(), out.numel(), value);
  BIGBATCH_CHECK_LAUNCH("fill_kernel");
}

}  // namespace

void fill(const Tensor& out, double value) {
  switch (out.dtype()) {
    case DType::f32: return launch_fill(out, static_cast<float>(value));
    case DType::f16: return launch_fill(out, __float2half_rn(static_cast<float>(value)));
    case DType::bf16: return launch_fill(out, __float2bfloat16_rn(static_cast<float>(value)));
    case DType::i32: return launch_fill(out, static_cast<std::int32_t>(value));
    case DType::f64: throw std::invalid_argument("fill: f64 tensors exist only on the CPU");
  }
}

}  // namespace bigbatch::cuda

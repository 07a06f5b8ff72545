#include "kernels/fill.hpp"

#include <algorithm>

#include "common/bfloat16.hpp"
#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch {

void fill(const Tensor& out, double value) {
  if (out.device().is_cuda()) BIGBATCH_RUN_CUDA("fill", cuda::fill(out, value));
  cpu::fill(out, value);
}

namespace cpu {
namespace {

template <class T>
void fill_typed(const Tensor& out, T value) {
  T* data = out.data<T>();
  parallel_for(out.numel(), 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    std::fill(data + begin, data + end, value);
  });
}

}  // namespace

void fill(const Tensor& out, double value) {
  switch (out.dtype()) {
    case DType::f32: return fill_typed(out, static_cast<float>(value));
    case DType::f16: return fill_typed(out, static_cast<f16>(static_cast<float>(value)));
    case DType::bf16: return fill_typed(out, to_bf16(static_cast<float>(value)));
    case DType::f64: return fill_typed(out, value);
    case DType::i32: return fill_typed(out, static_cast<std::int32_t>(value));
  }
}

}  // namespace cpu
}  // namespace bigbatch

#include "kernels/gemm_epilogue.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/activation.hpp"
#include "kernels/bias.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/gemm.hpp"

namespace bigbatch {
namespace {

std::atomic<bool>& fused_setting() {
  static std::atomic<bool> enabled = [] {
    const char* value = std::getenv("BIGBATCH_FUSED_EPILOGUES");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return enabled;
}

std::atomic<std::int64_t> fused_calls{0};

#if BIGBATCH_HAVE_CUDA
/// Whether this call may try the fused path: enabled, on CUDA, f16 operands (bf16 ones take
/// the unfused path).
bool try_fused(const Tensor& operand) {
  return fused_setting().load() && operand.device().is_cuda() && operand.dtype() == DType::f16;
}
#endif

}  // namespace

void set_fused_epilogues(bool enabled) { fused_setting().store(enabled); }
bool fused_epilogues_enabled() { return fused_setting().load(); }
std::int64_t fused_epilogue_calls() { return fused_calls.load(); }

void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                              const Tensor& pre, const Tensor& y) {
  constexpr const char* op = "linear_bias_gelu_forward";
  detail::common_device(op, {&x, &w, &bias, &pre, &y});
  detail::check_rank(op, "x", x, 2);
  detail::check_rank(op, "w", w, 2);
  detail::check_shape(op, "pre", pre, {x.dim(0), w.dim(0)});
  detail::check_shape(op, "y", y, pre.shape());
  detail::check_dtype(op, "pre", pre, x.dtype());
  detail::check_dtype(op, "y", y, x.dtype());
#if BIGBATCH_HAVE_CUDA
  if (try_fused(x) && w.dtype() == x.dtype() && bias.dtype() == DType::f32 &&
      bias.shape() == Shape{w.dim(0)} && x.dim(1) == w.dim(1) &&
      cuda::fused_bias_gelu_forward(x, w, bias, pre, y)) {
    fused_calls.fetch_add(1);
    return;
  }
#endif
  gemm(x, false, w, true, pre);
  add_bias(pre, bias);
  gelu_forward(pre, y);
}

void gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dh) {
  constexpr const char* op = "gemm_gelu_backward";
  detail::common_device(op, {&dy, &w, &pre, &dh});
  detail::check_rank(op, "dy", dy, 2);
  detail::check_rank(op, "w", w, 2);
  detail::check_shape(op, "dh", dh, {dy.dim(0), w.dim(1)});
  detail::check_shape(op, "pre", pre, dh.shape());
  detail::check_dtype(op, "dh", dh, dy.dtype());
  detail::check_dtype(op, "pre", pre, dy.dtype());
#if BIGBATCH_HAVE_CUDA
  if (try_fused(dy) && w.dtype() == dy.dtype() && dy.dim(1) == w.dim(0) &&
      cuda::fused_gelu_backward(dy, w, pre, dh)) {
    fused_calls.fetch_add(1);
    return;
  }
#endif
  gemm(dy, false, w, false, dh);
  gelu_backward(pre, dh, dh);
}

}  // namespace bigbatch

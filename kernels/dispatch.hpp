// dispatch.hpp: what every op's dispatcher needs: argument checks with readable
// errors, and the call into the CUDA backend (or a clear error where it is not built).
//
// Every op family declares its API three times in its header: bigbatch::op (checks
// the arguments, then dispatches on the tensors' device), bigbatch::cpu::op (the CPU
// reference) and bigbatch::cuda::op (the CUDA implementation, compiled from the .cu).
// Tensors are handles: an op writes through the `const Tensor&` of an output.
#pragma once

#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/check.hpp"
#include "common/tensor.hpp"

namespace bigbatch::detail {

/// Throws std::runtime_error: `op` was called on a CUDA tensor in a build without CUDA.
[[noreturn]] inline void throw_no_cuda(const char* op) {
  throw std::runtime_error(std::string(op) +
                           ": this build has no CUDA backend (reconfigure with nvcc available)");
}

/// Every tensor lives on the same device as the first; returns that device.
inline Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device device = (*tensors.begin())->device();
  for (const Tensor* t : tensors) {
    BIGBATCH_CHECK(t->device() == device, op, ": all tensors must be on one device, got ",
                   (*tensors.begin())->describe(), " and ", t->describe());
  }
  return device;
}

/// Throws std::invalid_argument unless tensor `name` of `op` has dtype `expected`.
inline void check_dtype(const char* op, const char* name, const Tensor& t, DType expected) {
  BIGBATCH_CHECK(t.dtype() == expected, op, ": ", name, " must be ", dtype_name(expected),
                 ", got ", t.describe());
}

/// Throws std::invalid_argument unless tensor `name` of `op` holds floating-point data an op
/// computes on: f32, f16 or bf16 (f64 too, which exists only on the CPU, for the oracles).
inline void check_floating(const char* op, const char* name, const Tensor& t) {
  const DType d = t.dtype();
  BIGBATCH_CHECK(d == DType::f32 || is_half_width(d) || (d == DType::f64 && t.device().is_cpu()),
                 op, ": ", name, " must be f32, f16 or bf16 (f64 on the CPU), got ",
                 t.describe());
}

/// Throws std::invalid_argument unless tensor `name` of `op` has shape `expected`.
inline void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  BIGBATCH_CHECK(t.shape() == expected, op, ": ", name, " must have shape ",
                 shape_string(expected), ", got ", t.describe());
}

/// Throws std::invalid_argument unless tensor `name` of `op` has `rank` dimensions.
inline void check_rank(const char* op, const char* name, const Tensor& t, int rank) {
  BIGBATCH_CHECK(t.rank() == rank, op, ": ", name, " must have rank ", rank, ", got ",
                 t.describe());
}

/// True when the byte ranges of a and b intersect (an empty tensor shares nothing).
inline bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a_begin = static_cast<const char*>(a.raw_data());
  const auto* b_begin = static_cast<const char*>(b.raw_data());
  return std::less<>()(a_begin, b_begin + b.nbytes()) &&
         std::less<>()(b_begin, a_begin + a.nbytes());
}

/// A tensor and the name an error message gives it.
using NamedTensor = std::pair<const char*, const Tensor*>;

/// Throws std::invalid_argument, naming `op` and both tensors, when a and b share memory;
/// `allowed` tells the caller what would be accepted.
inline void refuse_overlap(const char* op, const NamedTensor& a, const NamedTensor& b,
                           const char* allowed) {
  BIGBATCH_CHECK(!overlaps(*a.second, *b.second), op, ": ", a.first, " ", a.second->describe(),
                 " shares memory with ", b.first, " ", b.second->describe(), "; ", allowed);
}

}  // namespace bigbatch::detail

/// In a dispatcher: `if (device.is_cuda()) BIGBATCH_RUN_CUDA("op", cuda::op(args));`
#if BIGBATCH_HAVE_CUDA
#define BIGBATCH_RUN_CUDA(op_name, call) \
  do {                                   \
    call;                                \
    return;                              \
  } while (false)
#else
#define BIGBATCH_RUN_CUDA(op_name, call) ::bigbatch::detail::throw_no_cuda(op_name)
#endif

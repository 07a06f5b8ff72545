#include "kernels/cross_entropy.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "common/data/dataset.hpp"
#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {
namespace {

/// The loss and the gradient: f64 next to f64 logits, f32 otherwise.
DType loss_dtype(DType logits) { return logits == DType::f64 ? DType::f64 : DType::f32; }

/// logits: [M, C] floating, C >= 1; labels: [M] i32 on the same device.
void check_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  detail::check_rank(op, "logits", logits, 2);
  detail::check_floating(op, "logits", logits);
  BIGBATCH_CHECK(logits.dtype() != DType::f64 || logits.device().is_cpu(), op,
                 ": logits are f64, which exists only on the CPU: ", logits.describe());
  BIGBATCH_CHECK(logits.dim(1) >= 1, op, ": logits need at least one class, got ",
                 logits.describe());
  detail::check_dtype(op, "labels", labels, DType::i32);
  detail::check_shape(op, "labels", labels, {logits.dim(0)});
}

/// Every label in [0, C) or kIgnoredLabel, for CPU tensors (check_labels). CUDA labels are
/// not copied back to be checked (that would wait for the device in every step): they were
/// checked where they were placed on the device, and the kernels turn a label outside
/// [0, C), other than kIgnoredLabel, into NaN.
void check_label_values(const char* op, const Tensor& labels, std::int64_t classes) {
  if (labels.device().is_cpu()) check_labels(labels, classes, op, IgnoredLabels::allowed);
}

void check_count_and_scale(const char* op, float global_count, float scale) {
  BIGBATCH_CHECK(std::isfinite(global_count) && global_count > 0.0f, op,
                 ": global_count must be a positive number (the samples in the whole batch), got ",
                 global_count);
  BIGBATCH_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                           float global_count, float scale) {
  constexpr const char* op = "cross_entropy_forward";
  check_logits_and_labels(op, logits, labels);
  detail::check_dtype(op, "loss", loss, loss_dtype(logits.dtype()));
  detail::check_shape(op, "loss", loss, {1});
  check_count_and_scale(op, global_count, scale);
  const Device device = detail::common_device(op, {&logits, &labels, &loss});
  check_label_values(op, labels, logits.dim(1));
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::cross_entropy_forward(logits, labels, loss, global_count, scale));
  }
  cpu::cross_entropy_forward(logits, labels, loss, global_count, scale);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale) {
  constexpr const char* op = "cross_entropy_backward";
  check_logits_and_labels(op, logits, labels);
  detail::check_dtype(op, "dlogits", dlogits, loss_dtype(logits.dtype()));
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  check_count_and_scale(op, global_count, scale);
  const Device device = detail::common_device(op, {&logits, &labels, &dlogits});
  check_label_values(op, labels, logits.dim(1));
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::cross_entropy_backward(logits, labels, dlogits, global_count,
                                                       scale));
  }
  cpu::cross_entropy_backward(logits, labels, dlogits, global_count, scale);
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  constexpr const char* op = "count_correct";
  check_logits_and_labels(op, logits, labels);
  const Device device = detail::common_device(op, {&logits, &labels});
  check_label_values(op, labels, logits.dim(1));
  if (device.is_cuda()) {
#if BIGBATCH_HAVE_CUDA
    return cuda::count_correct(logits, labels);
#else
    detail::throw_no_cuda(op);
#endif
  }
  return cpu::count_correct(logits, labels);
}

namespace cpu {
namespace {

/// All internal math is done in double for double logits, in float otherwise.
using scalar_math::ComputeType;

/// Rows per parallel chunk: about 32K elements.
std::int64_t rows_per_chunk(std::int64_t classes) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 15) / classes);
}

template <class T>
ComputeType<T> row_max(const T* row, std::int64_t classes) {
  ComputeType<T> max = load(row);
  for (std::int64_t c = 1; c < classes; ++c) max = std::max(max, load(row + c));
  return max;
}

template <class T>
void forward_typed(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                   float global_count, float scale) {
  using A = ComputeType<T>;
  const std::int64_t M = logits.dim(0), C = logits.dim(1);
  const T* z = logits.data<T>();  // [M, C]
  const std::int32_t* label = labels.data<std::int32_t>();
  const Tensor row_losses({M}, DTypeOf<A>::value, Device::cpu(), MemoryCategory::workspace);
  A* row_loss = row_losses.data<A>();  // [M]
  parallel_for(M, rows_per_chunk(C), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      if (label[i] == kIgnoredLabel) {  // no target: no loss (adding 0 changes no total)
        row_loss[i] = 0;
        continue;
      }
      const T* row = z + i * C;
      const A max = row_max(row, C);
      A sum_exp = 0;
      for (std::int64_t c = 0; c < C; ++c) sum_exp += std::exp(load(row + c) - max);
      row_loss[i] =
          detail::cross_entropy_row_loss(max, load(row + label[i]), std::log(sum_exp));
    }
  });
  A total = 0;
  for (std::int64_t i = 0; i < M; ++i) total += row_loss[i];  // row order, as documented
  A* out = loss.data<A>();
  out[0] = out[0] + total * detail::cross_entropy_factor<A>(global_count, scale);
}

template <class T>
void backward_typed(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                    float global_count, float scale) {
  using A = ComputeType<T>;
  const std::int64_t M = logits.dim(0), C = logits.dim(1);
  const T* z = logits.data<T>();  // [M, C]
  const std::int32_t* label = labels.data<std::int32_t>();
  A* dz = dlogits.data<A>();  // [M, C]
  const A factor = detail::cross_entropy_factor<A>(global_count, scale);
  parallel_for(M, rows_per_chunk(C), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const T* row = z + i * C;
      A* out = dz + i * C;  // holds exp(z - max) until it becomes the gradient
      if (label[i] == kIgnoredLabel) {  // no target: no gradient
        std::fill(out, out + C, A(0));
        continue;
      }
      const A max = row_max(row, C);
      A sum_exp = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        out[c] = std::exp(load(row + c) - max);
        sum_exp += out[c];
      }
      for (std::int64_t c = 0; c < C; ++c) {
        out[c] = detail::cross_entropy_gradient(out[c], sum_exp, c == label[i], factor);
      }
    }
  });
}

template <class T>
std::int64_t count_correct_typed(const Tensor& logits, const Tensor& labels) {
  const std::int64_t M = logits.dim(0), C = logits.dim(1);
  const T* z = logits.data<T>();  // [M, C]
  const std::int32_t* label = labels.data<std::int32_t>();
  std::atomic<std::int64_t> correct{0};  // integer sums: exact in any order
  parallel_for(M, rows_per_chunk(C), [&](std::int64_t begin, std::int64_t end) {
    std::int64_t correct_here = 0;
    for (std::int64_t i = begin; i < end; ++i) {
      const T* row = z + i * C;
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < C; ++c) {
        if (detail::argmax_replaces(load(row + c), load(row + best))) best = c;
      }
      correct_here += best == label[i] ? 1 : 0;
    }
    correct += correct_here;
  });
  return correct;
}


}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                           float global_count, float scale) {
  with_float_type("cross_entropy_forward", logits.dtype(), [&]<class T>(T) {
    forward_typed<T>(logits, labels, loss, global_count, scale);
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale) {
  with_float_type("cross_entropy_backward", logits.dtype(), [&]<class T>(T) {
    backward_typed<T>(logits, labels, dlogits, global_count, scale);
  });
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  std::int64_t correct = 0;
  with_float_type("count_correct", logits.dtype(),
                  [&]<class T>(T) { correct = count_correct_typed<T>(logits, labels); });
  return correct;
}

}  // namespace cpu
}  // namespace bigbatch

// accumulation.hpp: chapter 02's component. One optimizer step's gradient, computed from
// N micro-batches in two ways side by side, and the classic mistakes as functions, so the
// demo and tests/test_gradient_accumulation.cpp show exactly the same code.
//
//   memory-free   model.zero_grad() once; every micro-batch's loss divided by the GLOBAL
//                 batch size B, its backward adding into the gradients (no extra memory)
//   naive         a separate fp32 buffer per parameter that averages the micro-batches'
//                 MEAN-loss gradients: right only when the N micro-batches are equal
//   mistakes      forgotten_zero_grad, sum_of_micro_batch_means, step_every_micro_batch:
//                 each returns what a training loop that makes it would leave behind
//
// Every function runs the micro-batches [0, m), [m, 2m), ... of x in row order, with
// micro-batch k's ForwardContext::first_row = context.first_row + k * m.
// Why and how: docs/internals.md#chapters02_gradient_accumulationaccumulationhpp
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/memory.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"
#include "common/tensor.hpp"

namespace bigbatch::accumulation {

/// How many micro-batches of at most `micro_batch` rows a batch of `rows` rows makes.
std::int64_t micro_batch_count(std::int64_t rows, std::int64_t micro_batch);

/// Deep copies of the model's parameter gradients, in parameters() order (they count as
/// MemoryCategory::gradients while they live).
std::vector<Tensor> copy_gradients(const nn::Model& model);

/// The memory-free way: zero_grad, then nn::accumulate_gradients with global count B.
/// Leaves the batch's mean-loss gradient in the model; returns the batch's mean loss.
float memory_free_gradients(nn::Model& model, const Tensor& x, const Tensor& labels,
                            std::int64_t micro_batch, const nn::ForwardContext& context);

/// The naive way, with its own accumulation buffers (allocated once, by the constructor,
/// in MemoryCategory::gradients, on the model's device).
class NaiveAccumulator {
 public:
  explicit NaiveAccumulator(const nn::Model& model);

  /// Leaves (1/N) * sum_k (gradient of micro-batch k's mean loss) in the model's
  /// gradients, N = micro_batch_count(B, micro_batch); returns (1/N) * sum_k mean loss_k.
  /// Equals the batch gradient when every micro-batch has micro_batch rows; with a
  /// shorter last one it is the per-micro-batch averaging mistake.
  float gradients(nn::Model& model, const Tensor& x, const Tensor& labels,
                  std::int64_t micro_batch, const nn::ForwardContext& context);

  /// The extra memory this way of accumulating costs: the buffers' bytes.
  std::size_t buffer_bytes() const;

 private:
  std::vector<Tensor> buffers_;  // one f32 tensor per parameter, its shape
};

// ---- the classic mistakes -----------------------------------------------------------

/// Mistake: the gradients are not reset before the batch (no zero_grad), so they keep
/// whatever the previous step left: after a step whose gradient was g1, this leaves
/// g1 + g2. Returns the batch's mean loss.
float forgotten_zero_grad(nn::Model& model, const Tensor& x, const Tensor& labels,
                          std::int64_t micro_batch, const nn::ForwardContext& context);

/// Mistake: every micro-batch's backward uses its own mean loss (divided by its n_k) and
/// nothing divides by N afterwards: sum_k g_k, N times the batch gradient for N equal
/// micro-batches. Zeroes the gradients first. Returns sum_k mean loss_k.
float sum_of_micro_batch_means(nn::Model& model, const Tensor& x, const Tensor& labels,
                               std::int64_t micro_batch, const nn::ForwardContext& context);

/// Mistake: an optimizer step after every micro-batch (each with its own mean loss and
/// zeroed gradients): N steps on batches of B/N instead of one step on B.
void step_every_micro_batch(nn::Model& model, nn::Optimizer& optimizer, const Tensor& x,
                            const Tensor& labels, std::int64_t micro_batch,
                            const nn::ForwardContext& context);

// ---- bounding rounding ---------------------------------------------------------------

/// For every parameter gradient element, sum_i |gradient of sample i alone|, each sample's
/// loss divided by global_count: the magnitude M of the per-sample terms that every
/// accumulation order sums. n such terms added in any order are within gamma(n) * M of
/// their exact sum (Higham, Accuracy and Stability of Numerical Algorithms, ch. 4), so two
/// orders differ by at most 2 gamma(n) M. (One row's gradient is one product per element,
/// so it is the term itself.) Runs one forward/backward per row; overwrites the gradients.
std::vector<std::vector<double>> per_sample_magnitude(nn::Model& model, const Tensor& x,
                                                      const Tensor& labels,
                                                      std::int64_t global_count,
                                                      const nn::ForwardContext& context);

// ---- measuring ----------------------------------------------------------------------

/// What running one step cost: the peak bytes by category and in total while it ran
/// (peaks measured from what was live when it started) and its wall-clock time.
struct StepCost {
  MemoryStats::PerCategory peak{};
  std::size_t peak_total = 0;
  double seconds = 0;

  std::size_t peak_of(MemoryCategory c) const { return peak[static_cast<std::size_t>(c)]; }
};

/// Runs `step` once and measures it on `device`'s allocator (resets its peak first).
StepCost measure(Device device, const std::function<void()>& step);

}  // namespace bigbatch::accumulation

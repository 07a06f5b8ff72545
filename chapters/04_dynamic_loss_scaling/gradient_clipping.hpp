// gradient_clipping.hpp: chapter 04's second component: clipping by the global L2 norm, and
// the order of everything that happens at the optimizer boundary.
//
// The boundary, after the step's last micro-batch (bigbatch::train::Trainer runs exactly
// this sequence; the chapter's demo checks each mistake it avoids):
//   1. unscale    g = g * (1/S) for every parameter gradient, with the inf/NaN check and
//                 the global squared norm in the same pass (unscale_and_measure)
//   2. overflow?  skip: no clip, no optimizer step, the learning-rate schedule does not
//                 advance; the dynamic scale backs off
//   3. norm       sqrt of the sum of every g^2: a float64 sum in a fixed order, rounded
//                 once to float (kernels/elementwise.hpp), logged every step
//   4. clip       g = g * min(1, MAX / (norm + 1e-6)), PyTorch's clip_grad_norm_
//   5. step       the optimizer, with the schedule's learning rate; the schedule advances
//   6. scale      the dynamic scale's growth counter counts the step
//   7. zero       the gradients, before the next step's first micro-batch
//
// The mistakes this order avoids: clipping each micro-batch (the norm of a part of the
// batch, not of the step's gradient), clipping before unscaling (the threshold then acts
// on S times the gradient: the true one is clipped at MAX / S), and advancing the schedule
// on a skipped step.
#pragma once

#include <cstdint>
#include <vector>

#include "common/tensor.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::clipping {

/// What the boundary's one pass over the gradients found.
struct GradientStats {
  bool overflow = false;  ///< some gradient was inf or NaN before unscaling
  float norm = 0;         ///< the global L2 norm of the unscaled gradients (inf or NaN
                          ///< after an overflow)
};

/// Steps 1 and 3: the fused pass, and the two small device tensors it reports through.
class BoundaryCheck {
 public:
  /// g = g * (1 / scale) for every parameter gradient of the model; returns whether any
  /// was inf or NaN and the norm of the result. scale must be finite and positive (1: no
  /// loss scaling, the pass only measures). Two values come back from the device.
  GradientStats unscale_and_measure(const nn::Model& model, float scale);
  /// Allocates the pass's two results (12 bytes of workspace) now rather than at the first
  /// call, so that every step, the first of a run or of a resumed run included, holds the
  /// same bytes.
  void allocate(Device device);

 private:
  Tensor found_inf_;     // f32 [1], on the model's device (workspace), allocated on first use
  Tensor squared_norm_;  // f64 [1]
};

/// PyTorch's clip_grad_norm_ factor, in float: min(1, max_norm / (norm + 1e-6)).
/// max_norm must be positive.
float clip_factor(float norm, float max_norm);

/// Step 4: multiplies every parameter gradient by clip_factor(norm, max_norm) (nothing is
/// written when it is 1); returns the factor.
float clip_gradients(const nn::Model& model, float norm, float max_norm);

/// A mistake, kept so that the chapter can measure it: the step's micro-batches are
/// accumulated one at a time, and after each one the running gradient is clipped, as
/// calling clip_grad_norm_ inside a PyTorch accumulation loop does. Arguments as
/// nn::accumulate_gradients (no loss scale); returns the mean loss.
float accumulate_clipping_each_micro_batch(nn::Model& model, const Tensor& x,
                                           const Tensor& labels, std::int64_t micro_batch,
                                           const nn::ForwardContext& context,
                                           std::int64_t global_count, float max_norm);

// ---- float64 predictions (the chapter's demo and tests measure the mistakes with them) ----

/// Every parameter gradient of a model, widened to float64, in model.parameters() order.
using Gradients = std::vector<std::vector<double>>;
Gradients gradients_of(const nn::Model& model);
double norm_of(const Gradients& g);

/// What accumulate_clipping_each_micro_batch should produce, replayed exactly in float64
/// from each micro-batch's own contribution c_i (its gradient with the global count):
/// a_0 = 0, a_i = clip(a_{i-1} + c_i), with clip(a) = a * min(1, max_norm / (|a| + 1e-6)).
Gradients predict_clipping_each_micro_batch(const std::vector<Gradients>& contributions,
                                            double max_norm);
/// The right rule, in float64: clip(c_1 + ... + c_k), once.
Gradients predict_clipping_the_step(const std::vector<Gradients>& contributions,
                                    double max_norm);
/// The largest |a - b| over every element (same shapes).
double largest_difference(const Gradients& a, const Gradients& b);
/// |a - b|, the L2 norm of the difference (same shapes).
double distance(const Gradients& a, const Gradients& b);

}  // namespace bigbatch::clipping

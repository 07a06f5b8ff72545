// gradient_clipping.hpp: chapter 04's second component: clipping by the global L2 norm, and
// the order of everything that happens at the optimizer boundary, after the step's last
// micro-batch (optimizer_boundary.hpp holds exactly this sequence in one object):
//   1. unscale    g = g * (1/S) for every parameter gradient, with the inf/NaN check and
//                 the global squared norm in the same pass (UnscalePass::unscale_and_measure)
//   2. overflow?  skip: no clip, no optimizer step, the learning-rate schedule does not
//                 advance; the dynamic scale backs off
//   3. norm       sqrt of the sum of every g^2: a float64 sum in a fixed order, rounded
//                 once to float (kernels/elementwise.hpp), logged every step
//   4. clip       g = g * min(1, MAX / (norm + 1e-6)), PyTorch's clip_grad_norm_
//   5. step       the optimizer, with the schedule's learning rate; the schedule advances
//   6. scale      the dynamic scale's growth counter counts the step
//   7. zero       the gradients, before the next step's first micro-batch
// Why and how: docs/internals.md#chapters04_dynamic_loss_scalinggradient_clippinghpp
#pragma once

#include <cstdint>
#include <vector>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "common/tensor.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::clipping {

/// Steps 1 and 3 are chapter 03's fused pass, measuring the norm too
/// (loss_scaling::UnscalePass::unscale_and_measure).
using loss_scaling::GradientStats;

/// PyTorch's clip_grad_norm_ factor, in float: min(1, max_norm / (norm + 1e-6)).
/// max_norm must be positive.
float clip_factor(float norm, float max_norm);

/// Step 4: multiplies every parameter gradient by clip_factor(norm, max_norm) (nothing is
/// written when it is 1); returns the factor.
float clip_gradients(const nn::Network& model, float norm, float max_norm);
/// The same over these gradients (the part of a model's one rank steps under ZeRO).
float clip_gradients(const std::vector<Tensor>& gradients, float norm, float max_norm);

/// A mistake, kept so that the chapter can measure it: the step's micro-batches are
/// accumulated one at a time, and after each one the running gradient is clipped, as
/// calling clip_grad_norm_ inside a PyTorch accumulation loop does. Arguments as
/// nn::accumulate_gradients (no loss scale); returns the mean loss.
float accumulate_clipping_each_micro_batch(nn::Network& model, const Tensor& x,
                                           const Tensor& labels, std::int64_t micro_batch,
                                           const nn::ForwardContext& context,
                                           std::int64_t global_count, float max_norm);
/// The same mistake over a batch of `rows` that is not on the device, its micro-batches
/// fetched from `rows_of` (as the second nn::accumulate_gradients).
float accumulate_clipping_each_micro_batch(nn::Network& model, std::int64_t rows,
                                           const nn::BatchRows& rows_of,
                                           std::int64_t micro_batch,
                                           const nn::ForwardContext& context,
                                           std::int64_t global_count, float max_norm);

// ---- float64 predictions (the chapter's demo and tests measure the mistakes with them) ----

/// Every parameter gradient of a model, widened to float64, in model.parameters() order.
using Gradients = std::vector<std::vector<double>>;
Gradients gradients_of(const nn::Network& model);
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

// loss_scaling.hpp: chapter 03's component. The loss scale S multiplies the loss's gradient
// (and so every gradient) to lift fp16's small gradients into range, and is divided out
// again before the optimizer sees them. The scale enters once and leaves once:
//
//   enters   nn::accumulate_gradients(..., loss_scale = S): dlogits = S (p - y) / B,
//            every micro-batch of the optimizer step with the same S
//   leaves   unscale_gradients(model, S): every f32 parameter gradient g = g * (1/S),
//            in one fused pass that also reports whether any was inf or NaN (overflow)
//
// With an overflow the step must be skipped; StaticLossScaler keeps S fixed and says
// whether to step. UnscalePass holds the pass's results on the device (found-inf, and the
// squared norm when it is measured).
// Why and how: docs/internals.md#chapters03_fp16_static_loss_scalingloss_scalinghpp
#pragma once

#include <limits>
#include <vector>

#include "common/tensor.hpp"
#include "nn/model.hpp"

namespace bigbatch::loss_scaling {

/// The model's f32 parameter gradients, in parameters() order (they share its storage).
std::vector<Tensor> gradient_tensors(const nn::Network& model);

/// g = g * (1 / scale) for every parameter gradient of the model, in one pass per tensor
/// (kernels/elementwise.hpp's unscale_and_check_finite); returns true when any gradient
/// held an inf or a NaN before (an overflow). Reads one float back from the device: the
/// one host synchronisation of an optimizer step. `found_inf` is an f32 [1] tensor on
/// the model's device, reused across steps. With squared_norm (f64 [1], the same device),
/// the same pass also writes the sum of the unscaled gradients' squares there (gradient
/// clipping's norm, chapter 04).
bool unscale_gradients(const nn::Network& model, float scale, const Tensor& found_inf,
                       const Tensor* squared_norm = nullptr);
/// The same pass over these f32 gradients (a part of a model's: data parallel under ZeRO,
/// chapter 07, where each rank unscales and measures the shard it steps).
bool unscale_gradients(const std::vector<Tensor>& gradients, float scale,
                       const Tensor& found_inf, const Tensor* squared_norm = nullptr);

/// What the boundary's one pass over the gradients found.
struct GradientStats {
  bool overflow = false;  ///< some gradient was inf or NaN before unscaling
  /// The global L2 norm of the unscaled gradients (inf or NaN after an overflow; NaN when
  /// the pass did not measure it).
  float norm = std::numeric_limits<float>::quiet_NaN();
  /// The float64 sum of their squares that norm is the rounded square root of (NaN when
  /// not measured): what ranks that each measured a part of the gradients add up.
  double squared_norm = std::numeric_limits<double>::quiet_NaN();
};

/// The statistics of a float64 sum of squares: norm = sqrt(squared_norm) rounded once to
/// float (within half an ulp of the exact norm whenever the sum itself is).
GradientStats stats_from(bool overflow, double squared_norm);

/// The fused pass of unscale_gradients with its device results: found-inf (f32 [1]) and,
/// when the norm is measured, the squared norm (f64 [1]), both MemoryCategory::workspace on
/// the model's device, allocated once and reused.
class UnscalePass {
 public:
  /// g = g * (1 / scale) for every parameter gradient; returns whether any was inf or NaN.
  /// One float comes back from the device.
  bool unscale(const nn::Network& model, float scale);
  /// The same pass, also measuring the unscaled gradients' global L2 norm (scale 1: it
  /// only measures). Two values come back from the device.
  GradientStats unscale_and_measure(const nn::Network& model, float scale);
  /// The same over these gradients (a part of a model's, on `device`).
  GradientStats unscale_and_measure(const std::vector<Tensor>& gradients, Device device,
                                    float scale);
  /// Allocates the results now (4 bytes, 12 with the norm's) rather than at the first
  /// call, so that every step, the first of a run included, holds the same bytes.
  void allocate(Device device, bool with_norm);

 private:
  Tensor found_inf_;     // f32 [1]
  Tensor squared_norm_;  // f64 [1], when the norm is measured
};

/// A fixed loss scale S (a power of two keeps scaling and unscaling exact).
class StaticLossScaler {
 public:
  /// Throws std::invalid_argument unless scale is finite and positive.
  explicit StaticLossScaler(float scale);

  float scale() const { return scale_; }

  /// At the optimizer boundary, after the last micro-batch's backward: unscales the
  /// gradients and returns whether the step may be taken (false on an overflow: the
  /// caller skips the optimizer step and zeroes the gradients).
  bool unscale_and_check(const nn::Network& model);

  /// Optimizer steps skipped so far because of an overflow.
  std::int64_t skipped_steps() const { return skipped_; }

 private:
  float scale_;
  std::int64_t skipped_ = 0;
  UnscalePass pass_;
};

/// Of the nonzero elements of an f32 tensor, the shares that a 16-bit type rounds to zero
/// and to a subnormal (chapter 03: fp16's range against the loss's gradient; chapter 04:
/// bf16's).
struct RangeShares {
  double zero = 0;       ///< rounded to +-0: lost
  double subnormal = 0;  ///< kept with fewer significant bits than the type's
};
/// x's nonzero elements (x: f32, on the CPU) rounded to `dtype` (f16 or bf16) by the cast
/// kernel, the rounding of every 16-bit store, and counted.
RangeShares range_shares(const Tensor& x, DType dtype);

/// How chapters 03 and 04 compare 16-bit gradients with fp32's: the worst tensor's
/// ||g - reference|| / ||reference|| (computed in double), over the tensors whose reference
/// is not all zeros. `g` and `reference` hold the same tensors' values, in order.
double worst_normalised_error(const std::vector<std::vector<float>>& g,
                              const std::vector<std::vector<float>>& reference);

}  // namespace bigbatch::loss_scaling

// optimizer_boundary.hpp: chapter 04's third component, the optimizer boundary as one
// object, shaped like PyTorch's GradScaler, holding gradient_clipping.hpp's order:
//
//   const float s = boundary.scale();       S for every micro-batch of the step (1: none)
//   ... nn::accumulate_gradients(..., s) ... the loss scaled by S, micro-batch by micro-batch
//   boundary.unscale(model);                ready -> unscaled: the one fused pass (g *= 1/S,
//                                           the inf/NaN check, the global norm)
//   boundary.step(model, optimizer);        unscaled -> stepped: an overflow skips it (no
//                                           clip, no optimizer step); else clip, then step
//   boundary.update();                      stepped -> ready: the scale rule (static: none;
//                                           dynamic: back off, or count the clean step)
//
// Misuse (any other order) throws std::logic_error naming the stage. With neither a loss
// scale nor clipping there is nothing to unscale: step() may follow the micro-batches.
// Why and how: docs/internals.md#chapters04_dynamic_loss_scalingoptimizer_boundaryhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"
#include "chapters/04_dynamic_loss_scaling/gradient_clipping.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::loss_scaling {

/// How the loss is scaled under mixed precision (chapters 03-04).
enum class LossScaleRule { none, fixed, dynamic };
/// "none", "fixed", "dynamic": the rule's setting text (common/settings.hpp).
std::string setting_text(LossScaleRule rule);

struct BoundaryOptions {
  LossScaleRule rule = LossScaleRule::none;
  float fixed_scale = 1.0f;            ///< S of LossScaleRule::fixed
  DynamicScalerOptions dynamic = {};   ///< for LossScaleRule::dynamic
  float clip_grad_norm = 0.0f;         ///< the global L2 norm to clip to; 0: no clipping
};

/// Whether a boundary with these options runs its fused pass at every step: with a loss
/// scale (fixed or dynamic) or clipping.
bool runs_the_pass(const BoundaryOptions& options);

/// The bytes a boundary with these options holds on the device for its whole life: its
/// fused pass's results (MemoryCategory::workspace: found-inf f32 and the squared norm
/// f64) when the pass runs, with a loss scale or clipping; 0 without it. A step's memory
/// is the model's step (nn::predict_step) plus these.
std::size_t boundary_workspace_bytes(const BoundaryOptions& options);

/// What one optimizer boundary did.
struct BoundaryOutcome {
  bool skipped = false;    ///< an overflow: no optimizer step was taken
  float scale_used = 1;    ///< the S this step's gradients were computed with
  /// The unscaled gradients' global L2 norm before clipping (NaN when the pass did not run).
  float norm = std::numeric_limits<float>::quiet_NaN();
  float clip_factor = 1;   ///< what clipping multiplied the gradients by (1: none)
};

/// Parts of a model's gradients that are measured apart, and how the parts' statistics
/// become those of all the gradients: data parallel under ZeRO (chapter 07), where each
/// rank holds the sum of its shard alone and the ranks combine their found-infs and squared
/// norms. One part holding every gradient, combined as it is, is the single process's pass.
struct GradientPieces {
  std::vector<std::vector<Tensor>> parts;  ///< f32 gradients (or views of them), part by part
  /// The statistics of all the gradients from those of `parts`, in parts' order.
  std::function<GradientStats(std::span<const GradientStats>)> combine;
};

class OptimizerBoundary {
 public:
  enum class Stage { ready, unscaled, stepped };

  /// Checks the options (a finite positive fixed scale, the dynamic rule's ranges, a
  /// finite clip_grad_norm >= 0) and allocates the pass's results on `device` when needed.
  OptimizerBoundary(BoundaryOptions options, Device device);

  /// S for this step's micro-batches; only at Stage::ready (before the first backward).
  float scale() const;
  Stage stage() const { return stage_; }
  /// A loss scale is in use (fixed or dynamic): an overflow skips the step.
  bool scaling() const { return options_.rule != LossScaleRule::none; }
  /// The fused pass runs at every boundary (a loss scale or clipping).
  bool measures() const { return runs_the_pass(options_); }
  /// boundary_workspace_bytes(options): what the pass's results hold on the device.
  std::size_t workspace_bytes() const { return boundary_workspace_bytes(options_); }

  /// The fused pass: ready -> unscaled. Returns what it found.
  const GradientStats& unscale(const nn::Network& model);
  /// The same pass over each part of `gradients` (on `device`), their statistics combined.
  const GradientStats& unscale(const GradientPieces& gradients, Device device);
  /// unscaled (or ready, when the pass is not needed) -> stepped: skips on an overflow,
  /// else clips (when asked) and takes the optimizer step.
  BoundaryOutcome step(const nn::Network& model, nn::Optimizer& optimizer);
  /// The same, clipping `gradients`: those the optimizer reads (a rank's shards under ZeRO).
  BoundaryOutcome step(const std::vector<Tensor>& gradients, nn::Optimizer& optimizer);
  /// stepped -> ready: the dynamic rule moves S (LossScaleUnderflowError at its minimum).
  void update();

  /// Optimizer steps skipped for an overflow so far.
  std::int64_t skipped_steps() const { return skipped_; }
  /// The dynamic rule's state (snapshots), or nullopt without it.
  std::optional<DynamicLossScaler::State> dynamic_state() const;
  /// Continues the dynamic rule from a state(), and the skip count. Throws
  /// std::invalid_argument when the rule is not dynamic but a state is given, or the
  /// reverse, and as DynamicLossScaler::restore does.
  void restore(const std::optional<DynamicLossScaler::State>& state, std::int64_t skipped);

 private:
  /// Throws std::logic_error unless at `wanted`, naming `action` and the stage.
  void require(Stage wanted, const char* action) const;
  /// The rule's S now (1, the fixed scale or the dynamic one), at any stage.
  float current_scale() const;

  BoundaryOptions options_;
  std::optional<DynamicLossScaler> dynamic_;
  UnscalePass pass_;
  Stage stage_ = Stage::ready;
  GradientStats stats_;
  bool overflow_ = false;  // the current step's verdict, between step() and update()
  std::int64_t skipped_ = 0;
};

/// "ready", "unscaled", "stepped".
std::string stage_name(OptimizerBoundary::Stage stage);

}  // namespace bigbatch::loss_scaling

// dynamic_loss_scaler.hpp: chapter 04's component, a loss scale that finds itself.
//
// PyTorch's GradScaler rules, with its defaults: start at S = 2^16; an optimizer step whose
// gradients hold an inf or a NaN (an overflow) is skipped and S is multiplied by 0.5; after
// 2000 consecutive clean optimizer steps S is multiplied by 2. Added: hysteresis H (back off
// only on the H-th overflow in a row; every overflow still skips its step), a maximum scale
// (growth stops there) and a minimum scale (a backoff below it throws
// LossScaleUnderflowError). The scale is constant within an optimizer step: every
// micro-batch's backward uses scale(), and update() runs once, at the boundary, after the
// unscale. The counters count optimizer steps, not micro-batches.
//
// Why and how: docs/internals.md#chapters04_dynamic_loss_scalingdynamic_loss_scalerhpp
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "common/settings.hpp"

namespace bigbatch::loss_scaling {

struct DynamicScalerOptions {
  float initial_scale = 65536.0f;  ///< 2^16, GradScaler's init_scale
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int64_t growth_interval = 2000;  ///< clean optimizer steps before a growth
  std::int64_t hysteresis = 1;          ///< overflows in a row before a backoff
  float min_scale = 1.0f;               ///< a backoff below it is an error
  float max_scale = 16777216.0f;        ///< 2^24: growth stops here
};

/// The scaler's settings (common/settings.hpp), named by bigbatch train's --scale-* flags.
template <SettingsOf<DynamicScalerOptions> Self, class Visit>
constexpr void visit_settings(Self& o, Visit&& visit) {
  visit("scale-init", o.initial_scale, SettingRole::trajectory);
  visit("scale-growth", o.growth_factor, SettingRole::trajectory);
  visit("scale-backoff", o.backoff_factor, SettingRole::trajectory);
  visit("scale-interval", o.growth_interval, SettingRole::trajectory);
  visit("scale-hysteresis", o.hysteresis, SettingRole::trajectory);
  visit("scale-min", o.min_scale, SettingRole::trajectory);
  visit("scale-max", o.max_scale, SettingRole::trajectory);
}
static_assert(every_field_visited<DynamicScalerOptions>(),
              "classify DynamicScalerOptions' new field above");

/// Thrown when an overflow would take the scale below its minimum.
class LossScaleUnderflowError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the scaler decided at one optimizer boundary.
struct ScaleUpdate {
  bool overflow = false;  ///< the gradients held an inf or a NaN: the step is skipped
  float scale_used = 0;   ///< the scale this step's gradients were computed with
  float next_scale = 0;   ///< the scale of the next step
};

class DynamicLossScaler {
 public:
  /// Throws std::invalid_argument for options out of range (factors, interval,
  /// hysteresis, or min <= initial <= max violated).
  explicit DynamicLossScaler(DynamicScalerOptions options = {});

  /// The scale of the current optimizer step (constant over its micro-batches).
  float scale() const { return scale_; }
  const DynamicScalerOptions& options() const { return options_; }

  /// The rule alone, for one optimizer step whose gradients did (or did not) overflow:
  /// moves the scale and the counters. Throws LossScaleUnderflowError at the minimum.
  ScaleUpdate update(bool overflow);

  /// At the boundary: unscales the model's gradients with scale(), checks them, and
  /// applies update(). The caller takes the optimizer step unless result.overflow.
  ScaleUpdate unscale_and_update(const nn::Network& model);

  std::int64_t clean_steps_in_a_row() const { return clean_run_; }
  std::int64_t overflows_in_a_row() const { return overflow_run_; }
  std::int64_t skipped_steps() const { return skipped_; }

  /// Everything update() reads and writes, for snapshots (a resumed run continues the
  /// same sequence of scales).
  struct State {
    float scale = 0;
    std::int64_t clean_run = 0, overflow_run = 0, skipped = 0;
  };
  State state() const { return {scale_, clean_run_, overflow_run_, skipped_}; }
  /// Continues from a state(); throws std::invalid_argument when it is not one this
  /// scaler's options can reach (a scale outside [min, max], a negative or too long run).
  void restore(const State& state);

 private:
  DynamicScalerOptions options_;
  float scale_;
  std::int64_t clean_run_ = 0;
  std::int64_t overflow_run_ = 0;
  std::int64_t skipped_ = 0;
  UnscalePass pass_;
};

}  // namespace bigbatch::loss_scaling

// dynamic_loss_scaler.cpp: the growth, backoff and hysteresis rules.
#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/check.hpp"

namespace bigbatch::loss_scaling {

DynamicLossScaler::DynamicLossScaler(DynamicScalerOptions options)
    : options_(options), scale_(options.initial_scale) {
  const auto& o = options_;
  BIGBATCH_CHECK(o.growth_factor > 1.0f && std::isfinite(o.growth_factor),
                 "DynamicLossScaler: the growth factor must be > 1, got ", o.growth_factor);
  BIGBATCH_CHECK(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f,
                 "DynamicLossScaler: the backoff factor must lie in (0, 1), got ",
                 o.backoff_factor);
  BIGBATCH_CHECK(o.growth_interval >= 1,
                 "DynamicLossScaler: the growth interval must be >= 1, got ", o.growth_interval);
  BIGBATCH_CHECK(o.hysteresis >= 1, "DynamicLossScaler: the hysteresis must be >= 1, got ",
                 o.hysteresis);
  BIGBATCH_CHECK(o.min_scale > 0.0f && o.min_scale <= o.initial_scale &&
                     o.initial_scale <= o.max_scale && std::isfinite(o.max_scale),
                 "DynamicLossScaler: need 0 < min_scale <= initial_scale <= max_scale < inf, "
                 "got ", o.min_scale, ", ", o.initial_scale, ", ", o.max_scale);
}

void DynamicLossScaler::restore(const State& state) {
  const auto& o = options_;
  BIGBATCH_CHECK(state.scale >= o.min_scale && state.scale <= o.max_scale,
                 "DynamicLossScaler::restore: the scale ", state.scale, " lies outside [",
                 o.min_scale, ", ", o.max_scale, "]");
  BIGBATCH_CHECK(state.clean_run >= 0 && state.clean_run < o.growth_interval &&
                     state.overflow_run >= 0 && state.overflow_run < o.hysteresis &&
                     state.skipped >= 0,
                 "DynamicLossScaler::restore: counters out of range (clean run ",
                 state.clean_run, ", overflow run ", state.overflow_run, ", skipped ",
                 state.skipped, ")");
  scale_ = state.scale;
  clean_run_ = state.clean_run;
  overflow_run_ = state.overflow_run;
  skipped_ = state.skipped;
}

// snippet: rule
ScaleUpdate DynamicLossScaler::update(bool overflow) {
  ScaleUpdate result{overflow, scale_, scale_};
  if (overflow) {
    ++skipped_;
    clean_run_ = 0;
    if (++overflow_run_ >= options_.hysteresis) {
      overflow_run_ = 0;
      const float backed_off = scale_ * options_.backoff_factor;
      if (backed_off < options_.min_scale) {
        std::ostringstream message;
        message << "dynamic loss scaling: an overflow at scale " << scale_
                << " would take the scale to " << backed_off << ", below its minimum "
                << options_.min_scale << " (" << skipped_
                << " steps skipped so far); the gradients are not finite at any scale: "
                   "look for a NaN or inf in the data, or a diverged model";
        throw LossScaleUnderflowError(message.str());
      }
      scale_ = backed_off;
    }
  } else {
    overflow_run_ = 0;
    if (++clean_run_ >= options_.growth_interval) {
      clean_run_ = 0;
      scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
    }
  }
  result.next_scale = scale_;
  return result;
}
// snippet end: rule

ScaleUpdate DynamicLossScaler::unscale_and_update(const nn::Network& model) {
  return update(pass_.unscale(model, scale_));
}

}  // namespace bigbatch::loss_scaling

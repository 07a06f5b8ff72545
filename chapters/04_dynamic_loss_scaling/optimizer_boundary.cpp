// optimizer_boundary.cpp: the boundary's stages (optimizer_boundary.hpp).
#include "chapters/04_dynamic_loss_scaling/optimizer_boundary.hpp"

#include <cmath>
#include <stdexcept>

#include "common/check.hpp"

namespace bigbatch::loss_scaling {

std::string setting_text(LossScaleRule rule) {
  switch (rule) {
    case LossScaleRule::none: return "none";
    case LossScaleRule::fixed: return "fixed";
    case LossScaleRule::dynamic: return "dynamic";
  }
  return "?";
}

std::string stage_name(OptimizerBoundary::Stage stage) {
  switch (stage) {
    case OptimizerBoundary::Stage::ready: return "ready";
    case OptimizerBoundary::Stage::unscaled: return "unscaled";
    case OptimizerBoundary::Stage::stepped: return "stepped";
  }
  return "?";
}

bool runs_the_pass(const BoundaryOptions& options) {
  return options.rule != LossScaleRule::none || options.clip_grad_norm > 0.0f;
}

std::size_t boundary_workspace_bytes(const BoundaryOptions& options) {
  return runs_the_pass(options) ? sizeof(float) + sizeof(double) : 0;
}

OptimizerBoundary::OptimizerBoundary(BoundaryOptions options, Device device)
    : options_(options) {
  BIGBATCH_CHECK(options_.clip_grad_norm >= 0.0f && std::isfinite(options_.clip_grad_norm),
                 "OptimizerBoundary: clip_grad_norm must be finite and >= 0 (0: off), got ",
                 options_.clip_grad_norm);
  BIGBATCH_CHECK(options_.rule != LossScaleRule::fixed ||
                     (std::isfinite(options_.fixed_scale) && options_.fixed_scale > 0.0f),
                 "OptimizerBoundary: the fixed scale must be finite and positive, got ",
                 options_.fixed_scale);
  if (options_.rule == LossScaleRule::dynamic) dynamic_.emplace(options_.dynamic);
  if (measures()) pass_.allocate(device, /*with_norm=*/true);
}

void OptimizerBoundary::require(Stage wanted, const char* action) const {
  if (stage_ == wanted) return;
  throw std::logic_error(std::string("OptimizerBoundary: ") + action + " at stage " +
                         stage_name(stage_) + "; it belongs at stage " + stage_name(wanted) +
                         " (scale, unscale, step, update, in that order, once each per step)");
}

float OptimizerBoundary::scale() const {
  require(Stage::ready, "scale() asked");
  return current_scale();
}

float OptimizerBoundary::current_scale() const {
  switch (options_.rule) {
    case LossScaleRule::none: return 1.0f;
    case LossScaleRule::fixed: return options_.fixed_scale;
    case LossScaleRule::dynamic: return dynamic_->scale();
  }
  return 1.0f;
}

const GradientStats& OptimizerBoundary::unscale(const nn::Network& model) {
  require(Stage::ready, "unscale()");
  stats_ = pass_.unscale_and_measure(model, current_scale());
  stage_ = Stage::unscaled;
  return stats_;
}

const GradientStats& OptimizerBoundary::unscale(const GradientPieces& gradients, Device device) {
  require(Stage::ready, "unscale()");
  BIGBATCH_CHECK(!gradients.parts.empty() && gradients.combine,
                 "OptimizerBoundary::unscale: no parts, or no way to combine them");
  std::vector<GradientStats> parts;
  for (const std::vector<Tensor>& part : gradients.parts) {
    parts.push_back(pass_.unscale_and_measure(part, device, current_scale()));
  }
  stats_ = gradients.combine(parts);
  stage_ = Stage::unscaled;
  return stats_;
}

BoundaryOutcome OptimizerBoundary::step(const nn::Network& model, nn::Optimizer& optimizer) {
  return step(gradient_tensors(model), optimizer);
}

// snippet: boundary
BoundaryOutcome OptimizerBoundary::step(const std::vector<Tensor>& gradients,
                                        nn::Optimizer& optimizer) {
  BoundaryOutcome outcome;
  if (measures()) {
    require(Stage::unscaled, "step()");
    outcome.norm = stats_.norm;
  } else {
    require(Stage::ready, "step()");
    stats_ = GradientStats{};
  }
  outcome.scale_used = current_scale();
  overflow_ = stats_.overflow;
  if (overflow_) {
    outcome.skipped = true;  // no clip, no step
    ++skipped_;
  } else {
    if (options_.clip_grad_norm > 0.0f) {
      outcome.clip_factor =
          clipping::clip_gradients(gradients, stats_.norm, options_.clip_grad_norm);
    }
    optimizer.step();
  }
  stage_ = Stage::stepped;
  return outcome;
}
// snippet end: boundary

void OptimizerBoundary::update() {
  require(Stage::stepped, "update()");
  stage_ = Stage::ready;  // first: an underflow error leaves the boundary usable
  if (dynamic_) dynamic_->update(overflow_);
}

std::optional<DynamicLossScaler::State> OptimizerBoundary::dynamic_state() const {
  if (!dynamic_) return std::nullopt;
  return dynamic_->state();
}

void OptimizerBoundary::restore(const std::optional<DynamicLossScaler::State>& state,
                                std::int64_t skipped) {
  BIGBATCH_CHECK(state.has_value() == dynamic_.has_value(), "OptimizerBoundary::restore: the "
                 "state ", state ? "has" : "has no", " dynamic loss scaler, this boundary ",
                 dynamic_ ? "has one" : "has none");
  BIGBATCH_CHECK(skipped >= 0, "OptimizerBoundary::restore: ", skipped, " skipped steps");
  if (dynamic_) dynamic_->restore(*state);
  skipped_ = skipped;
  stage_ = Stage::ready;
}

}  // namespace bigbatch::loss_scaling

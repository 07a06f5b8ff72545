// test_optimizer_boundary.cpp: chapter 04's OptimizerBoundary. Its stages refuse every
// order but scale, unscale, step, update; each strategy (no scale, a fixed one, the
// dynamic rule) and clipping do what their chapters say, checked against computations made
// another way: the norm against a float64 sum of the gradients, the clipped step against
// clip_grad_norm_'s factor applied by hand to SGD's rule, a skipped step against the
// parameters before it, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "chapters/04_dynamic_loss_scaling/optimizer_boundary.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"
#include "tests/harness.hpp"
#include "tests/labelled_batch.hpp"

namespace bigbatch {
namespace {

using loss_scaling::BoundaryOptions;
using loss_scaling::LossScaleRule;
using loss_scaling::OptimizerBoundary;
using Stage = OptimizerBoundary::Stage;

nn::ModelConfig small_config(nn::Precision precision = nn::Precision::fp32) {
  return {.inputs = 12, .hidden = 16, .expansion = 2, .classes = 4, .depth = 2,
          .dropout = 0.0f, .seed = 7, .precision = precision};
}

/// The model's gradients for one batch of 16 rows in micro-batches of 8, with loss scale S.
void backward(nn::Model& model, float scale, std::uint64_t seed = 1) {
  const testing::LabelledBatch batch = testing::random_labelled_batch(model.config(), 16, seed);
  model.zero_grad();
  nn::accumulate_gradients(model, batch.x, batch.labels, 8, {true, 5, 0}, 0, scale);
}

/// Every parameter value, as doubles, in parameters() order.
std::vector<std::vector<double>> values_of(const nn::Model& model) {
  std::vector<std::vector<double>> values;
  for (const nn::NamedParameter& p : model.parameters()) values.push_back(testing::to_doubles(p.value));
  return values;
}

using testing::error_of;

TEST(OptimizerBoundary, RefusesEveryOrderButScaleUnscaleStepUpdate) {
  nn::Model model(small_config(), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), SgdOptions{});
  OptimizerBoundary boundary({.rule = LossScaleRule::fixed, .fixed_scale = 256.0f},
                             Device::cpu());
  backward(model, boundary.scale());
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.step(model, optimizer); }),
                                {"step() at stage ready", "belongs at stage unscaled"}));
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.update(); }),
                                {"update() at stage ready"}));
  EXPECT_THROW(boundary.update(), std::logic_error);
  boundary.unscale(model);
  EXPECT_EQ(boundary.stage(), Stage::unscaled);
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.unscale(model); }),
                                {"unscale() at stage unscaled"}));
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.scale(); }),
                                {"scale() asked at stage unscaled"}));
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.update(); }),
                                {"update() at stage unscaled"}));
  boundary.step(model, optimizer);
  EXPECT_EQ(boundary.stage(), Stage::stepped);
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.step(model, optimizer); }),
                                {"step() at stage stepped"}));
  EXPECT_TRUE(testing::mentions(error_of([&] { boundary.unscale(model); }),
                                {"unscale() at stage stepped"}));
  boundary.update();
  EXPECT_EQ(boundary.stage(), Stage::ready);
  EXPECT_EQ(boundary.scale(), 256.0f);
  EXPECT_EQ(optimizer.steps_taken(), 1);

  // With clipping and no loss scale the pass is still needed: no step before it.
  OptimizerBoundary clipping({.clip_grad_norm = 0.5f}, Device::cpu());
  EXPECT_TRUE(clipping.measures());
  EXPECT_TRUE(testing::mentions(error_of([&] { clipping.step(model, optimizer); }),
                                {"step() at stage ready"}));
  // With neither, the step follows the micro-batches directly.
  OptimizerBoundary plain({}, Device::cpu());
  EXPECT_FALSE(plain.measures());
  const loss_scaling::BoundaryOutcome outcome = plain.step(model, optimizer);
  EXPECT_FALSE(outcome.skipped);
  EXPECT_TRUE(std::isnan(outcome.norm));
  plain.update();
}

TEST(OptimizerBoundary, RefusesOptionsOutOfRange) {
  EXPECT_THROW(OptimizerBoundary({.rule = LossScaleRule::fixed, .fixed_scale = 0.0f}, Device::cpu()),
               std::invalid_argument);
  EXPECT_THROW(OptimizerBoundary({.rule = LossScaleRule::fixed,
                                  .fixed_scale = std::numeric_limits<float>::infinity()},
                                 Device::cpu()),
               std::invalid_argument);
  EXPECT_THROW(OptimizerBoundary({.clip_grad_norm = -1.0f}, Device::cpu()), std::invalid_argument);
  EXPECT_THROW(OptimizerBoundary({.rule = LossScaleRule::dynamic,
                                  .dynamic = {.initial_scale = 4, .min_scale = 8}},
                                 Device::cpu()),
               std::invalid_argument);
}

TEST(OptimizerBoundary, UnscalesMeasuresClipsAndStepsAsTheChaptersSay) {
  // fp32 with S = 2^10: unscaling is exact, so the unscaled gradients are those of S = 1.
  const float max_norm = 0.05f, lr = 0.1f;
  nn::Model model(small_config(), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), SgdOptions{.lr = lr});
  OptimizerBoundary boundary({.rule = LossScaleRule::fixed, .fixed_scale = 1024.0f,
                              .clip_grad_norm = max_norm},
                             Device::cpu());
  nn::Model reference(small_config(), Device::cpu());
  backward(reference, 1.0f);
  double sum = 0;  // the norm another way: a float64 sum of every gradient's square
  for (const nn::NamedParameter& p : reference.parameters()) {
    for (const double g : testing::to_doubles(p.grad)) sum += g * g;
  }
  const double norm = std::sqrt(sum);
  ASSERT_GT(norm, 2 * max_norm) << "the test needs a step that clipping changes";

  backward(model, boundary.scale());
  const std::vector<std::vector<double>> before = values_of(model);
  const loss_scaling::GradientStats& stats = boundary.unscale(model);
  EXPECT_FALSE(stats.overflow);
  // A float64 sum rounded once to float, against the sum here in another order: a few
  // float64 ulps apart, far below float's half ulp (2^-24 relative).
  EXPECT_NEAR(stats.norm, norm, norm * 0x1p-23);
  const loss_scaling::BoundaryOutcome outcome = boundary.step(model, optimizer);
  boundary.update();
  const float factor = std::min(1.0f, max_norm / (stats.norm + 1e-6f));  // clip_grad_norm_
  EXPECT_EQ(outcome.clip_factor, factor);
  EXPECT_EQ(outcome.norm, stats.norm);
  EXPECT_EQ(outcome.scale_used, 1024.0f);
  // SGD without momentum or decay: w - lr * (factor * g), g from the unscaled reference;
  // one float rounding per product and sum: within 2 ulps of |w| + |lr g|.
  const std::vector<std::vector<double>> after = values_of(model);
  const auto parameters = reference.parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const std::vector<double> g = testing::to_doubles(parameters[i].grad);
    for (std::size_t j = 0; j < g.size(); ++j) {
      const double expected = before[i][j] - lr * (factor * g[j]);
      EXPECT_NEAR(after[i][j], expected, 2 * 0x1p-24 * (std::abs(before[i][j]) + lr * std::abs(g[j])))
          << parameters[i].name << "[" << j << "]";
    }
  }
}

TEST(OptimizerBoundary, AnOverflowSkipsTheStepAndTheDynamicRuleBacksOff) {
  nn::Model model(small_config(nn::Precision::fp16), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  OptimizerBoundary boundary(
      {.rule = LossScaleRule::dynamic,
       .dynamic = {.initial_scale = 1024, .growth_interval = 2, .min_scale = 1, .max_scale = 4096},
       .clip_grad_norm = 1.0f},
      Device::cpu());
  backward(model, boundary.scale());
  // An inf in one gradient, as an overflowing backward leaves it.
  Tensor grad = model.parameters()[0].grad;
  std::vector<float> values = grad.to_vector<float>();
  values[3] = std::numeric_limits<float>::infinity();
  grad.copy_from(Tensor::from_vector(values, grad.shape()));
  const std::vector<std::vector<double>> before = values_of(model);
  EXPECT_TRUE(boundary.unscale(model).overflow);
  const loss_scaling::BoundaryOutcome skipped = boundary.step(model, optimizer);
  boundary.update();
  EXPECT_TRUE(skipped.skipped);
  EXPECT_EQ(skipped.clip_factor, 1.0f) << "nothing is clipped on a skipped step";
  EXPECT_FALSE(std::isfinite(skipped.norm));
  EXPECT_EQ(values_of(model), before) << "a skipped step changes no weight";
  EXPECT_EQ(optimizer.steps_taken(), 0);
  EXPECT_EQ(boundary.scale(), 512.0f) << "the scale halves";
  EXPECT_EQ(boundary.skipped_steps(), 1);
  // Two clean steps: the second grows the scale back.
  for (int k = 0; k < 2; ++k) {
    backward(model, boundary.scale(), 2 + k);
    EXPECT_FALSE(boundary.unscale(model).overflow);
    EXPECT_FALSE(boundary.step(model, optimizer).skipped);
    boundary.update();
  }
  EXPECT_EQ(boundary.scale(), 1024.0f);
  EXPECT_EQ(optimizer.steps_taken(), 2);
  const auto state = boundary.dynamic_state();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->skipped, 1);

  // A fixed scale skips too, and stays.
  OptimizerBoundary fixed({.rule = LossScaleRule::fixed, .fixed_scale = 8.0f}, Device::cpu());
  backward(model, fixed.scale());
  grad.copy_from(Tensor::from_vector(values, grad.shape()));
  EXPECT_TRUE(fixed.unscale(model).overflow);
  EXPECT_TRUE(fixed.step(model, optimizer).skipped);
  fixed.update();
  EXPECT_EQ(fixed.scale(), 8.0f);
  EXPECT_EQ(fixed.skipped_steps(), 1);
  EXPECT_FALSE(fixed.dynamic_state().has_value());
  EXPECT_THROW(fixed.restore(state, 1), std::invalid_argument);
}

}  // namespace
}  // namespace bigbatch

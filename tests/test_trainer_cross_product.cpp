// test_trainer_cross_product.cpp: every optimizer (SGD with and without momentum, AdamW) x
// precision (fp32, fp16, bf16) x loss scaling (none, fixed, dynamic) x clipping (off, on)
// through train::Trainer, three steps of accumulation over uneven micro-batches, each
// checked against something computed another way:
//   - memory: every step's measured peak is nn::predict_step's prediction (the memory
//     model replays the step, it does not run it) holding the boundary's pass results,
//     which are 12 bytes (an f32 found-inf flag and an f64 squared norm) exactly when a
//     loss scale or clipping is on;
//   - fp32 and bf16 under a loss scale of 2^10 train to the bits of the unscaled run:
//     multiplying by a power of two commutes with every rounding of the backward pass (no
//     value comes near the range's ends at this size: bf16 has fp32's exponents, which is
//     why it needs no scaler), and the unscale by 2^-10 is exact, so a scale that leaks
//     into the update, the norm, the clip or the recorded loss shows; fp16, whose small
//     gradients are subnormal or zero at S = 1, is the one precision the scale changes;
//   - fp16 and bf16 under a fixed scale train to the bits of the dynamic rule holding the
//     same scale (no overflow, no growth within the run): the two strategies are one step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "chapters/train/trainer.hpp"
#include "nn/memory_model.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kBatch = 32, kMicro = 7, kSteps = 3;  // 32 = 4 x 7 + 4
constexpr float kScale = 1024.0f;                            // 2^10

struct Case {
  std::string optimizer_name;
  nn::Optimizer::Options optimizer;
  nn::Precision precision;
  train::LossScaling scaling;
  float clip;

  std::string name() const {
    return optimizer_name + " " + nn::precision_name(precision) + " scale " +
           loss_scaling::setting_text(scaling) + " clip " + std::to_string(clip);
  }
};

struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> parameters;  // the f32 values (masters when mixed)
};

Outcome run(const Case& c) {
  const Dataset data = testing::tiny_data(100);
  nn::ModelConfig model_config = testing::tiny_model(2, 0.25f);
  model_config.precision = c.precision;
  nn::Model model(model_config, Device::cpu());
  nn::Optimizer optimizer(model.parameters(), c.optimizer);
  train::TrainConfig config;
  config.batch = kBatch;
  config.micro_batch = kMicro;
  config.steps = kSteps;
  config.seed = 3;
  config.loss_scaling = c.scaling;
  config.fixed_scale = kScale;
  config.dynamic_scaling.initial_scale = kScale;
  config.dynamic_scaling.growth_interval = 100;  // no growth within the run
  config.clip_grad_norm = c.clip;
  train::Trainer trainer(model, optimizer, data, config);

  // 12 bytes, f32 + f64, whenever the boundary's pass runs; nothing otherwise. The
  // configuration tells it before any trainer exists (as the program's prediction needs).
  const bool pass = c.scaling != train::LossScaling::none || c.clip > 0.0f;
  const std::size_t boundary = pass ? 12u : 0u;
  EXPECT_EQ(trainer.boundary_bytes(), boundary) << c.name();
  EXPECT_EQ(loss_scaling::boundary_workspace_bytes(train::boundary_options(config)), boundary)
      << c.name();
  const std::size_t predicted =
      nn::predict_step(nn::ModelLedger(model_config), kBatch, kMicro, c.optimizer, nullptr, boundary).peak();
  Outcome outcome;
  int clipped = 0;
  trainer.run([&](const train::StepRecord& record) {
    clipped += record.clip_factor < 1.0f ? 1 : 0;
    EXPECT_FALSE(record.skipped) << c.name() << ", step " << record.step;
    EXPECT_TRUE(std::isfinite(record.loss)) << c.name() << ", step " << record.step;
    EXPECT_EQ(record.memory.peak_total, predicted) << c.name() << ", step " << record.step;
    outcome.losses.push_back(record.loss);
  });
  if (c.clip > 0.0f) {
    EXPECT_GT(clipped, 0) << c.name() << ": the limit never clipped";
  }
  for (const nn::NamedParameter& p : model.parameters()) {
    outcome.parameters.push_back(p.value.to_vector<float>());
  }
  return outcome;
}

TEST(TrainerCrossProduct, EveryOptimizerPrecisionScalingAndClipping) {
  const std::vector<std::pair<std::string, nn::Optimizer::Options>> optimizers = {
      {"sgd", SgdOptions{.lr = 0.05}},
      {"sgd-momentum", SgdOptions{.lr = 0.05, .momentum = 0.9}},
      {"adamw", AdamWOptions{}}};
  int runs = 0;
  for (const auto& [name, optimizer] : optimizers) {
    for (const float clip : {0.0f, 0.05f}) {
      for (const nn::Precision precision :
           {nn::Precision::fp32, nn::Precision::fp16, nn::Precision::bf16}) {
        const Case none{name, optimizer, precision, train::LossScaling::none, clip};
        const Case fixed{name, optimizer, precision, train::LossScaling::fixed, clip};
        const Case dynamic{name, optimizer, precision, train::LossScaling::dynamic, clip};
        const Outcome unscaled = run(none), by_fixed = run(fixed), by_dynamic = run(dynamic);
        runs += 3;
        EXPECT_EQ(by_fixed.losses, by_dynamic.losses) << fixed.name();
        EXPECT_EQ(by_fixed.parameters, by_dynamic.parameters) << fixed.name();
        if (precision == nn::Precision::fp16) {
          // The one precision whose bits the scale changes (it keeps small gradients).
          EXPECT_NE(by_fixed.parameters, unscaled.parameters) << fixed.name();
        } else {
          EXPECT_EQ(by_fixed.losses, unscaled.losses) << fixed.name();
          EXPECT_EQ(by_fixed.parameters, unscaled.parameters) << fixed.name();
        }
      }
    }
  }
  EXPECT_EQ(runs, 54);
}

TEST(TrainerCrossProduct, ClippingChangesTheUpdate) {
  // Without this, the clip-on half of the cross product could be the clip-off half again.
  const Case off{"sgd", SgdOptions{.lr = 0.05}, nn::Precision::fp32, train::LossScaling::none, 0};
  Case on = off;
  on.clip = 0.01f;
  EXPECT_NE(run(off).parameters, run(on).parameters);
}

}  // namespace
}  // namespace bigbatch

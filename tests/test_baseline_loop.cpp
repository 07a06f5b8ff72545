// test_baseline_loop.cpp: chapter 01 writes its training loop out by hand, for the reader
// (BaselineLoop); the program trains through train::Trainer. The two are one loop: over
// an epoch's short last batch and into the next epoch, with dropout and uneven
// micro-batches, they give the same losses and the same parameters and optimizer state,
// bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/train/trainer.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

std::vector<std::vector<float>> state_of(const nn::Model& model, const nn::Optimizer& optimizer) {
  std::vector<std::vector<float>> values;
  for (const auto& [name, tensor] : model.state_dict()) values.push_back(tensor.to_vector<float>());
  for (const auto& [name, tensor] : optimizer.state()) values.push_back(tensor.to_vector<float>());
  return values;
}

TEST(BaselineLoop, TrainsToTheTrainersBits) {
  const Dataset data = testing::tiny_data(100);  // batches of 32: 32, 32, 32, 4 per epoch
  constexpr std::int64_t kBatch = 32, kMicro = 7, kSteps = 6;
  constexpr std::uint64_t kSeed = 11;
  const nn::ModelConfig config = testing::tiny_model(2, 0.25f);

  nn::Model by_hand(config, Device::cpu());
  nn::Optimizer by_hand_optimizer(by_hand.parameters(), AdamWOptions{});
  baseline::BaselineLoop loop(by_hand, by_hand_optimizer, data, kBatch, kMicro, kSeed);
  ASSERT_EQ(loop.steps_per_epoch(), 4);
  std::vector<float> by_hand_losses;
  for (std::int64_t k = 0; k < kSteps; ++k) by_hand_losses.push_back(loop.step(k));

  nn::Model trained(config, Device::cpu());
  nn::Optimizer optimizer(trained.parameters(), AdamWOptions{});
  train::TrainConfig run;
  run.batch = kBatch;
  run.micro_batch = kMicro;
  run.steps = kSteps;
  run.seed = kSeed;
  train::Trainer trainer(trained, optimizer, data, run);
  std::vector<float> losses;
  trainer.run([&](const train::StepRecord& record) { losses.push_back(record.loss); });

  EXPECT_EQ(by_hand_losses, losses);
  EXPECT_EQ(state_of(by_hand, by_hand_optimizer), state_of(trained, optimizer));
}

}  // namespace
}  // namespace bigbatch

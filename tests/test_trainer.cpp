// test_trainer.cpp: the trainer's sample stream (consecutive wrapping batches, or a
// per-epoch permutation determined by the seed), bit-identical training with and without
// gradient accumulation through the trainer, and evaluate() against a hand count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/data/dataset.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/sample_stream.hpp"

namespace bigbatch {
namespace {

using nn::ModelConfig;
using train::TrainConfig;

Dataset tiny_data(std::int64_t samples) {
  SyntheticOptions options;
  options.samples = samples;
  options.features = 12;
  options.classes = 5;
  options.teacher_hidden = 8;
  return make_synthetic(options);
}

ModelConfig tiny_model(std::int64_t depth, float dropout) {
  return {.inputs = 12, .hidden = 16, .expansion = 2, .classes = 5, .depth = depth,
          .dropout = dropout, .seed = 7};
}

std::vector<std::int64_t> range(std::int64_t begin, std::int64_t end) {
  std::vector<std::int64_t> values(static_cast<std::size_t>(end - begin));
  std::iota(values.begin(), values.end(), begin);
  return values;
}

struct Fixture {
  Dataset data;
  nn::Model model;
  nn::Optimizer optimizer;
  Fixture(std::int64_t samples, ModelConfig config)
      : data(tiny_data(samples)),
        model(config, Device::cpu()),
        optimizer(model.parameters(), AdamWOptions{}) {}
};

TEST(TrainerStream, ShuffleOffTakesConsecutiveBatchesThatWrapAround) {
  Fixture f(10, tiny_model(0, 0.0f));
  TrainConfig config;
  config.batch = 4;
  config.steps = 4;
  config.shuffle = false;
  const train::Trainer trainer(f.model, f.optimizer, f.data, config);
  EXPECT_EQ(trainer.batch_indices(0), range(0, 4));
  EXPECT_EQ(trainer.batch_indices(1), range(4, 8));
  EXPECT_EQ(trainer.batch_indices(2), (std::vector<std::int64_t>{8, 9, 0, 1}));
  EXPECT_EQ(trainer.batch_indices(3), range(2, 6));
  EXPECT_EQ(trainer.batch_indices(5), range(0, 4));  // positions 20..23 = 2 epochs later
}

TEST(TrainerStream, ShuffleOnIsAPermutationPerEpochDeterminedByTheSeed) {
  Fixture f(10, tiny_model(0, 0.0f));
  TrainConfig config;
  config.batch = 5;
  config.epochs = 3;
  config.seed = 42;
  const train::Trainer trainer(f.model, f.optimizer, f.data, config);
  EXPECT_EQ(trainer.total_steps(), 6);
  std::vector<std::vector<std::int64_t>> epochs;
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::int64_t> order = trainer.batch_indices(2 * epoch);
    const std::vector<std::int64_t> second = trainer.batch_indices(2 * epoch + 1);
    order.insert(order.end(), second.begin(), second.end());
    EXPECT_EQ(order, nn::epoch_permutation(10, 42, epoch));
    std::vector<std::int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, range(0, 10)) << "epoch " << epoch << " is not a permutation";
    epochs.push_back(order);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epochs[0], range(0, 10));
  // The same seed gives the same stream, another seed another.
  EXPECT_EQ(nn::epoch_permutation(1000, 42, 1), nn::epoch_permutation(1000, 42, 1));
  EXPECT_NE(nn::epoch_permutation(1000, 42, 1), nn::epoch_permutation(1000, 43, 1));

  // A batch that straddles two epochs ends one permutation and starts the next.
  TrainConfig straddling = config;
  straddling.batch = 4;
  const train::Trainer trainer4(f.model, f.optimizer, f.data, straddling);
  const auto& e0 = epochs[0];
  const auto& e1 = epochs[1];
  EXPECT_EQ(trainer4.batch_indices(2), (std::vector<std::int64_t>{e0[8], e0[9], e1[0], e1[1]}));
}

TEST(TrainerStream, LargePermutationIsAPermutation) {
  std::vector<std::int64_t> order = nn::epoch_permutation(1025, 3, 7);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, range(0, 1025));
}

std::vector<std::vector<float>> trained_parameters(std::int64_t micro_batch) {
  Fixture f(100, tiny_model(2, 0.25f));
  TrainConfig config;
  config.batch = 32;
  config.micro_batch = micro_batch;
  config.steps = 20;
  config.seed = 5;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  std::int64_t steps_seen = 0;
  trainer.run([&](const train::StepRecord& record) {
    ++steps_seen;
    EXPECT_EQ(record.step, steps_seen);
    EXPECT_EQ(record.samples, 32 * steps_seen);
    EXPECT_TRUE(std::isfinite(record.loss));
    EXPECT_GT(record.peak_bytes[static_cast<std::size_t>(MemoryCategory::data)], 0u);
  });
  EXPECT_EQ(steps_seen, 20);
  std::vector<std::vector<float>> values;
  for (const nn::NamedParameter& p : f.model.parameters()) {
    values.push_back(p.value.to_vector<float>());
  }
  return values;
}

TEST(TrainerAccumulation, MicroBatchesOfSevenGiveBitIdenticalParameters) {
  // LayerNorm on the fp32 CPU backend: micro-batch gradients are those of the batch bit
  // for bit (docs/model.md), dropout masks follow the global row (first_row = k B), so
  // 20 steps through the trainer must agree exactly, with 32 = 4 x 7 + 4 uneven.
  const auto whole = trained_parameters(32);
  const auto accumulated = trained_parameters(7);
  ASSERT_EQ(whole.size(), accumulated.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    ASSERT_EQ(whole[i].size(), accumulated[i].size());
    EXPECT_EQ(std::memcmp(whole[i].data(), accumulated[i].data(), whole[i].size() * sizeof(float)),
              0)
        << "parameter " << i << " differs";
  }
  // And training moved them: the test would be vacuous otherwise.
  Fixture untouched(100, tiny_model(2, 0.25f));
  EXPECT_NE(untouched.model.parameters()[0].value.to_vector<float>(), whole[0]);
}

TEST(TrainerEvaluate, MatchesAHandCountOfTheLogits) {
  Fixture f(23, tiny_model(1, 0.5f));  // dropout must be off in evaluation
  const nn::EvaluationResult result = nn::evaluate(f.model, f.data, 5);  // 4 x 5 + 3

  // The oracle: logits of the whole set at once, argmax and log-sum-exp in double.
  const Tensor logits_tensor = f.model.forward(f.data.features, {false, 0, 0});
  const std::vector<float> logits = logits_tensor.to_vector<float>();
  const std::vector<std::int32_t> labels = f.data.labels.to_vector<std::int32_t>();
  std::int64_t correct = 0;
  double loss = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const float* row = &logits[i * 5];
    const auto best = static_cast<std::int32_t>(std::max_element(row, row + 5) - row);
    correct += best == labels[i];
    double sum = 0;
    for (int c = 0; c < 5; ++c) sum += std::exp(static_cast<double>(row[c]));
    loss += std::log(sum) - row[labels[i]];
  }
  loss /= static_cast<double>(labels.size());
  EXPECT_EQ(result.samples, 23);
  EXPECT_EQ(result.correct, correct);
  EXPECT_DOUBLE_EQ(result.accuracy, static_cast<double>(correct) / 23.0);
  // The kernel sums 23 f32 per-row terms (each a few ulp of its log-sum-exp): gamma(23)
  // times the loss bounds the sum's rounding, with a factor 4 for the per-row terms.
  const double tolerance = 4 * 23 * 0x1p-24 * std::abs(loss) + 1e-6;
  EXPECT_NEAR(result.loss, loss, tolerance);
  EXPECT_GT(correct, 0);
}

}  // namespace
}  // namespace bigbatch

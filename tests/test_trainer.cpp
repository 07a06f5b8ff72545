// test_trainer.cpp: the trainer's sample stream (whole epochs of batches, the last one
// short or dropped, in data order or a per-epoch permutation determined by the seed),
// bit-identical training with and without gradient accumulation through the trainer (short
// last batches included), the learning-rate schedule reaching the optimizer, and
// evaluate() against a hand count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/data/dataset.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/sample_stream.hpp"
#include "tests/harness.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using nn::ModelConfig;
using train::TrainConfig;

using testing::tiny_data;
using testing::tiny_model;

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

TEST(TrainerStream, ShuffleOffTakesWholeEpochsWithAShortLastBatch) {
  // N = 10, B = 4: an epoch is 3 batches of 4, 4 and 10 mod 4 = 2 samples.
  Fixture f(10, tiny_model(0, 0.0f));
  TrainConfig config;
  config.batch = 4;
  config.epochs = 2;
  config.shuffle = false;
  const train::Trainer trainer(f.model, f.optimizer, f.data, config);
  EXPECT_EQ(trainer.batches_per_epoch(), 3);
  EXPECT_EQ(trainer.total_steps(), 6);
  EXPECT_EQ(trainer.batch_indices(0), range(0, 4));
  EXPECT_EQ(trainer.batch_indices(1), range(4, 8));
  EXPECT_EQ(trainer.batch_indices(2), range(8, 10));  // short: never straddles into epoch 1
  EXPECT_EQ(trainer.batch_indices(3), range(0, 4));   // epoch 1 starts afresh
  EXPECT_EQ(trainer.batch_indices(5), range(8, 10));

  // --drop-last: 2 batches per epoch, the 2 left-over samples are not trained.
  TrainConfig dropping = config;
  dropping.drop_last = true;
  const train::Trainer trainer_dropping(f.model, f.optimizer, f.data, dropping);
  EXPECT_EQ(trainer_dropping.batches_per_epoch(), 2);
  EXPECT_EQ(trainer_dropping.total_steps(), 4);
  EXPECT_EQ(trainer_dropping.batch_indices(2), range(0, 4));
  EXPECT_EQ(trainer_dropping.batch_indices(3), range(4, 8));
}

TEST(TrainerStream, SamplesAfterCountsWholeEpochsThenWholeBatchesAndAResumeChecksThem) {
  // N = 10, B = 4: steps take 4, 4, 2 | 4, 4, 2 | ... samples; with --drop-last 4, 4 | 4, 4.
  Fixture f(10, tiny_model(0, 0.0f));
  TrainConfig config;
  config.batch = 4;
  config.epochs = 3;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  const std::vector<std::int64_t> expected = {0, 4, 8, 10, 14, 18, 20, 24, 28, 30};
  for (std::int64_t k = 0; k <= trainer.total_steps(); ++k) {
    EXPECT_EQ(trainer.samples_after(k), expected[static_cast<std::size_t>(k)]) << k;
  }
  config.drop_last = true;
  EXPECT_EQ(train::Trainer(f.model, f.optimizer, f.data, config).samples_after(5), 20);
  // A state whose samples are not its steps' is refused; its steps' are taken.
  train::TrainerState state = trainer.state();
  state.steps_done = state.optimizer_steps = 4;
  state.samples_done = 15;
  EXPECT_THROW(trainer.restore(state), std::invalid_argument);
  state.samples_done = 14;
  trainer.restore(state);
  EXPECT_EQ(trainer.steps_done(), 4);
}

TEST(TrainerStream, BatchesPerEpochAreCeilOrFloorOfNOverB) {
  // N = 2000, B = 64: 2000 = 31 x 64 + 16, so 32 batches per epoch (the last of 16
  // samples) and 31 with drop_last.
  const Dataset data = tiny_data(2000);
  const nn::SampleStream keeping(data, 64, true, 1, nn::LastBatch::keep_short);
  const nn::SampleStream dropping(data, 64, true, 1, nn::LastBatch::drop);
  EXPECT_EQ(keeping.batches_per_epoch(), 32);
  EXPECT_EQ(dropping.batches_per_epoch(), 31);
  const nn::BatchPosition last = keeping.position(31);
  EXPECT_EQ(last.epoch, 0);
  EXPECT_EQ(last.size, 16);
  EXPECT_EQ(last.first_row, 31 * 64);
  const nn::BatchPosition next = keeping.position(32);
  EXPECT_EQ(next.epoch, 1);
  EXPECT_EQ(next.index, 0);
  EXPECT_EQ(next.size, 64);
  EXPECT_EQ(next.first_row, 2000);
  EXPECT_EQ(dropping.position(31).epoch, 1);
  // A batch larger than the data set: one short batch per epoch, or nothing to drop to.
  const nn::SampleStream whole(data, 5000, false, 1, nn::LastBatch::keep_short);
  EXPECT_EQ(whole.batches_per_epoch(), 1);
  EXPECT_EQ(whole.batch_indices(3), range(0, 2000));
  EXPECT_THROW(nn::SampleStream(data, 5000, false, 1, nn::LastBatch::drop), std::exception);
}

TEST(TrainerStream, ShuffleOnIsAPermutationPerEpochDeterminedByTheSeed) {
  // N = 10, B = 4: the batches of epoch e are positions [0, 4), [4, 8), [8, 10) of
  // epoch_permutation(10, seed, e).
  Fixture f(10, tiny_model(0, 0.0f));
  TrainConfig config;
  config.batch = 4;
  config.epochs = 3;
  config.seed = 42;
  const train::Trainer trainer(f.model, f.optimizer, f.data, config);
  EXPECT_EQ(trainer.total_steps(), 9);
  std::vector<std::vector<std::int64_t>> epochs;
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::int64_t> order;
    for (std::int64_t j = 0; j < 3; ++j) {
      const std::vector<std::int64_t> batch = trainer.batch_indices(3 * epoch + j);
      EXPECT_EQ(batch.size(), j < 2 ? 4u : 2u);
      order.insert(order.end(), batch.begin(), batch.end());
    }
    EXPECT_EQ(order, nn::epoch_permutation(10, 42, epoch));
    std::vector<std::int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, range(0, 10)) << "epoch " << epoch << " is not a permutation";
    epochs.push_back(order);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epochs[0], range(0, 10));

  // The order is a pure function of (seed, epoch): a fresh stream asked for epoch 2's
  // second batch first, then epoch 0's, gives the same samples as walking in order.
  const nn::SampleStream fresh(f.data, 4, true, 42, nn::LastBatch::keep_short);
  EXPECT_EQ(fresh.batch_indices(7), (std::vector<std::int64_t>(epochs[2].begin() + 4,
                                                               epochs[2].begin() + 8)));
  EXPECT_EQ(fresh.batch_indices(0), (std::vector<std::int64_t>(epochs[0].begin(),
                                                               epochs[0].begin() + 4)));
  // The same seed gives the same permutation, another seed another.
  EXPECT_EQ(nn::epoch_permutation(1000, 42, 1), nn::epoch_permutation(1000, 42, 1));
  EXPECT_NE(nn::epoch_permutation(1000, 42, 1), nn::epoch_permutation(1000, 43, 1));
}

TEST(TrainerStream, LargePermutationIsAPermutation) {
  std::vector<std::int64_t> order = nn::epoch_permutation(1025, 3, 7);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, range(0, 1025));
}

std::vector<std::vector<float>> parameter_values(const nn::Model& model) {
  std::vector<std::vector<float>> values;
  for (const nn::NamedParameter& p : model.parameters()) {
    values.push_back(p.value.to_vector<float>());
  }
  return values;
}

void expect_bit_identical(const std::vector<std::vector<float>>& a,
                          const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << "parameter " << i << " differs";
  }
}

// N = 100, B = 32: every epoch is 32, 32, 32 and a short batch of 100 mod 32 = 4.
std::vector<std::vector<float>> trained_parameters(std::int64_t micro_batch,
                                                   nn::LrScheduleKind schedule,
                                                   std::int64_t warmup_steps) {
  Fixture f(100, tiny_model(2, 0.25f));
  TrainConfig config;
  config.batch = 32;
  config.micro_batch = micro_batch;
  config.steps = 10;  // epochs 0 and 1, and half of epoch 2
  config.seed = 5;
  config.lr_schedule = schedule;
  config.warmup_steps = warmup_steps;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  std::int64_t steps_seen = 0, samples = 0;
  trainer.run([&](const train::StepRecord& record) {
    ++steps_seen;
    const std::int64_t expected_rows = steps_seen % 4 == 0 ? 4 : 32;
    samples += expected_rows;
    EXPECT_EQ(record.step, steps_seen);
    EXPECT_EQ(record.batch_samples, expected_rows);
    EXPECT_EQ(record.samples, samples);
    EXPECT_DOUBLE_EQ(record.epoch, static_cast<double>(steps_seen) / 4.0);
    EXPECT_TRUE(std::isfinite(record.loss));
    // The device holds one micro-batch of samples (nn::MicroBatchBuffer), not the batch:
    // x f32 [m, D] and labels i32 [m], m the micro-batch (the batch when 0).
    const auto staged = static_cast<std::size_t>(micro_batch == 0 ? config.batch : micro_batch);
    EXPECT_EQ(record.memory.peak_of(MemoryCategory::data),
              staged * (4 * static_cast<std::size_t>(f.data.feature_dim()) + 4));
    EXPECT_GT(record.memory.peak_total, 0u);
  });
  EXPECT_EQ(steps_seen, 10);
  return parameter_values(f.model);
}

TEST(TrainerAccumulation, MicroBatchesOfSevenGiveBitIdenticalParameters) {
  // LayerNorm on the fp32 CPU backend: micro-batch gradients are those of the batch bit
  // for bit (docs/model.md), dropout masks follow the run's row (first_row = e N + j B),
  // so 10 steps through the trainer must agree exactly, with 32 = 4 x 7 + 4 uneven and
  // the short last batch of each epoch (4 samples, one micro-batch) included.
  const auto whole = trained_parameters(32, nn::LrScheduleKind::constant, 0);
  const auto accumulated = trained_parameters(7, nn::LrScheduleKind::constant, 0);
  expect_bit_identical(whole, accumulated);
  // And training moved them: the test would be vacuous otherwise.
  Fixture untouched(100, tiny_model(2, 0.25f));
  EXPECT_NE(untouched.model.parameters()[0].value.to_vector<float>(), whole[0]);
}

TEST(TrainerAccumulation, MicroBatchesAgreeUnderAWarmUpAndCosineSchedule) {
  const auto whole = trained_parameters(32, nn::LrScheduleKind::cosine, 3);
  const auto accumulated = trained_parameters(5, nn::LrScheduleKind::cosine, 3);
  expect_bit_identical(whole, accumulated);
  // The schedule changed the training: it is not the constant rate's.
  EXPECT_NE(whole, trained_parameters(32, nn::LrScheduleKind::constant, 0));
}

TEST(TrainerSchedule, TheOptimizerUsesTheScheduledRateOfEveryStep) {
  Fixture f(100, tiny_model(1, 0.0f));
  TrainConfig config;
  config.batch = 32;
  config.steps = 6;
  config.lr_schedule = nn::LrScheduleKind::cosine;
  config.warmup_steps = 2;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  const nn::LrSchedule expected{1e-3, 6, 2, nn::LrScheduleKind::cosine};  // AdamW's 1e-3
  EXPECT_EQ(trainer.lr_schedule().base_lr, 1e-3);
  trainer.run([&](const train::StepRecord& record) {
    EXPECT_EQ(record.learning_rate, nn::lr_at(expected, record.step - 1));
    EXPECT_EQ(f.optimizer.learning_rate(), record.learning_rate);
  });
  EXPECT_EQ(f.optimizer.steps_taken(), 6);
}

// Mixed precision with dynamic loss scaling, at the optimizer boundary: a step whose
// scaled gradients overflow f16 (S = 2^30: the scaled dlogits exceed 65504) is skipped:
// not clipped, the weights, their f16 copies and AdamW's state keep their bits, the scale
// halves, and the schedule does not advance (it counts optimizer steps taken, so the next
// step still uses the warm-up's first rate).
TEST(TrainerLossScaling, AnOverflowingStepIsSkippedAndTheScheduleWaits) {
  ModelConfig model_config = tiny_model(1, 0.0f);
  model_config.precision = nn::Precision::fp16;
  Fixture f(100, model_config);
  TrainConfig config;
  config.batch = 32;
  config.micro_batch = 8;
  config.steps = 2;
  config.warmup_steps = 4;
  config.loss_scaling = train::LossScaling::dynamic;
  config.dynamic_scaling = {.initial_scale = 1073741824.0f, .growth_interval = 100,
                            .min_scale = 1, .max_scale = 1073741824.0f};
  config.clip_grad_norm = 0.05f;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  std::vector<Tensor> before;
  for (const auto& p : f.model.parameters()) {
    before.push_back(p.value.clone());
    if (p.half.defined()) before.push_back(p.half.clone());
  }
  const train::StepRecord first = trainer.step();
  EXPECT_TRUE(first.skipped);
  EXPECT_EQ(first.loss_scale, 1073741824.0f);
  EXPECT_FALSE(std::isfinite(first.grad_norm));
  EXPECT_EQ(first.clip_factor, 1.0f) << "an overflowing step was clipped";
  EXPECT_EQ(f.optimizer.steps_taken(), 0);
  std::size_t i = 0;
  for (const auto& p : f.model.parameters()) {
    EXPECT_TRUE(testing::bitwise_equal(p.value, before[i++])) << p.name;
    if (p.half.defined()) {
      EXPECT_TRUE(testing::bitwise_equal(p.half, before[i++])) << p.name;
    }
  }
  for (const auto& [name, state] : f.optimizer.state()) {
    for (const double v : testing::to_doubles(state)) ASSERT_EQ(v, 0.0) << name;
  }
  const train::StepRecord second = trainer.step();
  EXPECT_EQ(second.loss_scale, 536870912.0f) << "the scale halves after an overflow";
  EXPECT_EQ(second.learning_rate, first.learning_rate) << "a skipped step advanced the schedule";
  EXPECT_EQ(second.skipped_steps, second.skipped ? 2 : 1);
}

TEST(TrainerSchedule, AConstantScheduleTrainsAsTheFixedRateLoopBitForBit) {
  // The loop written out by hand, without any schedule: the trainer with the constant
  // schedule must give the same bits (setting the rate to itself changes nothing).
  Fixture by_hand(100, tiny_model(2, 0.25f));
  {
    const nn::SampleStream stream(by_hand.data, 32, true, 5, nn::LastBatch::keep_short);
    const std::uint64_t dropout_seed = nn::dropout_seed_for_run(5);
    for (std::int64_t k = 0; k < 6; ++k) {
      const nn::BatchPosition batch = stream.position(k);
      const Tensor x({batch.size, 12}, DType::f32, Device::cpu(), MemoryCategory::data);
      const Tensor labels({batch.size}, DType::i32, Device::cpu(), MemoryCategory::data);
      stream.gather(k, x, labels);
      by_hand.model.zero_grad();
      nn::accumulate_gradients(by_hand.model, x, labels, 32, {true, dropout_seed, batch.first_row});
      by_hand.optimizer.step();
    }
  }
  Fixture trained(100, tiny_model(2, 0.25f));
  TrainConfig config;
  config.batch = 32;
  config.steps = 6;
  config.seed = 5;
  train::Trainer trainer(trained.model, trained.optimizer, trained.data, config);
  trainer.run();
  expect_bit_identical(parameter_values(by_hand.model), parameter_values(trained.model));
}

TEST(TrainerMemory, AStepReportsItsOwnPeakOnTheDevice) {
  // 8 MiB allocated and freed before the step (as an evaluation between steps would) must
  // not show in the step's peak: the trainer measures each step from a fresh peak.
  Fixture f(100, tiny_model(1, 0.0f));
  TrainConfig config;
  config.batch = 32;
  config.steps = 2;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  const std::size_t big = std::size_t{8} << 20;
  { const Tensor between_steps({static_cast<std::int64_t>(big / 4)}, DType::f32, Device::cpu(),
                               MemoryCategory::workspace); }
  const train::StepRecord record = trainer.step();
  EXPECT_GT(record.memory.peak_total, 0u);
  EXPECT_LT(record.memory.peak_total, big);
  // The device's categories at that moment add up to the step's peak; the host's data
  // sets (whose live bytes the breakdown also records) are not part of it.
  std::size_t sum = 0;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    if (counts_on_device(static_cast<MemoryCategory>(c))) sum += record.memory.at_peak[c];
  }
  EXPECT_EQ(sum, record.memory.peak_total);
  EXPECT_EQ(trainer.largest_step_memory().peak_total, record.memory.peak_total);
}

// Training on a GPU, end to end: the trainer, mixed precision with dynamic scaling, and
// evaluation on CUDA tensors. A functional check (no tolerance): 40 steps on an easy
// synthetic task must keep every loss finite, end below where they started, and beat
// chance on held-out data; the same run on the CPU is the yardstick printed beside it.
TEST(TrainerCuda, TrainsAndEvaluatesOnTheGpu) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::fp16}) {
    SCOPED_TRACE(nn::precision_name(precision));
    ModelConfig model_config = tiny_model(2, 0.1f);
    model_config.precision = precision;
    const Dataset data = tiny_data(600);
    nn::Model model(model_config, Device::cuda());
    nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
    TrainConfig config;
    config.batch = 64;
    config.micro_batch = 24;
    config.steps = 40;
    if (precision == nn::Precision::fp16) config.loss_scaling = train::LossScaling::dynamic;
    train::Trainer trainer(model, optimizer, data, config);
    std::vector<float> losses;
    trainer.run([&](const train::StepRecord& record) { losses.push_back(record.loss); });
    for (const float loss : losses) ASSERT_TRUE(std::isfinite(loss));
    EXPECT_LT(losses.back(), losses.front());
    const nn::EvaluationResult result = nn::evaluate(model, data, 50);
    std::printf("cuda %s: loss %.4f -> %.4f, accuracy %.3f\n",
                nn::precision_name(precision).c_str(), losses.front(), losses.back(),
                result.accuracy);
    EXPECT_GT(result.accuracy, 1.5 / 5) << "no better than chance (5 classes)";
  }
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
  // Derived part: the 23 non-negative row losses are added in f32 (within each batch of 5,
  // then each batch's sum times 1/23 into the total): at most 23 + 2 x 5 rounded
  // operations on every path, so gamma(33) |loss| bounds that rounding. Not derived: each
  // row loss itself (f32 exp, log and max-shift of 5 logits) is within a few ulp of its
  // log-sum-exp; 1e-6 absolute covers that (about 4 ulp of a loss near 2). Measured: an
  // error of 8.3e-8 against a tolerance of 3.9e-6 (both printed).
  const double u = 0x1p-24, gamma33 = 33 * u / (1 - 33 * u);
  const double tolerance = gamma33 * std::abs(loss) + 1e-6;
  std::printf("evaluation loss: error %.3g, tolerance %.3g\n", std::abs(result.loss - loss),
              tolerance);
  EXPECT_NEAR(result.loss, loss, tolerance);
  EXPECT_GT(correct, 0);
}

// A run evaluates in its trainer's staging buffer: the same batches, so the same bits as a
// buffer of its own, and no data bytes beside the step's. A buffer of other samples (other
// features) is refused before anything is copied.
TEST(TrainerEvaluate, InTheTrainersStagingBufferGivesTheSameBitsAndNoNewData) {
  Fixture f(23, tiny_model(1, 0.0f));
  TrainConfig config;
  config.batch = 10;
  config.micro_batch = 5;
  config.steps = 2;
  train::Trainer trainer(f.model, f.optimizer, f.data, config);
  trainer.run();
  const nn::EvaluationResult own = nn::evaluate(f.model, f.data, 5);
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const std::size_t data_before = allocator.stats().live_of(MemoryCategory::data);
  allocator.reset_peak();
  const nn::EvaluationResult staged = nn::evaluate(f.model, f.data, trainer.staging());
  EXPECT_EQ(allocator.stats().peak_of(MemoryCategory::data), data_before);
  EXPECT_EQ(staged.loss, own.loss);
  EXPECT_EQ(staged.correct, own.correct);
  EXPECT_EQ(staged.samples, own.samples);
  nn::MicroBatchBuffer other(5, f.data.feature_dim() + 1, Device::cpu());
  EXPECT_FALSE(other.holds(f.data));
  EXPECT_THROW(nn::evaluate(f.model, f.data, other), std::invalid_argument);
}

}  // namespace
}  // namespace bigbatch

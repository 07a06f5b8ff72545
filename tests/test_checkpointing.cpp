// test_checkpointing.cpp: chapter 05's driver (chapters/05_activation_checkpointing/
// scheduled_runner.hpp) on the model. Whatever a policy keeps and recomputes, the step must
// compute the same numbers: every block runs the same kernels on the same inputs, dropout
// masks come from the counter RNG (keyed by seed, row and block, not by how often a block
// ran), and BatchNorm's running statistics move once per forward. So the tests ask for bit
// equality with the model run without checkpointing:
// - every policy and depth, dropout on, LayerNorm and BatchNorm, on each backend;
// - the counted block forwards equal the schedule's (advances + tapes);
// - with the trainer: uneven micro-batches, fp16 with dynamic loss scaling;
// - the activation memory measured by the allocator falls as the policy keeps less;
// - the same on chapter 08's GPT, whose transformer blocks the same runner checkpoints
//   (whole blocks: selective recomputation is the MLP block's and is refused).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/text_corpus.hpp"
#include "nn/gpt.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"
#include "tests/harness.hpp"
#include "tests/labelled_batch.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using checkpointing::GptScheduledRunner;
using checkpointing::ScheduledRunner;

const std::vector<std::string> kPolicies = {
    "none",      "every:1",   "every:3",   "sqrt",           "optimal:1",
    "optimal:2", "optimal:3", "selective", "sqrt+selective", "optimal:2+selective"};

nn::ModelConfig config_for(std::int64_t depth, nn::Norm norm) {
  nn::ModelConfig config = testing::tiny_model(depth, 0.25f);
  config.norm = norm;
  return config;
}

struct StepResult {
  std::vector<std::vector<float>> gradients;  // then the running statistics, if any
  float loss = 0;
  std::int64_t evaluations = -1;  // block forwards the runner counted (-1: no runner)
  std::int64_t recomputations = -1;
};

/// One forward and backward of 24 rows (micro-batches of 8: BatchNorm needs >= 2 rows).
StepResult one_step(std::int64_t depth, nn::Norm norm, const std::string& policy,
                    Device device) {
  const nn::ModelConfig config = config_for(depth, norm);
  nn::Model model(config, device);
  std::shared_ptr<ScheduledRunner> runner;
  if (policy != "none") {
    runner = ScheduledRunner::for_policy(checkpointing::Policy::parse(policy), depth);
    model.set_block_runner(runner);
  }
  const testing::LabelledBatch batch = testing::random_labelled_batch(config, 24, 3);
  StepResult result;
  result.loss = nn::accumulate_gradients(model, batch.x.to(device), batch.labels.to(device), 8,
                                         {true, 17, 100});
  for (const nn::NamedParameter& p : model.parameters()) {
    result.gradients.push_back(p.grad.to_vector<float>());
  }
  for (const auto& [name, tensor] : model.state_dict()) {
    if (name.find("running") != std::string::npos) {
      result.gradients.push_back(tensor.to_vector<float>());
    }
  }
  if (runner) {
    result.evaluations = runner->evaluations();
    result.recomputations = runner->recomputations();
  }
  return result;
}

class Checkpointing : public testing::DeviceTest {};

TEST_P(Checkpointing, EveryPolicyGivesTheGradientsOfNoCheckpointingBitForBit) {
  for (const nn::Norm norm : {nn::Norm::layer, nn::Norm::batch}) {
    for (const std::int64_t depth : {1, 2, 7, 16}) {
      const StepResult reference = one_step(depth, norm, "none", device());
      for (const std::string& policy : kPolicies) {
        if (policy == "none") continue;
        SCOPED_TRACE(policy + ", depth " + std::to_string(depth) + ", " + nn::norm_name(norm));
        const StepResult checkpointed = one_step(depth, norm, policy, device());
        EXPECT_EQ(std::memcmp(&checkpointed.loss, &reference.loss, sizeof(float)), 0);
        // Gradients, and for BatchNorm the running statistics: moved once per forward,
        // never again by a recomputation.
        EXPECT_EQ(checkpointed.gradients, reference.gradients);
        // 3 micro-batches, each running the schedule's block forwards.
        const checkpointing::ScheduleStats stats =
            checkpointing::simulate(ScheduledRunner::for_policy(checkpointing::Policy::parse(policy), depth)->schedule());
        EXPECT_EQ(checkpointed.evaluations, 3 * (stats.advances + stats.tapes));
        EXPECT_EQ(checkpointed.recomputations, 3 * (stats.advances + stats.tapes - depth));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Checkpointing, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

/// 6 steps through the trainer: batch 32 over 100 samples (short last batches), uneven
/// micro-batches of 7, dropout, fp16 with dynamic loss scaling from a scale that
/// overflows first (skipped steps included).
std::vector<std::vector<float>> trained_fp16(const std::string& policy) {
  const Dataset data = testing::tiny_data(100);
  nn::ModelConfig config = testing::tiny_model(5, 0.25f);
  config.precision = nn::Precision::fp16;
  nn::Model model(config, Device::cpu());
  if (policy != "none") {
    model.set_block_runner(ScheduledRunner::for_policy(checkpointing::Policy::parse(policy), 5));
  }
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  train::TrainConfig train_config;
  train_config.batch = 32;
  train_config.micro_batch = 7;
  train_config.steps = 6;
  train_config.loss_scaling = train::LossScaling::dynamic;
  train_config.dynamic_scaling = {.initial_scale = 0x1p24f, .growth_interval = 2,
                                  .min_scale = 1, .max_scale = 0x1p24f};
  train::Trainer trainer(model, optimizer, data, train_config);
  std::int64_t skipped = 0;
  trainer.run([&](const train::StepRecord& r) { skipped = r.skipped_steps; });
  std::vector<std::vector<float>> values;
  for (const nn::NamedParameter& p : model.parameters()) {
    values.push_back(p.value.to_vector<float>());
  }
  values.push_back({static_cast<float>(skipped)});
  return values;
}

TEST(CheckpointingTraining, Fp16DynamicScalingAndUnevenMicroBatchesAgreeBitForBit) {
  const auto reference = trained_fp16("none");
  for (const std::string policy : {"every:2", "sqrt", "optimal:2", "selective"}) {
    EXPECT_EQ(trained_fp16(policy), reference) << policy;
  }
}

/// The step's peak of activations plus checkpoints, measured by the CPU allocator.
std::size_t activation_peak(std::int64_t depth, const std::string& policy) {
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const nn::ModelConfig config = testing::tiny_model(depth, 0.0f);
  nn::Model model(config, Device::cpu());
  if (policy != "none") {
    model.set_block_runner(ScheduledRunner::for_policy(checkpointing::Policy::parse(policy), depth));
  }
  const testing::LabelledBatch batch = testing::random_labelled_batch(config, 64, 5);
  allocator.reset_peak();
  nn::accumulate_gradients(model, batch.x, batch.labels, 64, {true, 1, 0});
  const MemoryStats stats = allocator.stats();
  return stats.at_peak_of(MemoryCategory::activations) +
         stats.at_peak_of(MemoryCategory::checkpoints);
}

TEST(CheckpointingMemory, KeepingLessMeasuresLess) {
  // Depth 16: no checkpointing keeps 16 blocks' activations; sqrt keeps 4 block inputs and
  // one segment of 4 blocks; the binomial schedule with 2 slots keeps 2 inputs and 1 block.
  // Selective keeps, of a block's (2 + 2E) H values per sample (E = 2 here), the output
  // and fc1's output, (1 + E) H: half.
  const std::size_t none = activation_peak(16, "none");
  const std::size_t sqrt = activation_peak(16, "sqrt");
  const std::size_t optimal = activation_peak(16, "optimal:2");
  const std::size_t selective = activation_peak(16, "selective");
  std::printf("depth 16, activations + checkpoints at the step's peak: none %zu, sqrt %zu, "
              "optimal:2 %zu, selective %zu bytes\n", none, sqrt, optimal, selective);
  EXPECT_LT(sqrt, none / 2);
  EXPECT_LT(optimal, sqrt);
  EXPECT_LT(selective, none * 6 / 10);
  EXPECT_LT(activation_peak(16, "sqrt+selective"), sqrt);
}

// ---- the GPT's transformer blocks -------------------------------------------------------

const std::vector<std::string> kWholeBlockPolicies = {"every:1", "every:3", "sqrt",
                                                      "optimal:1", "optimal:2", "optimal:3"};
/// Selective attention recomputation, alone and on whole-block schedules: a taped block
/// drops its attention's probabilities and rebuilds them in its backward.
const std::vector<std::string> kAttentionPolicies = {"attention", "every:2+attention",
                                                     "optimal:1+attention"};

/// Token sequences of 12 positions (documents of 2 to 30 bytes: most are padded).
Dataset gpt_data() {
  return make_token_dataset(make_sequences(synthetic_documents(40, 2, 30, /*seed=*/4), 12),
                            "synthetic-text");
}

struct GptRun {
  std::vector<std::vector<float>> parameters;  // then the steps skipped
  std::int64_t evaluations = -1;               // block forwards the runner counted
};

/// 3 AdamW steps of 10 sequences in micro-batches of 4 (4 + 4 + 2), dropout on; fp16 under
/// the dynamic scaler from 2^20, which overflows once, then trains (1 step of 3 skipped).
GptRun trained_gpt(std::int64_t layers, nn::Precision precision, const std::string& policy,
                   Device device, nn::AttentionKernel attention = nn::AttentionKernel::plain) {
  const Dataset data = gpt_data();
  nn::Gpt model({.vocabulary = 256, .context = 12, .layers = layers, .width = 16, .heads = 2,
                 .dropout = 0.2f, .seed = 9, .precision = precision, .attention = attention},
                device);
  std::shared_ptr<GptScheduledRunner> runner;
  if (policy != "none") {
    runner = GptScheduledRunner::for_policy(checkpointing::Policy::parse(policy), layers);
    model.set_block_runner(runner);
  }
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
  train::TrainConfig config;
  config.batch = 10;
  config.micro_batch = 4;
  config.steps = 3;
  config.seed = 9;
  if (precision == nn::Precision::fp16) {
    config.loss_scaling = train::LossScaling::dynamic;
    config.dynamic_scaling = {.initial_scale = 0x1p20f, .growth_interval = 2, .min_scale = 1,
                              .max_scale = 0x1p24f};
  }
  train::Trainer trainer(model, optimizer, data, config);
  std::int64_t skipped = 0;
  trainer.run([&](const train::StepRecord& r) { skipped = r.skipped_steps; });
  GptRun run;
  for (const nn::NamedParameter& p : model.parameters()) {
    run.parameters.push_back(p.value.to_vector<float>());
  }
  run.parameters.push_back({static_cast<float>(skipped)});
  if (runner) run.evaluations = runner->evaluations();
  return run;
}

class GptCheckpointing : public testing::DeviceTest {};

TEST_P(GptCheckpointing, EveryPolicyTrainsTheBitsOfNoCheckpointing) {
  for (const nn::Precision precision :
       {nn::Precision::fp32, nn::Precision::bf16, nn::Precision::fp16}) {
    for (const std::int64_t layers : {1, 2, 5}) {
      const GptRun reference = trained_gpt(layers, precision, "none", device());
      std::vector<std::string> policies = kWholeBlockPolicies;
      policies.insert(policies.end(), kAttentionPolicies.begin(), kAttentionPolicies.end());
      for (const std::string& policy : policies) {
        SCOPED_TRACE(policy + ", " + std::to_string(layers) + " blocks, " +
                     nn::precision_name(precision));
        const GptRun checkpointed = trained_gpt(layers, precision, policy, device());
        EXPECT_EQ(checkpointed.parameters, reference.parameters);
        // 3 steps of 3 micro-batches, each running the schedule's block forwards.
        const checkpointing::ScheduleStats stats = checkpointing::simulate(
            GptScheduledRunner::for_policy(checkpointing::Policy::parse(policy), layers)
                ->schedule());
        EXPECT_EQ(checkpointed.evaluations, 9 * (stats.advances + stats.tapes));
      }
    }
  }
  // fp16's run must have skipped a step, or the scaler's path was not exercised.
  EXPECT_EQ(trained_gpt(2, nn::Precision::fp16, "none", device()).parameters.back(),
            std::vector<float>{1.0f});
}

// Memory-efficient attention's blocks recomputed: the same bits as its run without
// checkpointing (which are not plain attention's: the online softmax rounds otherwise).
TEST_P(GptCheckpointing, EfficientAttentionRecomputedTrainsItsOwnBits) {
  constexpr nn::AttentionKernel kEfficient = nn::AttentionKernel::efficient;
  for (const nn::Precision precision :
       {nn::Precision::fp32, nn::Precision::bf16, nn::Precision::fp16}) {
    for (const std::int64_t layers : {1, 3}) {
      const GptRun reference = trained_gpt(layers, precision, "none", device(), kEfficient);
      EXPECT_NE(reference.parameters, trained_gpt(layers, precision, "none", device()).parameters);
      for (const std::string policy : {"every:1", "sqrt", "optimal:1"}) {
        SCOPED_TRACE(policy + ", " + std::to_string(layers) + " blocks, " +
                     nn::precision_name(precision));
        EXPECT_EQ(trained_gpt(layers, precision, policy, device(), kEfficient).parameters,
                  reference.parameters);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GptCheckpointing, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

TEST(GptCheckpointingPolicies, EachModelRefusesTheOthersSelectiveRecomputation) {
  for (const std::string policy : {"selective", "sqrt+selective"}) {
    EXPECT_THROW(GptScheduledRunner::for_policy(checkpointing::Policy::parse(policy), 4),
                 std::invalid_argument)
        << policy;
  }
  for (const std::string policy : {"attention", "sqrt+attention"}) {
    EXPECT_THROW(ScheduledRunner::for_policy(checkpointing::Policy::parse(policy), 4),
                 std::invalid_argument)
        << policy;
    EXPECT_NO_THROW(GptScheduledRunner::for_policy(checkpointing::Policy::parse(policy), 4));
  }
}

/// One training forward and backward of 16 sequences of 32 tokens (12 blocks, width 32):
/// the activations plus checkpoints at the step's peak, measured by the CPU allocator.
std::size_t gpt_activation_peak(const std::string& policy) {
  constexpr std::int64_t kLayers = 12;
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const Dataset data = make_token_dataset(
      make_sequences(synthetic_documents(16, 40, 60, /*seed=*/5), 32), "synthetic-text");
  nn::Gpt model({.vocabulary = 256, .context = 32, .layers = kLayers, .width = 32, .heads = 4},
                Device::cpu());
  if (policy != "none") {
    model.set_block_runner(
        GptScheduledRunner::for_policy(checkpointing::Policy::parse(policy), kLayers));
  }
  allocator.reset_peak();
  nn::accumulate_gradients(model, data.features, data.labels, data.size(), {true, 1, 0});
  const MemoryStats stats = allocator.stats();
  return stats.at_peak_of(MemoryCategory::activations) +
         stats.at_peak_of(MemoryCategory::checkpoints);
}

TEST(GptCheckpointingMemory, KeepingLessMeasuresLess) {
  // 12 blocks: none keeps 12 blocks' activations; sqrt keeps 4 block inputs ([b, T, C]
  // each, a small part of a block's) and one segment of 3 blocks; the binomial schedule
  // with 2 slots keeps 2 inputs and 1 block at a time.
  const std::size_t none = gpt_activation_peak("none");
  const std::size_t sqrt = gpt_activation_peak("sqrt");
  const std::size_t optimal = gpt_activation_peak("optimal:2");
  const std::size_t attention = gpt_activation_peak("attention");
  std::printf("GPT of 12 blocks, activations + checkpoints at the step's peak: none %zu, "
              "sqrt %zu, optimal:2 %zu, attention %zu bytes\n", none, sqrt, optimal, attention);
  EXPECT_LT(sqrt, none / 2);
  EXPECT_LT(optimal, sqrt);
  // attention keeps every block's activations but P: 11 blocks' P fewer at least (the
  // block in its backward holds its own again). P: 16 sequences x 4 heads x 32^2 x 4 bytes.
  EXPECT_LE(attention + 11 * 16 * 4 * 32 * 32 * 4, none);
}

}  // namespace
}  // namespace bigbatch

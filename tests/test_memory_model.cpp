// test_memory_model.cpp: nn::predict_step (nn/memory_model.hpp) and chapter 05's
// predict_policy against the tracking allocator. The claim is exact: the predicted step
// peak, its breakdown by category at that moment, every category's own peak and what is
// live after the step equal the allocator's counts to the byte, for every checkpoint
// policy, both precisions, both norms, depths 1, 2, 7, 16, 33 and 64, with uneven
// micro-batches; and the block forwards the runner counts equal the formula of each
// schedule (the binomial optimum for optimal:SLOTS). The same for chapter 08's GPT
// (nn::predict_step over nn::GptLedger): the trainer's step, every precision, dropout on
// and off, uneven micro-batches of sequences, and its whole-block policies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"
#include "tests/harness.hpp"
#include "tests/labelled_batch.hpp"
#include "tests/measure_step.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using checkpointing::ScheduledRunner;
using testing::MlpStep;
using testing::Measured;
using testing::measure;

const std::vector<std::string> kPolicies = {
    "none",      "every:1",   "every:3",   "sqrt",           "optimal:1",
    "optimal:2", "optimal:3", "selective", "sqrt+selective", "optimal:2+selective"};

constexpr std::int64_t kBatch = 10, kMicroBatch = 4;  // micro-batches of 4, 4 and 2 rows
constexpr std::int64_t kMicroBatches = 3;

/// The advances (recomputed block forwards) of a policy per micro-batch, by its formula:
/// every:K replays every block outside the last segment once (schedule.hpp), sqrt is
/// every:ceil(sqrt(n)), optimal:S the binomial optimum, none and selective none.
std::int64_t expected_advances(const std::string& policy, std::int64_t n) {
  const std::string base = policy.substr(0, policy.find('+'));
  const auto segments_of = [n](std::int64_t k) { return k * ((n + k - 1) / k - 1); };
  if (base.rfind("every:", 0) == 0) return segments_of(std::stoll(base.substr(6)));
  if (base == "sqrt") {
    return segments_of(static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(n)))));
  }
  if (base.rfind("optimal:", 0) == 0) {
    const std::int64_t slots = std::stoll(base.substr(8));
    return checkpointing::binomial_advances(n, std::min(slots, n));
  }
  return 0;  // none, selective
}

/// Every figure the allocator keeps on the device, predicted to the byte (the allocation
/// count aside: the batch's tensors are made differently here). host_data, the batch the
/// step copies its micro-batches from, is the host's and outside the prediction.
void expect_equal_books(const MemoryStats& want, const MemoryStats& got, const std::string& what) {
  EXPECT_EQ(want.peak_total, got.peak_total) << what;
  EXPECT_EQ(want.live_total, got.live_total) << what;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    if (!counts_on_device(static_cast<MemoryCategory>(c))) continue;
    const std::string name(category_name(static_cast<MemoryCategory>(c)));
    EXPECT_EQ(want.at_peak[c], got.at_peak[c]) << what << ", " << name << " at the peak";
    EXPECT_EQ(want.peak[c], got.peak[c]) << what << ", " << name << "'s own peak";
    EXPECT_EQ(want.live[c], got.live[c]) << what << ", " << name << " live after";
  }
}

class MemoryModel : public testing::DeviceTest {};

TEST_P(MemoryModel, EveryPolicyPrecisionAndDepthIsPredictedToTheByte) {
  for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::fp16}) {
    for (const std::int64_t depth : {1, 2, 7, 16, 33, 64}) {
      for (const std::string& text : kPolicies) {
        const checkpointing::Policy policy = checkpointing::Policy::parse(text);
        MlpStep step{testing::tiny_model(depth, 0.25f), kBatch, kMicroBatch, AdamWOptions{}};
        step.model.precision = precision;
        const std::string what = nn::precision_name(precision) + ", depth " +
                                 std::to_string(depth) + ", " + text;
        const nn::StepPrediction predicted = checkpointing::predict_policy(step.shape(), policy);
        const Measured measured = measure(step, policy, false, device());
        expect_equal_books(predicted.stats, measured.stats, what);
        const std::int64_t advances = expected_advances(text, depth);
        EXPECT_EQ(predicted.block_forwards, kMicroBatches * (depth + advances)) << what;
        if (policy.needs_runner()) {
          EXPECT_EQ(measured.evaluations, predicted.block_forwards) << what;
          EXPECT_EQ(measured.recomputations, kMicroBatches * advances) << what;
        }
      }
    }
  }
}

TEST_P(MemoryModel, BatchNormAndTheRunnerForNoneArePredictedToTheByte) {
  for (const std::int64_t depth : {1, 7, 16}) {
    for (const std::string text : {"none", "sqrt", "optimal:2+selective"}) {
      const checkpointing::Policy policy = checkpointing::Policy::parse(text);
      MlpStep step{testing::tiny_model(depth, 0.25f), kBatch, kMicroBatch, SgdOptions{}};
      step.model.norm = nn::Norm::batch;
      const std::string what = "BatchNorm, SGD, depth " + std::to_string(depth) + ", " + text;
      expect_equal_books(checkpointing::predict_policy(step.shape(), policy).stats,
                         measure(step, policy, false, device()).stats, what);
    }
    // store_all executed by the runner allocates as the model's own loop does.
    const MlpStep step{testing::tiny_model(depth, 0.0f), kBatch, kMicroBatch, AdamWOptions{}};
    expect_equal_books(checkpointing::predict_policy(step.shape(), {}).stats,
                       measure(step, {}, true, device()).stats, "the runner's none");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MemoryModel, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);
// ---- the GPT -------------------------------------------------------------------------------

/// The step's peak, its breakdown at that moment and every category's own peak: the
/// trainer's record of a step holds these (what is live after it is the trainer's).
void expect_equal_peaks(const MemoryStats& want, const MemoryStats& got, const std::string& what) {
  EXPECT_EQ(want.peak_total, got.peak_total) << what;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    if (!counts_on_device(static_cast<MemoryCategory>(c))) continue;
    const std::string name(category_name(static_cast<MemoryCategory>(c)));
    EXPECT_EQ(want.at_peak[c], got.at_peak[c]) << what << ", " << name << " at the peak";
    EXPECT_EQ(want.peak[c], got.peak[c]) << what << ", " << name << "'s own peak";
  }
}

class GptMemoryModel : public testing::DeviceTest {};

TEST_P(GptMemoryModel, EveryPrecisionPolicyAndDepthIsPredictedToTheByte) {
  for (const nn::Precision precision :
       {nn::Precision::fp32, nn::Precision::bf16, nn::Precision::fp16}) {
    for (const float dropout : {0.0f, 0.1f}) {
      for (const std::int64_t layers : {0, 1, 3, 6}) {
        for (const std::string policy : {"none", "every:2", "sqrt", "optimal:1", "optimal:2",
                                         "attention", "sqrt+attention", "optimal:1+attention",
                                         "efficient", "every:2 efficient",
                                         "optimal:1 efficient"}) {
          if (layers == 0 && policy != "none") continue;
          // "POLICY efficient": memory-efficient attention, checkpointed by POLICY.
          const std::size_t space = policy.find(' ');
          const bool efficient = policy.ends_with("efficient");
          const std::string checkpoint =
              policy == "efficient" ? "none" : policy.substr(0, space);
          const nn::GptConfig config{
              .vocabulary = 256, .context = 12, .layers = layers, .width = 16, .heads = 2,
              .dropout = dropout, .seed = 2, .precision = precision,
              .attention = efficient ? nn::AttentionKernel::efficient : nn::AttentionKernel::plain};
          train::TrainConfig train;
          if (precision == nn::Precision::fp16) train.loss_scaling = train::LossScaling::dynamic;
          const std::string what = nn::precision_name(precision) + ", dropout " +
                                   std::to_string(dropout) + ", " + std::to_string(layers) +
                                   " blocks, " + policy;
          const checkpointing::Policy parsed = checkpointing::Policy::parse(checkpoint);
          std::unique_ptr<nn::BlockLedgerRunner> ledger;
          if (parsed.needs_runner()) {
            ledger = checkpointing::GptScheduledRunner::for_policy(parsed, layers)->ledger();
          }
          // Batches of 10 sequences in micro-batches of 4, 4 and 2; fp16 with the scaler
          // keeps the boundary's 12 bytes.
          const nn::StepPrediction predicted = nn::predict_step(
              nn::GptLedger(config, config.context), 10, 4, AdamWOptions{}, ledger.get(),
              loss_scaling::boundary_workspace_bytes(train::boundary_options(train)));
          const testing::Measured measured = testing::measure_gpt(
              {config, 10, 4, config.context, AdamWOptions{},
               loss_scaling::boundary_workspace_bytes(train::boundary_options(train))},
              parsed, device());
          expect_equal_peaks(predicted.stats, measured.stats, what);
          if (ledger) {
            EXPECT_EQ(measured.evaluations, predicted.block_forwards) << what;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GptMemoryModel, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

TEST(GptMemoryModel, NamesTheMomentThatHoldsThePeak) {
  // Without checkpointing a step of one micro-batch peaks in the last block's backward:
  // every block's activations, the logits and their gradient are still held when the
  // attention's backward adds its row sums to the gradients of q, k, v, the heads' output
  // and ln_2's input.
  const nn::GptConfig config{.vocabulary = 256, .context = 64, .layers = 4, .width = 32,
                             .heads = 4};
  const nn::StepPrediction p = nn::predict_step(nn::GptLedger(config, 64), 8, 8, AdamWOptions{});
  EXPECT_EQ(p.peak_moment, "micro-batch 1, block 3 backward: the attention's row sums (f32)");
  EXPECT_EQ(p.block_forwards, 4);
  EXPECT_THROW(nn::GptLedger(config, 65), std::invalid_argument);
}

// ZeRO stage 2 releases a model's gradients group by group as its backward tells them
// (nn::Network::releases_state); the GPT's backward tells none, so a step that holds only
// a shard of its gradients cannot be replayed, and is refused rather than counted without
// the groups' bytes.
TEST(GptMemoryModel, AStepHoldingAPartOfTheGradientsIsRefused) {
  const nn::GptConfig config{.vocabulary = 64, .context = 8, .layers = 2, .width = 16,
                             .heads = 2};
  nn::GptLedger model(config, 8);
  EXPECT_FALSE(model.releases_state());
  EXPECT_THROW(nn::predict_step(model, 4, 2, AdamWOptions{}, nullptr, 0, {.gradients = 100}),
               std::invalid_argument);
  EXPECT_GT(nn::predict_step(model, 4, 2, AdamWOptions{}, nullptr, 0, {.optimizer_state = 100})
                .peak(),
            0u);
}

TEST(MemoryModel, ParameterBytesAreTheBuiltModelsAndSaturatePast64Bits) {
  // The floor the program holds against the device before it replays a step: the bytes of
  // MemoryCategory::parameters a built model allocates, to the byte, for each norm and
  // precision; SIZE_MAX for a model too large to count (it is refused, never wrapped).
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const auto parameters_live = [&] { return allocator.stats().live_of(MemoryCategory::parameters); };
  for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::fp16}) {
    for (const nn::Norm norm : {nn::Norm::layer, nn::Norm::batch}) {
      for (const std::int64_t depth : {0, 3}) {
        nn::ModelConfig config = testing::tiny_model(depth, 0.0f);
        config.precision = precision;
        config.norm = norm;
        const std::size_t before = parameters_live();
        const nn::Model model(config, Device::cpu());
        EXPECT_EQ(parameters_live() - before, nn::parameter_bytes(config))
            << nn::precision_name(precision) << ", depth " << depth
            << (norm == nn::Norm::batch ? ", BatchNorm" : ", LayerNorm");
      }
    }
    for (const std::int64_t layers : {0, 2}) {
      const nn::GptConfig config{.vocabulary = 256, .context = 12, .layers = layers, .width = 16,
                                 .heads = 2, .precision = precision};
      const std::size_t before = parameters_live();
      const nn::Gpt model(config, Device::cpu());
      EXPECT_EQ(parameters_live() - before, nn::parameter_bytes(config))
          << "GPT, " << nn::precision_name(precision) << ", " << layers << " blocks";
    }
  }
  nn::ModelConfig wide = testing::tiny_model(2, 0.0f);
  wide.hidden = std::int64_t{1} << 40;  // 2 e h^2 = 2^83 elements per block
  EXPECT_EQ(nn::parameter_bytes(wide), std::numeric_limits<std::size_t>::max());
  const nn::GptConfig long_context{.vocabulary = 256, .context = std::int64_t{1} << 61,
                                   .layers = 1, .width = 16, .heads = 2};  // wpe: 2^65 f32
  EXPECT_EQ(nn::parameter_bytes(long_context), std::numeric_limits<std::size_t>::max());
}

TEST(MemoryModel, ListsTheTrainableTensorsTheModelHas) {
  for (const std::int64_t depth : {0, 1, 3}) {
    nn::ModelConfig config = testing::tiny_model(depth, 0.0f);
    config.expansion = 3;  // fc1 and fc2 of other shapes than H x H
    const nn::Model model(config, Device::cpu());
    std::vector<std::int64_t> sizes;
    for (const nn::NamedParameter& p : model.parameters()) sizes.push_back(p.value.numel());
    std::vector<std::int64_t> predicted = nn::ModelLedger(config).trainable_sizes();
    std::sort(sizes.begin(), sizes.end());
    std::sort(predicted.begin(), predicted.end());
    EXPECT_EQ(predicted, sizes) << "depth " << depth;
  }
}

// The GPT's lists, which ZeRO would shard tensor by tensor: one count per parameter of the
// built model, and the masters' those of the 16-bit working copies.
TEST(GptMemoryModel, ListsTheTrainableTensorsTheModelHas) {
  for (const std::int64_t layers : {0, 1, 3}) {
    const nn::GptConfig config{.vocabulary = 40, .context = 12, .layers = layers, .width = 16,
                               .heads = 2, .precision = nn::Precision::bf16};
    const nn::Gpt model(config, Device::cpu());
    std::vector<std::int64_t> sizes, halves;
    for (const nn::NamedParameter& p : model.parameters()) {
      sizes.push_back(p.value.numel());
      if (p.half.defined()) halves.push_back(p.half.numel());
    }
    const nn::GptLedger ledger(config, 12);
    std::vector<std::int64_t> predicted = ledger.trainable_sizes();
    std::vector<std::int64_t> masters = ledger.master_weight_sizes();
    for (std::vector<std::int64_t>* list : {&sizes, &halves, &predicted, &masters}) {
      std::sort(list->begin(), list->end());
    }
    EXPECT_EQ(predicted, sizes) << layers << " blocks";
    EXPECT_EQ(masters, halves) << layers << " blocks";
  }
}

// What a block can keep: the MLP's all or its GEMM outputs (selective recomputation); a
// transformer block all, or all but its attention's probabilities where plain attention
// keeps them. budget:BYTES weighs only these.
TEST(GptMemoryModel, EachModelKeepsWhatItsBlocksCan) {
  const nn::ModelLedger mlp(testing::tiny_model(2, 0.0f));
  EXPECT_TRUE(mlp.keeps(nn::BlockKeep::all));
  EXPECT_TRUE(mlp.keeps(nn::BlockKeep::gemm_outputs));
  EXPECT_FALSE(mlp.keeps(nn::BlockKeep::all_but_probabilities));
  nn::GptConfig config{.vocabulary = 40, .context = 12, .layers = 2, .width = 16, .heads = 2};
  for (const nn::AttentionKernel kernel :
       {nn::AttentionKernel::plain, nn::AttentionKernel::efficient}) {
    config.attention = kernel;
    const nn::GptLedger gpt(config, 12);
    EXPECT_TRUE(gpt.keeps(nn::BlockKeep::all));
    EXPECT_FALSE(gpt.keeps(nn::BlockKeep::gemm_outputs));
    EXPECT_EQ(gpt.keeps(nn::BlockKeep::all_but_probabilities),
              kernel == nn::AttentionKernel::plain);
  }
}

TEST(MemoryModel, AnOptimizerOverPartOfTheParametersHoldsThatPartsState) {
  const nn::ModelConfig config = testing::tiny_model(2, 0.0f);
  const AdamWOptions adamw;
  nn::ModelLedger model(config);
  const nn::StepPrediction all = nn::predict_step(model, 20, 8, adamw);
  const nn::StepPrediction part =
      nn::predict_step(model, 20, 8, adamw, nullptr, 0, {.optimizer_state = 100});
  const auto state = static_cast<std::size_t>(MemoryCategory::optimizer_state);
  EXPECT_EQ(part.stats.live[state], 800u) << "AdamW: 8 bytes per element";
  EXPECT_EQ(all.stats.peak_total - part.stats.peak_total, all.stats.live[state] - 800u);
  EXPECT_THROW(nn::predict_step(model, 20, 8, adamw, nullptr, 0, {.optimizer_state = 1 << 30}),
               std::invalid_argument);
}

// A part of the f32 masters (chapter 07's ZeRO under mixed precision): 4 bytes an element
// held, the rest gone from the peak; fp32 has no masters, whatever is asked.
TEST(MemoryModel, APartOfTheMastersHoldsThatPartsBytes) {
  nn::ModelConfig config = testing::tiny_model(2, 0.0f);
  config.precision = nn::Precision::bf16;
  const AdamWOptions adamw;
  const auto masters = static_cast<std::size_t>(MemoryCategory::master_weights);
  const nn::StepPrediction all = nn::predict_step(nn::ModelLedger(config), 20, 8, adamw);
  const nn::StepPrediction part = nn::predict_step(nn::ModelLedger(config), 20, 8, adamw,
                                                   nullptr, 0, {.master_weights = 100});
  EXPECT_EQ(part.stats.live[masters], 400u);
  EXPECT_GT(all.stats.live[masters], 400u);
  EXPECT_EQ(all.stats.peak_total - part.stats.peak_total, all.stats.live[masters] - 400u);
  std::int64_t weights = 0;
  for (const std::int64_t n : nn::ModelLedger(config).master_weight_sizes()) weights += n;
  EXPECT_EQ(all.stats.live[masters], 4 * static_cast<std::size_t>(weights));
  EXPECT_THROW(nn::predict_step(nn::ModelLedger(config), 20, 8, adamw, nullptr, 0,
                                {.master_weights = weights + 1}),
               std::invalid_argument);
  config.precision = nn::Precision::fp32;
  EXPECT_EQ(nn::predict_step(nn::ModelLedger(config), 20, 8, adamw, nullptr, 0,
                             {.master_weights = 100})
                .stats.live[masters],
            0u);
}

TEST(MemoryModel, NamesTheMomentThatHoldsThePeak) {
  // Without checkpointing the step peaks in the backward pass of the last block, when its
  // input gradient is allocated: every activation of the forward pass is still held but
  // the head's, and the workspace holds the gradients of the block's output, of fc2's and
  // fc1's inputs, and the one being made.
  MlpStep step{testing::tiny_model(4, 0.0f), 8, 8, AdamWOptions{}};
  EXPECT_EQ(checkpointing::predict_policy(step.shape(), {}).peak_moment,
            "micro-batch 1, block 3 backward: the block's input gradient");
  // With one checkpoint slot, every block but the first is reached again from h0 only:
  // the peak comes while block 3 is taped again for its backward.
  const std::string optimal = checkpointing::predict_policy(step.shape(), checkpointing::Policy::parse("optimal:1")).peak_moment;
  EXPECT_NE(optimal.find("backward"), std::string::npos) << optimal;
}

TEST(MemoryModel, TheBudgetPolicyPicksTheCheapestThatFits) {
  MlpStep step{testing::tiny_model(16, 0.0f), 64, 64, AdamWOptions{}};
  const std::size_t none = checkpointing::predict_policy(step.shape(), {}).peak();
  // Room for everything: no recomputation at all.
  EXPECT_EQ(checkpointing::choose_for_budget(step.shape(), none).policy.text(), "none");
  // Tighter budgets: something must be recomputed. The choice fits, and no policy that
  // fits costs less (brute force over every candidate the header lists).
  std::vector<std::string> candidates = {"none", "selective"};
  for (const std::string family : {"every:", "optimal:"}) {
    for (int k = 1; k <= 16; ++k) {
      candidates.push_back(family + std::to_string(k));
      candidates.push_back(family + std::to_string(k) + "+selective");
    }
  }
  const std::size_t selective =
      checkpointing::predict_policy(step.shape(), checkpointing::Policy::parse("selective")).peak();
  for (const std::size_t budget : {none - 1, selective - 1}) {
    const checkpointing::BudgetChoice choice = checkpointing::choose_for_budget(step.shape(), budget);
    EXPECT_LE(choice.prediction.peak(), budget);
    EXPECT_EQ(choice.candidates, candidates.size());
    for (const std::string& text : candidates) {
      const checkpointing::Policy policy = checkpointing::Policy::parse(text);
      if (checkpointing::predict_policy(step.shape(), policy).peak() <= budget) {
        EXPECT_LE(choice.cost, checkpointing::recompute_cost(policy, 16))
            << "budget " << budget << ": " << choice.policy.text() << " chosen, " << text
            << " fits and costs less";
      }
    }
    // The measured peak of the chosen policy fits the budget too.
    EXPECT_LE(measure(step, choice.policy, false, Device::cpu()).stats.peak_total, budget);
  }
  // Below the smallest possible peak: a clear error naming it.
  try {
    checkpointing::choose_for_budget(step.shape(), 1000);
    FAIL() << "a budget of 1000 bytes fitted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the smallest predicted peak is"), std::string::npos)
        << e.what();
  }
  const auto resolved = [&](const std::string& text) {
    return checkpointing::resolve_policy(checkpointing::Policy::parse(text), step.shape()).text();
  };
  EXPECT_EQ(resolved("sqrt"), "sqrt");
  EXPECT_EQ(resolved("budget:" + std::to_string(none)), "none");
  EXPECT_EQ(resolved("budget:" + std::to_string(none - 1)),
            checkpointing::choose_for_budget(step.shape(), none - 1).policy.text());
}

}  // namespace
}  // namespace bigbatch

// test_documented_rules.cpp: rules the headers of chapters 05-06 and nn/ state in words,
// each checked against a computation of its own:
//   - optimal()'s split: ties go to the largest i (schedule.hpp), against a brute-force
//     minimum over binomial_advances' closed form;
//   - recompute_cost: a policy's advances plus kSelectiveCost per block with selective
//     recomputation, at every depth, against simulate() of the policy's schedule;
//   - budget:BYTES when nothing fits names the smallest peak of every candidate and its
//     policy (memory_plan.hpp), against predict_policy over the candidates;
//   - the cost model's key tells apart every model field that changes a step's time, and
//     no other (planner.hpp); its line fit clamps the slope and the intercept at 0;
//   - evaluate() runs BatchNorm on its running statistics (sample_stream.hpp): every
//     sample's prediction is its own, whatever the evaluation batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/format.hpp"
#include "nn/memory_model.hpp"
#include "nn/sample_stream.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using checkpointing::Op;
using checkpointing::Policy;
using checkpointing::ScheduleKind;

TEST(DocumentedRules, TheBinomialSplitTakesTheLargestOfTiedMinima) {
  int ties = 0;
  for (std::int64_t n = 2; n <= 40; ++n) {
    for (std::int64_t s = 2; s <= 5; ++s) {
      // reverse(0, n, s) splits at m = i minimising i + p(n - i, s - 1) + p(i, s).
      std::int64_t best = 0, best_cost = std::numeric_limits<std::int64_t>::max(), count = 0;
      for (std::int64_t i = 1; i < n; ++i) {
        const std::int64_t cost = i + checkpointing::binomial_advances(n - i, s - 1) +
                                  checkpointing::binomial_advances(i, s);
        if (cost < best_cost) {
          best_cost = cost;
          count = 0;
        }
        if (cost == best_cost) {
          best = i;  // the largest of the minima so far
          ++count;
        }
      }
      ties += count > 1 ? 1 : 0;
      // The schedule's second store (after h_0's) holds h_m.
      const checkpointing::Schedule schedule = checkpointing::optimal(n, s);
      std::int64_t stores = 0, split = -1;
      for (const checkpointing::Action& a : schedule.actions) {
        if (a.op == Op::store && ++stores == 2) {
          split = a.block;
          break;
        }
      }
      EXPECT_EQ(split, best) << "depth " << n << ", slots " << s;
    }
  }
  EXPECT_GT(ties, 0) << "no tie in the grid: the rule would go untested";
}

TEST(DocumentedRules, RecomputeCostIsTheAdvancesPlusSelectivesCostPerBlockAtEveryDepth) {
  for (std::int64_t depth = 1; depth <= 48; ++depth) {
    for (const Policy& policy : checkpointing::checkpoint_candidates(depth)) {
      const std::int64_t advances =
          policy.needs_runner() && policy.schedule != ScheduleKind::none
              ? checkpointing::simulate(policy.schedule_for(depth)).advances
              : 0;
      const double selective =
          policy.keep == nn::BlockKeep::gemm_outputs ? 0.15 * static_cast<double>(depth) : 0.0;
      EXPECT_DOUBLE_EQ(checkpointing::recompute_cost(policy, depth),
                       static_cast<double>(advances) + selective)
          << policy.text() << " at depth " << depth;
    }
  }
}

TEST(DocumentedRules, ANoFitBudgetNamesTheSmallestPeakOfAllCandidatesAndItsPolicy) {
  for (const std::int64_t depth : {3, 8}) {
    const checkpointing::StepShape step{
        std::make_shared<nn::ModelLedger>(testing::tiny_model(depth, 0.1f)), 64, 24,
        AdamWOptions{}};
    std::size_t smallest = std::numeric_limits<std::size_t>::max();
    std::string policy;
    for (const Policy& p : checkpointing::checkpoint_candidates(depth)) {
      const std::size_t peak = checkpointing::predict_policy(step, p).peak();
      if (peak < smallest) {  // the first of the smallest, in the list's order
        smallest = peak;
        policy = p.text();
      }
    }
    try {
      checkpointing::choose_for_budget(step, smallest - 1);
      FAIL() << "a budget below every candidate's peak fitted";
    } catch (const std::invalid_argument& e) {
      const std::string expected = "the smallest predicted peak is " + format_bytes(smallest) +
                                   " (" + std::to_string(smallest) + " bytes, " + policy + ")";
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << e.what() << "\nexpected: " << expected;
    }
    EXPECT_EQ(checkpointing::choose_for_budget(step, smallest).prediction.peak(), smallest);
  }
}

TEST(DocumentedRules, TheCostKeyTellsApartEveryFieldThatChangesAStepsTime) {
  const nn::ModelConfig base = testing::tiny_model(2, 0.0f);
  const std::string key = planning::cost_key(planning::MlpPlanned(base), AdamWOptions{}, Device::cpu());
  std::vector<nn::ModelConfig> other(8, base);
  other[0].inputs += 1;
  other[1].classes += 1;
  other[2].hidden += 8;  // another width must not reuse this calibration
  other[3].expansion += 1;
  other[4].depth += 1;
  other[5].norm = nn::Norm::batch;
  other[6].activation = nn::Activation::relu;
  other[7].dropout = 0.1f;
  for (std::size_t i = 0; i < other.size(); ++i) {
    EXPECT_NE(planning::cost_key(planning::MlpPlanned(other[i]), AdamWOptions{}, Device::cpu()), key) << "field " << i;
  }
  EXPECT_NE(planning::cost_key(planning::MlpPlanned(base), SgdOptions{}, Device::cpu()), key);
  // SGD's step reads and writes the momentum buffer only when there is one.
  EXPECT_NE(planning::cost_key(planning::MlpPlanned(base), SgdOptions{.momentum = 0.9}, Device::cpu()),
            planning::cost_key(planning::MlpPlanned(base), SgdOptions{}, Device::cpu()));
  // The seed and the precision do not: one calibration measures both precisions.
  nn::ModelConfig same = base;
  same.seed += 1;
  same.precision = nn::Precision::fp16;
  EXPECT_EQ(planning::cost_key(planning::MlpPlanned(same), AdamWOptions{}, Device::cpu()), key);
}

TEST(DocumentedRules, TheLineFitClampsItsSlopeAndInterceptAtZero) {
  // Through (16, 2 + 16 * 3) and (128, 2 + 128 * 3): fixed 2, per row 3, exactly.
  const planning::LinearCost line = planning::fit_line(16, 50.0, 128, 386.0);
  EXPECT_DOUBLE_EQ(line.fixed, 2.0);
  EXPECT_DOUBLE_EQ(line.per_row, 3.0);
  // A falling line (noise on a flat cost): no slope, the first point's time.
  const planning::LinearCost flat = planning::fit_line(16, 5.0, 128, 4.0);
  EXPECT_EQ(flat.per_row, 0.0);
  EXPECT_EQ(flat.fixed, 5.0);
  // A line through a negative intercept: the slope kept, the intercept 0.
  const planning::LinearCost steep = planning::fit_line(16, 10.0, 128, 122.0);
  EXPECT_DOUBLE_EQ(steep.per_row, 1.0);
  EXPECT_EQ(steep.fixed, 0.0);
  // One point: a constant.
  const planning::LinearCost one = planning::fit_line(16, 7.0, 16, 9.0);
  EXPECT_EQ(one.per_row, 0.0);
  EXPECT_EQ(one.fixed, 7.0);
}

TEST(DocumentedRules, EvaluationRunsBatchNormOnItsRunningStatistics) {
  // A BatchNorm model trained a few steps (its running statistics are no longer 0 and 1),
  // evaluated one sample at a time and in one batch: with the running statistics every
  // sample's logits are its own, so the counts agree exactly. (With the batch's own
  // statistics, a batch of one sample normalises to the bias: every prediction the same.)
  const Dataset data = testing::tiny_data(100);
  nn::ModelConfig config = testing::tiny_model(2, 0.0f);
  config.norm = nn::Norm::batch;
  nn::Model model(config, Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
  train::TrainConfig run;
  run.batch = 20;
  run.steps = 10;
  train::Trainer trainer(model, optimizer, data, run);
  trainer.run();
  const nn::EvaluationResult one_at_a_time = nn::evaluate(model, data, 1);
  const nn::EvaluationResult whole = nn::evaluate(model, data, 100);
  EXPECT_EQ(one_at_a_time.correct, whole.correct);
  // The mean loss groups the same 100 per-sample losses differently: the cross-entropy
  // kernel returns each batch's loss as a float, so each grouping rounds the sum of its
  // terms to float (2^-24 relative per rounding); over at most 100 roundings the means
  // differ by under 100 x 2^-24 = 6e-6 relative, which 1e-5 bounds. (Batch statistics
  // would move the loss by far more: every single-sample batch predicts the same class.)
  EXPECT_NEAR(one_at_a_time.loss, whole.loss, 1e-5 * whole.loss);
  EXPECT_GT(whole.correct, 20) << "the model must have learned something for this to say much";
}

}  // namespace
}  // namespace bigbatch

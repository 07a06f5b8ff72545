// test_planner.cpp: chapter 06's planner (chapters/06_planner/planner.hpp). For a grid of
// models and budgets the chosen plan's peak, measured by the allocator, equals its
// prediction and fits the budget, and no (micro-batch, precision, policy) that fits is
// predicted faster (brute force over every triple); when nothing fits, the smallest peak
// reported is the smallest of every triple. The cost model here is fixed numbers, so the
// choices do not depend on this machine's timing; the calibration file is tested apart.
// The same for chapter 08's GPT, whose plans keep whole blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <filesystem>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/06_planner/planner.hpp"
#include "common/json.hpp"
#include "tests/measure_step.hpp"
#include "tests/temp_files.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using planning::CostModel;
using planning::Plan;
using planning::PrecisionCost;
using planning::PlanRequest;

/// Fixed costs that make every trade visible: a micro-batch's fixed cost, the rows' cost,
/// a forward at about a third of a micro-batch step, fp16 a little faster per row, bf16
/// between the two.
CostModel fixed_cost_model() {
  CostModel cost;
  cost.key = "test";
  cost.fp32 = {{2e-3, 1e-4}, {0.7e-3, 0.35e-4}, 5e-3, {0.1e-3, 0.1e-4}};
  cost.fp16 = {{2.5e-3, 0.6e-4}, {0.9e-3, 0.2e-4}, 6e-3, {0.15e-3, 0.05e-4}};
  cost.bf16 = {{2.4e-3, 0.8e-4}, {0.8e-3, 0.3e-4}, 5.5e-3, {0.12e-3, 0.07e-4}};
  return cost;
}

TEST(Planner, MicroBatchCandidatesHalveDownToOne) {
  const nn::ModelConfig model = testing::tiny_model(2, 0.0f);
  const std::vector<std::int64_t> halves = {1000, 500, 250, 125, 63, 32, 16, 8, 4, 2, 1};
  EXPECT_EQ(planning::micro_batch_candidates(1000), halves);
  EXPECT_EQ(planning::micro_batch_candidates(1), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(planning::MlpPlanned(model).micro_batches(1000), halves);
  nn::ModelConfig batch_norm = model;
  batch_norm.norm = nn::Norm::batch;  // smaller micro-batches change the update (chapter 02)
  EXPECT_EQ(planning::MlpPlanned(batch_norm).micro_batches(1000),
            (std::vector<std::int64_t>{1000}));
  const nn::GptConfig gpt{.vocabulary = 64, .context = 8, .layers = 1, .width = 16, .heads = 2};
  EXPECT_EQ(planning::GptPlanned(gpt, 8).micro_batches(1000), halves);
}

TEST(Planner, StepTimeFollowsTheFormula) {
  const CostModel cost = fixed_cost_model();
  // B = 100 in micro-batches of 30: n = 4; R = 6 block forwards per micro-batch at depth 3.
  const double expected = 5e-3 + 4 * 2e-3 + 100 * 1e-4 + (6.0 / 3) * (4 * 0.7e-3 + 100 * 0.35e-4);
  EXPECT_DOUBLE_EQ(cost.step_seconds(100, 30, nn::Precision::fp32, 6, 3), expected);
  EXPECT_DOUBLE_EQ(cost.step_seconds(100, 100, nn::Precision::fp16, 0, 3), 6e-3 + 2.5e-3 + 100 * 0.6e-4);
  EXPECT_DOUBLE_EQ(cost.step_seconds(100, 100, nn::Precision::bf16, 0, 3), 5.5e-3 + 2.4e-3 + 100 * 0.8e-4);
  // A = 3 blocks rebuild their probabilities in each of the n = 4 micro-batches.
  EXPECT_DOUBLE_EQ(cost.step_seconds(100, 30, nn::Precision::fp32, 6, 3, 3),
                   expected + 3 * (4 * 0.1e-3 + 100 * 0.1e-4));
  // JSON and back: the same numbers.
  const CostModel back = CostModel::from_json(Json::parse(cost.to_json().dump()));
  EXPECT_EQ(back.to_json(), cost.to_json());
  EXPECT_THROW(CostModel::from_json(Json::parse(R"({"key":"x"})")), std::runtime_error);
}

struct Triple {
  std::int64_t micro;
  nn::Precision precision;
  checkpointing::Policy policy;
  std::size_t peak;
  double seconds;
};

/// The request to plan the MLP of `model`.
PlanRequest mlp_request(const nn::ModelConfig& model, std::int64_t batch, std::size_t budget,
                        std::vector<nn::Precision> precisions = {nn::Precision::fp32,
                                                                 nn::Precision::fp16,
                                                                 nn::Precision::bf16}) {
  return {{std::make_shared<planning::MlpPlanned>(model)}, batch, AdamWOptions{}, budget,
          std::move(precisions)};
}

/// The step of a plan of the MLP of `model`: fp16 trains with dynamic loss scaling, whose
/// boundary keeps its pass's 12 bytes (f32 found-inf, f64 squared norm) through every
/// step; fp32 and bf16 keep none (no clipping is asked here).
testing::MlpStep plan_step(const nn::ModelConfig& model, const PlanRequest& request,
                           nn::Precision precision, std::int64_t micro) {
  nn::ModelConfig config = model;
  config.precision = precision;
  return {config, request.batch, micro, request.optimizer,
          precision == nn::Precision::fp16 ? 12u : 0u};
}

/// Every (micro-batch, precision, policy) the planner could choose for the MLP of `model`,
/// predicted.
std::vector<Triple> every_triple(const nn::ModelConfig& model, const PlanRequest& request,
                                 const CostModel& cost) {
  std::vector<Triple> all;
  const std::int64_t depth = model.depth;
  for (const nn::Precision precision : request.precisions) {
    for (const std::int64_t micro : planning::micro_batch_candidates(request.batch)) {
      const checkpointing::StepShape step = plan_step(model, request, precision, micro).shape();
      for (const checkpointing::Policy& policy : checkpointing::checkpoint_candidates(depth)) {
        all.push_back({micro, precision, policy, checkpointing::predict_policy(step, policy).peak(),
                       cost.step_seconds(request.batch, micro, precision,
                                         checkpointing::recompute_cost(policy, depth), depth)});
      }
    }
  }
  return all;
}

TEST(Planner, TheChosenPlanFitsIsMeasuredAsPredictedAndNothingFasterFits) {
  const CostModel cost = fixed_cost_model();
  // Every precision together, and each alone: a search that misses a plan of one precision
  // can hide behind another precision's faster plan in the mix.
  using Precisions = std::vector<nn::Precision>;
  for (const Precisions& precisions :
       {Precisions{nn::Precision::fp32, nn::Precision::fp16, nn::Precision::bf16},
        Precisions{nn::Precision::fp32}, Precisions{nn::Precision::fp16},
        Precisions{nn::Precision::bf16}}) {
    for (const std::int64_t depth : {3, 8}) {
      const nn::ModelConfig model = testing::tiny_model(depth, 0.0f);
      PlanRequest request = mlp_request(model, 48, 0, precisions);
      const std::vector<Triple> all = every_triple(model, request, cost);
      std::vector<std::size_t> peaks;
      for (const Triple& t : all) peaks.push_back(t.peak);
      std::sort(peaks.begin(), peaks.end());
      // Budgets from the roomiest down to the smallest peak any plan has.
      for (const double quantile : {1.0, 0.8, 0.5, 0.2, 0.05, 0.0}) {
        const std::size_t budget = peaks[static_cast<std::size_t>(quantile * (peaks.size() - 1))];
        request.budget = budget;
        const planning::PlanResult result = planning::make_plan(request, {cost});
        const std::string where = "depth " + std::to_string(depth) + ", budget " +
                                  std::to_string(budget) + ", " +
                                  std::to_string(precisions.size()) + " precision(s) from " +
                                  nn::precision_name(precisions.front());
        ASSERT_FALSE(result.feasible.empty()) << where;
        const Plan& best = result.best();
        EXPECT_LE(best.prediction.peak(), budget) << where;
        for (const Triple& t : all) {
          if (t.peak <= budget) {
            EXPECT_GE(t.seconds, best.seconds) << where << ": " << t.micro << " "
                                               << nn::precision_name(t.precision) << " " << t.policy.text()
                                               << " fits and is predicted faster than "
                                               << planning::describe(best, request.batch);
          }
        }
        // Run the chosen plan's step: the allocator's peak is the prediction, to the byte.
        const testing::Measured measured = testing::measure(
            plan_step(model, request, best.precision, best.micro_batch), best.checkpoint, false,
            Device::cpu());
        EXPECT_EQ(measured.stats.peak_total, best.prediction.peak()) << where;
        EXPECT_LE(measured.stats.peak_total, budget) << where;
      }
      // One byte below the smallest peak: nothing fits, and the smallest is the true minimum.
      request.budget = peaks.front() - 1;
      const planning::PlanResult none = planning::make_plan(request, {cost});
      EXPECT_TRUE(none.feasible.empty());
      ASSERT_TRUE(none.smallest.has_value());
      EXPECT_EQ(none.smallest->prediction.peak(), peaks.front());
      EXPECT_EQ(none.weighed, all.size());
      EXPECT_GT(none.fixed_bytes, 0u);
      EXPECT_LE(none.fixed_bytes, peaks.front());
      EXPECT_THROW(none.best(), std::logic_error);
    }
  }
}

TEST(Planner, OnePrecisionWhenAsked) {
  const PlanRequest request =
      mlp_request(testing::tiny_model(4, 0.0f), 32, 1u << 30, {nn::Precision::fp16});
  const planning::PlanResult result = planning::make_plan(request, {fixed_cost_model()});
  ASSERT_FALSE(result.feasible.empty());
  for (const Plan& plan : result.feasible) EXPECT_EQ(plan.precision, nn::Precision::fp16);
  // Room for everything: the whole batch at once, no recomputation.
  EXPECT_EQ(result.best().micro_batch, 32);
  EXPECT_EQ(result.best().checkpoint.text(), "none");
}

TEST(Planner, TheCalibrationIsMeasuredOnceAndReused) {
  testing::TemporaryPath path("calibration.json");
  const planning::MlpPlanned model(testing::tiny_model(2, 0.0f));
  bool measured = false;
  const CostModel first =
      planning::calibration_for(path.str(), model, AdamWOptions{}, Device::cpu(), 32, false, &measured);
  EXPECT_TRUE(measured);
  for (const auto* c : {&first.fp32, &first.fp16, &first.bf16}) {
    EXPECT_GE(c->micro_batch.fixed, 0);
    EXPECT_GE(c->micro_batch.per_row, 0);
    EXPECT_GT(c->micro_batch.fixed + 32 * c->micro_batch.per_row, 0);  // a step takes time
    EXPECT_GT(c->optimizer, 0);
  }
  const CostModel again =
      planning::calibration_for(path.str(), model, AdamWOptions{}, Device::cpu(), 32, false, &measured);
  EXPECT_FALSE(measured);
  EXPECT_EQ(again.to_json(), first.to_json());
  // Another model gets its own entry; the first stays.
  planning::calibration_for(path.str(), planning::MlpPlanned(testing::tiny_model(3, 0.0f)),
                            AdamWOptions{}, Device::cpu(), 32, false, &measured);
  EXPECT_TRUE(measured);
  planning::calibration_for(path.str(), model, AdamWOptions{}, Device::cpu(), 32, false, &measured);
  EXPECT_FALSE(measured);
  planning::calibration_for(path.str(), model, AdamWOptions{}, Device::cpu(), 32, true, &measured);
  EXPECT_TRUE(measured);
  // An entry written before bf16 was a precision (no "bf16" costs) is measured again.
  Json file = Json::parse(testing::read_file(path.str()));
  const std::string key = planning::cost_key(model, AdamWOptions{}, Device::cpu());
  file[key].erase("bf16");
  testing::write_file(path.str(), file.dump());
  planning::calibration_for(path.str(), model, AdamWOptions{}, Device::cpu(), 32, false, &measured);
  EXPECT_TRUE(measured);
  EXPECT_TRUE(Json::parse(testing::read_file(path.str()))[key].contains("bf16"));
}

// ---- the GPT (chapter 08) ----------------------------------------------------------------

/// A cost model for memory-efficient attention beside fixed_cost_model()'s plain one: a
/// micro-batch 1.5x dearer (the rows' exponentials again in the backward), no probabilities
/// to rebuild. Dear enough that rebuilding P is the cheaper way to keep less where both fit,
/// so that some budget chooses each.
CostModel efficient_cost_model() {
  CostModel cost = fixed_cost_model();
  for (PrecisionCost* c : {&cost.fp32, &cost.fp16, &cost.bf16}) {
    c->micro_batch.fixed *= 1.5;
    c->micro_batch.per_row *= 1.5;
    c->probabilities = {};
  }
  return cost;
}

/// A plan the GPT's planner could choose, with its kernel.
struct GptTriple {
  Triple triple;
  nn::AttentionKernel kernel;
};

TEST(GptPlanner, TheChosenPlanFitsIsMeasuredAsPredictedAndNothingFasterFits) {
  const std::vector<CostModel> costs = {fixed_cost_model(), efficient_cost_model()};
  const nn::GptConfig model{.vocabulary = 256, .context = 16, .layers = 4, .width = 16,
                            .heads = 2, .dropout = 0.1f};
  const std::int64_t length = 16;
  const std::vector<nn::AttentionKernel> kernels = {nn::AttentionKernel::plain,
                                                    nn::AttentionKernel::efficient};
  const auto planned = [&](nn::AttentionKernel kernel) {
    nn::GptConfig config = model;
    config.attention = kernel;
    return std::make_shared<planning::GptPlanned>(config, length);
  };
  PlanRequest request{{planned(kernels[0]), planned(kernels[1])}, 12, AdamWOptions{}, 0};
  // Every plan the planner could choose: the attention kernels, the micro-batches, the
  // precisions and the policies that keep whole blocks, with plain attention each also
  // with the probabilities rebuilt (A = 4 blocks rebuild them in each micro-batch).
  std::vector<GptTriple> all;
  const auto step_of = [&](nn::AttentionKernel kernel, nn::Precision precision,
                           std::int64_t micro) {
    nn::GptConfig config = model;
    config.precision = precision;
    config.attention = kernel;
    return testing::GptStep{config, request.batch, micro, length, request.optimizer,
                            precision == nn::Precision::fp16 ? 12u : 0u};
  };
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    const nn::AttentionKernel kernel = kernels[k];
    const CostModel& cost = costs[k];
    for (const nn::Precision precision : request.precisions) {
      for (const std::int64_t micro : planning::micro_batch_candidates(12)) {
        for (checkpointing::Policy policy : checkpointing::checkpoint_candidates(4)) {
          if (policy.keep != nn::BlockKeep::all) continue;
          const double recompute = checkpointing::recompute_cost(policy, 4);
          for (const std::int64_t rebuilt : {0, 4}) {
            if (rebuilt && kernel == nn::AttentionKernel::efficient) continue;  // no P kept
            policy.keep = rebuilt ? nn::BlockKeep::all_but_probabilities : nn::BlockKeep::all;
            const std::size_t peak =
                checkpointing::predict_policy(step_of(kernel, precision, micro).shape(), policy)
                    .peak();
            all.push_back({{micro, precision, policy, peak,
                            cost.step_seconds(12, micro, precision, recompute, 4, rebuilt)},
                           kernel});
          }
        }
      }
    }
  }
  std::vector<std::size_t> peaks;
  for (const GptTriple& t : all) peaks.push_back(t.triple.peak);
  std::sort(peaks.begin(), peaks.end());
  // The brute force's price of a plan the planner chose: the formula with R and A.
  const auto priced = [&](const Plan& plan) {
    for (const GptTriple& t : all) {
      if (t.kernel == plan.attention && t.triple.micro == plan.micro_batch &&
          t.triple.precision == plan.precision && t.triple.policy == plan.checkpoint) {
        return t.triple.seconds;
      }
    }
    ADD_FAILURE() << "a plan outside the brute force: " << planning::describe(plan, 12);
    return 0.0;
  };
  const auto measured_peak = [&](const Plan& plan) {
    return testing::measure_gpt(step_of(*plan.attention, plan.precision, plan.micro_batch),
                                plan.checkpoint, Device::cpu())
        .stats.peak_total;
  };
  for (const double quantile : {1.0, 0.5, 0.2, 0.0}) {
    request.budget = peaks[static_cast<std::size_t>(quantile * (peaks.size() - 1))];
    const std::string where = "budget " + std::to_string(request.budget);
    const planning::PlanResult result = planning::make_plan(request, costs);
    ASSERT_FALSE(result.feasible.empty()) << where;
    const Plan& best = result.best();
    ASSERT_TRUE(best.attention.has_value()) << where;
    EXPECT_LE(best.prediction.peak(), request.budget) << where;
    EXPECT_NE(best.checkpoint.keep, nn::BlockKeep::gemm_outputs) << where;
    for (const GptTriple& t : all) {
      if (t.triple.peak <= request.budget) {
        EXPECT_GE(t.triple.seconds, best.seconds)
            << where << ": " << t.triple.micro << " " << nn::precision_name(t.triple.precision)
            << " " << t.triple.policy.text() << " " << nn::attention_kernel_name(t.kernel)
            << " fits and is predicted faster than " << planning::describe(best, request.batch);
      }
    }
    // The chosen plan's step through the trainer: its peak is the prediction, to the byte.
    EXPECT_EQ(measured_peak(best), best.prediction.peak()) << where;
  }
  // Each kind of plan is weighed: some budget makes a plan that rebuilds P the fastest that
  // fits, and some other budget one of memory-efficient attention; each is measured as
  // predicted.
  std::optional<Plan> rebuilding, efficient;
  for (const std::size_t budget : peaks) {
    request.budget = budget;
    const Plan best = planning::make_plan(request, costs).best();
    EXPECT_DOUBLE_EQ(best.seconds, priced(best)) << planning::describe(best, request.batch);
    if (best.checkpoint.keep == nn::BlockKeep::all_but_probabilities && !rebuilding) {
      rebuilding = best;
    }
    if (best.attention == nn::AttentionKernel::efficient && !efficient) efficient = best;
  }
  for (const std::optional<Plan>* found : {&rebuilding, &efficient}) {
    ASSERT_TRUE(found->has_value()) << "no budget chose a plan that rebuilds P, or one of "
                                       "memory-efficient attention";
    EXPECT_EQ(measured_peak(**found), (*found)->prediction.peak())
        << planning::describe(**found, request.batch);
  }
  // Memory-efficient attention alone keeps no probabilities: nothing rebuilds them.
  PlanRequest only_efficient = request;
  only_efficient.models = {planned(nn::AttentionKernel::efficient)};
  for (const std::size_t budget : peaks) {
    only_efficient.budget = budget;
    for (const Plan& plan : planning::make_plan(only_efficient, {costs[1]}).feasible) {
      EXPECT_EQ(plan.checkpoint.keep, nn::BlockKeep::all) << plan.checkpoint.text();
      EXPECT_EQ(plan.attention, nn::AttentionKernel::efficient);
    }
  }
  // A model without a cost model is refused.
  EXPECT_THROW(planning::make_plan(request, {fixed_cost_model()}), std::invalid_argument);
  request.budget = peaks.front() - 1;
  const planning::PlanResult none = planning::make_plan(request, costs);
  EXPECT_TRUE(none.feasible.empty());
  ASSERT_TRUE(none.smallest.has_value());
  EXPECT_EQ(none.smallest->prediction.peak(), peaks.front());
}

TEST(GptPlanner, TheCalibrationHasItsOwnKeyAndIsReused) {
  testing::TemporaryPath path("calibration.json");
  const nn::GptConfig model{.vocabulary = 256, .context = 16, .layers = 1, .width = 16,
                            .heads = 2};
  const planning::GptPlanned plain(model, 16);
  bool measured = false;
  const CostModel first = planning::calibration_for(path.str(), plain, AdamWOptions{},
                                                    Device::cpu(), 8, false, &measured);
  EXPECT_TRUE(measured);
  EXPECT_EQ(first.key, planning::cost_key(plain, AdamWOptions{}, Device::cpu()));
  for (const auto* c : {&first.fp32, &first.fp16, &first.bf16}) {
    EXPECT_GT(c->micro_batch.fixed + 8 * c->micro_batch.per_row, 0);  // a step takes time
    EXPECT_GT(c->optimizer, 0);
    EXPECT_GT(c->probabilities.fixed + c->probabilities.per_row, 0);  // and rebuilding P
  }
  planning::calibration_for(path.str(), plain, AdamWOptions{}, Device::cpu(), 8, false,
                            &measured);
  EXPECT_FALSE(measured);
  // Another sequence length is another step: measured apart.
  planning::calibration_for(path.str(), planning::GptPlanned(model, 8), AdamWOptions{},
                            Device::cpu(), 8, false, &measured);
  EXPECT_TRUE(measured);
  // So is memory-efficient attention: other kernels, another cost.
  nn::GptConfig efficient = model;
  efficient.attention = nn::AttentionKernel::efficient;
  const CostModel without_p =
      planning::calibration_for(path.str(), planning::GptPlanned(efficient, 16), AdamWOptions{},
                                Device::cpu(), 8, false, &measured);
  EXPECT_TRUE(measured);
  // It keeps no probabilities, so none are rebuilt: that cost is not measured.
  EXPECT_EQ(without_p.fp32.probabilities.fixed + without_p.fp32.probabilities.per_row, 0);
  // The MLP's entries and the GPT's do not meet.
  EXPECT_EQ(planning::cost_key(plain, AdamWOptions{}, Device::cpu()).rfind("gpt, ", 0), 0u);
}

}  // namespace
}  // namespace bigbatch

// memory_plan.cpp: predicting a policy's step, and the budget policy.
#include "chapters/05_activation_checkpointing/memory_plan.hpp"

#include <optional>
#include <vector>
#include <stdexcept>

#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "common/check.hpp"
#include "common/format.hpp"

namespace bigbatch::checkpointing {

nn::StepPrediction predict_policy(const StepShape& step, const Policy& policy) {
  const auto runner =
      policy.needs_runner() ? ScheduledRunner::for_policy(policy, step.model.depth) : nullptr;
  const auto ledger = runner ? runner->ledger() : nullptr;
  return nn::predict_step(step.model, step.batch, step.micro_batch, step.optimizer, ledger.get(),
                          step.boundary_bytes, step.held);
}

nn::StepPrediction predict_policy(const GptStepShape& step, const Policy& policy) {
  const auto runner = policy.needs_runner()
                          ? GptScheduledRunner::for_policy(policy, step.model.layers)
                          : nullptr;
  const auto ledger = runner ? runner->ledger() : nullptr;
  return nn::predict_gpt_step(step.model, step.batch, step.micro_batch, step.length,
                              step.optimizer, ledger.get(), step.boundary_bytes);
}

double recompute_cost(const Policy& policy, std::int64_t depth) {
  if (!policy.needs_runner()) return 0;
  BIGBATCH_CHECK(policy.keep != nn::BlockKeep::all_but_probabilities, "recompute_cost: ",
                 policy.text(), " recomputes the attention's probabilities, whose cost grows "
                 "with T and has no price in block forwards");
  const bool selective = policy.keep == nn::BlockKeep::gemm_outputs;
  return static_cast<double>(advances(policy.schedule_for(depth))) +
         (selective ? kSelectiveCost * static_cast<double>(depth) : 0.0);
}

std::vector<Policy> checkpoint_candidates(std::int64_t depth) {
  std::vector<Policy> candidates = {Policy{},
                                    Policy{.keep = nn::BlockKeep::gemm_outputs, .budget = {}}};
  for (const ScheduleKind family : {ScheduleKind::every, ScheduleKind::optimal}) {
    for (std::int64_t k = 1; k <= depth; ++k) {
      for (const nn::BlockKeep keep : {nn::BlockKeep::all, nn::BlockKeep::gemm_outputs}) {
        candidates.push_back(
            Policy{.schedule = family, .argument = k, .keep = keep, .budget = {}});
      }
    }
  }
  return candidates;
}

namespace {

std::int64_t depth_of(const StepShape& step) { return step.model.depth; }
std::int64_t depth_of(const GptStepShape& step) { return step.model.layers; }

/// The candidates a step weighs: every one for the MLP; for the GPT those that keep
/// whole blocks.
std::vector<Policy> candidates_for(const StepShape& step) {
  return checkpoint_candidates(depth_of(step));
}
std::vector<Policy> candidates_for(const GptStepShape& step) {
  std::vector<Policy> candidates = checkpoint_candidates(depth_of(step));
  std::erase_if(candidates,
                [](const Policy& policy) { return policy.keep != nn::BlockKeep::all; });
  return candidates;
}

template <class Shape>
BudgetChoice choose(const Shape& step, std::size_t budget) {
  const std::int64_t depth = depth_of(step);
  const std::vector<Policy> candidates = candidates_for(step);
  BudgetChoice best;
  bool found = false;
  std::optional<Policy> smallest_policy;
  std::size_t smallest = 0;
  for (const Policy& policy : candidates) {
    const nn::StepPrediction prediction = predict_policy(step, policy);
    if (!smallest_policy || prediction.peak() < smallest) {
      smallest = prediction.peak();
      smallest_policy = policy;
    }
    if (prediction.peak() > budget) continue;
    const double cost = recompute_cost(policy, depth);
    if (!found || cost < best.cost ||
        (cost == best.cost && prediction.peak() < best.prediction.peak())) {
      best = {policy, prediction, cost, 0};
      found = true;
    }
  }
  if (!found) {
    throw std::invalid_argument(
        "budget:" + std::to_string(budget) + ": no checkpoint policy fits the step in " +
        format_bytes(budget) + "; the smallest predicted peak is " + format_bytes(smallest) +
        " (" + std::to_string(smallest) + " bytes, " + smallest_policy->text() +
        "); parameters, gradients, optimizer state and the micro-batch's samples cannot be "
        "checkpointed: "
        "try a smaller --micro-batch or --precision fp16");
  }
  best.candidates = candidates.size();
  return best;
}

}  // namespace

BudgetChoice choose_for_budget(const StepShape& step, std::size_t budget) {
  return choose(step, budget);
}

BudgetChoice choose_for_budget(const GptStepShape& step, std::size_t budget) {
  return choose(step, budget);
}

Policy resolve_policy(const Policy& policy, const StepShape& step) {
  return policy.is_budget() ? choose_for_budget(step, *policy.budget).policy : policy;
}

Policy resolve_policy(const Policy& policy, const GptStepShape& step) {
  return policy.is_budget() ? choose_for_budget(step, *policy.budget).policy : policy;
}

}  // namespace bigbatch::checkpointing

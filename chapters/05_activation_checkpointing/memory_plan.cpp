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
  BIGBATCH_CHECK(step.model != nullptr, "predict_policy: the step has no model");
  const auto ledger =
      policy.needs_runner() ? ledger_for_policy(policy, step.model->depth()) : nullptr;
  return nn::predict_step(*step.model, step.batch, step.micro_batch, step.optimizer,
                          ledger.get(), step.boundary_bytes, step.held);
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

BudgetChoice choose_for_budget(const StepShape& step, std::size_t budget) {
  BIGBATCH_CHECK(step.model != nullptr, "choose_for_budget: the step has no model");
  const std::int64_t depth = step.model->depth();
  // The candidates the model's blocks can keep: every one for the MLP; for the GPT those
  // that keep whole blocks.
  std::vector<Policy> candidates = checkpoint_candidates(depth);
  std::erase_if(candidates,
                [&](const Policy& policy) { return !step.model->keeps(policy.keep); });
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

Policy resolve_policy(const Policy& policy, const StepShape& step) {
  return policy.is_budget() ? choose_for_budget(step, *policy.budget).policy : policy;
}

}  // namespace bigbatch::checkpointing

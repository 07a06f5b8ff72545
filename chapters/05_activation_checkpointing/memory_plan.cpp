// memory_plan.cpp: predicting a policy's step, and the budget policy.
#include "chapters/05_activation_checkpointing/memory_plan.hpp"

#include <stdexcept>

#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "common/format.hpp"

namespace bigbatch::checkpointing {
namespace {

const std::string kSelectiveSuffix = "+selective";

}  // namespace

nn::StepPrediction predict_policy(const StepShape& step, const std::string& policy) {
  if (policy == "none") {
    return nn::predict_step(step.model, step.batch, step.micro_batch, step.optimizer);
  }
  const auto runner = ScheduledRunner::for_policy(policy, step.model.depth);
  const auto ledger = runner->ledger();
  return nn::predict_step(step.model, step.batch, step.micro_batch, step.optimizer, ledger.get());
}

double recompute_cost(const std::string& policy, std::int64_t depth) {
  if (policy == "none") return 0;
  const auto runner = ScheduledRunner::for_policy(policy, depth);
  const bool selective = runner->keep() == nn::BlockKeep::gemm_outputs;
  return static_cast<double>(advances(runner->schedule())) +
         (selective ? kSelectiveCost * static_cast<double>(depth) : 0.0);
}

std::vector<std::string> checkpoint_candidates(std::int64_t depth) {
  std::vector<std::string> candidates = {"none", "selective"};
  for (const char* family : {"every:", "optimal:"}) {
    for (std::int64_t k = 1; k <= depth; ++k) {
      candidates.push_back(family + std::to_string(k));
      candidates.push_back(family + std::to_string(k) + kSelectiveSuffix);
    }
  }
  return candidates;
}

BudgetChoice choose_for_budget(const StepShape& step, std::size_t budget) {
  const std::int64_t depth = step.model.depth;
  const std::vector<std::string> candidates = checkpoint_candidates(depth);
  BudgetChoice best;
  bool found = false;
  std::string smallest_policy;
  std::size_t smallest = 0;
  for (const std::string& policy : candidates) {
    const nn::StepPrediction prediction = predict_policy(step, policy);
    if (smallest_policy.empty() || prediction.peak() < smallest) {
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
        " (" + std::to_string(smallest) + " bytes, " + smallest_policy +
        "); parameters, gradients, optimizer state and the batch cannot be checkpointed: "
        "try a smaller --micro-batch or --precision fp16");
  }
  best.candidates = candidates.size();
  return best;
}

std::string resolve_policy(const std::string& policy, const StepShape& step) {
  const std::string prefix = "budget:";
  if (policy.compare(0, prefix.size(), prefix) != 0) {
    ScheduledRunner::for_policy(policy, step.model.depth);  // throws for what it cannot read
    return policy;
  }
  std::size_t budget = 0;
  try {
    budget = parse_bytes(policy.substr(prefix.size()));
  } catch (const std::exception& e) {
    throw std::invalid_argument("\"" + policy + "\": BYTES must be a size such as 96MiB (" +
                                e.what() + ")");
  }
  return choose_for_budget(step, budget).policy;
}

}  // namespace bigbatch::checkpointing

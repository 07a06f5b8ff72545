// rank_plan.cpp: a rank's plan on a modelled cluster (rank_plan.hpp).
#include "chapters/07_data_parallel/rank_plan.hpp"

#include <algorithm>

#include "common/check.hpp"
#include "common/integer_math.hpp"
#include "nn/memory_model.hpp"

namespace bigbatch::data_parallel {

double step_communication_seconds(const nn::NetworkLedger& model, int ranks, ZeroStage zero,
                                  const Cluster& cluster, std::int64_t micro_batches) {
  BIGBATCH_CHECK(micro_batches >= 1, "step_communication_seconds: ", micro_batches,
                 " micro-batches");
  const nn::ModelBytes bytes = model.held();
  const auto gradients = 4.0 * static_cast<double>(bytes.trainable);  // f32, summed
  if (zero == ZeroStage::replicated) return cluster_all_reduce_seconds(gradients, ranks, cluster);
  // Stages 1 and 2 gather what the optimizer writes: every f32 value (4 bytes per trainable
  // element, the gradients' bytes) but, under mixed precision, of a Linear weight only its
  // 16-bit working copy (2 bytes where its master has 4: each rank keeps its shard of the
  // masters), half the masters' bytes less.
  const double gathered = gradients - static_cast<double>(bytes.master_weights) / 2;
  const double reduce_scatters =
      zero == ZeroStage::gradients ? static_cast<double>(micro_batches) : 1.0;
  return reduce_scatters * 0.5 * cluster_all_reduce_seconds(gradients, ranks, cluster) +
         0.5 * cluster_all_reduce_seconds(gathered, ranks, cluster);
}

RankPlans plan_share(planning::PlanRequest request, const planning::CostModel& cost, int ranks,
                     ZeroStage zero) {
  BIGBATCH_CHECK(ranks >= 1 && ranks <= request.batch, "plan_share: ", ranks,
                 " ranks for a batch of ", request.batch, " (each rank needs a sample)");
  RankPlans plans;
  plans.share = collectives::share_of(request.batch, ranks, 0).size;
  request.batch = plans.share;
  BIGBATCH_CHECK(request.models.size() == 1, "plan_share: one model, not ",
                 request.models.size());
  request.held =
      held_elements(*request.models.front()->ledger(nn::Precision::fp32), ranks, 0, zero);
  plans.result = planning::make_plan(request, {cost});
  return plans;
}

RankPlans plan_ranks(planning::PlanRequest request, const planning::CostModel& cost, int ranks,
                     ZeroStage zero, const Cluster& cluster) {
  RankPlans plans = plan_share(request, cost, ranks, zero);
  const auto fp32 = request.models.front()->ledger(nn::Precision::fp32);
  const auto half = request.models.front()->ledger(nn::Precision::bf16);  // as fp16's bytes
  plans.sum_seconds_fp32 = step_communication_seconds(*fp32, ranks, zero, cluster);
  plans.sum_seconds_16bit = step_communication_seconds(*half, ranks, zero, cluster);
  plans.seconds_per_further_micro_batch =
      step_communication_seconds(*fp32, ranks, zero, cluster, 2) - plans.sum_seconds_fp32;
  for (planning::Plan& plan : plans.result.feasible) {
    plan.seconds += step_communication_seconds(
        plan.precision == nn::Precision::fp32 ? *fp32 : *half, ranks, zero, cluster,
        ceil_div(plans.share, plan.micro_batch));
  }
  std::stable_sort(plans.result.feasible.begin(), plans.result.feasible.end(),
                   planning::faster);
  return plans;
}

}  // namespace bigbatch::data_parallel

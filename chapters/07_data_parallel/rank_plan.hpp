// rank_plan.hpp: chapter 06's planner for one rank of a data-parallel step on a modelled
// cluster (`bigbatch plan --ranks R`). Modelled, not measured.
//
// Each rank runs its share of the batch as chapter 06 plans a batch: the micro-batch, the
// precision and the checkpoint policy that fit its memory, fastest first. Rank 0's share is
// the largest (collectives::share_of), so its plan is the one that must fit; its memory is
// predict_rank_step's. Every plan's step time gains the gradient sum on the cluster
// (comm_model.hpp).
//
// Why and how: docs/internals.md#chapters07_data_parallelrank_planhpp
#pragma once

#include <cstdint>

#include "chapters/06_planner/planner.hpp"
#include "chapters/07_data_parallel/comm_model.hpp"
#include "chapters/07_data_parallel/data_parallel.hpp"

namespace bigbatch::data_parallel {

/// What planning a rank's step found.
struct RankPlans {
  planning::PlanResult result;  ///< rank 0's plans, their seconds including the sum
  std::int64_t share = 0;       ///< rank 0's samples of each batch
  /// The modelled gradient sum of each precision's plans (in their seconds): fp32's and
  /// the 16-bit ones' differ at stages 1 and 2, where the Linear weights are gathered as
  /// their 16-bit working copies.
  /// At stage 2, that of a step of one micro-batch.
  double sum_seconds_fp32 = 0, sum_seconds_16bit = 0;
  /// At stage 2, what each further micro-batch of a plan adds to its sum (one
  /// reduce-scatter of the f32 gradients, in every precision); 0 at stages 0 and 1.
  double seconds_per_further_micro_batch = 0;
};

/// The seconds of one step's communication of `model` (any model's ledger, in its
/// precision) over `ranks` of `cluster` at `zero`: an all-reduce of the f32 gradients at
/// stage 0; at stages 1 and 2 a reduce-scatter of them (at stage 2 one per micro-batch of
/// the `micro_batches`) and an all-gather of what the optimizer writes, each half an
/// all-reduce of its bytes.
double step_communication_seconds(const nn::NetworkLedger& model, int ranks, ZeroStage zero,
                                  const Cluster& cluster, std::int64_t micro_batches = 1);

/// Plans rank 0's step of request.batch over `ranks` (>= 1, <= the batch) for the request's
/// one model: chapter 06's plans of its share, with the optimizer state of its shard at `zero`, the sum not priced
/// (the sums are 0 in the answer). What `bigbatch train --plan auto` plans on ranks of this
/// machine, whose links the planner does not know: at stage 0 the sum is the same for
/// every plan. std::invalid_argument for ranks outside that range.
RankPlans plan_share(planning::PlanRequest request, const planning::CostModel& cost, int ranks,
                     ZeroStage zero);

/// plan_share, pricing the sum of each precision's plans on `cluster` too, fastest first;
/// std::invalid_argument for ranks not filling the cluster's whole nodes as well.
RankPlans plan_ranks(planning::PlanRequest request, const planning::CostModel& cost, int ranks,
                     ZeroStage zero, const Cluster& cluster);

}  // namespace bigbatch::data_parallel

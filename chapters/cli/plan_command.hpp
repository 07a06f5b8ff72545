// plan_command.hpp: `bigbatch plan`, and the planning behind `bigbatch train --plan auto`
// (chapter 06): the plans whose step fits --device-memory, fastest first.
#pragma once

#include <optional>

#include "chapters/06_planner/planner.hpp"
#include "chapters/cli/options.hpp"
#include "common/device.hpp"

namespace bigbatch::cli {

/// Chapter 06's answer for `models` (the model's ModelRun::planned) and the batch,
/// optimizer and --device-memory of `options`, with its table printed (with --json, one
/// JSON object instead); throws UsageError without --device-memory, NoPlanFits when no plan
/// fits (after the JSON object, with --json). --device-model prices the plans from a spec
/// sheet where every model has one (PlannedModel::modelled_cost; else UsageError), and
/// --ranks and --zero plan a rank's share of one model on the modelled cluster. With
/// `train_ranks` (`bigbatch train --plan auto` on R ranks of this machine): rank 0's share of
/// the batch, at --zero's stage (data_parallel::plan_share).
planning::PlanResult plan_for(const TrainOptions& options, const planning::PlannedModels& models,
                              Device device, std::optional<int> train_ranks = std::nullopt);

/// bigbatch plan: the table, and the train flags of the fastest plan.
int run_plan(TrainOptions options);

}  // namespace bigbatch::cli

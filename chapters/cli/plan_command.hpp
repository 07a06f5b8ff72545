// plan_command.hpp: `bigbatch plan`, and the planning behind `bigbatch train --plan auto`
// (chapter 06): the plans whose step fits --device-memory, fastest first.
#pragma once

#include "chapters/06_planner/planner.hpp"
#include "chapters/cli/options.hpp"
#include "common/device.hpp"
#include "nn/model.hpp"

namespace bigbatch::cli {

/// Chapter 06's answer for the model, batch, optimizer and --device-memory of `options`,
/// with its table printed (with --json, one JSON object instead); throws UsageError without
/// --device-memory, NoPlanFits when no plan fits (after the JSON object, with --json).
planning::PlanResult plan_for(const TrainOptions& options, const nn::ModelConfig& model,
                              Device device);

/// bigbatch plan: the table, and the train flags of the fastest plan.
int run_plan(const TrainOptions& options);

}  // namespace bigbatch::cli

// plan_command.hpp: `bigbatch plan`, and the planning behind `bigbatch train --plan auto`
// (chapter 06): the plans whose step fits --device-memory, fastest first.
#pragma once

#include <optional>

#include "chapters/06_planner/planner.hpp"
#include "chapters/cli/options.hpp"
#include "common/device.hpp"
#include "nn/model.hpp"

namespace bigbatch::cli {

/// Chapter 06's answer for the model, batch, optimizer and --device-memory of `options`,
/// with its table printed (with --json, one JSON object instead); throws UsageError without
/// --device-memory, NoPlanFits when no plan fits (after the JSON object, with --json).
/// With `train_ranks` (`bigbatch train --plan auto` on R ranks of this machine): rank 0's
/// share of the batch, at --zero's stage (data_parallel::plan_share).
planning::PlanResult plan_for(const TrainOptions& options, const nn::ModelConfig& model,
                              Device device, std::optional<int> train_ranks = std::nullopt);

/// The same for chapter 08's GPT on sequences of `length` positions (measured on this
/// machine: --device-model, --ranks and --zero are refused with UsageError).
planning::PlanResult plan_for_gpt(const TrainOptions& options, const nn::GptConfig& model,
                                  std::int64_t length, Device device);

/// bigbatch plan: the table, and the train flags of the fastest plan.
int run_plan(TrainOptions options);

}  // namespace bigbatch::cli

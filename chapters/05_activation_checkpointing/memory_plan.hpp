// memory_plan.hpp: chapter 05's memory model and the budget policy. nn::predict_step
// replays a training step's allocations on a ledger (nn/memory_model.hpp); with a
// checkpoint policy it replays the policy's schedule through the same interpreter the
// runner executes (schedule_execution.hpp). So, before any block runs, the chapter knows
// the step's peak bytes by category, the moment of the step that holds the peak, and the
// block forwards it costs, and `budget:BYTES` can pick a policy by them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/policy.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::checkpointing {

/// What a step is: the model as the memory model replays it, the batch and micro-batch, the
/// optimizer (its state is live).
struct StepShape {
  /// Any model's ledger (nn::ModelLedger, nn::GptLedger); each prediction starts a step on
  /// it, so one shape predicts one step at a time.
  std::shared_ptr<nn::NetworkLedger> model;
  std::int64_t batch = 0;        ///< samples per optimizer step (the GPT's: sequences)
  std::int64_t micro_batch = 0;  ///< samples per forward pass
  nn::Optimizer::Options optimizer;
  /// What the optimizer boundary keeps on the device through every step (chapter 04's
  /// loss_scaling::boundary_workspace_bytes: 12 with a loss scale or clipping, else 0).
  std::size_t boundary_bytes = 0;
  /// What the step holds a part of: a rank's shards under chapter 07's ZeRO (the default,
  /// all of it).
  nn::HeldElements held = {};
};

/// nn::predict_step for a policy (not a budget: std::invalid_argument); none is the model
/// run without a runner (its own order).
nn::StepPrediction predict_policy(const StepShape& step, const Policy& policy);

/// The recomputation a policy costs, in block forwards per step beyond the n of plain
/// training: its advances, plus, with selective recomputation, kSelectiveCost for each
/// block (the LayerNorm and activation it runs again in the backward pass). Per micro-batch.
double recompute_cost(const Policy& policy, std::int64_t depth);

/// Selective recomputation of one block, in block forwards: the LayerNorm's forward again
/// and the store of the rebuilt activation (the fused backward pass rebuilds it). From
/// bench/results/cpu-2core-avx512/cpu-checkpointing.json as first committed (2 CPU cores, width
/// 256, batch 64, medians of 7):
/// selective's extra step time over sqrt's extra per advance is 0.10 block forwards per
/// block at depth 32 and 0.20 at depth 64; we charge 0.15. On a GPU at large widths the
/// GEMMs dominate a block and the figure is smaller still.
inline constexpr double kSelectiveCost = 0.15;

struct BudgetChoice {
  Policy policy;                 ///< e.g. optimal:3 or sqrt+selective
  nn::StepPrediction prediction;
  double cost = 0;               ///< recompute_cost
  std::size_t candidates = 0;    ///< policies weighed
};

/// The policies budget:BYTES weighs, in this order: none, selective, then every:K and
/// optimal:SLOTS for K, SLOTS = 1 .. depth, each without and with +selective.
std::vector<Policy> checkpoint_candidates(std::int64_t depth);

/// budget:BYTES: of checkpoint_candidates(depth) those whose keep the model's blocks can
/// keep (NetworkLedger::keeps), the one of least recompute_cost whose predicted step peak
/// (StepPrediction::peak: everything on the device) is at most `budget`; ties go to the
/// smaller peak, then to the earlier in that list. Throws std::invalid_argument when none
/// fits, naming the smallest peak any of them reaches and its policy.
BudgetChoice choose_for_budget(const StepShape& step, std::size_t budget);

/// A policy with budget:BYTES resolved by choose_for_budget; any other policy is returned
/// as it is.
Policy resolve_policy(const Policy& policy, const StepShape& step);

}  // namespace bigbatch::checkpointing

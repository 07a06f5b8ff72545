// scheduled_runner.hpp: chapter 05's driver. One class executes every checkpointing
// policy's schedule (schedule.hpp) through the model's hooks (nn::BlockRunnerFor,
// Net::block_forward and Net::block_backward), on the MLP's residual blocks and on the
// GPT's transformer blocks alike. forward() runs the actions up to the one that produces
// h_n, the head's input; backward() runs the rest; checkpoints are MemoryCategory::
// checkpoints. ledger() replays the same schedule on nn::predict_step's ledger. An
// evaluation forward (context.training false) keeps nothing: it runs every block once and
// no backward may follow. A block run a second time in the same step is a recomputation
// (ForwardContext::recompute): its dropout masks are the same, and BatchNorm's running
// statistics are not updated again.
//
// Why and how: docs/internals.md#chapters05_activation_checkpointingscheduled_runnerhpp
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "chapters/05_activation_checkpointing/policy.hpp"
#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "nn/gpt.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"

namespace bigbatch::checkpointing {

/// Executes a schedule on a network's blocks (schedule_execution.hpp's executor for
/// tensors): Net is nn::Model or nn::Gpt.
template <class Net>
struct NetworkExecutor;
/// Replays a schedule on any model's memory ledger (the executor for bytes).
struct LedgerExecutor;
template <class Executor>
class ScheduleExecution;

template <class Net>
class ScheduledRunnerFor : public nn::BlockRunnerFor<Net> {
 public:
  /// Validates the schedule (schedule.hpp's rules); its depth must be the model's. With
  /// BlockKeep::gemm_outputs every taped block keeps only its GEMM outputs (selective
  /// recomputation, nn/model.hpp: the MLP's blocks alone; std::invalid_argument for the GPT).
  explicit ScheduledRunnerFor(Schedule schedule, nn::BlockKeep keep = nn::BlockKeep::all);
  ~ScheduledRunnerFor() override;

  /// The runner for a policy (policy.hpp): its schedule for `depth` blocks, each taped
  /// block keeping what the policy's keep says (none: store_all). Throws
  /// std::invalid_argument for a budget (memory_plan.hpp resolves it to one of these first).
  static std::shared_ptr<ScheduledRunnerFor> for_policy(const Policy& policy,
                                                        std::int64_t depth);

  Tensor forward(Net& model, Tensor h0, const nn::ForwardContext& context) override;
  Tensor backward(Net& model, Tensor dh_n, const nn::ForwardContext& context) override;

  /// A replay of this runner's schedule for nn::predict_step (fresh counts).
  std::unique_ptr<nn::BlockLedgerRunner> ledger() const;

  /// The schedule it runs.
  const Schedule& schedule() const { return schedule_; }
  /// What each taped block keeps.
  nn::BlockKeep keep() const { return keep_; }
  /// Block forwards run since construction (advances and tapes).
  std::int64_t evaluations() const;
  /// Those of them that were recomputations (a block's second or later run within a step).
  std::int64_t recomputations() const;

 private:
  Schedule schedule_;
  nn::BlockKeep keep_;
  std::unique_ptr<ScheduleExecution<NetworkExecutor<Net>>> execution_;
};

/// The replay of a policy's schedule on `depth` blocks for nn::predict_step, on any model's
/// ledger (what ScheduledRunnerFor::for_policy(policy, depth)->ledger() replays); throws
/// std::invalid_argument for a budget, as for_policy does.
std::unique_ptr<nn::BlockLedgerRunner> ledger_for_policy(const Policy& policy,
                                                         std::int64_t depth);

/// The MLP's runner (chapters 05-07).
using ScheduledRunner = ScheduledRunnerFor<nn::Model>;
/// The GPT's runner (chapter 08).
using GptScheduledRunner = ScheduledRunnerFor<nn::Gpt>;

extern template class ScheduledRunnerFor<nn::Model>;
extern template class ScheduledRunnerFor<nn::Gpt>;

}  // namespace bigbatch::checkpointing

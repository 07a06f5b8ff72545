// scheduled_runner.hpp: chapter 05's driver. One class executes every checkpointing
// policy: the policy is only a schedule (schedule.hpp), a list of actions on the chain of
// residual blocks, and this runner carries them out through the model's hooks
// (nn::BlockRunner, Model::block_forward and Model::block_backward):
//
//   store i      copy the current block input h_i into a checkpoint (MemoryCategory::
//                checkpoints)
//   advance i    h_{i+1} = block i (h_i), keeping nothing of the block
//   tape i       h_{i+1} = block i (h_i), keeping the block's activations for its backward
//   backward i   the block's backward from its taped activations, which are then freed
//   restore i    continue from checkpoint i
//   drop i       free checkpoint i
//
// forward() runs the actions up to the one that produces h_n, the head's input; backward()
// runs the rest. The interpreter of the actions is schedule_execution.hpp, shared with the
// memory model: ledger() replays the same schedule on nn::predict_step's ledger. An evaluation forward (context.training false) keeps nothing: it runs
// every block once and no backward may follow. A block run a second time in the same step is a recomputation
// (ForwardContext::recompute): its dropout masks are the same (the counter RNG), and
// BatchNorm's running statistics are not updated again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "chapters/05_activation_checkpointing/policy.hpp"
#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"

namespace bigbatch::checkpointing {

/// Executes a schedule on the model (schedule_execution.hpp's executor for tensors).
struct ModelExecutor;
/// Replays a schedule on a memory ledger (the executor for bytes).
struct LedgerExecutor;
template <class Executor>
class ScheduleExecution;

class ScheduledRunner : public nn::BlockRunner {
 public:
  /// Validates the schedule (schedule.hpp's rules); its depth must be the model's. With
  /// BlockKeep::gemm_outputs every taped block keeps only its GEMM outputs (selective
  /// recomputation, nn/model.hpp).
  explicit ScheduledRunner(Schedule schedule, nn::BlockKeep keep = nn::BlockKeep::all);
  ~ScheduledRunner() override;

  /// The runner for a policy (policy.hpp): its schedule for `depth` blocks, each taped
  /// block keeping what the policy's keep says (none: store_all). Throws
  /// std::invalid_argument for a budget (memory_plan.hpp resolves it to one of these first).
  static std::shared_ptr<ScheduledRunner> for_policy(const Policy& policy, std::int64_t depth);

  Tensor forward(nn::Model& model, Tensor h0, const nn::ForwardContext& context) override;
  Tensor backward(nn::Model& model, Tensor dh_n, const nn::ForwardContext& context) override;

  /// A replay of this runner's schedule for nn::predict_step (fresh counts).
  std::unique_ptr<nn::BlockLedgerRunner> ledger() const;

  const Schedule& schedule() const { return schedule_; }
  nn::BlockKeep keep() const { return keep_; }
  /// Block forwards run since construction (advances and tapes), and those of them that
  /// were recomputations (a block's second or later run within one step).
  std::int64_t evaluations() const;
  std::int64_t recomputations() const;

 private:
  Schedule schedule_;
  nn::BlockKeep keep_;
  std::unique_ptr<ScheduleExecution<ModelExecutor>> execution_;
};

}  // namespace bigbatch::checkpointing

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
// runs the rest. An evaluation forward (context.training false) keeps nothing: it runs
// every block once and no backward may follow. A block run a second time in the same step is a recomputation
// (ForwardContext::recompute): its dropout masks are the same (the counter RNG), and
// BatchNorm's running statistics are not updated again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "nn/model.hpp"

namespace bigbatch::checkpointing {

class ScheduledRunner : public nn::BlockRunner {
 public:
  /// Validates the schedule (schedule.hpp's rules); its depth must be the model's. With
  /// BlockKeep::gemm_outputs every taped block keeps only its GEMM outputs (selective
  /// recomputation, nn/model.hpp).
  explicit ScheduledRunner(Schedule schedule, nn::BlockKeep keep = nn::BlockKeep::all);

  /// The runner for a policy as `bigbatch train --checkpoint` reads it: a schedule
  /// (schedule.hpp's parse_policy: none, every:K, sqrt, optimal:SLOTS), "selective"
  /// (every block taped, keeping its GEMM outputs only), or a schedule and selective
  /// together as "POLICY+selective". Throws std::invalid_argument for anything else.
  static std::shared_ptr<ScheduledRunner> for_policy(const std::string& policy,
                                                     std::int64_t depth);

  Tensor forward(nn::Model& model, const Tensor& h0, const nn::ForwardContext& context) override;
  Tensor backward(nn::Model& model, const Tensor& dh_n,
                  const nn::ForwardContext& context) override;

  const Schedule& schedule() const { return schedule_; }
  nn::BlockKeep keep() const { return keep_; }
  /// Block forwards run since construction (advances and tapes), and those of them that
  /// were recomputations (a block's second or later run within one step).
  std::int64_t evaluations() const { return evaluations_; }
  std::int64_t recomputations() const { return recomputations_; }

 private:
  /// Carries out actions from next_ on; with stop_at_head, returns after the one that
  /// produces h_n.
  void run(nn::Model& model, const nn::ForwardContext& context, bool stop_at_head);
  Tensor evaluate(nn::Model& model, std::int64_t block, const nn::ForwardContext& context,
                  nn::BlockActivations& saved, nn::BlockKeep keep = nn::BlockKeep::all);

  Schedule schedule_;
  nn::BlockKeep keep_;
  std::size_t next_ = 0;               // the next action
  bool in_step_ = false;               // a training forward ran; its backward is due
  Tensor current_;                     // the current block input (or h_n)
  Tensor gradient_;                    // the gradient flowing backward
  std::map<std::int64_t, Tensor> checkpoints_;
  std::map<std::int64_t, nn::BlockActivations> taped_;
  std::vector<bool> evaluated_;        // per block: already run in this step
  std::int64_t evaluations_ = 0;
  std::int64_t recomputations_ = 0;
};

}  // namespace bigbatch::checkpointing

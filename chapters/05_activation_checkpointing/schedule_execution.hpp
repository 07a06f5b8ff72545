// schedule_execution.hpp: the one interpreter of a checkpoint schedule (schedule.hpp's
// actions), written once for two executors: the model, whose values are tensors
// (scheduled_runner.cpp), and the memory model, whose values are byte counts on a ledger
// (nn/memory_model.hpp). Both therefore keep, copy, recompute and release in exactly the
// same order, which is what lets the predicted peak equal the measured one to the byte.
//
// An Executor provides:
//   using Value = ...;  using Saved = ...;   // a hidden state or gradient; a taped block
//   Value block_forward(i, Value h, Saved& saved, nn::BlockKeep keep, bool recompute);
//   Value block_backward(i, const Saved& saved, const Value& gradient);
//   Value checkpoint(i, const Value& h);     // a copy of h_i in MemoryCategory::checkpoints
// Values are shared handles (copying one shares it; assigning null releases it).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "common/check.hpp"
#include "nn/model.hpp"

namespace bigbatch::checkpointing {

template <class Executor>
class ScheduleExecution {
 public:
  using Value = typename Executor::Value;
  using Saved = typename Executor::Saved;

  ScheduleExecution(const Schedule& schedule, nn::BlockKeep keep)
      : schedule_(schedule), keep_(keep) {}

  /// A training forward from h0: runs the actions up to the one that produces h_n and
  /// returns it, keeping the checkpoints and taped blocks the rest of the schedule needs.
  Value forward(Executor& executor, Value h0) {
    start(std::move(h0));
    in_step_ = true;
    run(executor, /*stop_at_head=*/true);
    return std::exchange(current_, Value());
  }

  /// An evaluation forward: every block once, nothing kept; no backward may follow.
  Value evaluate(Executor& executor, Value h0) {
    start(std::move(h0));
    for (std::int64_t i = 0; i < schedule_.depth; ++i) {
      Saved discarded;
      current_ = block_forward(executor, i, discarded, nn::BlockKeep::all);
    }
    next_ = schedule_.actions.size();
    return std::exchange(current_, Value());
  }

  /// The rest of the actions, from dh_n; returns dh_0.
  Value backward(Executor& executor, Value dh_n) {
    BIGBATCH_CHECK(in_step_, "ScheduledRunner: backward without a training forward before it");
    in_step_ = false;
    gradient_ = std::move(dh_n);
    run(executor, /*stop_at_head=*/false);
    BIGBATCH_CHECK(taped_.empty() && checkpoints_.empty(),
                   "ScheduledRunner: the schedule left blocks taped or checkpoints stored");
    current_ = Value();
    return std::exchange(gradient_, Value());
  }

  /// Block forwards run so far (advances and tapes), and those that were a block's second
  /// or later run within one step.
  std::int64_t evaluations() const { return evaluations_; }
  std::int64_t recomputations() const { return recomputations_; }

 private:
  void start(Value h0) {
    next_ = 0;
    in_step_ = false;
    checkpoints_.clear();
    taped_.clear();
    gradient_ = Value();
    evaluated_.assign(static_cast<std::size_t>(schedule_.depth), false);
    current_ = std::move(h0);
  }

  Value block_forward(Executor& executor, std::int64_t block, Saved& saved, nn::BlockKeep keep) {
    const auto index = static_cast<std::size_t>(block);
    const bool recompute = evaluated_[index];
    recomputations_ += recompute ? 1 : 0;
    ++evaluations_;
    evaluated_[index] = true;
    return executor.block_forward(block, current_, saved, keep, recompute);
  }

  // snippet: interpreter
  void run(Executor& executor, bool stop_at_head) {
    const std::int64_t depth = schedule_.depth;
    while (next_ < schedule_.actions.size()) {
      const Action action = schedule_.actions[next_++];
      const std::int64_t i = action.block;
      switch (action.op) {
        case Op::store:
          checkpoints_[i] = executor.checkpoint(i, current_);
          break;
        case Op::advance: {
          Saved discarded;  // released when this scope ends
          current_ = block_forward(executor, i, discarded, nn::BlockKeep::all);
          break;
        }
        case Op::tape:
          current_ = block_forward(executor, i, taped_[i], keep_);
          break;
        case Op::backward:
          gradient_ = executor.block_backward(i, taped_.at(i), gradient_);
          taped_.erase(i);
          break;
        case Op::restore:
          current_ = checkpoints_.at(i);  // shared, read-only: blocks never write h
          break;
        case Op::drop:
          checkpoints_.erase(i);
          break;
      }
      if (stop_at_head && i == depth - 1 && (action.op == Op::advance || action.op == Op::tape)) {
        return;
      }
    }
  }
  // snippet end: interpreter

  Schedule schedule_;
  nn::BlockKeep keep_;
  std::size_t next_ = 0;     // the next action
  bool in_step_ = false;     // a training forward ran; its backward is due
  Value current_;            // the current block input (or h_n)
  Value gradient_;           // the gradient flowing backward
  std::map<std::int64_t, Value> checkpoints_;
  std::map<std::int64_t, Saved> taped_;
  std::vector<bool> evaluated_;  // per block: already run in this step
  std::int64_t evaluations_ = 0;
  std::int64_t recomputations_ = 0;
};

}  // namespace bigbatch::checkpointing

// scheduled_runner.cpp: executing a checkpoint schedule on the model, and replaying it on
// the memory model's ledger, through one interpreter (schedule_execution.hpp).
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"

#include <stdexcept>
#include <utility>

#include "chapters/05_activation_checkpointing/schedule_execution.hpp"
#include "common/check.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch::checkpointing {

struct ModelExecutor {
  using Value = Tensor;
  using Saved = nn::BlockActivations;

  nn::Model& model;
  const nn::ForwardContext& context;

  Tensor block_forward(std::int64_t i, const Tensor& h, Saved& saved, nn::BlockKeep keep,
                       bool recompute) {
    nn::ForwardContext run = context;
    run.recompute = recompute;  // BatchNorm's running statistics move once per step
    return model.block_forward(static_cast<std::size_t>(i), h, run, saved, keep);
  }
  Tensor block_backward(std::int64_t i, const Saved& saved, const Tensor& gradient) {
    return model.block_backward(static_cast<std::size_t>(i), saved, gradient, context);
  }
  Tensor checkpoint(std::int64_t, const Tensor& h) {
    Tensor copy(h.shape(), h.dtype(), h.device(), MemoryCategory::checkpoints);
    cast(h, copy);  // same dtype: a copy
    return copy;
  }
};

struct LedgerExecutor {
  using Value = nn::MemoryLedger::Bytes;
  using Saved = nn::BlockBytes;

  nn::ModelLedger& model;

  Value block_forward(std::int64_t i, Value h, Saved& saved, nn::BlockKeep keep, bool recompute) {
    return model.block_forward(i, std::move(h), saved, keep, recompute);
  }
  Value block_backward(std::int64_t i, const Saved& saved, const Value&) {
    return model.block_backward(i, saved);  // the gradient's bytes stay the caller's
  }
  Value checkpoint(std::int64_t i, const Value&) { return model.checkpoint(i); }
};

namespace {

class ScheduleLedger : public nn::BlockLedgerRunner {
 public:
  ScheduleLedger(const Schedule& schedule, nn::BlockKeep keep) : execution_(schedule, keep) {}
  nn::MemoryLedger::Bytes forward(nn::ModelLedger& model, nn::MemoryLedger::Bytes h0) override {
    LedgerExecutor executor{model};
    return execution_.forward(executor, std::move(h0));
  }
  nn::MemoryLedger::Bytes backward(nn::ModelLedger& model,
                                   nn::MemoryLedger::Bytes dh_n) override {
    LedgerExecutor executor{model};
    return execution_.backward(executor, std::move(dh_n));
  }
  std::int64_t evaluations() const override { return execution_.evaluations(); }

 private:
  ScheduleExecution<LedgerExecutor> execution_;
};

}  // namespace

ScheduledRunner::ScheduledRunner(Schedule schedule, nn::BlockKeep keep)
    : schedule_(std::move(schedule)), keep_(keep) {
  validate(schedule_);
  execution_ = std::make_unique<ScheduleExecution<ModelExecutor>>(schedule_, keep_);
}

ScheduledRunner::~ScheduledRunner() = default;

std::shared_ptr<ScheduledRunner> ScheduledRunner::for_policy(const Policy& policy,
                                                             std::int64_t depth) {
  return std::make_shared<ScheduledRunner>(policy.schedule_for(depth), policy.keep);
}

Tensor ScheduledRunner::forward(nn::Model& model, Tensor h0, const nn::ForwardContext& context) {
  BIGBATCH_CHECK(schedule_.depth == model.config().depth, "ScheduledRunner: the schedule is for ",
                 schedule_.depth, " blocks, the model has ", model.config().depth);
  ModelExecutor executor{model, context};
  if (!context.training) return execution_->evaluate(executor, std::move(h0));
  return execution_->forward(executor, std::move(h0));
}

Tensor ScheduledRunner::backward(nn::Model& model, Tensor dh_n,
                                 const nn::ForwardContext& context) {
  ModelExecutor executor{model, context};
  return execution_->backward(executor, std::move(dh_n));
}

std::unique_ptr<nn::BlockLedgerRunner> ScheduledRunner::ledger() const {
  return std::make_unique<ScheduleLedger>(schedule_, keep_);
}

std::int64_t ScheduledRunner::evaluations() const { return execution_->evaluations(); }
std::int64_t ScheduledRunner::recomputations() const { return execution_->recomputations(); }

}  // namespace bigbatch::checkpointing

// scheduled_runner.cpp: executing a checkpoint schedule on the model, and replaying it on
// the memory model's ledger, through one interpreter (schedule_execution.hpp).
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"

#include <stdexcept>
#include <utility>

#include "chapters/05_activation_checkpointing/schedule_execution.hpp"
#include "common/check.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch::checkpointing {

template <class Net>
struct NetworkExecutor {
  using Value = Tensor;
  using Saved = typename Net::SavedBlock;

  Net& model;
  const nn::ForwardContext& context;

  // A recomputed block draws the same dropout masks (the counter RNG keys them by block,
  // not by how often it ran); BatchNorm's running statistics move once per step.
  Tensor block_forward(std::int64_t i, const Tensor& h, Saved& saved, nn::BlockKeep keep,
                       bool recompute) {
    nn::ForwardContext run = context;
    run.recompute = recompute;
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

  nn::NetworkLedger& model;

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
  ScheduleLedger(const Schedule& schedule, nn::BlockKeep keep) : execution_(schedule, keep) {
    validate(schedule);
  }
  nn::MemoryLedger::Bytes forward(nn::NetworkLedger& model, nn::MemoryLedger::Bytes h0) override {
    LedgerExecutor executor{model};
    return execution_.forward(executor, std::move(h0));
  }
  nn::MemoryLedger::Bytes backward(nn::NetworkLedger& model,
                                   nn::MemoryLedger::Bytes dh_n) override {
    LedgerExecutor executor{model};
    return execution_.backward(executor, std::move(dh_n));
  }
  std::int64_t evaluations() const override { return execution_.evaluations(); }

 private:
  ScheduleExecution<LedgerExecutor> execution_;
};

}  // namespace

std::unique_ptr<nn::BlockLedgerRunner> ledger_for_policy(const Policy& policy,
                                                         std::int64_t depth) {
  return std::make_unique<ScheduleLedger>(policy.schedule_for(depth), policy.keep);
}

template <class Net>
ScheduledRunnerFor<Net>::ScheduledRunnerFor(Schedule schedule, nn::BlockKeep keep)
    : schedule_(std::move(schedule)), keep_(keep) {
  validate(schedule_);
  if (!Net::keeps(keep_)) {  // what each BlockKeep is, and which blocks have it
    throw std::invalid_argument(
        keep_ == nn::BlockKeep::gemm_outputs
            ? "selective recomputation keeps the MLP block's GEMM outputs; a transformer block "
              "recomputes whole blocks (every:K, sqrt, optimal:SLOTS) or its attention's "
              "probabilities (attention, POLICY+attention)"
            : "attention recomputes a transformer block's attention probabilities; the MLP's "
              "blocks have none (its selective recomputation: selective, POLICY+selective)");
  }
  execution_ = std::make_unique<ScheduleExecution<NetworkExecutor<Net>>>(schedule_, keep_);
}

template <class Net>
ScheduledRunnerFor<Net>::~ScheduledRunnerFor() = default;

template <class Net>
std::shared_ptr<ScheduledRunnerFor<Net>> ScheduledRunnerFor<Net>::for_policy(
    const Policy& policy, std::int64_t depth) {
  return std::make_shared<ScheduledRunnerFor>(policy.schedule_for(depth), policy.keep);
}

template <class Net>
Tensor ScheduledRunnerFor<Net>::forward(Net& model, Tensor h0,
                                        const nn::ForwardContext& context) {
  const std::int64_t depth = model.blocks();
  BIGBATCH_CHECK(schedule_.depth == depth, "ScheduledRunner: the schedule is for ",
                 schedule_.depth, " blocks, the model has ", depth);
  NetworkExecutor<Net> executor{model, context};
  if (!context.training) return execution_->evaluate(executor, std::move(h0));
  return execution_->forward(executor, std::move(h0));
}

template <class Net>
Tensor ScheduledRunnerFor<Net>::backward(Net& model, Tensor dh_n,
                                         const nn::ForwardContext& context) {
  NetworkExecutor<Net> executor{model, context};
  return execution_->backward(executor, std::move(dh_n));
}

template <class Net>
std::unique_ptr<nn::BlockLedgerRunner> ScheduledRunnerFor<Net>::ledger() const {
  return std::make_unique<ScheduleLedger>(schedule_, keep_);
}

template <class Net>
std::int64_t ScheduledRunnerFor<Net>::evaluations() const {
  return execution_->evaluations();
}
template <class Net>
std::int64_t ScheduledRunnerFor<Net>::recomputations() const {
  return execution_->recomputations();
}

template class ScheduledRunnerFor<nn::Model>;
template class ScheduledRunnerFor<nn::Gpt>;

}  // namespace bigbatch::checkpointing

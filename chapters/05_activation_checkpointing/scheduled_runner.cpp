// scheduled_runner.cpp: executing a checkpoint schedule on the model.
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"

#include <utility>

#include "common/check.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch::checkpointing {

ScheduledRunner::ScheduledRunner(Schedule schedule, nn::BlockKeep keep)
    : schedule_(std::move(schedule)), keep_(keep) {
  validate(schedule_);
}

std::shared_ptr<ScheduledRunner> ScheduledRunner::for_policy(const std::string& policy,
                                                             std::int64_t depth) {
  const std::string suffix = "+selective";
  if (policy == "selective") {
    return std::make_shared<ScheduledRunner>(store_all(depth), nn::BlockKeep::gemm_outputs);
  }
  if (policy.size() > suffix.size() &&
      policy.compare(policy.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return std::make_shared<ScheduledRunner>(
        parse_policy(policy.substr(0, policy.size() - suffix.size()), depth),
        nn::BlockKeep::gemm_outputs);
  }
  return std::make_shared<ScheduledRunner>(parse_policy(policy, depth));
}

Tensor ScheduledRunner::evaluate(nn::Model& model, std::int64_t block,
                                 const nn::ForwardContext& context, nn::BlockActivations& saved,
                                 nn::BlockKeep keep) {
  nn::ForwardContext run = context;
  const auto index = static_cast<std::size_t>(block);
  run.recompute = evaluated_[index];
  recomputations_ += run.recompute ? 1 : 0;
  ++evaluations_;
  evaluated_[index] = true;
  return model.block_forward(index, current_, run, saved, keep);
}

void ScheduledRunner::run(nn::Model& model, const nn::ForwardContext& context,
                          bool stop_at_head) {
  const std::int64_t depth = schedule_.depth;
  while (next_ < schedule_.actions.size()) {
    const Action action = schedule_.actions[next_++];
    const std::int64_t i = action.block;
    switch (action.op) {
      case Op::store: {
        Tensor copy(current_.shape(), current_.dtype(), current_.device(),
                    MemoryCategory::checkpoints);
        cast(current_, copy);  // same dtype: a copy
        checkpoints_[i] = std::move(copy);
        break;
      }
      case Op::advance: {
        nn::BlockActivations discarded;  // freed when this scope ends
        current_ = evaluate(model, i, context, discarded);
        break;
      }
      case Op::tape:
        current_ = evaluate(model, i, context, taped_[i], keep_);
        break;
      case Op::backward:
        gradient_ = model.block_backward(static_cast<std::size_t>(i), taped_.at(i), gradient_,
                                         context);
        taped_.erase(i);
        break;
      case Op::restore:
        current_ = checkpoints_.at(i);  // read-only from here on: blocks never write h
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

Tensor ScheduledRunner::forward(nn::Model& model, const Tensor& h0,
                                const nn::ForwardContext& context) {
  BIGBATCH_CHECK(schedule_.depth == model.config().depth, "ScheduledRunner: the schedule is for ",
                 schedule_.depth, " blocks, the model has ", model.config().depth);
  next_ = 0;
  in_step_ = false;
  checkpoints_.clear();
  taped_.clear();
  gradient_ = Tensor();
  evaluated_.assign(static_cast<std::size_t>(schedule_.depth), false);
  current_ = h0;
  if (!context.training) {  // evaluation: no backward follows, so nothing is kept
    for (std::int64_t i = 0; i < schedule_.depth; ++i) {
      nn::BlockActivations discarded;
      current_ = evaluate(model, i, context, discarded);
    }
    next_ = schedule_.actions.size();
    return std::exchange(current_, Tensor());
  }
  in_step_ = true;
  run(model, context, /*stop_at_head=*/true);
  Tensor h_n = std::move(current_);
  current_ = Tensor();
  return h_n;
}

Tensor ScheduledRunner::backward(nn::Model& model, const Tensor& dh_n,
                                 const nn::ForwardContext& context) {
  BIGBATCH_CHECK(in_step_, "ScheduledRunner: backward without a training forward before it");
  in_step_ = false;
  gradient_ = dh_n;
  run(model, context, /*stop_at_head=*/false);
  BIGBATCH_CHECK(taped_.empty() && checkpoints_.empty(),
                 "ScheduledRunner: the schedule left blocks taped or checkpoints stored");
  current_ = Tensor();
  return std::exchange(gradient_, Tensor());
}

}  // namespace bigbatch::checkpointing

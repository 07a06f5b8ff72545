// trainer.cpp: the training step.
#include "chapters/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

namespace bigbatch::train {

loss_scaling::BoundaryOptions boundary_options(const TrainConfig& config) {
  BIGBATCH_CHECK(config.clip_grad_norm >= 0.0f && std::isfinite(config.clip_grad_norm),
                 "Trainer: clip_grad_norm must be finite and >= 0 (0: off), got ",
                 config.clip_grad_norm);
  return {config.loss_scaling, config.fixed_scale, config.dynamic_scaling,
          config.clip_grad_norm};
}

Trainer::Trainer(nn::Network& model, nn::Optimizer& optimizer, const Dataset& data,
                 TrainConfig config, data_parallel::RankGroup* ranks)
    : Trainer(model, nullptr, optimizer, data, config, ranks) {}

Trainer::Trainer(nn::Model& model, nn::Optimizer& optimizer, const Dataset& data,
                 TrainConfig config, data_parallel::RankGroup* ranks)
    : Trainer(model, &model, optimizer, data, config, ranks) {}

Trainer::Trainer(nn::Network& model, nn::Model* mlp, nn::Optimizer& optimizer,
                 const Dataset& data, TrainConfig config, data_parallel::RankGroup* ranks)
    : model_(model),
      mlp_(mlp),
      optimizer_(optimizer),
      config_(config),
      stream_(data, config.batch, config.shuffle, config.seed,
              config.drop_last ? nn::LastBatch::drop : nn::LastBatch::keep_short),
      boundary_(boundary_options(config), model.device()),
      ranks_(ranks) {
  BIGBATCH_CHECK(config_.micro_batch >= 0 && config_.micro_batch <= config_.batch,
                 "Trainer: micro_batch must lie in [0, batch = ", config_.batch, "], got ",
                 config_.micro_batch);
  if (config_.micro_batch == 0) config_.micro_batch = config_.batch;
  model_.check_data(data);
  BIGBATCH_CHECK(config_.steps > 0 || config_.epochs > 0,
                 "Trainer: give a positive number of steps or epochs");
  BIGBATCH_CHECK(config_.warmup_steps >= 0, "Trainer: warmup_steps must be >= 0, got ",
                 config_.warmup_steps);
  if (ranks_) {
    BIGBATCH_CHECK(mlp_ != nullptr || (ranks_->zero() == data_parallel::ZeroStage::replicated &&
                                       !ranks_->overlaps()),
                   "Trainer: ZeRO and sums overlapping the backward need the residual MLP "
                   "(nn::Model tells its final gradients and releases them); this model's "
                   "ranks sum whole gradients once per step");
    // Every rank must have a sample of every batch, the short last one included.
    const std::int64_t last = stream_.position(stream_.batches_per_epoch() - 1).size;
    BIGBATCH_CHECK(ranks_->ranks() <= last, "Trainer: ", ranks_->ranks(),
                   " ranks need a sample each in every batch, and ",
                   last == config_.batch ? "a batch" : "the epoch's last batch", " has ", last);
  }
  total_steps_ =
      config_.steps > 0 ? config_.steps : config_.epochs * stream_.batches_per_epoch();
  schedule_ = {optimizer_.learning_rate(), total_steps_, config_.warmup_steps,
               config_.lr_schedule};
  dropout_seed_ = nn::dropout_seed_for_run(config_.seed);
  // The largest micro-batch a step runs: under ranks, at most the first local rank's share
  // (the largest of its ranks' shares).
  std::int64_t staged_rows = config_.micro_batch;
  if (ranks_) {
    staged_rows = std::min(staged_rows, dist::share_of(config_.batch, ranks_->ranks(),
                                                       ranks_->local_ranks().front()).size);
  }
  staging_.emplace(staged_rows, data, model_.device());
}

StepRecord Trainer::step() {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t k = steps_done_;
  const nn::BatchPosition batch = stream_.position(k);
  if (ranks_ && ranks_->zero() != data_parallel::ZeroStage::replicated) {
    // ZeRO: the masters' shards taken; at stage 2, how many sums the ranks take, and the
    // model's gradients go.
    const std::int64_t largest = dist::share_of(batch.size, ranks_->ranks(), 0).size;
    ranks_->start_step(*mlp_, (largest + config_.micro_batch - 1) / config_.micro_batch);
  }
  TrackingAllocator& allocator = allocator_for(model_.device());
  allocator.reset_peak();  // this step's peak, not the run's

  const double lr = nn::lr_at(schedule_, optimizer_steps_);
  optimizer_.set_learning_rate(lr);
  model_.zero_grad();
  // The scale is constant over the step's micro-batches; it changes only at the boundary.
  const float scale = boundary_.scale();
  const nn::ForwardContext context{true, dropout_seed_, batch.first_row};
  const nn::BatchRows rows = staging_->rows_of(stream_, k);
  // The loss of every target is divided by the count of the whole step's targets (the MLP:
  // its samples; the GPT: its tokens that are not padding), whatever the micro-batches.
  const std::int64_t targets = count_targets(stream_.data(), stream_.batch_indices(k));
  float loss = 0;
  double reduce_seconds = 0;
  if (!ranks_) {
    loss = nn::accumulate_gradients(model_, batch.size, rows, config_.micro_batch, context,
                                    /*global_count=*/targets, scale);
  } else {  // chapter 07: each rank its share, with no communication; one sum at the end
    std::vector<float> losses;
    for (const int r : ranks_->local_ranks()) {
      const dist::Share share = dist::share_of(batch.size, ranks_->ranks(), r);
      const nn::BatchRows share_rows = [&rows, &share](std::int64_t begin, std::int64_t end) {
        return rows(share.begin + begin, share.begin + end);
      };
      nn::ForwardContext share_context = context;
      share_context.first_row += share.begin;  // its samples' own dropout masks
      // With overlap, the sum of each group of gradients starts as the share's last
      // backward finishes it; at ZeRO stage 2, as every backward finishes it.
      if (ranks_->overlaps() || ranks_->sums_every_micro_batch()) {  // the MLP (checked)
        const nn::GradientsReady on_final = [this](std::size_t first, std::size_t end) {
          ranks_->gradients_ready(*mlp_, first, end);
        };
        losses.push_back(nn::accumulate_gradients(
            *mlp_, share.size, share_rows, config_.micro_batch, share_context,
            /*global_count=*/targets, scale, on_final,
            ranks_->sums_every_micro_batch() ? nn::TellGradients::every_micro_batch
                                             : nn::TellGradients::last_micro_batch));
      } else {
        losses.push_back(nn::accumulate_gradients(model_, share.size, share_rows,
                                                  config_.micro_batch, share_context,
                                                  /*global_count=*/targets, scale));
      }
      ranks_->share_done(r, model_);
    }
    const auto reduce_start = std::chrono::steady_clock::now();
    loss = ranks_->reduce(model_, losses);
    reduce_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                   reduce_start).count() +
                     ranks_->take_seconds_in_backward();
  }
  // The boundary, in gradient_clipping.hpp's order (the object refuses any other).
  const bool scaling = boundary_.scaling();
  if (!scaling && !std::isfinite(loss)) {  // with a scaler, the check below skips the step
    throw NonFiniteLossError("step " + std::to_string(k + 1) + " (epoch " +
                             std::to_string(batch.epoch) + ", batch " +
                             std::to_string(batch.index) + "): the loss is " +
                             std::to_string(loss) +
                             "; the run stops before the optimizer step writes it into the "
                             "weights (look for a NaN or inf in the data, or lower the "
                             "learning rate)");
  }
  if (boundary_.measures()) {
    // 1, 3 (data parallel: over the parts the ranks hold, e.g. their shards under ZeRO)
    const loss_scaling::GradientStats& gradients =
        ranks_ ? boundary_.unscale(ranks_->boundary_pieces(model_), model_.device())
               : boundary_.unscale(model_);
    if (gradients.overflow && !scaling) {
      throw NonFiniteGradientError("step " + std::to_string(k + 1) +
                                   ": a gradient is inf or NaN (the global norm is " +
                                   std::to_string(gradients.norm) +
                                   "); without a loss scaler the step cannot be skipped, so "
                                   "the run stops before the weights are written");
    }
  }
  // 2 (an overflow: no clip, no step, the schedule stays) or 4 and 5, with lr_at(schedule_,
  // optimizer_steps_).
  loss_scaling::BoundaryOutcome outcome;
  if (!ranks_) {
    outcome = boundary_.step(model_, optimizer_);
  } else {  // clipping the gradients this process's optimizer reads, then sharing the result
    std::vector<Tensor> stepped;
    for (const nn::NamedParameter& p : ranks_->stepped_parameters(model_)) stepped.push_back(p.grad);
    outcome = boundary_.step(stepped, optimizer_);
    if (!outcome.skipped) {
      const auto gather_start = std::chrono::steady_clock::now();
      ranks_->gather_parameters(model_);  // ZeRO: the all-reduce's second half, after the step
      reduce_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                      gather_start).count();
    }
  }
  if (!outcome.skipped) ++optimizer_steps_;
  boundary_.update();  // 2 (back off) or 6 (count it)
  // 7: the gradients are zeroed before the next step's first micro-batch.

  ++steps_done_;
  samples_done_ += batch.size;
  StepRecord record;
  record.step = steps_done_;
  record.loss = loss;
  record.batch_samples = batch.size;
  record.batch_targets = targets;
  record.samples = samples_done_;
  record.epoch = static_cast<double>(batch.epoch) +
                 static_cast<double>(batch.index + 1) /
                     static_cast<double>(stream_.batches_per_epoch());
  record.learning_rate = lr;
  record.loss_scale = scale;
  record.skipped = outcome.skipped;
  record.grad_norm = outcome.norm;
  record.clip_factor = outcome.clip_factor;
  record.skipped_steps = boundary_.skipped_steps();
  record.reduce_seconds = reduce_seconds;
  record.memory = allocator.stats();
  if (record.memory.peak_total > largest_step_memory_.peak_total) {
    largest_step_memory_ = record.memory;
  }
  record.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return record;
}

TrainerState Trainer::state() const {
  return {steps_done_, samples_done_, optimizer_steps_, boundary_.skipped_steps(),
          boundary_.dynamic_state()};
}

void Trainer::restore(const TrainerState& s) {
  BIGBATCH_CHECK(s.steps_done >= 0 && s.steps_done <= total_steps_,
                 "Trainer::restore: ", s.steps_done, " steps done, but this run has ",
                 total_steps_);
  BIGBATCH_CHECK(s.optimizer_steps >= 0 && s.skipped_steps >= 0 &&
                     s.optimizer_steps + s.skipped_steps == s.steps_done,
                 "Trainer::restore: ", s.optimizer_steps, " steps taken and ", s.skipped_steps,
                 " skipped do not add up to ", s.steps_done, " done");
  BIGBATCH_CHECK(s.samples_done == samples_after(s.steps_done), "Trainer::restore: ",
                 s.samples_done, " samples seen, but ", s.steps_done, " steps take ",
                 samples_after(s.steps_done));
  const bool dynamic = boundary_.dynamic_state().has_value();
  BIGBATCH_CHECK(s.scaler.has_value() == dynamic, "Trainer::restore: the state ",
                 s.scaler ? "has" : "has no", " dynamic loss scaler, this run ",
                 dynamic ? "has one" : "has none");
  boundary_.restore(s.scaler, s.skipped_steps);
  steps_done_ = s.steps_done;
  samples_done_ = s.samples_done;
  optimizer_steps_ = s.optimizer_steps;
  optimizer_.set_steps_taken(s.optimizer_steps);
}

std::int64_t Trainer::samples_after(std::int64_t steps) const {
  const std::int64_t per_epoch = stream_.batches_per_epoch();
  const std::int64_t epoch_samples =
      (per_epoch - 1) * config_.batch + stream_.position(per_epoch - 1).size;
  return steps / per_epoch * epoch_samples + steps % per_epoch * config_.batch;
}

void Trainer::run(const std::function<void(const StepRecord&)>& on_step) {
  while (steps_done_ < total_steps_) {
    const StepRecord record = step();
    if (on_step) on_step(record);
  }
}

}  // namespace bigbatch::train

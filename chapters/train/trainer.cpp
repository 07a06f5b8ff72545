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

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Trainer::Trainer(nn::Network& model, nn::Optimizer& optimizer, const Dataset& data,
                 TrainConfig config, GradientSync* sync)
    : model_(model),
      optimizer_(optimizer),
      config_(config),
      stream_(data, config.batch, config.shuffle, config.seed,
              config.drop_last ? nn::LastBatch::drop : nn::LastBatch::keep_short),
      boundary_(boundary_options(config), model.device()),
      sync_(sync) {
  BIGBATCH_CHECK(config_.micro_batch >= 0 && config_.micro_batch <= config_.batch,
                 "Trainer: micro_batch must lie in [0, batch = ", config_.batch, "], got ",
                 config_.micro_batch);
  if (config_.micro_batch == 0) config_.micro_batch = config_.batch;
  model_.check_data(data);
  BIGBATCH_CHECK(config_.steps > 0 || config_.epochs > 0,
                 "Trainer: give a positive number of steps or epochs");
  BIGBATCH_CHECK(config_.warmup_steps >= 0, "Trainer: warmup_steps must be >= 0, got ",
                 config_.warmup_steps);
  // The smallest batch of the run: the epoch's last (short unless drop_last or B | N).
  this->sync().check_run(model_, stream_.position(stream_.batches_per_epoch() - 1).size);
  total_steps_ =
      config_.steps > 0 ? config_.steps : config_.epochs * stream_.batches_per_epoch();
  schedule_ = {optimizer_.learning_rate(), total_steps_, config_.warmup_steps,
               config_.lr_schedule};
  dropout_seed_ = nn::dropout_seed_for_run(config_.seed);
  // The largest micro-batch a step runs: at most its largest part of a whole batch.
  std::int64_t staged_rows = 0;
  for (const BatchPart& part : this->sync().parts(config_.batch)) {
    staged_rows = std::max(staged_rows, std::min(config_.micro_batch, part.size));
  }
  staging_.emplace(staged_rows, data, model_.device());
}

// snippet: step
StepRecord Trainer::step() {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t k = steps_done_;
  const nn::BatchPosition batch = stream_.position(k);
  sync().start_step(model_, batch.size, config_.micro_batch);
  TrackingAllocator& allocator = allocator_for(model_.device());
  allocator.reset_peak();  // this step's peak, not the run's
  const double lr = nn::lr_at(schedule_, optimizer_steps_);
  optimizer_.set_learning_rate(lr);
  model_.zero_grad();
  // The scale is constant over the step's micro-batches; it changes only at the boundary.
  const float scale = boundary_.scale();
  const nn::BatchRows rows = staging_->rows_of(stream_, k);
  // The loss of every target is divided by the count of the whole step's targets (the MLP:
  // its samples; the GPT: its tokens that are not padding), whatever the micro-batches.
  const std::int64_t targets = count_targets(stream_.data(), stream_.batch_indices(k));
  std::vector<float> losses;  // each part's share of the batch's mean loss
  for (const BatchPart& part : sync().parts(batch.size)) {
    const nn::BatchRows part_rows = [&rows, &part](std::int64_t begin, std::int64_t end) {
      return rows(part.begin + begin, part.begin + end);
    };
    // Each sample's dropout masks are keyed by its row in the run.
    const nn::ForwardContext context{true, dropout_seed_, batch.first_row + part.begin};
    losses.push_back(nn::accumulate_gradients(model_, part.size, part_rows,
                                              config_.micro_batch, context, targets, scale,
                                              sync().gradients_ready(model_), sync().tell()));
    sync().part_done(part, model_);
  }
  const auto reduce_start = std::chrono::steady_clock::now();
  const float loss = sync().reduce(model_, losses);
  double reduce_seconds = seconds_since(reduce_start) + sync().take_seconds_in_backward();
  const loss_scaling::BoundaryOutcome outcome = cross_boundary(k, batch, loss);
  if (!outcome.skipped) {
    const auto after_start = std::chrono::steady_clock::now();
    sync().after_step(model_);  // ZeRO: the ranks share their updated shards
    reduce_seconds += seconds_since(after_start);
  }
  ++steps_done_;
  samples_done_ += batch.size;
  return record_step(batch, loss, targets, lr, scale, outcome, reduce_seconds, allocator.stats(),
                     seconds_since(start));
}
// snippet end: step

loss_scaling::BoundaryOutcome Trainer::cross_boundary(std::int64_t k,
                                                      const nn::BatchPosition& batch,
                                                      float loss) {
  // In gradient_clipping.hpp's order (the object refuses any other).
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
        boundary_.unscale(sync().boundary_pieces(model_), model_.device());
    if (gradients.overflow && !scaling) {
      throw NonFiniteGradientError("step " + std::to_string(k + 1) +
                                   ": a gradient is inf or NaN (the global norm is " +
                                   std::to_string(gradients.norm) +
                                   "); without a loss scaler the step cannot be skipped, so "
                                   "the run stops before the weights are written");
    }
  }
  // 2 (an overflow: no clip, no step, the schedule stays) or 4 and 5, with lr_at(schedule_,
  // optimizer_steps_); clipping scales the gradients this process's optimizer reads.
  std::vector<Tensor> stepped;
  for (const nn::NamedParameter& p : sync().stepped_parameters(model_)) stepped.push_back(p.grad);
  const loss_scaling::BoundaryOutcome outcome = boundary_.step(stepped, optimizer_);
  if (!outcome.skipped) ++optimizer_steps_;
  boundary_.update();  // 2 (back off) or 6 (count it)
  // 7: the gradients are zeroed before the next step's first micro-batch.
  return outcome;
}

StepRecord Trainer::record_step(const nn::BatchPosition& batch, float loss,
                                std::int64_t targets, double lr, float scale,
                                const loss_scaling::BoundaryOutcome& outcome,
                                double reduce_seconds, const MemoryStats& memory,
                                double seconds) {
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
  record.memory = memory;
  if (record.memory.peak_total > largest_step_memory_.peak_total) {
    largest_step_memory_ = record.memory;
  }
  record.seconds = seconds;
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

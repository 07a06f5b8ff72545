// trainer.cpp: the training step.
#include "chapters/train/trainer.hpp"

#include <chrono>

namespace bigbatch::train {

Trainer::Trainer(nn::Model& model, nn::Optimizer& optimizer, const Dataset& data,
                 TrainConfig config)
    : model_(model),
      optimizer_(optimizer),
      config_(config),
      stream_(data, config.batch, config.shuffle, config.seed,
              config.drop_last ? nn::LastBatch::drop : nn::LastBatch::keep_short) {
  BIGBATCH_CHECK(config_.micro_batch >= 0 && config_.micro_batch <= config_.batch,
                 "Trainer: micro_batch must lie in [0, batch = ", config_.batch, "], got ",
                 config_.micro_batch);
  if (config_.micro_batch == 0) config_.micro_batch = config_.batch;
  BIGBATCH_CHECK(data.feature_dim() == model_.config().inputs, "Trainer: the data set has ",
                 data.feature_dim(), " features per sample, the model takes ",
                 model_.config().inputs);
  BIGBATCH_CHECK(config_.steps > 0 || config_.epochs > 0,
                 "Trainer: give a positive number of steps or epochs");
  BIGBATCH_CHECK(config_.warmup_steps >= 0, "Trainer: warmup_steps must be >= 0, got ",
                 config_.warmup_steps);
  total_steps_ =
      config_.steps > 0 ? config_.steps : config_.epochs * stream_.batches_per_epoch();
  schedule_ = {optimizer_.learning_rate(), total_steps_, config_.warmup_steps,
               config_.lr_schedule};
  dropout_seed_ = nn::dropout_seed_for_run(config_.seed);
  if (config_.loss_scaling == LossScaling::fixed) fixed_scaler_.emplace(config_.fixed_scale);
  if (config_.loss_scaling == LossScaling::dynamic) {
    dynamic_scaler_.emplace(config_.dynamic_scaling);
  }
  batch_features_ = Tensor({config_.batch, data.feature_dim()}, DType::f32, model_.device(),
                           MemoryCategory::data);
  batch_labels_ = Tensor({config_.batch}, DType::i32, model_.device(), MemoryCategory::data);
}

StepRecord Trainer::step() {
  const auto start = std::chrono::steady_clock::now();
  TrackingAllocator& allocator = allocator_for(model_.device());
  allocator.reset_peak();  // this step's peak, not the run's

  const std::int64_t k = steps_done_;
  const nn::BatchPosition batch = stream_.position(k);
  const Tensor x = batch_features_.rows(0, batch.size);
  const Tensor labels = batch_labels_.rows(0, batch.size);
  stream_.gather(k, x, labels);
  const double lr = nn::lr_at(schedule_, optimizer_steps_);
  optimizer_.set_learning_rate(lr);
  model_.zero_grad();
  // The scale is constant over the step's micro-batches; it changes only at the boundary.
  const float scale = fixed_scaler_     ? fixed_scaler_->scale()
                      : dynamic_scaler_ ? dynamic_scaler_->scale()
                                        : 1.0f;
  const nn::ForwardContext context{true, dropout_seed_, batch.first_row};
  const float loss = nn::accumulate_gradients(model_, x, labels, config_.micro_batch, context,
                                              /*global_count=*/batch.size, scale);
  bool overflow = false;  // the boundary: unscale, check, and (dynamic) move the scale
  if (fixed_scaler_) overflow = !fixed_scaler_->unscale_and_check(model_);
  if (dynamic_scaler_) overflow = dynamic_scaler_->unscale_and_update(model_).overflow;
  if (overflow) {
    ++skipped_steps_;  // the gradients are zeroed before the next step's first micro-batch
  } else {
    optimizer_.step();
    ++optimizer_steps_;
  }

  ++steps_done_;
  samples_done_ += batch.size;
  StepRecord record;
  record.step = steps_done_;
  record.loss = loss;
  record.batch_samples = batch.size;
  record.samples = samples_done_;
  record.epoch = static_cast<double>(batch.epoch) +
                 static_cast<double>(batch.index + 1) /
                     static_cast<double>(stream_.batches_per_epoch());
  record.learning_rate = lr;
  record.loss_scale = scale;
  record.skipped = overflow;
  record.skipped_steps = skipped_steps_;
  record.memory = allocator.stats();
  if (record.memory.peak_total > largest_step_memory_.peak_total) {
    largest_step_memory_ = record.memory;
  }
  record.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return record;
}

void Trainer::run(const std::function<void(const StepRecord&)>& on_step) {
  while (steps_done_ < total_steps_) {
    const StepRecord record = step();
    if (on_step) on_step(record);
  }
}

}  // namespace bigbatch::train

// trainer.cpp: the training step.
#include "chapters/train/trainer.hpp"

namespace bigbatch::train {

Trainer::Trainer(nn::Model& model, nn::Optimizer& optimizer, const Dataset& data,
                 TrainConfig config)
    : model_(model),
      optimizer_(optimizer),
      config_(config),
      stream_(data, config.batch, config.shuffle, config.seed) {
  BIGBATCH_CHECK(config_.micro_batch >= 0 && config_.micro_batch <= config_.batch,
                 "Trainer: micro_batch must lie in [0, batch = ", config_.batch, "], got ",
                 config_.micro_batch);
  if (config_.micro_batch == 0) config_.micro_batch = config_.batch;
  BIGBATCH_CHECK(data.feature_dim() == model_.config().inputs, "Trainer: the data set has ",
                 data.feature_dim(), " features per sample, the model takes ",
                 model_.config().inputs);
  BIGBATCH_CHECK(config_.steps > 0 || config_.epochs > 0,
                 "Trainer: give a positive number of steps or epochs");
  total_steps_ = config_.steps > 0
                     ? config_.steps
                     : (config_.epochs * data.size() + config_.batch - 1) / config_.batch;
  dropout_seed_ = nn::dropout_seed_for_run(config_.seed);
  batch_features_ = Tensor({config_.batch, data.feature_dim()}, DType::f32, model_.device(),
                           MemoryCategory::data);
  batch_labels_ = Tensor({config_.batch}, DType::i32, model_.device(), MemoryCategory::data);
}

StepRecord Trainer::step() {
  const std::int64_t k = steps_done_;
  stream_.gather(k, batch_features_, batch_labels_);
  model_.zero_grad();
  const nn::ForwardContext context{true, dropout_seed_, k * config_.batch};
  const float loss = nn::accumulate_gradients(model_, batch_features_, batch_labels_,
                                              config_.micro_batch, context);
  optimizer_.step();
  ++steps_done_;
  StepRecord record;
  record.step = steps_done_;
  record.loss = loss;
  record.samples = steps_done_ * config_.batch;
  record.peak_bytes = allocator_for(model_.device()).stats().peak;
  return record;
}

void Trainer::run(const std::function<void(const StepRecord&)>& on_step) {
  while (steps_done_ < total_steps_) {
    const StepRecord record = step();
    if (on_step) on_step(record);
  }
}

}  // namespace bigbatch::train

// run_settings.cpp: the record of a run's trajectory settings.
#include "chapters/train/run_settings.hpp"

#include <cstdint>
#include <variant>

namespace bigbatch::train {

namespace {

/// The optimizer's and the trainer's settings, after the model's.
void add_optimizer_and_trainer(SettingsRecord& record, const nn::Optimizer::Options& optimizer,
                               const TrainConfig& train) {
  record.put("optimizer", std::holds_alternative<SgdOptions>(optimizer) ? "sgd" : "adamw");
  std::visit([&record](const auto& options) { record.add(options); }, optimizer);
  record.add(train);
}

}  // namespace

SettingsRecord run_settings(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                            const TrainConfig& train) {
  SettingsRecord record;
  record.put("model", "mlp");
  record.add(model);
  add_optimizer_and_trainer(record, optimizer, train);
  if (model.norm == nn::Norm::batch) {
    const std::int64_t rows = train.micro_batch > 0 ? train.micro_batch : train.batch;
    record("micro-batch", rows, SettingRole::trajectory);
  }
  return record;
}

SettingsRecord run_settings(const nn::GptConfig& model, const nn::Optimizer::Options& optimizer,
                            const TrainConfig& train) {
  SettingsRecord record;
  record.put("model", "gpt");
  record.add(model);
  add_optimizer_and_trainer(record, optimizer, train);
  return record;
}

}  // namespace bigbatch::train

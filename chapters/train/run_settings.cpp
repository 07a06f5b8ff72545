// run_settings.cpp: the record of a run's trajectory settings.
#include "chapters/train/run_settings.hpp"

#include <cstdint>
#include <variant>

namespace bigbatch::train {

SettingsRecord run_settings(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                            const TrainConfig& train) {
  SettingsRecord record;
  record.add(model);
  record.put("optimizer", std::holds_alternative<SgdOptions>(optimizer) ? "sgd" : "adamw");
  std::visit([&record](const auto& options) { record.add(options); }, optimizer);
  record.add(train);
  if (model.norm == nn::Norm::batch) {
    const std::int64_t rows = train.micro_batch > 0 ? train.micro_batch : train.batch;
    record("micro-batch", rows, SettingRole::trajectory);
  }
  return record;
}

}  // namespace bigbatch::train

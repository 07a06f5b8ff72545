// run_settings.hpp: the settings a snapshot records and a resumed run must repeat,
// derived from the typed configurations (common/settings.hpp), not listed by hand.
//
// Every field of ModelConfig (or GptConfig), the optimizer's options and TrainConfig is
// classified beside its declaration; the trajectory ones are recorded here, by name, as
// text ("batch" -> "64"). One rule depends on two configurations and lives here: the
// micro-batch is recorded under BatchNorm (each micro-batch normalises with its own
// statistics), not under LayerNorm (accumulation gives the batch's bits).
#pragma once

#include <map>
#include <string>

#include "chapters/train/trainer.hpp"
#include "common/settings.hpp"
#include "nn/gpt.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::train {

/// The settings a run's trajectory depends on, by name ("batch" -> "64"). A snapshot
/// continues only under the same ones.
using RunConfig = std::map<std::string, std::string>;

/// The trajectory settings of a run of this model, optimizer and trainer configuration
/// (with "model": "mlp" or "gpt", and "optimizer": "sgd" or "adamw"). A program adds its own
/// (the data, the device).
SettingsRecord run_settings(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                            const TrainConfig& train);
/// The same for chapter 08's GPT.
SettingsRecord run_settings(const nn::GptConfig& model, const nn::Optimizer::Options& optimizer,
                            const TrainConfig& train);

}  // namespace bigbatch::train

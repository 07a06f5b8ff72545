// test_run_settings.cpp: the resume contract is derived from the configurations
// (common/settings.hpp, chapters/train/run_settings.hpp), so it cannot forget a setting.
//   - The check that every field is classified can fail: a struct whose visitor misses a
//     field is caught at compile time (the headers assert it for every real configuration).
//   - Every field classified as a trajectory setting reaches the record: changing it alone
//     changes the record under its name, and a snapshot written before the change refuses
//     the resume, naming it. Every field classified otherwise leaves the record unchanged.
//   - The micro-batch is recorded under BatchNorm only.
//   - The same for chapter 08's GPT, whose record names the model ("model": "gpt"), so that
//     a resume of another model's snapshot is refused by that setting first.
#include <gtest/gtest.h>

#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "chapters/train/run_settings.hpp"
#include "chapters/train/snapshot.hpp"
#include "common/data/text_corpus.hpp"
#include "nn/gpt.hpp"
#include "tests/temp_files.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

// ---- the classification check itself ---------------------------------------------------

struct Classified {
  int a = 0;
  double b = 0;
};
struct OneForgotten {  // c was added to the struct but not to its visitor
  int a = 0;
  double b = 0;
  bool c = false;
};

template <SettingsOf<Classified> Self, class Visit>
constexpr void visit_settings(Self& s, Visit&& visit) {
  visit("a", s.a, SettingRole::trajectory);
  visit("b", s.b, SettingRole::watch_only);
}
template <SettingsOf<OneForgotten> Self, class Visit>
constexpr void visit_settings(Self& s, Visit&& visit) {
  visit("a", s.a, SettingRole::trajectory);
  visit("b", s.b, SettingRole::watch_only);
}

// Checked when the test runs (the values are computed at compile time), so that a plant
// that breaks the check fails this test rather than the build.
TEST(RunSettings, AFieldLeftOutOfItsVisitorIsSeen) {
  EXPECT_EQ(field_count<OneForgotten>(), 3u);
  EXPECT_EQ(settings_visited<OneForgotten>(), 2u);
  EXPECT_TRUE(every_field_visited<Classified>());
  EXPECT_FALSE(every_field_visited<OneForgotten>()) << "a forgotten field must be seen";
  // The real configurations' fields are counted right (their headers assert the rest).
  EXPECT_EQ(field_count<train::TrainConfig>(), 13u);
  EXPECT_EQ(field_count<nn::ModelConfig>(), 10u);
}

// ---- every trajectory setting reaches the record ---------------------------------------

/// Changes a setting's value: variant 0 halves a real (0 becomes 0.5) and adds 1 to a
/// whole number, variant 1 doubles a real and adds 1, and adds 2 to a whole number (a
/// range check refuses one of them, not both); a flag flips, an enumeration swaps 0 and 1.
template <class T>
void perturb(T& value, int variant) {
  if constexpr (std::is_same_v<T, bool>) {
    value = !value;
  } else if constexpr (std::is_enum_v<T>) {  // every enumeration here has values 0 and 1
    value = static_cast<T>(static_cast<int>(value) == 0 ? 1 : 0);
  } else if constexpr (std::is_floating_point_v<T>) {
    value = variant == 0 ? (value == 0 ? T(0.5) : value / 2) : value * 2 + 1;
  } else if constexpr (std::is_integral_v<T>) {
    value = value + 1 + variant;
  }
}

struct Setting {
  std::string name;
  SettingRole role;
  bool group;  // a nested configuration (perturbed field by field on its own)
};

template <class Config>
std::vector<Setting> settings_of(const Config& config) {
  std::vector<Setting> settings;
  visit_settings(config, [&](std::string_view name, const auto& value, SettingRole role) {
    settings.push_back({std::string(name), role, SettingsGroup<std::decay_t<decltype(value)>>});
  });
  return settings;
}

/// `config` with its k-th setting changed (perturb's variant).
template <class Config>
Config with_setting_changed(Config config, std::size_t k, int variant = 0) {
  std::size_t i = 0;
  visit_settings(config, [&](std::string_view, auto& value, SettingRole) {
    if (i++ == k) {
      if constexpr (!SettingsGroup<std::decay_t<decltype(value)>>) perturb(value, variant);
    }
  });
  return config;
}

nn::ModelConfig base_model() { return testing::tiny_model(2, 0.0f); }
train::TrainConfig base_train() {
  train::TrainConfig c;
  c.batch = 32;
  c.steps = 2;
  c.loss_scaling = train::LossScaling::dynamic;
  c.seed = base_model().seed;  // the program gives the model and the trainer one seed
  return c;
}
const nn::Optimizer::Options kAdamW = AdamWOptions{};
const nn::Optimizer::Options kSgd = SgdOptions{.lr = 0.05, .momentum = 0.9};

using Record = std::map<std::string, std::string>;

Record record_of(const nn::ModelConfig& model, const nn::Optimizer::Options& optimizer,
                 const train::TrainConfig& train) {
  return train::run_settings(model, optimizer, train).values();
}

/// The record with the trainer's setting k changed (a changed seed is the model's too: the
/// program gives both one seed).
Record record_with_train_setting_changed(const nn::ModelConfig& model,
                                         const train::TrainConfig& train, std::size_t k) {
  const train::TrainConfig changed = with_setting_changed(train, k);
  nn::ModelConfig same_seed = model;
  same_seed.seed = changed.seed;
  return record_of(same_seed, kAdamW, changed);
}

/// Checks, setting by setting, that a change of a trajectory setting changes the record at
/// its name (and only there), and a change of any other leaves the record as it was.
/// `changed(k)` is the record with setting k of the configuration changed.
template <class Changed>
void expect_only_trajectory_settings_recorded(const std::vector<Setting>& settings,
                                              const Record& base, Changed&& changed) {
  for (std::size_t k = 0; k < settings.size(); ++k) {
    const Setting& s = settings[k];
    if (s.group) continue;
    const Record record = changed(k);
    if (s.role == SettingRole::trajectory) {
      ASSERT_EQ(record.count(s.name), 1u) << s.name << " is not recorded";
      EXPECT_NE(record.at(s.name), base.at(s.name)) << s.name << ": a change is not recorded";
      Record others = record;
      others[s.name] = base.at(s.name);
      // The one documented dependence: BatchNorm makes the micro-batch a trajectory setting.
      if (s.name == "norm") others.erase("micro-batch");
      EXPECT_EQ(others, base) << "changing " << s.name << " changed other settings";
    } else {
      EXPECT_EQ(record, base) << s.name << " is not a trajectory setting but is recorded";
    }
  }
}

TEST(RunSettings, EveryTrajectorySettingOfTheModelIsRecorded) {
  const nn::ModelConfig model = base_model();
  const train::TrainConfig train = base_train();
  const Record base = record_of(model, kAdamW, train);
  const std::vector<Setting> settings = settings_of(model);
  ASSERT_EQ(settings.size(), field_count<nn::ModelConfig>());
  expect_only_trajectory_settings_recorded(settings, base, [&](std::size_t k) {
    const nn::ModelConfig changed = with_setting_changed(model, k);
    train::TrainConfig same_seed = train;
    same_seed.seed = changed.seed;  // the program gives both one seed
    return record_of(changed, kAdamW, same_seed);
  });
}

TEST(RunSettings, EveryTrajectorySettingOfTheTrainerAndTheScalerIsRecorded) {
  const nn::ModelConfig model = base_model();
  const train::TrainConfig train = base_train();
  const Record base = record_of(model, kAdamW, train);
  const std::vector<Setting> settings = settings_of(train);
  ASSERT_EQ(settings.size(), field_count<train::TrainConfig>());
  expect_only_trajectory_settings_recorded(settings, base, [&](std::size_t k) {
    return record_with_train_setting_changed(model, train, k);
  });
  const std::vector<Setting> scaler = settings_of(train.dynamic_scaling);
  ASSERT_EQ(scaler.size(), field_count<loss_scaling::DynamicScalerOptions>());
  expect_only_trajectory_settings_recorded(scaler, base, [&](std::size_t k) {
    train::TrainConfig changed = train;
    changed.dynamic_scaling = with_setting_changed(train.dynamic_scaling, k);
    return record_of(model, kAdamW, changed);
  });
}

TEST(RunSettings, EveryTrajectorySettingOfBothOptimizersIsRecorded) {
  const nn::ModelConfig model = base_model();
  const train::TrainConfig train = base_train();
  const SgdOptions sgd = std::get<SgdOptions>(kSgd);
  const AdamWOptions adamw = std::get<AdamWOptions>(kAdamW);
  const Record sgd_base = record_of(model, sgd, train);
  const Record adamw_base = record_of(model, adamw, train);
  EXPECT_EQ(sgd_base.at("optimizer"), "sgd");
  EXPECT_EQ(adamw_base.at("optimizer"), "adamw");
  ASSERT_EQ(settings_of(sgd).size(), field_count<SgdOptions>());
  expect_only_trajectory_settings_recorded(settings_of(sgd), sgd_base, [&](std::size_t k) {
    return record_of(model, with_setting_changed(sgd, k), train);
  });
  ASSERT_EQ(settings_of(adamw).size(), field_count<AdamWOptions>());
  expect_only_trajectory_settings_recorded(settings_of(adamw), adamw_base, [&](std::size_t k) {
    return record_of(model, with_setting_changed(adamw, k), train);
  });
}

// The GPT: every field of its shape, dropout and precision the same way.
nn::GptConfig base_gpt() {
  return {.vocabulary = 256, .context = 8, .layers = 1, .width = 16, .heads = 2,
          .dropout = 0.25f, .seed = base_model().seed, .precision = nn::Precision::fp32};
}

Record gpt_record_of(const nn::GptConfig& model, const train::TrainConfig& train) {
  return train::run_settings(model, kAdamW, train).values();
}

TEST(RunSettings, EveryTrajectorySettingOfTheGptIsRecorded) {
  const nn::GptConfig model = base_gpt();
  const train::TrainConfig train = base_train();
  const Record base = gpt_record_of(model, train);
  EXPECT_EQ(base.at("model"), "gpt");
  EXPECT_EQ(record_of(base_model(), kAdamW, train).at("model"), "mlp");
  const std::vector<Setting> settings = settings_of(model);
  ASSERT_EQ(settings.size(), field_count<nn::GptConfig>());
  expect_only_trajectory_settings_recorded(settings, base, [&](std::size_t k) {
    const nn::GptConfig changed = with_setting_changed(model, k);
    train::TrainConfig same_seed = train;
    same_seed.seed = changed.seed;  // the program gives both one seed
    return gpt_record_of(changed, same_seed);
  });
}

TEST(RunSettings, TheMicroBatchIsRecordedUnderBatchNormOnly) {
  nn::ModelConfig model = base_model();
  train::TrainConfig train = base_train();
  train::TrainConfig smaller = train;
  smaller.micro_batch = 8;
  EXPECT_EQ(record_of(model, kAdamW, train), record_of(model, kAdamW, smaller))
      << "under LayerNorm accumulation gives the batch's bits: the micro-batch is free";
  model.norm = nn::Norm::batch;
  const Record whole = record_of(model, kAdamW, train);
  EXPECT_EQ(whole.at("micro-batch"), "32") << "0 is the whole batch";
  EXPECT_EQ(record_of(model, kAdamW, smaller).at("micro-batch"), "8");
}

TEST(RunSettings, ASettingRecordedTwiceMustAgree) {
  nn::ModelConfig model = base_model();
  model.seed = 1;  // the trainer's is 0
  EXPECT_THROW(record_of(model, kAdamW, base_train()), std::logic_error);
}

TEST(RunSettings, NumbersAreWrittenExactlyAndReadably) {
  EXPECT_EQ(setting_text(0.1), "0.1");
  EXPECT_EQ(setting_text(0.1f), "0.1");  // a float's own shortest text, not its double's
  EXPECT_EQ(setting_text(65536.0f), "65536");
  EXPECT_EQ(setting_text(std::int64_t{-3}), "-3");
  EXPECT_EQ(setting_text(true), "on");
}

// ---- the classification against the runs themselves ------------------------------------

/// What a run's trajectory is: the parameters and the optimizer's state after the last
/// step, and each step's scale and verdict. (Not the recorded loss: it adds the
/// micro-batches' losses in their order, so its last bits follow the micro-batch; the
/// gradients, and so the parameters, do not.)
struct Trajectory {
  std::vector<std::vector<float>> state;
  std::vector<std::pair<float, bool>> steps;  // loss scale, skipped
  bool operator==(const Trajectory&) const = default;
};

Trajectory trajectory_of(const nn::ModelConfig& model_config,
                         const nn::Optimizer::Options& options,
                         const train::TrainConfig& config) {
  const Dataset data = testing::tiny_data(40);
  nn::Model model(model_config, Device::cpu());
  nn::Optimizer optimizer(model.parameters(), options);
  train::Trainer trainer(model, optimizer, data, config);
  Trajectory t;
  trainer.run([&](const train::StepRecord& r) { t.steps.emplace_back(r.loss_scale, r.skipped); });
  for (const auto& [name, tensor] : model.state_dict()) {
    t.state.push_back(tensor.to_vector<float>());
  }
  for (const auto& [name, tensor] : optimizer.state()) t.state.push_back(tensor.to_vector<float>());
  return t;
}

/// The independent check of a classification: a setting whose change alone moves the
/// trajectory must be a trajectory setting (the record cannot miss it), and one classified
/// as giving the same bits must give them. (A trajectory setting may happen not to move
/// this small run: the rule runs one way.)
template <class Config, class Run>
void expect_classification_matches_the_runs(const Config& config, Run&& run) {
  const Trajectory base = run(config);
  ASSERT_EQ(base.steps.size(), 3u);
  const std::vector<Setting> settings = settings_of(config);
  for (std::size_t k = 0; k < settings.size(); ++k) {
    const Setting& s = settings[k];
    if (s.group || s.role == SettingRole::implied) continue;  // implied: the data decides
    std::optional<Trajectory> changed;
    for (int variant = 0; variant < 2 && !changed; ++variant) {
      try {
        changed = run(with_setting_changed(config, k, variant));
      } catch (const std::invalid_argument&) {  // out of its range: the other variant
      }
    }
    ASSERT_TRUE(changed) << s.name << ": neither change is a valid setting";
    const bool moved = *changed != base;
    if (moved) {
      EXPECT_EQ(s.role, SettingRole::trajectory) << s.name << " changes the run's bits";
    }
    if (s.role == SettingRole::same_bits) {
      EXPECT_FALSE(moved) << s.name << " is classified as giving the same bits";
    }
  }
}

// The run: fp16 (so the loss scale matters) with dynamic scaling from 2^20, which
// overflows f16 at first and then trains (the scaler's and the optimizer's settings move
// the run), dropout (the seed moves it), a warm-up, clipping that engages, batches of 12
// from 40 samples.
nn::ModelConfig moving_model() {
  nn::ModelConfig c = testing::tiny_model(1, 0.25f);
  c.precision = nn::Precision::fp16;
  return c;
}
train::TrainConfig moving_train() {
  train::TrainConfig c;
  c.batch = 12;
  c.steps = 3;
  c.seed = moving_model().seed;
  c.warmup_steps = 2;
  c.clip_grad_norm = 0.05f;
  c.loss_scaling = train::LossScaling::dynamic;
  c.dynamic_scaling = {.initial_scale = 0x1p20f, .growth_interval = 1, .max_scale = 0x1p24f};
  return c;
}

TEST(RunSettings, TheRunThatChecksTheClassificationSkipsAndTakesSteps) {
  const Trajectory t = trajectory_of(moving_model(), AdamWOptions{}, moving_train());
  ASSERT_EQ(t.steps.size(), 3u);
  EXPECT_TRUE(t.steps.front().second) << "the first step must overflow: the scale matters";
  EXPECT_FALSE(t.steps.back().second) << "the last must be taken: the optimizer matters";
}

TEST(RunSettings, TheTrainersClassificationMatchesWhatMovesARun) {
  expect_classification_matches_the_runs(moving_train(), [](train::TrainConfig c) {
    nn::ModelConfig model = moving_model();
    model.seed = c.seed;
    return trajectory_of(model, AdamWOptions{}, c);
  });
  expect_classification_matches_the_runs(moving_train().dynamic_scaling,
                                         [](const loss_scaling::DynamicScalerOptions& d) {
                                           train::TrainConfig c = moving_train();
                                           c.dynamic_scaling = d;
                                           return trajectory_of(moving_model(), AdamWOptions{}, c);
                                         });
}

TEST(RunSettings, TheModelsAndOptimizersClassificationMatchesWhatMovesARun) {
  expect_classification_matches_the_runs(moving_model(), [](nn::ModelConfig m) {
    train::TrainConfig c = moving_train();
    c.seed = m.seed;
    return trajectory_of(m, AdamWOptions{}, c);
  });
  expect_classification_matches_the_runs(AdamWOptions{}, [](const AdamWOptions& o) {
    return trajectory_of(moving_model(), o, moving_train());
  });
  expect_classification_matches_the_runs(SgdOptions{.lr = 0.05, .momentum = 0.5},
                                         [](const SgdOptions& o) {
                                           return trajectory_of(moving_model(), o, moving_train());
                                         });
}

/// A GPT's trajectory: 3 AdamW steps of batch 6 on token sequences of 8 positions.
Trajectory gpt_trajectory_of(const nn::GptConfig& config) {
  const Dataset data = make_token_dataset(
      make_sequences(synthetic_documents(12, 2, 20, /*seed=*/7), 8), "synthetic-text");
  nn::Gpt model(config, Device::cpu());
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  train::TrainConfig c;
  c.batch = 6;
  c.steps = 3;
  c.seed = config.seed;
  train::Trainer trainer(model, optimizer, data, c);
  Trajectory t;
  trainer.run([&](const train::StepRecord& r) { t.steps.emplace_back(r.loss_scale, r.skipped); });
  for (const auto& [name, tensor] : model.state_dict()) {
    t.state.push_back(tensor.to_vector<float>());
  }
  return t;
}

TEST(RunSettings, TheGptsClassificationMatchesWhatMovesARun) {
  // Nothing of the GPT's is decided by the data (the vocabulary is --vocabulary), so no
  // setting may pass the check below unchecked as implied.
  for (const Setting& s : settings_of(base_gpt())) {
    EXPECT_NE(s.role, SettingRole::implied) << s.name;
  }
  expect_classification_matches_the_runs(base_gpt(), gpt_trajectory_of);
}

// ---- and a snapshot refuses a resume under any changed one ------------------------------

TEST(RunSettings, ASnapshotRefusesAResumeUnderAnyChangedTrajectorySetting) {
  const nn::ModelConfig model = base_model();
  const train::TrainConfig train = base_train();
  const Dataset data = testing::tiny_data(64);
  nn::Model net(model, Device::cpu());
  nn::Optimizer optimizer(net.parameters(), kAdamW);
  train::Trainer trainer(net, optimizer, data, train);
  trainer.step();
  const testing::TemporaryDirectory folder;
  const Record base = record_of(model, kAdamW, train);
  const std::string path = train::Snapshots(folder.str(), 1).write(net, optimizer, trainer, base);

  std::vector<Record> changed_records;
  const std::vector<Setting> settings = settings_of(train);
  for (std::size_t k = 0; k < settings.size(); ++k) {
    const Record record = record_with_train_setting_changed(model, train, k);
    if (record == base) continue;  // micro-batch, and the scaler group itself
    SCOPED_TRACE(settings[k].name);
    try {
      train::restore_snapshot(path, net, optimizer, trainer, record);
      ADD_FAILURE() << "a resume with " << settings[k].name << " changed was accepted";
    } catch (const train::SnapshotMismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("--" + settings[k].name + " "), std::string::npos)
          << e.what();
    }
  }
  // The snapshot still resumes under its own settings.
  EXPECT_NO_THROW(train::restore_snapshot(path, net, optimizer, trainer, base));
}

TEST(RunSettings, AnotherModelsSnapshotIsRefusedByTheModelFirst) {
  // A GPT's snapshot, resumed by an MLP's run: the two records differ in most settings
  // ("activation" sorts before "model"), and the refusal names the model.
  const train::TrainConfig train = base_train();
  const Dataset tokens = make_token_dataset(
      make_sequences(synthetic_documents(8, 2, 20, /*seed=*/7), 8), "synthetic-text");
  nn::Gpt gpt(base_gpt(), Device::cpu());
  nn::Optimizer gpt_optimizer(gpt.parameters(), kAdamW);
  train::Trainer gpt_trainer(gpt, gpt_optimizer, tokens, train);
  const testing::TemporaryDirectory folder;
  const std::string path = train::Snapshots(folder.str(), 1)
                               .write(gpt, gpt_optimizer, gpt_trainer,
                                      gpt_record_of(base_gpt(), train));
  const Dataset data = testing::tiny_data(64);
  nn::Model mlp(base_model(), Device::cpu());
  nn::Optimizer optimizer(mlp.parameters(), kAdamW);
  train::Trainer trainer(mlp, optimizer, data, train);
  try {
    train::restore_snapshot(path, mlp, optimizer, trainer, record_of(base_model(), kAdamW, train));
    ADD_FAILURE() << "an MLP resumed a GPT's snapshot";
  } catch (const train::SnapshotMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("written with --model gpt, this run has --model mlp"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace bigbatch

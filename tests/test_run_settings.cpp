// test_run_settings.cpp: the resume contract is derived from the configurations
// (common/settings.hpp, chapters/train/run_settings.hpp), so it cannot forget a setting.
//   - The check that every field is classified can fail: a struct whose visitor misses a
//     field is caught at compile time (the headers assert it for every real configuration).
//   - Every field classified as a trajectory setting reaches the record: changing it alone
//     changes the record under its name, and a snapshot written before the change refuses
//     the resume, naming it. Every field classified otherwise leaves the record unchanged.
//   - The micro-batch is recorded under BatchNorm only.
#include <gtest/gtest.h>

#include <concepts>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "chapters/train/run_settings.hpp"
#include "chapters/train/snapshot.hpp"
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

static_assert(field_count<OneForgotten>() == 3);
static_assert(settings_visited<OneForgotten>() == 2);
static_assert(every_field_visited<Classified>());
static_assert(!every_field_visited<OneForgotten>(), "a forgotten field must be seen");
// The real configurations' fields are counted right (the headers assert the rest).
static_assert(field_count<train::TrainConfig>() == 13);
static_assert(field_count<nn::ModelConfig>() == 10);

// ---- every trajectory setting reaches the record ---------------------------------------

/// Changes a setting's value to another valid one.
template <class T>
void perturb(T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    value = !value;
  } else if constexpr (std::is_enum_v<T>) {  // every enumeration here has values 0 and 1
    value = static_cast<T>(static_cast<int>(value) == 0 ? 1 : 0);
  } else if constexpr (std::is_floating_point_v<T>) {
    value = value * 2 + 1;
  } else if constexpr (std::is_integral_v<T>) {
    value = value + 1;
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

/// `config` with its k-th setting changed.
template <class Config>
Config with_setting_changed(Config config, std::size_t k) {
  std::size_t i = 0;
  visit_settings(config, [&](std::string_view, auto& value, SettingRole) {
    if (i++ == k) {
      if constexpr (!SettingsGroup<std::decay_t<decltype(value)>>) perturb(value);
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

}  // namespace
}  // namespace bigbatch

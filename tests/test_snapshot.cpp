// test_snapshot.cpp: chapters/train/snapshot.hpp in one process. A run stopped after any
// step (steps 1 to 5 are skipped by the scaler, most later ones taken), written to a
// snapshot and continued by fresh objects from it, must end where the
// uninterrupted run ends, to the bit: parameters, optimizer state, counters, and every
// later step's record, with accumulation over uneven micro-batches, fp16 with dynamic loss
// scaling (skipped steps included), clipping, a warm-up and cosine schedule, dropout and
// activation checkpointing on. A changed setting is refused by name; the folder keeps the
// newest snapshots; a damaged file (cut short, or a bit flipped in any tensor) is refused
// and changes nothing; a folder has one writer at a time. (The CLI's tests kill real
// processes: tests/cli/check_resume.sh, check_snapshot_trust.sh.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/train/snapshot.hpp"
#include "tests/harness.hpp"
#include "tests/temp_files.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using train::RunConfig;
using train::Snapshots;

constexpr std::int64_t kSteps = 12;

/// One run's objects, built the same way every time.
struct TinyRun {
  Dataset data = testing::tiny_data(100);
  nn::Model model;
  nn::Optimizer optimizer;
  train::Trainer trainer;

  static nn::ModelConfig model_config() {
    nn::ModelConfig config = testing::tiny_model(4, 0.25f);
    config.precision = nn::Precision::fp16;
    return config;
  }
  static train::TrainConfig train_config(std::int64_t hysteresis, float initial_scale) {
    train::TrainConfig c;
    c.batch = 32;
    c.micro_batch = 7;
    c.steps = kSteps;
    c.lr_schedule = nn::LrScheduleKind::cosine;
    c.warmup_steps = 3;
    c.clip_grad_norm = 0.5f;
    c.loss_scaling = train::LossScaling::dynamic;
    // 2^24 overflows f16 at first: the first steps are skipped and the scale backs off.
    c.dynamic_scaling = {.initial_scale = initial_scale, .growth_interval = 3,
                         .hysteresis = hysteresis, .min_scale = 1, .max_scale = 0x1p24f};
    return c;
  }
  /// hysteresis > 1: overflows in a row before a backoff, so a snapshot can fall between
  /// two of them, with the scaler's overflow counter above 0.
  explicit TinyRun(std::int64_t hysteresis = 1, float initial_scale = 0x1p24f)
      : model(model_config(), Device::cpu()),
        optimizer(model.parameters(), AdamWOptions{}),
        trainer(model, optimizer, data, train_config(hysteresis, initial_scale)) {
    model.set_block_runner(checkpointing::ScheduledRunner::for_policy(checkpointing::Policy::parse("sqrt"), 4));
  }
};

const RunConfig kConfig = {{"batch", "32"}, {"precision", "fp16"}, {"seed", "0"}};

std::vector<std::vector<float>> everything(const TinyRun& run) {
  std::vector<std::vector<float>> values;
  for (const auto& [name, tensor] : run.model.state_dict()) values.push_back(tensor.to_vector<float>());
  for (const nn::NamedParameter& p : run.model.parameters()) {
    if (p.half.defined()) {
      const std::vector<double> half = testing::to_doubles(p.half);
      values.emplace_back(half.begin(), half.end());  // f16 values are exact in float
    }
  }
  for (const auto& [name, tensor] : run.optimizer.state()) values.push_back(tensor.to_vector<float>());
  return values;
}

/// What a step record says that depends neither on the clock nor on what else the
/// process holds (the memory figures: the CLI's test compares them), the norm by its bits
/// (a skipped step's is NaN, which == would never match).
std::vector<double> record_values(const train::StepRecord& r) {
  return {static_cast<double>(r.step), r.loss, static_cast<double>(r.samples), r.epoch,
          r.learning_rate, r.loss_scale, static_cast<double>(r.skipped),
          static_cast<double>(std::bit_cast<std::uint32_t>(r.grad_norm)), r.clip_factor,
          static_cast<double>(r.skipped_steps)};
}

/// Stops a run after each of several steps, snapshots it and resumes it in fresh objects;
/// each must end where the uninterrupted run ends. Returns the counters at each stop.
std::vector<train::TrainerState> expect_resumed_runs_end_as_the_straight_one(
    std::int64_t hysteresis, float initial_scale) {
  std::vector<train::TrainerState> at_stops;
  TinyRun straight(hysteresis, initial_scale);
  std::vector<std::vector<double>> straight_records;
  straight.trainer.run(
      [&](const train::StepRecord& r) { straight_records.push_back(record_values(r)); });
  EXPECT_GT(straight.trainer.state().skipped_steps, 0) << "the test needs skipped steps";

  for (const std::int64_t stop : {1, 2, 5, 7, 9, 11}) {  // after skipped and taken steps
    const testing::TemporaryDirectory folder;
    std::string path;
    {
      TinyRun first(hysteresis, initial_scale);
      for (std::int64_t k = 0; k < stop; ++k) first.trainer.step();
      at_stops.push_back(first.trainer.state());
      path = Snapshots(folder.str(), 2).write(first.model, first.optimizer, first.trainer,
                                              kConfig);
    }  // the first process is gone
    TinyRun resumed(hysteresis, initial_scale);
    train::restore_snapshot(path, resumed.model, resumed.optimizer, resumed.trainer, kConfig);
    EXPECT_EQ(resumed.trainer.steps_done(), stop);
    std::vector<std::vector<double>> records;
    resumed.trainer.run([&](const train::StepRecord& r) { records.push_back(record_values(r)); });
    EXPECT_EQ(everything(resumed), everything(straight)) << "stopped after step " << stop;
    const train::TrainerState a = resumed.trainer.state(), b = straight.trainer.state();
    EXPECT_EQ(std::vector<std::int64_t>({a.steps_done, a.samples_done, a.optimizer_steps,
                                         a.skipped_steps, a.scaler->clean_run,
                                         a.scaler->overflow_run, a.scaler->skipped}),
              std::vector<std::int64_t>({b.steps_done, b.samples_done, b.optimizer_steps,
                                         b.skipped_steps, b.scaler->clean_run,
                                         b.scaler->overflow_run, b.scaler->skipped}));
    EXPECT_EQ(a.scaler->scale, b.scaler->scale);
    EXPECT_EQ(records, std::vector<std::vector<double>>(straight_records.begin() + stop,
                                                        straight_records.end()))
        << "stopped after step " << stop;
  }
  return at_stops;
}

TEST(Snapshot, AResumedRunIsTheUninterruptedOneBitForBit) {
  expect_resumed_runs_end_as_the_straight_one(1, 0x1p24f);
}

TEST(Snapshot, EveryCounterASnapshotRestoresIsExercisedAwayFromItsDefault) {
  // Hysteresis 3 from 2^20, one backoff above the scale this model's f16 gradients take
  // (2^19, as the run above finds): snapshots fall between overflows (overflow_run 1 or 2),
  // between growths (clean_run 1 or 2) and after backoffs (a scale below the initial one),
  // so that every counter the snapshot carries takes a value other than its start in some
  // stop.
  const std::vector<train::TrainerState> stops =
      expect_resumed_runs_end_as_the_straight_one(3, 0x1p20f);
  const auto some = [&](auto&& holds) { return std::any_of(stops.begin(), stops.end(), holds); };
  using S = const train::TrainerState&;
  EXPECT_TRUE(some([](S s) { return s.steps_done > 0 && s.samples_done > 0; }));
  EXPECT_TRUE(some([](S s) { return s.optimizer_steps > 0 && s.skipped_steps > 0; }));
  EXPECT_TRUE(some([](S s) { return s.scaler->overflow_run > 0; })) << "no stop mid-hysteresis";
  EXPECT_TRUE(some([](S s) { return s.scaler->clean_run > 0; }));
  EXPECT_TRUE(some([](S s) { return s.scaler->skipped > 0; }));
  EXPECT_TRUE(some([](S s) { return s.scaler->scale < 0x1p24f; }));
}

/// The snapshot of a run after its first step, written in `folder`.
std::string snapshot_after_one_step(const testing::TemporaryDirectory& folder) {
  TinyRun first;
  first.trainer.step();
  return Snapshots(folder.str(), 1).write(first.model, first.optimizer, first.trainer, kConfig);
}

TEST(Snapshot, AChangedSettingIsRefusedByName) {
  const testing::TemporaryDirectory folder;
  const std::string path = snapshot_after_one_step(folder);
  TinyRun other;
  const auto before = everything(other);
  RunConfig changed = kConfig;
  changed["batch"] = "64";
  try {
    train::restore_snapshot(path, other.model, other.optimizer, other.trainer, changed);
    FAIL() << "a snapshot of batch 32 resumed a run of batch 64";
  } catch (const train::SnapshotMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("--batch 32, this run has --batch 64"),
              std::string::npos) << e.what();
  }
  RunConfig extra = kConfig;
  extra["depth"] = "4";
  EXPECT_THROW(train::restore_snapshot(path, other.model, other.optimizer, other.trainer, extra),
               train::SnapshotMismatchError);
  RunConfig fewer = kConfig;
  fewer.erase("seed");
  EXPECT_THROW(train::restore_snapshot(path, other.model, other.optimizer, other.trainer, fewer),
               train::SnapshotMismatchError);
  EXPECT_EQ(everything(other), before);
  EXPECT_EQ(other.trainer.steps_done(), 0);
}

// A setting the caller allows to change (the CLI's ranks) resumes with another value and
// is returned with the snapshot's, for the caller to report; missing on one side, it is
// still refused.
TEST(Snapshot, ASettingAllowedToChangeIsReturnedNotRefused) {
  const testing::TemporaryDirectory folder;
  const std::string path = snapshot_after_one_step(folder);
  TinyRun other;
  RunConfig changed = kConfig;
  changed["batch"] = "64";
  const RunConfig returned =
      train::restore_snapshot(path, other.model, other.optimizer, other.trainer, changed, {"batch"});
  EXPECT_EQ(returned, (RunConfig{{"batch", kConfig.at("batch")}}));
  EXPECT_EQ(other.trainer.steps_done(), 1);
  EXPECT_TRUE(train::restore_snapshot(path, other.model, other.optimizer, other.trainer, kConfig,
                                      {"batch"})
                  .empty())
      << "nothing changed, nothing returned";
  RunConfig fewer = kConfig;
  fewer.erase("batch");
  EXPECT_THROW(train::restore_snapshot(path, other.model, other.optimizer, other.trainer, fewer,
                                       {"batch"}),
               train::SnapshotMismatchError);
}

TEST(Snapshot, TheFolderKeepsTheNewestAndForgetsPartialWrites) {
  const testing::TemporaryDirectory folder;
  const Snapshots snapshots(folder.str(), 2);
  EXPECT_FALSE(snapshots.latest());
  // A write killed midway: a temporary file that nothing names.
  testing::write_file(folder.file("step-00000003.safetensors.tmp"), "partial");
  TinyRun run;
  for (int k = 0; k < 4; ++k) {
    run.trainer.step();
    snapshots.write(run.model, run.optimizer, run.trainer, kConfig);
  }
  const std::vector<train::SnapshotFile> files = snapshots.list();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].step, 3);
  EXPECT_EQ(files[1].step, 4);
  EXPECT_EQ(snapshots.latest()->path, folder.file("step-00000004.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(folder.file("step-00000003.safetensors.tmp")));
}

TEST(Snapshot, KeepingTheNewestNeverRemovesTheFileJustWritten) {
  const testing::TemporaryDirectory folder;
  // Another run's later step in the folder. `bigbatch train` refuses such a folder before
  // training; the folder must not delete what it writes even so, nor the other file.
  const std::string other = folder.file("step-00000120.safetensors");
  testing::write_file(other, "another run's");
  const Snapshots snapshots(folder.str(), 1);
  TinyRun run;
  run.trainer.step();
  const std::string first = snapshots.write(run.model, run.optimizer, run.trainer, kConfig);
  EXPECT_TRUE(std::filesystem::exists(first)) << "keep 1 removed the snapshot just written";
  run.trainer.step();
  const std::string second = snapshots.write(run.model, run.optimizer, run.trainer, kConfig);
  EXPECT_TRUE(std::filesystem::exists(second));
  EXPECT_FALSE(std::filesystem::exists(first)) << "keep 1: the older of the run's two stays";
  EXPECT_EQ(testing::read_file(other), "another run's");
}

TEST(Snapshot, ADamagedFileIsRefusedAndChangesNothing) {
  const testing::TemporaryDirectory folder;
  const std::string path = snapshot_after_one_step(folder);
  const std::string bytes = testing::read_file(path);
  testing::write_file(path, bytes.substr(0, bytes.size() - 100));  // cut short
  TinyRun other;
  const auto before = everything(other);
  try {
    train::restore_snapshot(path, other.model, other.optimizer, other.trainer, kConfig);
    FAIL() << "a truncated snapshot was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_EQ(everything(other), before);
  EXPECT_EQ(other.trainer.steps_done(), 0);
}

TEST(Snapshot, TensorsTheModelRefusesChangeNothingAfterTheCountersWereRead) {
  // A whole file of the same settings whose tensors are another model's: the counters
  // read and set, the optimizer's state checked, then the model refuses the tensors.
  // Nothing may have moved, the trainer's counters included ("nothing is changed unless
  // everything checks").
  const testing::TemporaryDirectory folder;
  const std::string path = snapshot_after_one_step(folder);
  struct OtherModel {
    Dataset data = testing::tiny_data(100);
    nn::Model model{[] {
                      nn::ModelConfig c = TinyRun::model_config();
                      // BatchNorm: the same parameters (so the optimizer's state fits)
                      // and running statistics the snapshot does not have.
                      c.norm = nn::Norm::batch;
                      return c;
                    }(),
                    Device::cpu()};
    nn::Optimizer optimizer{model.parameters(), AdamWOptions{}};
    train::Trainer trainer{model, optimizer, data, TinyRun::train_config(1, 0x1p24f)};
  } other;
  const auto model_values = [&] {
    std::vector<std::vector<float>> values;
    for (const auto& [name, tensor] : other.model.state_dict()) {
      values.push_back(tensor.to_vector<float>());
    }
    return values;
  };
  const std::vector<std::vector<float>> before = model_values();
  const train::TrainerState counters = other.trainer.state();
  EXPECT_THROW(
      train::restore_snapshot(path, other.model, other.optimizer, other.trainer, kConfig),
      std::runtime_error);
  EXPECT_EQ(model_values(), before);
  EXPECT_EQ(other.optimizer.steps_taken(), 0);
  for (const auto& [name, tensor] : other.optimizer.state()) {
    for (const float v : tensor.to_vector<float>()) ASSERT_EQ(v, 0.0f) << name;  // as made
  }
  const train::TrainerState now = other.trainer.state();
  EXPECT_EQ(now.steps_done, counters.steps_done);
  EXPECT_EQ(now.optimizer_steps, counters.optimizer_steps);
  EXPECT_EQ(now.skipped_steps, counters.skipped_steps);
  // The scaler is there before and after (reading an empty optional would be undefined).
  ASSERT_TRUE(counters.scaler.has_value());
  ASSERT_TRUE(now.scaler.has_value()) << "the refused restore dropped the scaler's state";
  EXPECT_EQ(now.scaler->scale, counters.scaler->scale);
}

TEST(Snapshot, AFlippedBitInAnyTensorIsRefusedNamingItAndChangesNothing) {
  const testing::TemporaryDirectory folder;
  const std::string path = snapshot_after_one_step(folder);
  ASSERT_TRUE(train::snapshot_is_intact(path));
  const std::string good = testing::read_file(path);
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data(), sizeof header_bytes);
  // The byte buffer holds the model's tensors and the optimizer's: a bit of the first
  // byte, of the middle one and of the last one, each in a tensor of its own part.
  const std::size_t buffer = 8 + header_bytes, size = good.size() - buffer;
  for (const std::size_t offset : {std::size_t{0}, size / 2, size - 1}) {
    std::string bad = good;
    bad[buffer + offset] = static_cast<char>(bad[buffer + offset] ^ 0x04);
    testing::write_file(path, bad);
    EXPECT_FALSE(train::snapshot_is_intact(path)) << "byte " << offset;
    TinyRun other;
    const auto before = everything(other);
    const std::string error = testing::error_of([&] {
      train::restore_snapshot(path, other.model, other.optimizer, other.trainer, kConfig);
    });
    EXPECT_TRUE(testing::mentions(error, {path, "\" is damaged"})) << error;
    EXPECT_EQ(everything(other), before) << "byte " << offset;
    EXPECT_EQ(other.trainer.steps_done(), 0);
  }
  testing::write_file(path, good);
  EXPECT_TRUE(train::snapshot_is_intact(path));
  EXPECT_FALSE(train::snapshot_is_intact(folder.file("no-such.safetensors")));
}

TEST(Snapshot, AFolderServesOneWriterAtATime) {
  const testing::TemporaryDirectory folder;
  {
    const Snapshots writer(folder.str(), 2);
    // Another holder (here another lock of this process: flock locks are per open file)
    // is refused, naming the folder and the holder's pid from the lock file.
    const std::string error = testing::error_of([&] { Snapshots(folder.str(), 2); });
    EXPECT_TRUE(testing::mentions(error, {"the snapshot folder " + folder.str() +
                                              " is in use by another run (pid " +
                                              std::to_string(::getpid()) + ")"}))
        << error;
    EXPECT_THROW(train::SnapshotFolderLock{folder.str()}, train::SnapshotFolderInUse);
    EXPECT_EQ(testing::read_file(folder.file(".lock")), std::to_string(::getpid()) + "\n");
    // The lock file is no snapshot.
    EXPECT_TRUE(writer.list().empty());
  }
  // Released with its holder: the folder is free again.
  EXPECT_NO_THROW(Snapshots(folder.str(), 2));
  train::SnapshotFolderLock first(folder.str());
  train::SnapshotFolderLock moved(std::move(first));  // the lock travels with the object
  EXPECT_THROW(train::SnapshotFolderLock{folder.str()}, train::SnapshotFolderInUse);
}

}  // namespace
}  // namespace bigbatch

// options.hpp: bigbatch's flags, typed. The command line is the one place where settings
// are text: CLI11 reads every flag into the fields below (words into enumerations, sizes
// into bytes, --checkpoint into a Policy, --loss-scale into the trainer's rule), each
// refused in words, naming the flag, when it does not read. Everything after parsing works
// on types: setup.hpp turns these options into the model's, the optimizer's and the
// trainer's configurations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "chapters/05_activation_checkpointing/policy.hpp"
#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/train/trainer.hpp"
#include "collectives/communicator.hpp"
#include "common/device.hpp"
#include "common/settings.hpp"
#include "nn/gpt.hpp"
#include "nn/lr_schedule.hpp"
#include "nn/model.hpp"

// CLI11 is included where flags are declared (options.cpp, generate_command.cpp) and parsed
// (bigbatch.cpp) only: its header costs about 5 s of compiling in every file that reads it.
namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI

namespace bigbatch::cli {

enum class DataKind { fashion_mnist, synthetic, npy, text, tokens };

/// --data and --test-data: a data set by name, a pair of .npy files, or chapter 08's token
/// sequences (a text file's bytes, or a .npy file of token ids).
struct DataSource {
  DataKind kind = DataKind::synthetic;
  std::string features_file, labels_file;  ///< of DataKind::npy
  std::string file;                        ///< of DataKind::text and DataKind::tokens

  /// "fashion-mnist", "synthetic", "npy:FEATURES.npy,LABELS.npy", "text:FILE" or
  /// "tokens:SEQUENCES.npy"; throws std::invalid_argument saying what was expected.
  static DataSource parse(std::string_view text);
  /// Token sequences (text or tokens), which the GPT trains on and the MLP does not.
  bool holds_tokens() const { return kind == DataKind::text || kind == DataKind::tokens; }
  /// The text parse reads back as this source.
  std::string text() const;
};
inline std::string setting_text(const DataSource& source) { return source.text(); }

/// What the run trains on and where: the program's own trajectory settings (the model's,
/// the optimizer's and the trainer's are classified beside their configurations).
struct RunSource {
  DataSource data;
  std::int64_t samples = 60000;  ///< of --data synthetic
  std::int64_t features = 784;   ///< of --data synthetic
  /// --validation N: the training data's last N samples held out and evaluated in place of
  /// the test split (0: none).
  std::int64_t validation = 0;
  Device device;
};

template <SettingsOf<RunSource> Self, class Visit>
constexpr void visit_settings(Self& s, Visit&& visit) {
  visit("data", s.data, SettingRole::trajectory);
  visit("samples", s.samples, SettingRole::trajectory);
  visit("features", s.features, SettingRole::trajectory);
  visit("validation", s.validation, SettingRole::trajectory);
  visit("device", s.device, SettingRole::trajectory);
}
static_assert(every_field_visited<RunSource>(), "classify RunSource's new field above");

enum class OptimizerKind { sgd, adamw };

/// --model: the residual MLP of chapters 00-07, or chapter 08's GPT.
enum class ModelKind { mlp, gpt };

/// --optimizer and its hyperparameters as given; setup.hpp fills in the defaults (which
/// depend on the optimizer) and scales the learning rate for the batch.
struct OptimizerFlags {
  OptimizerKind kind = OptimizerKind::adamw;
  std::optional<double> lr, momentum, weight_decay;
  nn::LrScale lr_scale = nn::LrScale::none;
  std::int64_t lr_reference_batch = 256;
};

/// How the run is watched and stored: nothing here changes its trajectory.
struct OutputOptions {
  std::string init;                 ///< initial parameters (a snapshot holds its own)
  std::string save, log;
  std::int64_t eval_every = 0;
  std::int64_t print_every = 0;
  bool explain = false;             ///< print the checkpoint schedule
  std::string snapshot_dir;         ///< where snapshots go ("": none, unless --resume)
  std::int64_t snapshot_every = 0;  ///< 0: only at the end and when interrupted
  std::int64_t snapshot_keep = 2;
  std::string resume;               ///< a snapshot folder to continue from
};

/// A device `bigbatch plan --device-model` prices plans for from its spec sheet.
enum class ModelledDevice { none, h200 };

/// Chapter 06's planner: `bigbatch plan`, and `bigbatch train --plan auto`.
struct PlanOptions {
  bool automatic = false;    ///< --plan auto: train with the plan it picks
  ModelledDevice modelled = ModelledDevice::none;  ///< --device-model: no measurement
  std::string calibration;   ///< the cost-model file ("": the cache's)
  bool recalibrate = false;  ///< measure the cost model again
  bool json = false;         ///< bigbatch plan --json: the answer as one JSON object
  std::int64_t ranks = 1;    ///< bigbatch plan --ranks R: plan rank 0's step of R (chapter 07)
};

/// Chapter 07: how a batch is spread over ranks (`bigbatch train`; --zero also `bigbatch
/// plan --ranks`).
struct ParallelOptions {
  bool data_parallel = false;      ///< --data-parallel: this process is one rank of mpirun's
  std::int64_t simulate_ranks = 0;  ///< --simulate-ranks R: R ranks in this process (0: off)
  collectives::Reduction reduction = collectives::Reduction::deterministic;  ///< --reduction
  /// --zero: what the ranks shard (stage 1: the optimizer's state)
  data_parallel::ZeroStage zero = data_parallel::ZeroStage::replicated;
  /// --bucket-size: the gradients of a bucket whose sum starts during the last backward
  /// (0, the default: one sum after the backward, no overlap; chapter 07's README measures
  /// why on a CPU)
  std::size_t bucket_bytes = 0;
};

/// Every flag of `bigbatch train` and `bigbatch plan`.
struct TrainOptions {
  RunSource source;
  std::optional<DataSource> test_data;
  ModelKind model_kind = ModelKind::mlp;  ///< --model
  /// The GPT's shape flags (--seq-len, --layers, --width, --heads); its dropout, precision
  /// and seed are the shared flags' (model's below).
  nn::GptConfig gpt{.vocabulary = 256, .context = 64, .layers = 2, .width = 64, .heads = 4};
  /// The shape flags (the data sets inputs and classes, --seed the seed).
  nn::ModelConfig model{.inputs = 0, .hidden = 256, .expansion = 4, .classes = 0, .depth = 2,
                        .dropout = 0.0f, .norm = nn::Norm::layer,
                        .activation = nn::Activation::gelu, .seed = 0,
                        .precision = nn::Precision::fp32};
  OptimizerFlags optimizer;
  /// --batch ... --clip-grad-norm; epochs 0 with steps 0 means one epoch (setup.hpp).
  train::TrainConfig train;
  checkpointing::Policy checkpoint;          ///< --checkpoint
  std::optional<std::size_t> device_memory;  ///< --device-memory: the allocator's cap
  OutputOptions output;
  PlanOptions plan;
  ParallelOptions parallel;
  std::set<std::string> given;  ///< the flags on the command line, e.g. "--depth"

  bool was_given(std::string_view flag) const { return given.count(std::string(flag)) != 0; }
};

/// The flags of `bigbatch train` (and `bigbatch plan`, which takes them to describe the run).
void add_train_flags(CLI::App& app, TrainOptions& options);

/// A flag's check, the same on every subcommand: a whole number >= minimum, refused in
/// words ("must be at least 1, got 0", "'99999999999999999999' is too large") rather than by
/// CLI11's range check, which prints the type's limits.
CLI::Validator whole_number_from(std::int64_t minimum);
/// A flag's check: a finite real number in [low, high], refused in words naming `what`.
CLI::Validator real_number_in(double low, double high, const std::string& what);
/// --seed, the same on every subcommand: a whole number from 0 to 2^63 - 1.
CLI::Option* add_seed_option(CLI::App& app, std::uint64_t& seed, const std::string& help);
/// The planner's flags, on both subcommands.
void add_plan_flags(CLI::App& app, TrainOptions& options);
/// --data-parallel, --simulate-ranks, --reduction, --bucket-size and --zero, of `bigbatch
/// train`.
void add_data_parallel_flags(CLI::App& train, TrainOptions& options);
/// --ranks and --zero, of `bigbatch plan`.
void add_rank_plan_flags(CLI::App& plan, TrainOptions& options);
/// --plan auto, of `bigbatch train`.
void add_plan_choice_flag(CLI::App& train, TrainOptions& options);
/// --device-model, of `bigbatch plan`.
void add_device_model_flag(CLI::App& plan, TrainOptions& options);

/// The word of --norm / --activation for a value, and the value of a word (nullopt for
/// an unknown one): --init compares the file's metadata with them.
std::optional<nn::Norm> norm_named(std::string_view word);
std::optional<nn::Activation> activation_named(std::string_view word);
/// The precision of a --precision word (nullopt for an unknown one): a plan sent between
/// ranks names it so.
std::optional<nn::Precision> precision_named(std::string_view word);
/// The attention kernel --attention names `word` ("plain", "efficient"), if any.
std::optional<nn::AttentionKernel> attention_kernel_named(std::string_view word);

}  // namespace bigbatch::cli

// setup.hpp: from bigbatch's typed options to what a run is made of: the data, the
// device, the model's, the optimizer's and the trainer's configurations, and the settings
// a snapshot records. Both subcommands use it; each function checks what it converts
// and refuses bad input with UsageError (exit code 2), naming the flag or file.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/policy.hpp"
#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/cli/options.hpp"
#include "chapters/train/run_settings.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/dataset.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitOutOfMemory = 3;

/// A mistake of the user's: reported without a stack of context, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// No plan fits --device-memory (bigbatch plan, --plan auto), or the model's state alone is
/// past the device's own memory, so that none could: exit code 3, as out of memory.
class NoPlanFits : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Splits {
  Dataset train;
  std::optional<Dataset> test;  ///< the split evaluated: the test split, or --validation's
  bool validation = false;      ///< `test` is held out of the training data (--validation)
  /// "validation" or "test", as the output names the evaluated split.
  const char* evaluated() const { return validation ? "validation" : "test"; }

  /// The classes the model needs: the larger of the two splits' counts.
  std::int64_t classes() const;
};

/// --data (and --test-data), loaded once.
Splits load_data(const TrainOptions& options);

/// --device, checked to be there (a CUDA device needs a driver and a GPU, and cuda:N the
/// N+1-th of this process's devices) and made current.
Device available_device(const TrainOptions& options);

/// The learning rate the user asked for, before scaling: --lr or the optimizer's default.
double base_learning_rate(const TrainOptions& options);

/// The optimizer's options, its learning rate scaled for the batch by --lr-scale.
nn::Optimizer::Options optimizer_options(const TrainOptions& options);

/// The model's shape from the flags, or, with --init, from the file's metadata (written
/// by Model::save) where no flag says otherwise; a flag that disagrees with the file is
/// refused by name. A file without bigbatch's metadata (e.g. from PyTorch) keeps the
/// flags' shape, and Model::load checks every tensor against it.
nn::ModelConfig model_config(const TrainOptions& options, const Splits& splits);

/// The trainer's configuration: --steps or --epochs (one epoch when neither is given),
/// and the dynamic scaler's flags checked against each other.
train::TrainConfig train_config(const TrainOptions& options);

/// The samples of a forward pass: --micro-batch, or --batch when it is not given. Refuses
/// a micro-batch larger than the batch, and --drop-last with a batch larger than `train`.
std::int64_t checked_micro_batch(const TrainOptions& options, const Dataset& train);

/// Refuses a BatchNorm micro-batch of a single sample (its variance is 0: PyTorch refuses
/// it too), in any batch of the run: the full ones and an epoch's short last one.
void check_batchnorm_micro_batches(std::int64_t batch, std::int64_t micro_batch,
                                   std::int64_t short_batch);

/// The GPT the options describe: --seq-len (its context), --layers, --width, --heads, with
/// the shared --dropout, --precision and --seed.
nn::GptConfig gpt_config(const TrainOptions& options);

/// `record` with the program's own trajectory settings (RunSource) added: resume_settings's
/// last step, the same for every model.
train::RunConfig with_program_settings(SettingsRecord record, const TrainOptions& options);

/// The settings a snapshot of this run records, and a --resume must repeat: the model's
/// (nn::ModelConfig or nn::GptConfig), the optimizer's and the trainer's trajectory settings
/// and the program's (RunSource).
template <class ModelShape>
train::RunConfig resume_settings(const TrainOptions& options, const ModelShape& model,
                                 const nn::Optimizer::Options& optimizer,
                                 const train::TrainConfig& train) {
  return with_program_settings(train::run_settings(model, optimizer, train), options);
}

/// --plan auto refuses the flags the plan chooses itself (--micro-batch, --checkpoint,
/// --loss-scale).
void check_plan_flags(const TrainOptions& options);

/// --plan auto: the plan's micro-batch, precision (fp16 with dynamic loss scaling) and
/// checkpoint policy, written into the options (the model's configuration reads its
/// precision from them).
void apply_plan(const planning::Plan& plan, TrainOptions& options);

/// The files the command line names for writing (--save, --log, --calibration) checked
/// before any work by output_files.hpp's rule, against each other and the files the run
/// reads (--data, --test-data, --init); each path that is a link is replaced by the file
/// it names, which is what the writes then replace.
void check_outputs(TrainOptions& options);

/// The model's parameters (nn::parameter_bytes: a floor under every step, from formulas)
/// held against the device and, `against_cap`, --device-memory, as cap_device_memory holds
/// the whole of what is live before a step: called first, since predicting the step takes
/// memory in proportion to the model's depth.
void check_parameters_fit(const TrainOptions& options, std::size_t parameter_bytes,
                          Device device, bool against_cap);

/// What is live before any step (parameters, gradients, optimizer state and one
/// micro-batch's samples: `plain`, the step predicted without checkpointing, holds them
/// after it) held against the device before anything is allocated: past the device's own
/// memory (the machine's, host_memory_bytes(), for the CPU) NoPlanFits, exit code 3, with
/// the bytes asked for; past --device-memory UsageError, a setting out of range and not a
/// step that ran out. Then --device-memory caps the device's allocator.
void cap_device_memory(const TrainOptions& options, const nn::StepPrediction& plain,
                       Device device);

/// --checkpoint as a run uses it: the policy asked for, the one it resolves to (a budget
/// becomes the policy of fewest recomputations whose predicted step fits) and the runner
/// of Net's blocks (null: every block keeps all).
template <class Net>
struct Checkpointing {
  checkpointing::Policy asked;   ///< --checkpoint
  checkpointing::Policy policy;  ///< what it resolved to
  std::shared_ptr<checkpointing::ScheduledRunnerFor<Net>> runner;  ///< null: none
};

/// Resolves --checkpoint for a step of `shape` whose model has `depth` blocks; UsageError
/// with what the budget search or the runner refuses.
template <class Net>
Checkpointing<Net> checkpointing_for(const checkpointing::Policy& asked,
                                     const checkpointing::StepShape& shape, std::int64_t depth) {
  Checkpointing<Net> c;
  c.asked = asked;
  try {
    c.policy = checkpointing::resolve_policy(asked, shape);
    if (c.policy.needs_runner()) {
      c.runner = checkpointing::ScheduledRunnerFor<Net>::for_policy(c.policy, depth);
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--checkpoint: ") + e.what());
  }
  return c;
}

/// The header's lines of a run's checkpointing: what a budget resolved to; with a runner,
/// "activation checkpointing sqrt: at most 4 block inputs kept and 4 blocks' activations at
/// a time; 24 block forwards per micro-batch instead of 16" and, with --explain, the
/// schedule; with a runner or --explain, "predicted step peak ..." and its moment
/// (`predicted`: the step under the resolved policy). "" when there is nothing to say.
std::string checkpointing_lines(const checkpointing::Policy& asked,
                                const checkpointing::Policy& policy,
                                const checkpointing::Schedule* schedule, bool explain,
                                const nn::StepPrediction& predicted);

/// "fp16 (f32 master weights), loss scale dynamic from 65536 (x2 after 2000 clean ...)"
std::string precision_description(nn::Precision precision, const train::TrainConfig& c);

/// "0.002 = 0.001 x sqrt(1024/256) (cosine after 5 linear warm-up steps from lr/5)"
std::string learning_rate_description(const TrainOptions& options,
                                      const nn::LrSchedule& schedule);

/// The header's second line: "optimizer adamw, lr ..., weight decay ..., seed ..., batch B,
/// micro-batch m: k accumulation steps per optimizer step (the last micro-batch has ...)".
std::string optimizer_line(const TrainOptions& options, const nn::LrSchedule& schedule,
                           const nn::Optimizer::Options& optimizer, std::int64_t micro_batch);

}  // namespace bigbatch::cli

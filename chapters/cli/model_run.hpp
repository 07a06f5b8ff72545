// model_run.hpp: what `bigbatch train` does differently for each model. run_train
// (train_command.cpp) is one path for every model: it reads the data, agrees with the
// ranks, plans, builds, resumes, runs the steps, saves and evaluates; a ModelRun answers
// the questions whose answer depends on the model (its flags, its shape, its plan, its step
// as the memory model sees it, its lines in the run's header). The MLP's is train_mlp.cpp,
// the GPT's train_gpt.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/cli/options.hpp"
#include "chapters/cli/parallel.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/train/run_settings.hpp"
#include "chapters/train/trainer.hpp"
#include "nn/network.hpp"
#include "nn/sample_stream.hpp"

namespace bigbatch::cli {

/// What one run needs to know of its model, in the order run_train asks it.
class ModelRun {
 public:
  virtual ~ModelRun() = default;
  /// The flags and data this model refuses (UsageError naming the flag).
  virtual void check_flags(const TrainOptions& options) const = 0;
  /// After the data is read: the model's shape from the options and the data, and what the
  /// ranks refuse of this run before anything is planned (RunRanks::check_run).
  virtual void check_ranks(const TrainOptions& options, const Splits& splits,
                           const RunRanks& ranks) = 0;
  /// The bytes of the parameters of the model the flags and the data describe
  /// (nn::parameter_bytes, from formulas; UsageError for sizes the model refuses); when
  /// `planned` (bigbatch plan, --plan auto), at 16 bits: the fewest bytes a plan can give
  /// them. check_parameters_fit holds them against the device before any step is predicted.
  virtual std::size_t parameter_bytes(const TrainOptions& options, const Splits& splits,
                                      bool planned) const = 0;
  /// The model as chapter 06's planner weighs it (the GPT once for each attention kernel
  /// weighed), from the options and the data: what `bigbatch plan` and --plan auto plan.
  virtual planning::PlannedModels planned(const TrainOptions& options,
                                          const Splits& splits) const = 0;
  /// --plan auto: the plan every rank trains (RunRanks::agreed_plan), printed and applied
  /// to `options`.
  virtual void plan(TrainOptions& options, const Splits& splits, Device device,
                    const RunRanks& ranks) = 0;
  /// Refuses micro-batches the model cannot train as asked (UsageError).
  virtual void check_micro_batch(const TrainOptions& /*options*/, const Splits& /*splits*/,
                                 std::int64_t /*micro_batch*/) const {}
  /// The model, on `device`, after its step (micro-batches of `micro_batch`; under MPI rank
  /// 0's share) has been held against the device and --device-memory, with the checkpoint
  /// runner --checkpoint asks for and the parameters --init names.
  virtual nn::Network& build(const TrainOptions& options, const Splits& splits, Device device,
                             const RunRanks& ranks, std::int64_t micro_batch,
                             const nn::Optimizer::Options& optimizer,
                             const train::TrainConfig& config) = 0;
  /// The settings a snapshot records and a resume compares (resume_settings).
  virtual train::RunConfig settings(const TrainOptions& options,
                                    const nn::Optimizer::Options& optimizer,
                                    const train::TrainConfig& config) const = 0;
  /// Warnings about the run as configured, on stderr (none by default).
  virtual void warn(std::int64_t /*batch*/, std::int64_t /*micro_batch*/) const {}
  /// The header's first line: the data, the model and its parameters, the steps, the device.
  virtual std::string describe(const Splits& splits, const train::Trainer& trainer,
                               Device device) const = 0;
  /// What follows the optimizer's line on the same line (nothing by default).
  virtual std::string optimizer_note(bool /*ranks*/) const { return ""; }
  /// The precision the model trains in (--plan auto may have chosen it).
  virtual nn::Precision precision() const = 0;
  /// checkpointing_lines for the model's step.
  virtual std::string checkpointing_report(bool explain) const = 0;
  /// The accuracy's name in the progress line and the log.
  virtual std::string accuracy_name() const = 0;
  /// Whether each log line counts the step's targets (token sequences: not its samples).
  virtual bool logs_targets() const { return false; }
  /// Writes the parameters to `path`; under ZeRO in 16 bits the f32 masters from `masters`.
  virtual void save(const std::string& path, const std::map<std::string, Tensor>& masters) = 0;
  /// What the held-out evaluation counted, for its line: "N samples", or the sequences and
  /// their target tokens.
  virtual std::string counted(const nn::EvaluationResult& test) const = 0;
};

/// Loads --init's parameters into `model`; UsageError with what the file lacks.
template <class Net>
void load_init(Net& model, const std::string& path) {
  try {
    model.load(path);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--init: ") + e.what());
  }
}

/// What every model's run holds the same way: its shape (Config), its step as chapter 05's
/// memory model sees it, the model (Net) and its checkpoint runner.
template <class Net, class Config>
class ModelRunOf : public ModelRun {
 public:
  train::RunConfig settings(const TrainOptions& options, const nn::Optimizer::Options& optimizer,
                            const train::TrainConfig& config) const override {
    return resume_settings(options, shape_, optimizer, config);
  }
  nn::Precision precision() const override { return shape_.precision; }
  std::string checkpointing_report(bool explain) const override {
    return checkpointing_lines(checkpoint_.asked, checkpoint_.policy,
                               checkpoint_.runner ? &checkpoint_.runner->schedule() : nullptr,
                               explain, checkpointing::predict_policy(step_, checkpoint_.policy));
  }

 protected:
  /// The model of shape_ on `device`, once step_ (set by the caller) has been held against
  /// the device and --device-memory; with --checkpoint's runner over its `depth` blocks and
  /// --init's parameters.
  Net& build_model(const TrainOptions& options, Device device, std::int64_t depth) {
    cap_device_memory(options, checkpointing::predict_policy(step_, {}), device);
    model_.emplace(shape_, device);
    checkpoint_ = checkpointing_for<Net>(options.checkpoint, step_, depth);
    if (checkpoint_.runner) model_->set_block_runner(checkpoint_.runner);
    if (!options.output.init.empty()) load_init(*model_, options.output.init);
    return *model_;
  }

  Config shape_;
  checkpointing::StepShape step_;
  std::optional<Net> model_;
  Checkpointing<Net> checkpoint_;
};

/// "S steps (E per epoch) on DEVICE": the end of every model's describe().
std::string steps_and_device(const train::Trainer& trainer, Device device);

/// The run of --model's model (one of the two below).
std::unique_ptr<ModelRun> model_run(const TrainOptions& options);
/// The residual MLP's run (train_mlp.cpp).
std::unique_ptr<ModelRun> mlp_run();
/// Chapter 08's GPT on byte tokens (train_gpt.cpp).
std::unique_ptr<ModelRun> gpt_run();

}  // namespace bigbatch::cli

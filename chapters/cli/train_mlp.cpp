// train_mlp.cpp: what `bigbatch train` asks of the residual MLP (model_run.hpp): its shape
// from --depth, --hidden and the data, its plan, its step as chapter 05's memory model sees
// it, BatchNorm's micro-batches, its header line.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/cli/model_run.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/train_command.hpp"
#include "nn/model.hpp"

namespace bigbatch::cli {

void check_mlp_flags(const TrainOptions& options) {
  for (const char* flag : {"--seq-len", "--layers", "--width", "--heads", "--vocabulary",
                           "--attention"}) {
    if (options.was_given(flag)) {
      throw UsageError(std::string(flag) + " is --model gpt's; the MLP's shape is --depth, "
                       "--hidden and --expansion");
    }
  }
  if (options.source.data.holds_tokens()) {
    throw UsageError("--data " + options.source.data.text() + " is token sequences: give "
                     "--model gpt");
  }
}

namespace {

class MlpRun final : public ModelRunOf<nn::Model, nn::ModelConfig> {
 public:
  void check_flags(const TrainOptions& options) const override { check_mlp_flags(options); }

  void check_ranks(const TrainOptions& options, const Splits& splits,
                   const RunRanks& ranks) override {
    shape_ = model_config(options, splits);
    ranks.check_run(options, shape_, splits.train.size());
  }

  std::size_t parameter_bytes(const TrainOptions& options, const Splits& splits,
                              bool planned) const override {
    nn::ModelConfig shape = model_config(options, splits);
    if (planned) shape.precision = nn::Precision::fp16;
    return nn::parameter_bytes(shape);
  }

  planning::PlannedModels planned(const TrainOptions& options,
                                  const Splits& splits) const override {
    return {std::make_shared<planning::MlpPlanned>(model_config(options, splits))};
  }

  void plan(TrainOptions& options, const Splits& splits, Device device,
            const RunRanks& ranks) override {
    // On ranks: rank 0's share, planned by rank 0 for all.
    const planning::Plan best = ranks.agreed_plan([&] {
      return plan_for(options, planned(options, splits), device, ranks.planned_ranks()).best();
    });
    const std::int64_t planned =
        ranks.planned_ranks()
            ? collectives::share_of(options.train.batch, ranks.count(), 0).size
            : options.train.batch;
    std::cout << "plan auto: " << planning::describe(best, planned) << "\n";
    apply_plan(best, options);
    shape_.precision = options.model.precision;
  }

  void check_micro_batch(const TrainOptions& options, const Splits& splits,
                         std::int64_t micro_batch) const override {
    if (shape_.norm != nn::Norm::batch) return;
    const std::int64_t batch = options.train.batch;
    check_batchnorm_micro_batches(batch, micro_batch, 0);
    if (!options.train.drop_last) {
      check_batchnorm_micro_batches(batch, micro_batch, splits.train.size() % batch);
    }
  }

  nn::Network& build(const TrainOptions& options, const Splits&, Device device,
                     const RunRanks& ranks, std::int64_t micro_batch,
                     const nn::Optimizer::Options& optimizer,
                     const train::TrainConfig& config) override {
    // The step as chapter 05's memory model sees it, the optimizer boundary's bytes
    // included: the cap is checked against it, budget:BYTES is chosen by its prediction,
    // and --explain prints the prediction. Under MPI, rank 0's step: its share, its shard
    // of the optimizer state (chapter 07).
    step_ = ranks.rank_step(
        {std::make_shared<nn::ModelLedger>(shape_), options.train.batch, micro_batch, optimizer,
         loss_scaling::boundary_workspace_bytes(train::boundary_options(config))});
    return build_model(options, device, shape_.depth);
  }

  void warn(std::int64_t batch, std::int64_t micro_batch) const override {
    if (shape_.norm != nn::Norm::batch || micro_batch >= batch) return;
    std::cerr << "bigbatch train: warning: --norm batch normalises each micro-batch of "
              << micro_batch << " with its own statistics, so the update is not the one a "
              << "batch of " << batch << " in one piece would give (gradient "
              << "accumulation is exact for --norm layer)\n";
  }

  std::string describe(const Splits& splits, const train::Trainer& trainer,
                       Device device) const override {
    return "bigbatch train: " + splits.train.name + " (" + std::to_string(splits.train.size()) +
           " samples, " + std::to_string(splits.train.feature_dim()) + " features, " +
           std::to_string(shape_.classes) + " classes), model depth " +
           std::to_string(shape_.depth) + " hidden " + std::to_string(shape_.hidden) + " (" +
           std::to_string(model_->parameter_count()) + " parameters), " +
           steps_and_device(trainer, device);
  }

  std::string accuracy_name() const override { return "accuracy"; }

  void save(const std::string& path, const std::map<std::string, Tensor>& masters) override {
    model_->save(path, masters);
  }

  std::string counted(const nn::EvaluationResult& test) const override {
    return std::to_string(test.samples) + " samples";
  }
};

}  // namespace

std::unique_ptr<ModelRun> mlp_run() { return std::make_unique<MlpRun>(); }

}  // namespace bigbatch::cli

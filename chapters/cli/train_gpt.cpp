// train_gpt.cpp: what `bigbatch train --model gpt` asks of chapter 08's GPT on byte tokens
// (model_run.hpp): run_train's one path runs it through the same trainer, snapshots, plan
// and ranks as the MLP. Its step as the memory model sees it is nn::predict_step's; the
// loss of every target token is over the count of the whole batch's target tokens, on
// every rank. What the MLP's ranks have and the GPT's do not (ZeRO, overlapped sums) is
// refused by name before anything runs.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/cli/model_run.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/train_command.hpp"
#include "nn/gpt.hpp"

namespace bigbatch::cli {

void check_gpt_flags(const TrainOptions& options) {
  for (const char* flag : {"--depth", "--hidden", "--expansion", "--norm", "--activation",
                           "--samples", "--features", "--test-data"}) {
    if (options.was_given(flag)) {
      throw UsageError(std::string(flag) + " shapes the MLP's data or model, not --model gpt's "
                       "(its shape: --seq-len, --layers, --width, --heads)");
    }
  }
  for (const char* flag : {"--zero", "--bucket-size"}) {
    if (options.was_given(flag)) {
      throw UsageError(std::string(flag) + " is the MLP's: --model gpt's ranks sum whole "
                       "gradients once per step (sharding and overlapping the sum need a "
                       "model that releases each group of gradients as its backward finishes "
                       "it, which the GPT does not yet)");
    }
  }
  if (options.gpt.attention == nn::AttentionKernel::efficient &&
      options.checkpoint.keep == nn::BlockKeep::all_but_probabilities) {
    throw UsageError("--checkpoint " + options.checkpoint.text() + " drops the attention's "
                     "probabilities, which --attention efficient never keeps: give one or the "
                     "other");
  }
  if (!options.source.data.holds_tokens()) {
    throw UsageError("--model gpt trains on token sequences: give --data text:FILE (e.g. "
                     "text:/usr/share/games/fortunes/fortunes from Debian's fortunes package) "
                     "or tokens:SEQUENCES.npy, not --data " + options.source.data.text());
  }
}

namespace {

/// "text:FILE (123 sequences of 64 tokens, 5678 target tokens, 12.3% padding)"
std::string describe_tokens(const Dataset& data) {
  const std::int64_t targets = count_targets(data);
  const std::int64_t positions = data.size() * data.feature_dim();
  std::ostringstream out;
  out.precision(3);
  out << data.name << " (" << data.size() << " sequences of " << data.feature_dim()
      << " tokens, " << targets << " target tokens, "
      << 100.0 * static_cast<double>(positions - targets) / static_cast<double>(positions)
      << "% padding)";
  return out.str();
}

class GptRun final : public ModelRunOf<nn::Gpt, nn::GptConfig> {
 public:
  void check_flags(const TrainOptions& options) const override { check_gpt_flags(options); }

  void check_ranks(const TrainOptions& options, const Splits& splits,
                   const RunRanks& ranks) override {
    ranks.check_run(options, splits.train.size());
  }

  std::size_t parameter_bytes(const TrainOptions& options, const Splits&,
                              bool planned) const override {
    nn::GptConfig shape = gpt_config(options);
    try {
      nn::check_gpt_config(shape);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--model gpt: ") + e.what());
    }
    if (planned) shape.precision = nn::Precision::fp16;
    return nn::parameter_bytes(shape);
  }

  planning::PlannedModels planned(const TrainOptions& options,
                                  const Splits& splits) const override {
    // Each attention kernel computes its own bits and has its own costs: both are weighed
    // unless --attention names one.
    nn::GptConfig config = gpt_config(options);
    std::vector<nn::AttentionKernel> kernels = {nn::AttentionKernel::plain,
                                                nn::AttentionKernel::efficient};
    if (options.was_given("--attention")) kernels = {config.attention};
    planning::PlannedModels models;
    for (const nn::AttentionKernel kernel : kernels) {
      config.attention = kernel;
      models.push_back(
          std::make_shared<planning::GptPlanned>(config, splits.train.feature_dim()));
    }
    return models;
  }

  void plan(TrainOptions& options, const Splits& splits, Device device,
            const RunRanks& ranks) override {
    // On ranks: rank 0's share, planned by rank 0 for all. The sum over ranks costs every
    // plan of the share the same (one sum of the same gradients per step), so the plans of
    // the share rank as the step's do.
    const std::int64_t rank_batch = ranks.rank_batch(options.train.batch);
    const planning::Plan best = ranks.agreed_plan([&] {
      TrainOptions share = options;
      share.train.batch = rank_batch;
      return plan_for(share, planned(options, splits), device).best();
    });
    std::cout << "plan auto: " << planning::describe(best, rank_batch) << "\n";
    apply_plan(best, options);
  }

  nn::Network& build(const TrainOptions& options, const Splits& splits, Device device,
                     const RunRanks& ranks, std::int64_t micro_batch,
                     const nn::Optimizer::Options& optimizer,
                     const train::TrainConfig& config) override {
    shape_ = gpt_config(options);  // checked by parameter_bytes
    // The step as nn::predict_step sees it (sequences of the data's length; under MPI,
    // rank 0's share): checked against the device and the cap before the model takes a
    // byte, budget:BYTES chosen by it, --explain prints it.
    step_ = ranks.rank_step(
        {std::make_shared<nn::GptLedger>(shape_, splits.train.feature_dim()),
         options.train.batch, micro_batch, optimizer,
         loss_scaling::boundary_workspace_bytes(train::boundary_options(config))});
    return build_model(options, device, shape_.layers);
  }

  std::string describe(const Splits& splits, const train::Trainer& trainer,
                       Device device) const override {
    const bool efficient = shape_.attention == nn::AttentionKernel::efficient;
    return "bigbatch train: " + describe_tokens(splits.train) + ", GPT of " +
           std::to_string(shape_.layers) + (shape_.layers == 1 ? " block" : " blocks") +
           ", width " + std::to_string(shape_.width) + ", " + std::to_string(shape_.heads) +
           (shape_.heads == 1 ? " head" : " heads") +
           (efficient ? " (efficient attention)" : "") + ", context " +
           std::to_string(shape_.context) + " (" + std::to_string(model_->parameter_count()) +
           " parameters), " + steps_and_device(trainer, device);
  }

  std::string optimizer_note(bool ranks) const override {
    return std::string(" (a batch of sequences: every target token's loss over the step's "
                       "real target tokens") +
           (ranks ? ", on every rank" : "") + ")";
  }

  std::string accuracy_name() const override { return "next-byte accuracy"; }
  bool logs_targets() const override { return true; }

  void save(const std::string& path, const std::map<std::string, Tensor>&) override {
    model_->save(path);  // whole masters: the GPT's ranks shard nothing
  }

  std::string counted(const nn::EvaluationResult& test) const override {
    return std::to_string(test.samples) + " sequences, " + std::to_string(test.targets) +
           " target tokens";
  }
};

}  // namespace

std::unique_ptr<ModelRun> gpt_run() { return std::make_unique<GptRun>(); }

}  // namespace bigbatch::cli

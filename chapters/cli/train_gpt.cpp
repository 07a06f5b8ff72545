// train_gpt.cpp: `bigbatch train --model gpt`: chapter 08's GPT on byte tokens of a text
// file, through the same trainer, optimizer boundary, progress line, log and memory report
// as the MLP, with the same snapshots and --resume (step_loop.hpp), chapter 05's checkpoint
// policies on its transformer blocks (budget:BYTES and --explain through the memory model
// of its step, nn::predict_gpt_step), chapter 06's --plan auto and chapter 07's ranks
// (--data-parallel, --simulate-ranks): the loss of every target token over the count of
// the whole batch's target tokens, on every rank. What the MLP's ranks have and the GPT's
// do not (ZeRO, overlapped sums) is refused by name before anything runs.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/cli/parallel.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/progress.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/step_loop.hpp"
#include "chapters/cli/train_command.hpp"
#include "common/json.hpp"
#include "common/memory.hpp"
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

}  // namespace

int run_train_gpt(TrainOptions options) {
  check_gpt_flags(options);
  if (options.plan.automatic) check_plan_flags(options);
  RunRanks ranks(options);  // chapter 07; under MPI, rank 0 alone prints and writes files
  ranks.quiet_other_ranks(options);
  check_outputs(options);
  const OutputOptions& output = options.output;
  const Splits splits = load_data(options);
  ranks.check_run(options, splits.train.size());
  options.source.device = ranks.device_of_this_rank(options.source.device);
  const Device device = available_device(options);
  check_model_fits(options, splits, device, options.plan.automatic);
  const std::int64_t rank_batch = ranks.rank_batch(options.train.batch);
  if (options.plan.automatic) {  // on ranks: rank 0's share, planned by rank 0 for all
    // The sum over ranks costs every plan of the share the same (one sum of the same
    // gradients per step), so the plans of the share rank as the step's do.
    const planning::Plan best = ranks.agreed_plan([&] {
      TrainOptions share = options;
      share.train.batch = rank_batch;
      return plan_for_gpt(share, gpt_config(options), splits.train.feature_dim(), device).best();
    });
    std::cout << "plan auto: " << planning::describe(best, rank_batch) << "\n";
    apply_plan(best, options);
  }
  const std::int64_t micro_batch = checked_micro_batch(options, splits.train);
  const nn::Optimizer::Options optimizer_choice = optimizer_options(options);
  const train::TrainConfig config = train_config(options);

  const nn::GptConfig shape = gpt_config(options);  // checked by check_model_fits
  // The step as nn::predict_gpt_step sees it (sequences of the data's length; under MPI,
  // rank 0's share): checked against the device and the cap before the model takes a
  // byte, budget:BYTES chosen by it, --explain prints it.
  const checkpointing::GptStepShape step_shape{
      shape, rank_batch, std::min(micro_batch, rank_batch), splits.train.feature_dim(),
      optimizer_choice, loss_scaling::boundary_workspace_bytes(train::boundary_options(config))};
  cap_device_memory(options, checkpointing::predict_policy(step_shape, {}), device);
  nn::Gpt model(shape, device);
  const Checkpointing<nn::Gpt> checkpoint =
      checkpointing_for<nn::Gpt>(options.checkpoint, step_shape, shape.layers);
  if (checkpoint.runner) model.set_block_runner(checkpoint.runner);
  if (!output.init.empty()) {
    try {
      model.load(output.init);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--init: ") + e.what());
    }
  }
  nn::Optimizer optimizer(model.parameters(), optimizer_choice);
  train::Trainer trainer(model, optimizer, splits.train, config,
                         ranks.group(model));

  // Snapshots go to --snapshot-dir, or back to the folder --resume reads.
  const train::RunConfig settings =
      ranks.with_settings(resume_settings(options, shape, optimizer.options(), config));
  SnapshotSetup snapshots(options, ranks.writes());
  snapshots.resume(model, optimizer, trainer, settings);
  ranks.check_agreement(settings, model, optimizer, trainer.steps_done());
  StepLoop loop(output, config, trainer, snapshots,
                {.write_snapshot = [&] { snapshots.write(model, optimizer, trainer, settings); },
                 .complete_line =
                     [&](const train::StepRecord& record, Progress& progress, Json& line) {
                       line["targets"] = record.batch_targets;
                       evaluate_at_step(model, splits, output.eval_every, micro_batch, record,
                                        "next-byte accuracy", progress, line);
                     },
                 .any_rank = [&](bool mine) { return ranks.any(mine); },
                 .ranks = ranks.enabled() ? ranks.count() : 0});
  std::cout << "bigbatch train: " << describe_tokens(splits.train) << ", GPT of "
            << shape.layers << (shape.layers == 1 ? " block" : " blocks") << ", width "
            << shape.width << ", " << shape.heads << (shape.heads == 1 ? " head" : " heads")
            << (shape.attention == nn::AttentionKernel::efficient ? " (efficient attention)" : "")
            << ", context " << shape.context << " (" << model.parameter_count()
            << " parameters), " << trainer.total_steps()
            << (trainer.total_steps() == 1 ? " step" : " steps") << " ("
            << trainer.batches_per_epoch() << " per epoch) on " << device.name() << "\n"
            << optimizer_line(options, trainer.lr_schedule(), optimizer.options(), micro_batch)
            << " (a batch of sequences: every target token's loss over the step's real "
               "target tokens"
            << (ranks.enabled() ? ", on every rank" : "") << ")\nprecision "
            << precision_description(shape.precision, config) << "\n";
  if (ranks.enabled()) {
    std::cout << ranks.describe(options.train.batch, micro_batch, shape.precision) << "\n";
  }
  std::cout << checkpointing_lines(checkpoint.asked, checkpoint.policy,
                                   checkpoint.runner ? &checkpoint.runner->schedule() : nullptr,
                                   output.explain,
                                   checkpointing::predict_policy(step_shape, checkpoint.policy))
            << resume_lines(snapshots, trainer) << std::flush;

  if (const int code = loop.run(); code != 0) return code;
  ranks.check_parameters_agree(model);
  loop.finish();
  if (!output.save.empty()) {  // before the evaluation: nothing trained is lost after this
    model.save(output.save);
    std::cout << "saved the parameters to " << output.save << "\n";
  }
  if (splits.test && ranks.writes()) {
    const nn::EvaluationResult test = nn::evaluate(model, *splits.test, micro_batch);
    std::printf("%s (%s, %lld sequences, %lld target tokens): loss %.4f, next-byte accuracy "
                "%.4f\n",
                splits.evaluated(), splits.test->name.c_str(),
                static_cast<long long>(test.samples), static_cast<long long>(test.targets),
                test.loss, test.accuracy);
  }
  if (loop.steps_run() > 0) {
    std::cout << step_memory_report(device, trainer.largest_step_memory(), loop.steps_run());
  }
  return 0;
}

}  // namespace bigbatch::cli

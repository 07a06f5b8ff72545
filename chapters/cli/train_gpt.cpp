// train_gpt.cpp: `bigbatch train --model gpt`: chapter 08's GPT on byte tokens of a text
// file, through the same trainer, optimizer boundary, progress line, log and memory report
// as the MLP, with the same snapshots and --resume (step_loop.hpp), chapter 05's checkpoint
// policies on its transformer blocks (budget:BYTES and --explain through the memory model
// of its step, nn::predict_gpt_step) and chapter 06's --plan auto. What the MLP's run has
// and the GPT's does not yet (ranks) is refused by name before anything runs.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/progress.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/step_loop.hpp"
#include "chapters/cli/train_command.hpp"
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
  for (const char* flag : {"--data-parallel", "--simulate-ranks", "--reduction",
                           "--bucket-size"}) {
    if (options.was_given(flag)) {
      throw UsageError(std::string(flag) + " is not available with --model gpt yet: its "
                       "training runs on one process");
    }
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
  if (options.was_given("--zero")) {
    throw UsageError("--zero shards the optimizer state over ranks; --model gpt trains on one "
                     "process");
  }
  if (options.plan.automatic) check_plan_flags(options);
  const OutputOptions& output = options.output;
  if (!output.save.empty()) check_writable(output.save);
  const Splits splits = load_data(options);
  const Device device = available_device(options);
  if (options.plan.automatic) {
    const planning::Plan best =
        plan_for_gpt(options, gpt_config(options), splits.train.feature_dim(), device).best();
    std::cout << "plan auto: " << planning::describe(best, options.train.batch) << "\n";
    apply_plan(best, options);
  }
  const std::int64_t micro_batch = checked_micro_batch(options, splits.train);
  const nn::Optimizer::Options optimizer_choice = optimizer_options(options);
  const train::TrainConfig config = train_config(options);

  const nn::GptConfig shape = gpt_config(options);
  std::optional<nn::Gpt> built;
  try {
    built.emplace(shape, device);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--model gpt: ") + e.what());
  }
  nn::Gpt& model = *built;
  // The step as nn::predict_gpt_step sees it (sequences of the data's length): the cap is
  // checked against it, budget:BYTES chosen by it, --explain prints it.
  const checkpointing::GptStepShape step_shape{
      shape, options.train.batch, micro_batch, splits.train.feature_dim(), optimizer_choice,
      loss_scaling::boundary_workspace_bytes(train::boundary_options(config))};
  cap_device_memory(options, checkpointing::predict_policy(step_shape, {}), device);
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
  train::Trainer trainer(model, optimizer, splits.train, config);

  // Snapshots go to --snapshot-dir, or back to the folder --resume reads.
  const train::RunConfig settings = resume_settings(options, shape, optimizer.options(), config);
  SnapshotSetup snapshots(options, /*writer=*/true);
  snapshots.resume(model, optimizer, trainer, settings);
  StepLoop loop(output, config, trainer, snapshots,
                {.write_snapshot = [&] { snapshots.write(model, optimizer, trainer, settings); },
                 .complete_line =
                     [&](const train::StepRecord& record, Progress& progress, Json& line) {
                       line["targets"] = record.batch_targets;
                       evaluate_at_step(model, splits, output.eval_every, micro_batch, record,
                                        "next-byte accuracy", progress, line);
                     }});
  std::cout << "bigbatch train: " << describe_tokens(splits.train) << ", GPT of "
            << shape.layers << (shape.layers == 1 ? " block" : " blocks") << ", width "
            << shape.width << ", " << shape.heads << (shape.heads == 1 ? " head" : " heads")
            << ", context " << shape.context << " (" << model.parameter_count()
            << " parameters), " << trainer.total_steps()
            << (trainer.total_steps() == 1 ? " step" : " steps") << " ("
            << trainer.batches_per_epoch() << " per epoch) on " << device.name() << "\n"
            << optimizer_line(options, trainer.lr_schedule(), optimizer.options(), micro_batch)
            << " (a batch of sequences: every target token's loss over the step's real "
               "target tokens)\nprecision "
            << precision_description(shape.precision, config) << "\n"
            << checkpointing_lines(checkpoint.asked, checkpoint.policy,
                                   checkpoint.runner ? &checkpoint.runner->schedule() : nullptr,
                                   output.explain,
                                   checkpointing::predict_policy(step_shape, checkpoint.policy))
            << resume_lines(snapshots, trainer) << std::flush;

  if (const int code = loop.run(); code != 0) return code;
  loop.finish();
  if (!output.save.empty()) {  // before the evaluation: nothing trained is lost after this
    model.save(output.save);
    std::cout << "saved the parameters to " << output.save << "\n";
  }
  if (splits.test) {
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

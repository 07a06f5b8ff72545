// train_command.cpp: `bigbatch train`, from typed options to a finished (or snapshotted)
// run, one path for every model (model_run.hpp says what each model answers); its steps
// run in step_loop.hpp's loop.
#include "chapters/cli/train_command.hpp"

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "chapters/cli/model_run.hpp"
#include "chapters/cli/parallel.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/progress.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/step_loop.hpp"
#include "common/json.hpp"

namespace bigbatch::cli {
namespace {

/// --resume: the snapshot's step, or a fresh start. Under --zero 1 a snapshot holds the
/// whole optimizer state: resumed into a whole optimizer, of which this rank keeps its
/// shard.
void resume(const OutputOptions& output, nn::Network& model, nn::Optimizer& optimizer,
            train::Trainer& trainer, SnapshotSetup& snapshots,
            const train::RunConfig& settings, RunRanks& ranks) {
  // Loading writes whole f32 masters: under ZeRO in 16 bits the ranks hold shards of them
  // (the first step shards the loaded ones again).
  if (!output.resume.empty()) ranks.gather_master_weights(model);
  auto whole = output.resume.empty() ? nullptr
                                     : ranks.whole_optimizer(model, optimizer, /*gather=*/false);
  if (!whole) {
    snapshots.resume(model, optimizer, trainer, settings);
    return;
  }
  const std::int64_t resumed_at = snapshots.resume(model, *whole, trainer, settings);
  if (resumed_at > 0) ranks.take_shard(*whole, optimizer);
  // The whole state is not kept: each rank trains on its shard's.
}

}  // namespace

std::string steps_and_device(const train::Trainer& trainer, Device device) {
  const std::int64_t steps = trainer.total_steps();
  return std::to_string(steps) + (steps == 1 ? " step" : " steps") + " (" +
         std::to_string(trainer.batches_per_epoch()) + " per epoch) on " + device.name();
}

std::unique_ptr<ModelRun> model_run(const TrainOptions& options) {
  return options.model_kind == ModelKind::gpt ? gpt_run() : mlp_run();
}

int run_train(TrainOptions options) {
  const std::unique_ptr<ModelRun> run = model_run(options);
  run->check_flags(options);
  if (options.plan.automatic) check_plan_flags(options);
  RunRanks ranks(options);  // chapter 07; under MPI, rank 0 alone prints and writes files
  ranks.quiet_other_ranks(options);
  check_outputs(options);
  const Splits splits = load_data(options);  // once, --plan auto included
  run->check_ranks(options, splits, ranks);  // before a plan of its share
  // After the ranks' checks, so that a combination no machine runs is named as such even
  // where the device is missing. Ranks sharing a machine take a GPU each.
  options.source.device = ranks.device_of_this_rank(options.source.device);
  const Device device = available_device(options);
  // The parameters alone first, before any plan or step is predicted: when planned, the
  // fewest bytes a plan gives them, against the device alone (a cap no plan fits is the
  // planner's to report, with what would fit).
  const bool planned = options.plan.automatic;
  check_parameters_fit(options, run->parameter_bytes(options, splits, planned), device, !planned);
  if (options.plan.automatic) run->plan(options, splits, device, ranks);
  // Rows per forward pass, in training and in evaluation: what the memory was sized for.
  const std::int64_t micro_batch = checked_micro_batch(options, splits.train);
  run->check_micro_batch(options, splits, micro_batch);
  const nn::Optimizer::Options optimizer_choice = optimizer_options(options);
  const train::TrainConfig config = train_config(options);
  nn::Network& model =
      run->build(options, splits, device, ranks, micro_batch, optimizer_choice, config);
  nn::Optimizer optimizer(ranks.stepped_parameters(model), optimizer_choice);
  train::Trainer trainer(model, optimizer, splits.train, config, ranks.group(model));

  // Snapshots go to --snapshot-dir, or back to the folder --resume reads.
  const train::RunConfig settings =
      ranks.with_settings(run->settings(options, optimizer.options(), config));
  SnapshotSetup snapshots(options, ranks.writes());
  resume(options.output, model, optimizer, trainer, snapshots, settings, ranks);
  ranks.check_agreement(settings, model, optimizer, trainer.steps_done());

  const OutputOptions& output = options.output;
  StepLoop loop(output, config, trainer, snapshots,
                {.write_snapshot =
                     [&] {
                       // Under --zero 1 and 2 every rank's shard of the state, gathered:
                       // stage 0's tensors.
                       ranks.gather_master_weights(model);
                       const auto whole = ranks.whole_optimizer(model, optimizer, /*gather=*/true);
                       snapshots.write(model, whole ? *whole : optimizer, trainer, settings);
                     },
                 .complete_line =
                     [&](const train::StepRecord& record, Progress& progress, Json& line) {
                       if (run->logs_targets()) line["targets"] = record.batch_targets;
                       evaluate_at_step(model, splits, output.eval_every, trainer, record,
                                        run->accuracy_name().c_str(), progress, line);
                     },
                 .any_rank = [&](bool mine) { return ranks.any(mine); },
                 .ranks = ranks.enabled() ? ranks.count() : 0});
  run->warn(options.train.batch, micro_batch);

  // What is trained, then how: the header.
  std::cout << run->describe(splits, trainer, device) << "\n"
            << optimizer_line(options, trainer.lr_schedule(), optimizer.options(), micro_batch)
            << run->optimizer_note(ranks.enabled()) << "\nprecision "
            << precision_description(run->precision(), config) << "\n";
  if (ranks.enabled()) {
    std::cout << ranks.describe(options.train.batch, micro_batch, run->precision()) << "\n";
  }
  std::cout << run->checkpointing_report(output.explain) << resume_lines(snapshots, trainer)
            << std::flush;

  if (const int code = loop.run(); code != 0) return code;
  // Under ZeRO in 16 bits the ranks hold shards of the f32 masters: --save writes them
  // gathered into host memory (every rank was given the flag; rank 0 writes), not on the
  // device, which the steps may fill. The comparison reads what every rank holds whole
  // (the working copies, the f32 parameters).
  const std::map<std::string, Tensor> masters =
      options.was_given("--save") ? ranks.gathered_masters(model)
                                  : std::map<std::string, Tensor>{};
  ranks.check_parameters_agree(model);
  loop.finish();
  if (!output.save.empty()) {  // before the evaluation: nothing trained is lost after this
    run->save(output.save, masters);
    std::cout << "saved the parameters to " << output.save << "\n";
  }
  if (splits.test && ranks.writes()) {
    const nn::EvaluationResult test = evaluate_in_run(model, *splits.test, trainer);
    std::printf("%s (%s, %s): loss %.4f, %s %.4f\n", splits.evaluated(),
                splits.test->name.c_str(), run->counted(test).c_str(), test.loss,
                run->accuracy_name().c_str(), test.accuracy);
  }
  if (loop.steps_run() > 0) {
    std::cout << step_memory_report(device, trainer.largest_step_memory(), loop.steps_run());
  }
  return 0;
}

}  // namespace bigbatch::cli

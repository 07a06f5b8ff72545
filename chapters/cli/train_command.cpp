// train_command.cpp: `bigbatch train` of the MLP, from typed options to a finished (or
// snapshotted) run; its steps run in step_loop.hpp's loop, which the GPT's run shares.
#include "chapters/cli/train_command.hpp"

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/cli/parallel.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/progress.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/cli/step_loop.hpp"
#include "common/format.hpp"
#include "common/json.hpp"
#include "common/memory.hpp"
#include "nn/memory_model.hpp"

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

int run_train(TrainOptions options) {
  if (options.model_kind == ModelKind::gpt) return run_train_gpt(std::move(options));
  check_mlp_flags(options);
  if (options.plan.automatic) check_plan_flags(options);
  RunRanks ranks(options);  // chapter 07; under MPI, rank 0 alone prints and writes files
  ranks.quiet_other_ranks(options);
  check_outputs(options);
  const Splits splits = load_data(options);  // once, --plan auto included
  nn::ModelConfig model_shape = model_config(options, splits);
  ranks.check_run(options, model_shape, splits.train.size());  // before a plan of its share
  // After the ranks' checks, so that a combination no machine runs is named as such even
  // where the device is missing. Ranks sharing a machine take a GPU each.
  options.source.device = ranks.device_of_this_rank(options.source.device);
  const Device device = available_device(options);
  check_model_fits(options, splits, device, options.plan.automatic);
  if (options.plan.automatic) {  // on ranks: rank 0's share, planned by rank 0 for all
    const planning::Plan best = ranks.agreed_plan(
        [&] { return plan_for(options, model_shape, device, ranks.planned_ranks()).best(); });
    const std::int64_t planned = ranks.planned_ranks()
                                     ? dist::share_of(options.train.batch, ranks.count(), 0).size
                                     : options.train.batch;
    std::cout << "plan auto: " << planning::describe(best, planned) << "\n";
    apply_plan(best, options);
    model_shape.precision = options.model.precision;
  }
  const std::int64_t batch = options.train.batch;
  // Rows per forward pass, in training and in evaluation: what the memory was sized for.
  const std::int64_t micro_batch = checked_micro_batch(options, splits.train);
  const std::int64_t samples = splits.train.size();
  const bool batch_norm = model_shape.norm == nn::Norm::batch;
  if (batch_norm) check_batchnorm_micro_batches(batch, micro_batch, 0);
  if (batch_norm && !options.train.drop_last) {
    check_batchnorm_micro_batches(batch, micro_batch, samples % batch);
  }
  // The step as chapter 05's memory model sees it, the optimizer boundary's bytes
  // included: the cap is checked against it, budget:BYTES is chosen by its prediction,
  // and --explain prints the prediction.
  const nn::Optimizer::Options optimizer_choice = optimizer_options(options);
  const train::TrainConfig config = train_config(options);
  // Under MPI, rank 0's step: its share, its shard of the optimizer state (chapter 07).
  const checkpointing::StepShape step_shape = ranks.rank_step(
      {model_shape, batch, micro_batch, optimizer_choice,
       loss_scaling::boundary_workspace_bytes(train::boundary_options(config))});
  cap_device_memory(options, checkpointing::predict_policy(step_shape, {}), device);

  nn::Model model(model_shape, device);
  const Checkpointing<nn::Model> checkpoint =
      checkpointing_for<nn::Model>(options.checkpoint, step_shape, model_shape.depth);
  if (checkpoint.runner) model.set_block_runner(checkpoint.runner);
  const OutputOptions& output = options.output;
  if (!output.init.empty()) {
    try {
      model.load(output.init);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--init: ") + e.what());
    }
  }
  nn::Optimizer optimizer(ranks.stepped_parameters(model), optimizer_choice);
  train::Trainer trainer(model, optimizer, splits.train, config, ranks.group(model));

  // Snapshots go to --snapshot-dir, or back to the folder --resume reads.
  const train::RunConfig settings =
      ranks.with_settings(resume_settings(options, model_shape, optimizer.options(), config));
  SnapshotSetup snapshots(options, ranks.writes());
  // Under --zero 1 a snapshot holds the whole optimizer state: resumed into a whole
  // optimizer, of which this rank keeps its shard.
  std::int64_t resumed_at = 0;
  // Loading writes whole f32 masters: under ZeRO in 16 bits the ranks hold shards of them
  // (the first step shards the loaded ones again).
  if (!output.resume.empty()) ranks.gather_master_weights(model);
  auto whole = output.resume.empty() ? nullptr
                                     : ranks.whole_optimizer(model, optimizer, /*gather=*/false);
  if (whole) {
    resumed_at = snapshots.resume(model, *whole, trainer, settings);
    if (resumed_at > 0) ranks.take_shard(*whole, optimizer);
    whole.reset();  // the whole state is not kept: each rank trains on its shard's
  } else {
    resumed_at = snapshots.resume(model, optimizer, trainer, settings);
  }
  ranks.check_agreement(settings, model, optimizer, trainer.steps_done());

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
                       evaluate_at_step(model, splits, output.eval_every, micro_batch, record,
                                        "accuracy", progress, line);
                     },
                 .any_rank = [&](bool mine) { return ranks.any(mine); },
                 .ranks = ranks.enabled() ? ranks.count() : 0});
  if (batch_norm && micro_batch < batch) {
    std::cerr << "bigbatch train: warning: --norm batch normalises each micro-batch of "
              << micro_batch << " with its own statistics, so the update is not the one a "
              << "batch of " << batch << " in one piece would give (gradient "
              << "accumulation is exact for --norm layer)\n";
  }

  // What is trained, then how: the two header lines.
  std::cout << "bigbatch train: " << splits.train.name << " (" << samples << " samples, "
            << splits.train.feature_dim() << " features, " << model_shape.classes
            << " classes), model depth " << model_shape.depth << " hidden "
            << model_shape.hidden << " (" << model.parameter_count() << " parameters), "
            << trainer.total_steps() << (trainer.total_steps() == 1 ? " step" : " steps")
            << " (" << trainer.batches_per_epoch() << " per epoch) on " << device.name() << "\n";
  std::cout << optimizer_line(options, trainer.lr_schedule(), optimizer.options(), micro_batch)
            << "\nprecision " << precision_description(model_shape.precision, config) << "\n";
  if (ranks.enabled()) std::cout << ranks.describe(batch, micro_batch, model_shape.precision) << "\n";
  std::cout << checkpointing_lines(
      checkpoint.asked, checkpoint.policy,
      checkpoint.runner ? &checkpoint.runner->schedule() : nullptr, output.explain,
      checkpointing::predict_policy(step_shape, checkpoint.policy));
  std::cout << resume_lines(snapshots, trainer) << std::flush;

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
    model.save(output.save, masters);
    std::cout << "saved the parameters to " << output.save << "\n";
  }
  if (splits.test && ranks.writes()) {
    const nn::EvaluationResult test = nn::evaluate(model, *splits.test, micro_batch);
    std::printf("%s (%s, %lld samples): loss %.4f, accuracy %.4f\n", splits.evaluated(),
                splits.test->name.c_str(),
                static_cast<long long>(test.samples), test.loss, test.accuracy);
  }
  if (loop.steps_run() > 0) {
    std::cout << step_memory_report(device, trainer.largest_step_memory(), loop.steps_run());
  }
  return 0;
}

}  // namespace bigbatch::cli

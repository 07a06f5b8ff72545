// train_command.cpp: `bigbatch train`, from typed options to a finished (or snapshotted) run.
#include "chapters/cli/train_command.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/cli/parallel.hpp"
#include "chapters/cli/plan_command.hpp"
#include "chapters/cli/progress.hpp"
#include "chapters/cli/setup.hpp"
#include "chapters/train/snapshot.hpp"
#include "common/format.hpp"
#include "common/json.hpp"
#include "common/memory.hpp"
#include "nn/memory_model.hpp"

namespace bigbatch::cli {
namespace {

/// The signal that asked the run to stop (SIGINT or SIGTERM), 0 while none has.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void request_stop(int signal) {
  g_stop_signal = signal;
  std::signal(signal, SIG_DFL);  // a second one stops at once
}

/// Thrown from the step callback to leave the training loop after a signal.
struct Interrupted {
  int signal;
};

/// Keeps the lines of a --log file up to step `last` (a resumed run appends the rest),
/// rewriting it atomically; nothing when the file does not exist.
void truncate_log(const std::string& path, std::int64_t last) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    // A line cut short by the kill that stopped the run does not parse: it goes.
    const Json parsed = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object() || !parsed.contains("step") || !parsed["step"].is_number_integer() ||
        parsed["step"].get<std::int64_t>() > last) {
      continue;
    }
    kept += line + "\n";
  }
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary, std::ios::trunc);
  out << kept;
  out.close();
  if (!out || std::rename(temporary.c_str(), path.c_str()) != 0) {
    throw UsageError("--log: cannot rewrite " + path + " for the resumed run");
  }
}

/// Below what is live before any step (parameters, gradients, optimizer state and the
/// batch) nothing can train: that is a setting out of range, not a step that ran out.
void cap_device_memory(const TrainOptions& options, const checkpointing::StepShape& shape,
                       Device device) {
  if (!options.device_memory) return;
  const std::size_t cap = *options.device_memory;
  const nn::StepPrediction step = checkpointing::predict_policy(shape, checkpointing::Policy{});
  if (cap < step.stats.live_total) {
    throw UsageError("--device-memory " + format_bytes(cap) + " is below the " +
                     format_bytes(step.stats.live_total) + " that the model's parameters, "
                     "gradients and optimizer state and one micro-batch's samples hold before any step (a "
                     "step then peaks at " + format_bytes(step.peak()) + ")");
  }
  allocator_for(device).set_cap(cap);
}

/// --checkpoint as the run uses it: the policy asked for, the one it resolves to (a
/// budget becomes the policy of fewest recomputations that fits) and its block runner.
struct Checkpointing {
  checkpointing::Policy asked, policy;
  std::shared_ptr<checkpointing::ScheduledRunner> runner;  // null: every block keeps all
};

Checkpointing checkpointing_for(const TrainOptions& options,
                                const checkpointing::StepShape& shape) {
  Checkpointing c;
  c.asked = options.checkpoint;
  try {
    c.policy = checkpointing::resolve_policy(c.asked, shape);
    if (c.policy.needs_runner()) {
      c.runner = checkpointing::ScheduledRunner::for_policy(c.policy, shape.model.depth);
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--checkpoint: ") + e.what());
  }
  return c;
}

/// The folder snapshots go to and, with --resume, where the run starts from. In a
/// data-parallel run every rank resumes from the folder's newest snapshot and rank 0 alone
/// (the writer) holds the folder's lock and writes: the ranks' states are the same (under
/// --zero 1 and 2 once their shards of the optimizer state and of the f32 masters are
/// gathered: RunRanks::whole_optimizer, gather_master_weights).
class SnapshotSetup {
 public:
  SnapshotSetup(const TrainOptions& options, bool writer)
      : output_(options.output),
        dir_(!output_.snapshot_dir.empty() ? output_.snapshot_dir : output_.resume),
        writer_(writer) {
    const OutputOptions& output = output_;
    if (dir_.empty() && (options.was_given("--snapshot-every") ||
                         options.was_given("--snapshot-keep"))) {
      throw UsageError("--snapshot-every and --snapshot-keep need --snapshot-dir (or --resume)");
    }
    if (!output.resume.empty() && !std::filesystem::is_directory(output.resume)) {
      throw UsageError("--resume " + output.resume + ": no such folder");
    }
    if (dir_.empty()) return;
    enabled_ = true;
    if (!writer_) return;
    try {
      snapshots_.emplace(dir_, output.snapshot_keep);  // and its folder's lock
    } catch (const std::runtime_error& e) {
      const char* flag = output.snapshot_dir.empty() ? "--resume: " : "--snapshot-dir: ";
      throw UsageError(flag + std::string(e.what()));
    }
  }

  /// With --resume: restores the newest snapshot of its folder into the run, and returns
  /// the steps it had done (0 without --resume).
  std::int64_t resume(nn::Model& model, nn::Optimizer& optimizer, train::Trainer& trainer,
                      const train::RunConfig& settings) {
    const std::string& from = output_.resume;
    if (from.empty()) return 0;
    // From the --resume folder, even when --snapshot-dir sends new snapshots elsewhere
    // (then that folder is locked too while it is read).
    std::optional<train::SnapshotFolderLock> reading;
    try {
      std::error_code unknown;  // a folder that cannot be compared is locked apart
      if (writer_ && !std::filesystem::equivalent(dir_, from, unknown)) reading.emplace(from);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--resume: ") + e.what());
    }
    const std::vector<train::SnapshotFile> files = train::list_snapshots(from);
    if (files.empty()) {
      throw UsageError("--resume " + from + ": no snapshot (step-*.safetensors) in it");
    }
    try {
      // Another R continues the same batches from the same state (the snapshot holds whole
      // tensors, so ZeRO's ranks take their shards of it at the new R); the ranks' sums
      // add in another order, so the bits from here are not the old R's.
      const train::RunConfig changed = train::restore_snapshot(
          files.back().path, model, optimizer, trainer, settings,
          settings.count("ranks") != 0 ? std::set<std::string>{"ranks"}
                                       : std::set<std::string>{});
      if (changed.count("ranks") != 0) {
        note_ = "the snapshot was written by " + changed.at("ranks") + " ranks, this run has " +
                settings.at("ranks") + ": the same batches and state go on, their shares " +
                "re-split (and under ZeRO the state re-sharded), but the sums over ranks add in " +
                "another order, so the steps from here are not the bits " +
                changed.at("ranks") + " ranks would give";
      }
    } catch (const train::SnapshotMismatchError& e) {  // a changed setting
      // Every recorded setting is a flag but the ranks (mpirun -np R, or --simulate-ranks R).
      std::string message = e.what();
      for (std::size_t at; (at = message.find("--ranks ")) != std::string::npos;) {
        message.replace(at, 8, "ranks ");
      }
      throw UsageError("--resume: " + message);
    } catch (const std::runtime_error& e) {  // a damaged file: is an older one whole?
      const auto intact = std::find_if(
          std::next(files.rbegin()), files.rend(),
          [](const train::SnapshotFile& file) { return train::snapshot_is_intact(file.path); });
      throw UsageError(std::string("--resume: ") + e.what() +
                       (intact == files.rend()
                            ? "; no older snapshot in " + from + " is intact"
                            : "; the older snapshot " + intact->path +
                                  " is intact: move the newer ones out of the folder to resume "
                                  "from it"));
    }
    last_ = files.back().path;
    last_step_ = trainer.steps_done();
    return last_step_;
  }

  bool enabled() const { return enabled_; }
  const std::string& dir() const { return dir_; }
  /// The newest snapshot written or resumed from ("" when none).
  const std::string& last() const { return last_; }
  /// What a resume changed that the reader should know ("" when nothing): another R.
  const std::string& resume_note() const { return note_; }
  std::int64_t last_step() const { return last_step_; }

  void write(const nn::Model& model, const nn::Optimizer& optimizer,
             const train::Trainer& trainer, const train::RunConfig& settings) {
    if (writer_) last_ = snapshots_->write(model, optimizer, trainer, settings);
    last_step_ = trainer.steps_done();
  }

 private:
  const OutputOptions& output_;
  std::string dir_;
  bool writer_ = true;
  bool enabled_ = false;
  std::optional<train::Snapshots> snapshots_;  // the writer's
  std::string last_;
  std::int64_t last_step_ = 0;
  std::string note_;
};

}  // namespace

int run_train(TrainOptions options) {
  if (options.model_kind == ModelKind::gpt) return run_train_gpt(options);
  for (const char* flag : {"--seq-len", "--layers", "--width", "--heads"}) {
    if (options.was_given(flag)) {
      throw UsageError(std::string(flag) + " shapes --model gpt; the MLP's shape is --depth, "
                       "--hidden and --expansion");
    }
  }
  if (options.source.data.kind == DataKind::text) {
    throw UsageError("--data " + options.source.data.text() + " is token sequences: train it "
                     "with --model gpt");
  }
  if (options.plan.automatic) check_plan_flags(options);
  RunRanks ranks(options);  // chapter 07; under MPI, rank 0 alone prints and writes files
  if (!ranks.writes()) {
    if (!std::freopen("/dev/null", "w", stdout)) throw std::runtime_error("rank " + std::to_string(ranks.rank()) + ": cannot silence stdout");
    options.output.save.clear();
    options.output.log.clear();
    options.output.eval_every = 0;
  }
  if (!options.output.save.empty()) check_writable(options.output.save);
  const Splits splits = load_data(options);  // once, --plan auto included
  nn::ModelConfig model_shape = model_config(options, splits);
  ranks.check_run(options, model_shape, splits.train.size());  // before a plan of its share
  // After the ranks' checks, so that a combination no machine runs is named as such even
  // where the device is missing. Ranks sharing a machine take a GPU each.
  options.source.device = ranks.device_of_this_rank(options.source.device);
  const Device device = available_device(options);
  if (options.plan.automatic) {  // on ranks: rank 0's share, planned by rank 0 for all
    const planning::Plan best = ranks.agreed_plan(
        [&] { return plan_for(options, model_shape, device, ranks.planned_ranks()).best(); });
    const std::int64_t planned = ranks.planned_ranks()
                                     ? dist::share_of(options.train.batch, ranks.count(), 0).size
                                     : options.train.batch;
    std::cout << "plan auto: " << planning::describe(best, planned) << "\n";
    apply_plan(best, options, model_shape);
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
  cap_device_memory(options, step_shape, device);

  nn::Model model(model_shape, device);
  const Checkpointing checkpoint = checkpointing_for(options, step_shape);
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

  std::ofstream log;
  if (!output.log.empty()) {
    if (resumed_at > 0) truncate_log(output.log, resumed_at);
    log.open(output.log, resumed_at > 0 ? std::ios::app : std::ios::trunc);
    if (!log) throw UsageError("--log: cannot write " + output.log);
  }
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
  if (checkpoint.asked != checkpoint.policy) {
    std::cout << "checkpoint " << checkpoint.asked.text() << ": " << checkpoint.policy.text()
              << ", the policy of fewest recomputations whose predicted step fits\n";
  }
  if (checkpoint.runner) {
    const checkpointing::ScheduleStats stats =
        checkpointing::simulate(checkpoint.runner->schedule());
    std::cout << "activation checkpointing " << checkpoint.policy.text() << ": at most "
              << stats.max_checkpoints << " block inputs kept and " << stats.max_taped
              << (stats.max_taped == 1 ? " block's" : " blocks'")
              << " activations at a time; " << stats.advances + stats.tapes
              << " block forwards per micro-batch instead of " << model_shape.depth << "\n";
    if (output.explain) std::cout << checkpointing::explain(checkpoint.runner->schedule()) << "\n";
  }
  if (checkpoint.runner || output.explain) {
    const nn::StepPrediction predicted =
        checkpointing::predict_policy(step_shape, checkpoint.policy);
    std::cout << "predicted step peak " << format_bytes(predicted.peak()) << " ("
              << predicted.peak() << " bytes), at: " << predicted.peak_moment << "\n";
  }
  if (resumed_at > 0) {
    std::cout << "resumed from " << snapshots.last() << " after step " << resumed_at << " of "
              << trainer.total_steps() << "\n";
    if (!snapshots.resume_note().empty()) std::cout << snapshots.resume_note() << "\n";
  }
  std::cout << std::flush;

  const bool scaled = config.loss_scaling != train::LossScaling::none;
  // The boundary's pass measures the gradients' norm when it runs: with a scaler or clipping.
  const bool norm_measured = scaled || config.clip_grad_norm > 0.0f;
  Progress progress(trainer.total_steps(), output.print_every, scaled,
                    config.clip_grad_norm > 0.0f);
  // A resumed run that has no step left reports the snapshot's scale and skips.
  const train::TrainerState start = trainer.state();
  float last_loss = 0;
  float last_scale = start.scaler                                   ? start.scaler->scale
                     : config.loss_scaling == train::LossScaling::fixed ? config.fixed_scale
                                                                        : 1.0f;
  std::int64_t skipped = start.skipped_steps;
  double reduce_seconds = 0;  // the steps' gradient sums over ranks
  const auto write_snapshot = [&] {
    if (log.is_open()) log.flush();  // every line up to the snapshot's step is in the file
    // Under --zero 1 and 2 every rank's shard of the state, gathered: stage 0's tensors.
    ranks.gather_master_weights(model);
    const auto whole = ranks.whole_optimizer(model, optimizer, /*gather=*/true);
    snapshots.write(model, whole ? *whole : optimizer, trainer, settings);
  };
  g_stop_signal = 0;
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  try {
    trainer.run([&](const train::StepRecord& record) {
      last_loss = record.loss;
      last_scale = record.loss_scale;
      skipped = record.skipped_steps;
      progress.update(record);
      Json line = log_line(record, progress.elapsed(), norm_measured, ranks.enabled());
      reduce_seconds += record.reduce_seconds;
      evaluate_at_step(model, splits, output.eval_every, micro_batch, record, "accuracy",
                       progress, line);
      if (log.is_open()) log << line.dump() << '\n';
      const bool stop = ranks.any(g_stop_signal != 0);
      if (snapshots.enabled() &&
          (stop || (output.snapshot_every > 0 && record.step % output.snapshot_every == 0))) {
        write_snapshot();
      }
      // A rank that saw no signal itself stops with the others' (mpirun sends SIGTERM).
      if (stop) throw Interrupted{g_stop_signal != 0 ? static_cast<int>(g_stop_signal) : SIGTERM};
    });
  } catch (const Interrupted& stop) {
    progress.break_line();
    if (log.is_open()) log.close();
    std::cout << "interrupted by " << (stop.signal == SIGINT ? "SIGINT" : "SIGTERM")
              << " after step " << trainer.steps_done() << " of " << trainer.total_steps();
    if (snapshots.enabled()) {
      std::cout << ": snapshot " << snapshots.last() << " written; continue with --resume "
                << snapshots.dir() << "\n";
    } else {
      std::cout << ": nothing saved (give --snapshot-dir to keep the state)\n";
    }
    return 128 + stop.signal;
  } catch (const train::NonFiniteLossError& e) {
    throw std::runtime_error(std::string(e.what()) +
                             (snapshots.last().empty()
                                  ? std::string("; no snapshot was written")
                                  : "; the last snapshot is " + snapshots.last() + " (step " +
                                        std::to_string(snapshots.last_step()) + ")"));
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  // Under ZeRO in 16 bits the ranks hold shards of the f32 masters: --save writes them
  // gathered into host memory (every rank was given the flag; rank 0 writes), not on the
  // device, which the steps may fill. The comparison reads what every rank holds whole
  // (the working copies, the f32 parameters).
  const std::map<std::string, Tensor> masters =
      options.was_given("--save") ? ranks.gathered_masters(model)
                                  : std::map<std::string, Tensor>{};
  ranks.check_parameters_agree(model);
  progress.break_line();
  if (snapshots.enabled() && snapshots.last_step() != trainer.steps_done()) write_snapshot();
  const double seconds = progress.elapsed();
  if (log.is_open()) {
    log.close();
    if (!log) throw std::runtime_error("--log: writing " + output.log + " failed");
  }

  const std::int64_t steps_run = trainer.total_steps() - resumed_at;
  std::printf("trained %lld steps in %s (%.1f ms/step on average)\n",
              static_cast<long long>(steps_run), clock_time(seconds).c_str(),
              steps_run > 0 ? 1e3 * seconds / static_cast<double>(steps_run) : 0.0);
  if (ranks.enabled() && steps_run > 0) {
    std::printf("summing the gradients over %d %s: %.1f ms per step (%.1f%% of the steps' time)\n",
                ranks.count(), ranks.count() == 1 ? "rank" : "ranks",
                1e3 * reduce_seconds / static_cast<double>(steps_run),
                seconds > 0 ? 100 * reduce_seconds / seconds : 0.0);
  }
  if (snapshots.enabled()) std::cout << "snapshot: " << snapshots.last() << "\n";
  if (steps_run > 0) std::printf("final train loss (last batch): %.4f\n", last_loss);
  if (scaled) {
    std::printf("loss scale: %g at the end; %lld of %lld steps skipped on an overflow\n",
                static_cast<double>(last_scale), static_cast<long long>(skipped),
                static_cast<long long>(trainer.total_steps()));
  }
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
  if (steps_run > 0) {
    std::cout << step_memory_report(device, trainer.largest_step_memory(), steps_run);
  }
  return 0;
}

}  // namespace bigbatch::cli

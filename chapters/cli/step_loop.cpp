// step_loop.cpp: the steps of a `bigbatch train` run, and its snapshots.
#include "chapters/cli/step_loop.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <set>
#include <vector>

#include "chapters/cli/setup.hpp"
#include "chapters/cli/stop_signals.hpp"
#include "common/json.hpp"

namespace bigbatch::cli {
namespace {

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

}  // namespace

SnapshotSetup::SnapshotSetup(const TrainOptions& options, bool writer)
    : output_(options.output),
      dir_(!output_.snapshot_dir.empty() ? output_.snapshot_dir : output_.resume),
      writer_(writer) {
  const OutputOptions& output = output_;
  if (dir_.empty() &&
      (options.was_given("--snapshot-every") || options.was_given("--snapshot-keep"))) {
    throw UsageError("--snapshot-every and --snapshot-keep need --snapshot-dir (or --resume)");
  }
  if (!output.resume.empty() && !std::filesystem::is_directory(output.resume)) {
    throw UsageError("--resume " + output.resume + ": no such folder");
  }
  if (dir_.empty()) return;
  enabled_ = true;
  refuse_another_runs_folder();
  if (!writer_) return;
  try {
    snapshots_.emplace(dir_, output.snapshot_keep);  // and its folder's lock
  } catch (const std::runtime_error& e) {
    const char* flag = output.snapshot_dir.empty() ? "--resume: " : "--snapshot-dir: ";
    throw UsageError(flag + std::string(e.what()));
  }
}

void SnapshotSetup::refuse_another_runs_folder() const {
  // A folder holds the snapshots of one run. A run that does not continue them (--resume
  // from that folder) would put its own among them, and keeping the newest would count the
  // other run's later steps as newer than its own and delete those. Every rank reads the
  // folder alike, so every rank refuses alike.
  const std::string& from = output_.resume;
  std::error_code unknown;  // a folder that is not there holds nothing
  if (!from.empty() && std::filesystem::equivalent(dir_, from, unknown)) return;
  if (!std::filesystem::is_directory(dir_, unknown)) return;
  std::vector<train::SnapshotFile> files;
  try {
    files = train::list_snapshots(dir_);
  } catch (const std::filesystem::filesystem_error& e) {
    throw UsageError("--snapshot-dir " + dir_ + ": cannot read the folder (" +
                     e.code().message() + ")");
  }
  if (files.empty()) return;
  throw UsageError("--snapshot-dir " + dir_ + " holds the snapshots of another run (the newest: " +
                   files.back().path + "): continue that run with --resume " + dir_ +
                   ", or give a folder without snapshots");
}

std::int64_t SnapshotSetup::resume(nn::Network& model, nn::Optimizer& optimizer,
                                   train::Trainer& trainer, const train::RunConfig& settings) {
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
        settings.count("ranks") != 0 ? std::set<std::string>{"ranks"} : std::set<std::string>{});
    if (changed.count("ranks") != 0) {
      note_ = "the snapshot was written by " + changed.at("ranks") + " ranks, this run has " +
              settings.at("ranks") + ": the same batches and state go on, their shares " +
              "re-split (and under ZeRO the state re-sharded), but the sums over ranks add in " +
              "another order, so the steps from here are not the bits " + changed.at("ranks") +
              " ranks would give";
    }
  } catch (const train::SnapshotMismatchError& e) {  // a changed setting
    // Every recorded setting is a flag but the ranks (mpirun -np R, or --simulate-ranks R),
    // which only one side has here: both sides having them, R may change.
    if (e.setting() == "ranks") {
      throw UsageError(
          "--resume: " + files.back().path +
          (settings.count("ranks") != 0
               ? " was written by a run without ranks, and this run has " + settings.at("ranks")
               : std::string(" was written by a run on ranks, and this run has none")) +
          ": a snapshot written on ranks resumes on ranks, any R (mpirun -np R or "
          "--simulate-ranks R), and one written without ranks resumes without them");
    }
    throw UsageError(std::string("--resume: ") + e.what());
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

void SnapshotSetup::write(const nn::Network& model, const nn::Optimizer& optimizer,
                          const train::Trainer& trainer, const train::RunConfig& settings) {
  if (writer_) last_ = snapshots_->write(model, optimizer, trainer, settings);
  last_step_ = trainer.steps_done();
}

StepLoop::StepLoop(const OutputOptions& output, const train::TrainConfig& config,
                   train::Trainer& trainer, SnapshotSetup& snapshots, Hooks hooks)
    : output_(output),
      scaled_(config.loss_scaling != train::LossScaling::none),
      // The boundary's pass measures the gradients' norm when it runs: with a scaler or
      // clipping.
      norm_measured_(scaled_ || config.clip_grad_norm > 0.0f),
      show_norm_(config.clip_grad_norm > 0.0f),
      trainer_(trainer),
      snapshots_(snapshots),
      hooks_(std::move(hooks)),
      resumed_at_(trainer.steps_done()) {
  if (!output.log.empty()) {
    if (resumed_at_ > 0) truncate_log(output.log, resumed_at_);
    log_.open(output.log, resumed_at_ > 0 ? std::ios::app : std::ios::trunc);
    if (!log_) throw UsageError("--log: cannot write " + output.log);
  }
  // A resumed run that has no step left reports the snapshot's scale and skips.
  const train::TrainerState start = trainer.state();
  last_scale_ = start.scaler                                       ? start.scaler->scale
                : config.loss_scaling == train::LossScaling::fixed ? config.fixed_scale
                                                                   : 1.0f;
  skipped_ = start.skipped_steps;
}

int StepLoop::run() {
  Progress& progress =
      progress_.emplace(trainer_.total_steps(), output_.print_every, scaled_, show_norm_);
  const auto write_snapshot = [&] {
    if (log_.is_open()) log_.flush();  // every line up to the snapshot's step is in the file
    hooks_.write_snapshot();
  };
  const StopSignals signals;
  try {
    trainer_.run([&](const train::StepRecord& record) {
      last_loss_ = record.loss;
      last_scale_ = record.loss_scale;
      skipped_ = record.skipped_steps;
      progress.update(record);
      Json line = log_line(record, progress.elapsed(), norm_measured_, hooks_.ranks > 0);
      reduce_seconds_ += record.reduce_seconds;
      hooks_.complete_line(record, progress, line);
      if (log_.is_open()) log_ << line.dump() << '\n';
      const bool stop = hooks_.any_rank(StopSignals::received() != 0);
      if (snapshots_.enabled() &&
          (stop || (output_.snapshot_every > 0 && record.step % output_.snapshot_every == 0))) {
        write_snapshot();
      }
      // A rank that saw no signal itself stops with the others' (mpirun sends SIGTERM).
      if (stop) throw Interrupted{StopSignals::received() != 0 ? StopSignals::received() : SIGTERM};
    });
  } catch (const Interrupted& stop) {
    progress.break_line();
    if (log_.is_open()) log_.close();
    std::cout << "interrupted by " << (stop.signal == SIGINT ? "SIGINT" : "SIGTERM")
              << " after step " << trainer_.steps_done() << " of " << trainer_.total_steps();
    if (snapshots_.enabled()) {
      std::cout << ": snapshot " << snapshots_.last() << " written; continue with --resume "
                << snapshots_.dir() << "\n";
    } else {
      std::cout << ": nothing saved (give --snapshot-dir to keep the state)\n";
    }
    return 128 + stop.signal;
  } catch (const train::NonFiniteLossError& e) {
    throw std::runtime_error(std::string(e.what()) +
                             (snapshots_.last().empty()
                                  ? std::string("; no snapshot was written")
                                  : "; the last snapshot is " + snapshots_.last() + " (step " +
                                        std::to_string(snapshots_.last_step()) + ")"));
  }
  return 0;
}

void StepLoop::finish() {
  Progress& progress = *progress_;
  progress.break_line();
  if (snapshots_.enabled() && snapshots_.last_step() != trainer_.steps_done()) {
    if (log_.is_open()) log_.flush();
    hooks_.write_snapshot();
  }
  const double seconds = progress.elapsed();
  if (log_.is_open()) {
    log_.close();
    if (!log_) throw std::runtime_error("--log: writing " + output_.log + " failed");
  }
  const std::int64_t steps = steps_run();
  std::printf("trained %lld steps in %s (%.1f ms/step on average)\n", static_cast<long long>(steps),
              clock_time(seconds).c_str(),
              steps > 0 ? 1e3 * seconds / static_cast<double>(steps) : 0.0);
  if (hooks_.ranks > 0 && steps > 0) {
    std::printf("summing the gradients over %d %s: %.1f ms per step (%.1f%% of the steps' time)\n",
                hooks_.ranks, hooks_.ranks == 1 ? "rank" : "ranks",
                1e3 * reduce_seconds_ / static_cast<double>(steps),
                seconds > 0 ? 100 * reduce_seconds_ / seconds : 0.0);
  }
  if (snapshots_.enabled()) std::cout << "snapshot: " << snapshots_.last() << "\n";
  if (steps > 0) std::printf("final train loss (last batch): %.4f\n", last_loss_);
  if (scaled_) {
    std::printf("loss scale: %g at the end; %lld of %lld steps skipped on an overflow\n",
                static_cast<double>(last_scale_), static_cast<long long>(skipped_),
                static_cast<long long>(trainer_.total_steps()));
  }
}

std::string resume_lines(const SnapshotSetup& snapshots, const train::Trainer& trainer) {
  if (snapshots.last_step() == 0 || snapshots.last().empty()) return "";
  std::string lines = "resumed from " + snapshots.last() + " after step " +
                      std::to_string(snapshots.last_step()) + " of " +
                      std::to_string(trainer.total_steps()) + "\n";
  if (!snapshots.resume_note().empty()) lines += snapshots.resume_note() + "\n";
  return lines;
}

}  // namespace bigbatch::cli

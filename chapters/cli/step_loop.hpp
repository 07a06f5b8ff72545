// step_loop.hpp: the part of `bigbatch train` that the MLP's run (train_command.cpp) and the
// GPT's (train_gpt.cpp) share, from a built trainer to the run's summary: where snapshots
// go and --resume starts from, the --log file, the progress line, SIGINT and SIGTERM, and
// "trained N steps in ...". One loop, so that a snapshot, an interrupted run and a resumed
// log behave the same for every model.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "chapters/cli/options.hpp"
#include "chapters/cli/progress.hpp"
#include "chapters/train/run_settings.hpp"
#include "chapters/train/snapshot.hpp"
#include "chapters/train/trainer.hpp"
#include "common/json_fwd.hpp"
#include "nn/network.hpp"
#include "nn/training.hpp"

namespace bigbatch::cli {

/// The folder snapshots go to (--snapshot-dir, or back to the folder --resume reads) and,
/// with --resume, the snapshot the run starts from. In a data-parallel run every rank
/// resumes from the folder's newest snapshot and rank 0 alone (the writer) holds the
/// folder's lock and writes: the ranks' states are the same (under --zero 1 and 2 once
/// their shards of the optimizer state and of the f32 masters are gathered).
class SnapshotSetup {
 public:
  /// Checks the flags (UsageError: --snapshot-every or --snapshot-keep without a folder, a
  /// --resume folder that does not exist, a folder that holds another run's snapshots, that
  /// is one the run does not --resume from) and, on the writer, takes the folder's lock.
  SnapshotSetup(const TrainOptions& options, bool writer);

  /// With --resume: restores the newest snapshot of its folder into the run (UsageError
  /// naming a changed setting, or a damaged file and whether an older one is intact) and
  /// returns the steps it had done; 0 without --resume. `settings` may differ from the
  /// snapshot's in "ranks" alone (resume_note() says what that changes).
  std::int64_t resume(nn::Network& model, nn::Optimizer& optimizer, train::Trainer& trainer,
                      const train::RunConfig& settings);

  /// Whether the run writes snapshots (a folder was given).
  bool enabled() const { return enabled_; }
  /// The folder snapshots go to.
  const std::string& dir() const { return dir_; }
  /// The newest snapshot written or resumed from ("" when none).
  const std::string& last() const { return last_; }
  /// What a resume changed that the reader should know ("" when nothing): another R.
  const std::string& resume_note() const { return note_; }
  /// The step of last() (0 when none).
  std::int64_t last_step() const { return last_step_; }

  /// Writes the run as it stands (the writer alone; every rank notes the step).
  void write(const nn::Network& model, const nn::Optimizer& optimizer,
             const train::Trainer& trainer, const train::RunConfig& settings);

 private:
  /// UsageError when the snapshot folder holds snapshots and the run does not resume them.
  void refuse_another_runs_folder() const;

  const OutputOptions& output_;
  std::string dir_;
  bool writer_ = true;
  bool enabled_ = false;
  std::optional<train::Snapshots> snapshots_;  // the writer's
  std::string last_;
  std::int64_t last_step_ = 0;
  std::string note_;
};

/// The trainer's remaining steps with everything the program shows and keeps around them.
class StepLoop {
 public:
  /// What the model's run adds to the loop.
  struct Hooks {
    /// Writes a snapshot of the run as it stands (SnapshotSetup::write; the MLP's ranks
    /// gather their shards first). Called only when snapshots are enabled.
    std::function<void()> write_snapshot;
    /// Completes a step's log line: the model's own fields, and the evaluation due at the
    /// step (evaluate_at_step, which prints through the progress line).
    std::function<void(const train::StepRecord&, Progress&, Json&)> complete_line;
    /// Whether any rank saw a stop signal (under MPI a collective, so that every rank stops
    /// after the same step); alone, `mine`.
    std::function<bool(bool)> any_rank = [](bool mine) { return mine; };
    /// R when the batch is split over ranks (the log and the summary show the time of the
    /// gradients' sum), 0 otherwise.
    int ranks = 0;
  };

  /// Opens --log: after a resume (the trainer has steps done) its lines up to that step
  /// are kept and the run appends to them; otherwise it starts empty. UsageError when it
  /// cannot be written. `output` and the objects referred to outlive the loop.
  StepLoop(const OutputOptions& output, const train::TrainConfig& config,
           train::Trainer& trainer, SnapshotSetup& snapshots, Hooks hooks);

  /// Runs the remaining steps: the progress line, a log line per step, a snapshot every
  /// --snapshot-every steps and when SIGINT or SIGTERM asks the run to stop (it finishes the
  /// step first; a second signal stops at once). Returns 0 after the last step; after a
  /// signal, says where the run stopped and how to continue, and returns 128 + the signal.
  /// A diverged loss (train::NonFiniteLossError) is rethrown as std::runtime_error naming
  /// the last snapshot.
  int run();

  /// After run() returned 0 (and whatever the ranks check between): the last step's
  /// snapshot unless it was written, the log closed, and the summary: "trained N steps in
  /// ...", the snapshot, the last batch's loss and the loss scale.
  void finish();

  /// The steps this process ran (the total less those a resume started after).
  std::int64_t steps_run() const { return trainer_.total_steps() - resumed_at_; }

 private:
  const OutputOptions& output_;
  bool scaled_;
  bool norm_measured_;
  bool show_norm_;
  train::Trainer& trainer_;
  SnapshotSetup& snapshots_;
  Hooks hooks_;
  std::int64_t resumed_at_;
  std::ofstream log_;
  std::optional<Progress> progress_;  // from the first step on
  float last_loss_ = 0;
  float last_scale_ = 1;
  std::int64_t skipped_ = 0;
  double reduce_seconds_ = 0;  // the steps' gradient sums over ranks
};

/// "resumed from DIR/step-N.safetensors after step N of M" and what the resume changed,
/// for the run's header ("" when the run did not resume).
std::string resume_lines(const SnapshotSetup& snapshots, const train::Trainer& trainer);

}  // namespace bigbatch::cli

// progress.hpp: what `bigbatch train` shows while it runs: the progress line, the --log
// line of every step, and the memory report at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "chapters/cli/setup.hpp"
#include "chapters/train/trainer.hpp"
#include "common/device.hpp"
#include "common/json_fwd.hpp"
#include "common/memory.hpp"

namespace bigbatch::cli {

/// One line of --log: the step's record; a float that is not finite (a diverged run)
/// is written null. The gradient norm appears when it was measured, the time of the
/// gradients' sum over ranks when the run has ranks (`ranked`).
Json log_line(const train::StepRecord& record, double elapsed_seconds, bool norm_measured,
              bool ranked = false);

/// 75 s as "1:15", 4000 s as "1:06:40".
std::string clock_time(double seconds);

/// Progress: one line rewritten in place on a terminal (at most ten times a second),
/// plain lines otherwise: the first step, every N steps and the last. Speeds are those of
/// the steps since the previous line (the current speed, not the run's average), timed by
/// the trainer, so evaluation between steps does not count; the ETA is the remaining steps
/// at that speed.
class Progress {
 public:
  Progress(std::int64_t total_steps, std::int64_t print_every, bool show_scale, bool show_norm);

  void update(const train::StepRecord& record);
  /// Ends the rewritten line before anything else is printed.
  void break_line();
  double elapsed() const;

 private:
  std::int64_t total_;
  bool show_scale_;
  bool show_norm_;
  bool terminal_;
  std::int64_t every_;
  std::chrono::steady_clock::time_point start_;
  double last_draw_ = 0;
  std::int64_t window_steps_ = 0, window_samples_ = 0;
  double window_seconds_ = 0;
  bool dirty_ = false;
  bool printed_ = false;
};

/// The model's loss and accuracy on `data` in the batches the run was sized for: gathered
/// into the trainer's staging buffer (Trainer::staging), so that an evaluation fits
/// wherever the run's steps fit; a buffer of its own, as many rows, for samples of another
/// shape.
nn::EvaluationResult evaluate_in_run(nn::Network& model, const Dataset& data,
                                     train::Trainer& trainer);

/// --eval-every N: after every N-th step, the model's loss and accuracy on the held-out split
/// (evaluate_in_run), printed as "step S: test loss L, <accuracy> A" and added to the step's
/// log line as test_loss and test_accuracy (validation_... for --validation's split).
/// Nothing at other steps.
void evaluate_at_step(nn::Network& model, const Splits& splits, std::int64_t eval_every,
                      train::Trainer& trainer, const train::StepRecord& record,
                      const char* accuracy, Progress& progress, Json& line);

/// The memory of the training step with the highest peak, by category at that moment
/// (the rows add up to the total), beside what is live now; host data in its own row.
std::string step_memory_report(Device device, const MemoryStats& step, std::int64_t steps);

}  // namespace bigbatch::cli

// trainer.hpp: the training step the `bigbatch` program runs, composing the techniques of
// one process: accumulation over micro-batches (nn/training.hpp), the loss scale and the
// optimizer boundary (chapters 03-04), the learning-rate schedule. Step k, in trainer.cpp:
//   its batch (nn::SampleStream: epoch e, b samples, left on the host); the learning rate;
//   zero_grad; for each part of the batch a GradientSync names (one process: the whole
//   batch; chapter 07: the shares of this process's ranks), accumulate_gradients with the
//   whole batch's count of targets and the loss scale, each micro-batch staged on the
//   device just before its forward; the parts summed (GradientSync::reduce); the boundary:
//   unscale and measure, skip on an overflow (the schedule stays), clip, step, update S.
// Any nn::Network trains (the MLP on rows, chapter 08's GPT on token sequences). Dropout is
// keyed by each sample's row in the run (e N + j B + i), so masks do not depend on the
// micro-batch size or the ranks. Without a loss scaler an inf or NaN loss or gradient
// stops the run before the optimizer writes it (NonFiniteLossError,
// NonFiniteGradientError). A step reports its own allocator peak.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <vector>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"
#include "chapters/04_dynamic_loss_scaling/gradient_clipping.hpp"
#include "chapters/04_dynamic_loss_scaling/optimizer_boundary.hpp"
#include "chapters/train/gradient_sync.hpp"
#include "common/data/dataset.hpp"
#include "common/memory.hpp"
#include "common/settings.hpp"
#include "nn/lr_schedule.hpp"
#include "nn/network.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bigbatch::train {

/// How the loss is scaled under mixed precision (chapters 03-04): none, fixed, dynamic.
using LossScaling = loss_scaling::LossScaleRule;

struct TrainConfig {
  std::int64_t batch = 256;        ///< B, samples per optimizer step
  std::int64_t micro_batch = 0;    ///< rows per forward/backward; 0 = batch
  std::int64_t steps = 0;          ///< steps to run; when 0, `epochs` decides
  std::int64_t epochs = 0;         ///< whole passes over the data (when steps is 0)
  bool drop_last = false;          ///< drop each epoch's short last batch (N mod B samples)
  bool shuffle = true;             ///< a fresh permutation per epoch, else data order
  std::uint64_t seed = 0;          ///< the permutations' and the dropout masks' seed
  /// The learning rate per optimizer step; the base rate is the optimizer's at the start.
  nn::LrScheduleKind lr_schedule = nn::LrScheduleKind::constant;
  std::int64_t warmup_steps = 0;   ///< linear warm-up steps (nn/lr_schedule.hpp)
  LossScaling loss_scaling = LossScaling::none;
  float fixed_scale = 1.0f;        ///< S of LossScaling::fixed
  loss_scaling::DynamicScalerOptions dynamic_scaling;  ///< for LossScaling::dynamic
  /// Clip the step's unscaled gradients to this global L2 norm (PyTorch's
  /// clip_grad_norm_); 0 turns clipping off.
  float clip_grad_norm = 0.0f;
};

/// TrainConfig's settings (common/settings.hpp). The micro-batch changes only how a batch
/// is computed under LayerNorm (accumulation is exact); under BatchNorm it changes the
/// statistics, so run_settings (run_settings.hpp) records it there.
template <SettingsOf<TrainConfig> Self, class Visit>
constexpr void visit_settings(Self& c, Visit&& visit) {
  visit("batch", c.batch, SettingRole::trajectory);
  visit("micro-batch", c.micro_batch, SettingRole::same_bits);
  visit("steps", c.steps, SettingRole::trajectory);
  visit("epochs", c.epochs, SettingRole::trajectory);
  visit("drop-last", c.drop_last, SettingRole::trajectory);
  visit("shuffle", c.shuffle, SettingRole::trajectory);
  visit("seed", c.seed, SettingRole::trajectory);
  visit("lr-schedule", c.lr_schedule, SettingRole::trajectory);
  visit("warmup-steps", c.warmup_steps, SettingRole::trajectory);
  visit("loss-scale", c.loss_scaling, SettingRole::trajectory);
  visit("fixed-scale", c.fixed_scale, SettingRole::trajectory);
  visit("dynamic-scaling", c.dynamic_scaling, SettingRole::trajectory);  // the scale-* group
  visit("clip-grad-norm", c.clip_grad_norm, SettingRole::trajectory);
}
static_assert(every_field_visited<TrainConfig>(), "classify TrainConfig's new field above");

/// The optimizer boundary's options of a run with this configuration (chapter 04); throws
/// std::invalid_argument for a clip_grad_norm that is negative or not finite.
loss_scaling::BoundaryOptions boundary_options(const TrainConfig& config);

/// A gradient held an inf or a NaN in a run without a loss scaler.
class NonFiniteGradientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The loss was inf or NaN in a run without a loss scaler.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The trainer's own counters: with the model's and the optimizer's tensors, everything a
/// run needs to continue exactly (chapters/train/snapshot.hpp). The data order, the
/// dropout masks and the learning rate are pure functions of these and the configuration.
struct TrainerState {
  std::int64_t steps_done = 0;       ///< steps run (taken or skipped)
  std::int64_t samples_done = 0;
  std::int64_t optimizer_steps = 0;  ///< steps taken: the schedule's clock
  std::int64_t skipped_steps = 0;
  std::optional<loss_scaling::DynamicLossScaler::State> scaler;  ///< with dynamic scaling
};

/// What one step reports.
struct StepRecord {
  std::int64_t step = 0;           ///< 1 for the first step
  float loss = 0;                  ///< the batch's mean loss
  std::int64_t batch_samples = 0;  ///< samples in this step's batch
  /// The targets its loss is the mean over: batch_samples for the MLP, the real (not
  /// padding) target tokens of its sequences for the GPT.
  std::int64_t batch_targets = 0;
  std::int64_t samples = 0;        ///< samples seen so far, this step's included
  double epoch = 0;                ///< epochs done: e + (j + 1) / batches per epoch
  double learning_rate = 0;        ///< the rate this step used
  float loss_scale = 1;            ///< the scale S this step's gradients were computed with
  bool skipped = false;            ///< an overflow: no optimizer step was taken
  /// The global L2 norm of the step's unscaled gradients, before clipping; measured when
  /// a loss scaler or clipping is on, else NaN. Inf or NaN on a skipped step.
  float grad_norm = 0;
  float clip_factor = 1;           ///< what clipping multiplied the gradients by (1: none)
  std::int64_t skipped_steps = 0;  ///< skipped so far, this one included
  double seconds = 0;              ///< the step's wall time
  /// The part of it spent summing the ranks' gradients, waiting for the slowest rank
  /// included, and under ZeRO gathering the updated parameters (data parallel; without
  /// ranks, the calls of OneProcess's hooks, which sum nothing). With overlap, what the sum
  /// still cost the step: the calls made inside the last backward (copying and starting
  /// buckets) and the wait after it.
  double reduce_seconds = 0;
  MemoryStats memory;              ///< the device allocator during this step only:
                                   ///< peak_total, at_peak (its breakdown), peak per category
};

class Trainer {
 public:
  /// Checks the configuration (batch > 0, 0 <= micro_batch <= batch, steps or epochs
  /// positive, warmup_steps >= 0, a non-empty data set whose samples fit the model:
  /// nn::Network::check_data, and what `sync` checks: GradientSync::check_run) and
  /// allocates one micro-batch's buffers on the model's device. `sync` (kept by reference)
  /// says how the batch's gradient is gathered from its parts; nullptr: one process, the
  /// batch as one part (OneProcess).
  Trainer(nn::Network& model, nn::Optimizer& optimizer, const Dataset& data,
          TrainConfig config, GradientSync* sync = nullptr);

  std::int64_t total_steps() const { return total_steps_; }
  std::int64_t steps_done() const { return steps_done_; }
  std::int64_t batches_per_epoch() const { return stream_.batches_per_epoch(); }
  const nn::LrSchedule& lr_schedule() const { return schedule_; }

  /// The sample indices of step k (0-based), in batch order.
  std::vector<std::int64_t> batch_indices(std::int64_t step) const {
    return stream_.batch_indices(step);
  }
  /// The samples the first `steps` steps take: whole epochs, then whole batches (an
  /// epoch's short batch is its last).
  std::int64_t samples_after(std::int64_t steps) const;

  /// Runs the next step.
  StepRecord step();
  /// Runs the remaining steps, calling on_step after each.
  void run(const std::function<void(const StepRecord&)>& on_step = {});

  /// The counters to snapshot, and their restoration (with the optimizer's step count;
  /// the model's and optimizer's tensors are the snapshot's business). restore() throws
  /// std::invalid_argument for a state this run cannot continue: more steps done than it
  /// has, steps taken and skipped that do not add up to them, samples other than those
  /// steps take, a dynamic scaler's state without dynamic scaling or the reverse.
  TrainerState state() const;
  void restore(const TrainerState& state);

  /// The memory of the step with the highest peak so far (the training step's peak,
  /// whatever evaluation or saving allocated between steps).
  const MemoryStats& largest_step_memory() const { return largest_step_memory_; }
  /// What the optimizer boundary holds on the device for the whole run (its pass's
  /// results, with a loss scaler or clipping): live in every step beside the model's step,
  /// loss_scaling::boundary_workspace_bytes(boundary_options(config)).
  std::size_t boundary_bytes() const { return boundary_.workspace_bytes(); }
  /// The device buffer each micro-batch is copied into, live for the whole run. An
  /// evaluation between steps or after the run gathers its samples here too
  /// (nn::evaluate's buffer overload), so it needs no data bytes beside the step's.
  nn::MicroBatchBuffer& staging() { return *staging_; }

 private:
  GradientSync& sync() { return sync_ ? *sync_ : one_process_; }
  /// The boundary of step k (its batch, its loss): checks, unscales, clips and steps.
  loss_scaling::BoundaryOutcome cross_boundary(std::int64_t k, const nn::BatchPosition& batch,
                                               float loss);
  /// The record of the step just done (steps_done_ and samples_done_ count it).
  StepRecord record_step(const nn::BatchPosition& batch, float loss, std::int64_t targets,
                         double lr, float scale, const loss_scaling::BoundaryOutcome& outcome,
                         double reduce_seconds, const MemoryStats& memory, double seconds);

  nn::Network& model_;
  nn::Optimizer& optimizer_;
  TrainConfig config_;
  nn::SampleStream stream_;
  nn::LrSchedule schedule_;
  loss_scaling::OptimizerBoundary boundary_;  // the scale, unscale, clip, step, update
  GradientSync* sync_ = nullptr;  // null: one process (one_process_)
  OneProcess one_process_;
  std::int64_t optimizer_steps_ = 0;  // steps taken: the schedule's clock
  std::int64_t total_steps_ = 0;
  std::int64_t steps_done_ = 0;
  std::int64_t samples_done_ = 0;
  std::uint64_t dropout_seed_ = 0;
  std::optional<nn::MicroBatchBuffer> staging_;  // one micro-batch on the device
  MemoryStats largest_step_memory_;
};

}  // namespace bigbatch::train

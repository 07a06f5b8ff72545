// lr_schedule.hpp: the learning rate of every optimizer step, as a pure function of the
// step, and the batch-size scaling rules of large-batch training.
//
// Steps are OPTIMIZER steps, counted from 0 (a batch of 4096 in micro-batches of 256 is one
// step). With base rate lr, T steps in all and W warm-up steps, step i uses
//
//   warm-up, i < W:    lr * (i + 1) / W          linear, from lr / W at step 0 to lr at W - 1
//   constant, i >= W:  lr
//   cosine, i >= W:    lr * (1 + cos(pi * (i - W) / (T - W))) / 2
//
// (PyTorch's LinearLR, then CosineAnnealingLR with eta_min = 0). The scaling rules set the
// base rate from a rate lr tuned at a reference batch B_ref: linear lr * B / B_ref, sqrt
// lr * sqrt(B / B_ref), none lr.
// Why and how: docs/internals.md#nnlr_schedulehpp
#pragma once

#include <cstdint>
#include <string>

namespace bigbatch::nn {

/// The rate after warm-up: constant, or cosine decay to the end of the run.
enum class LrScheduleKind { constant, cosine };
/// The batch-size scaling rule of scaled_learning_rate.
enum class LrScale { none, linear, sqrt };

/// A run's learning-rate schedule (the formulas above).
struct LrSchedule {
  double base_lr = 0;                ///< the rate after warm-up (already scaled)
  std::int64_t total_steps = 1;      ///< T, optimizer steps of the run
  std::int64_t warmup_steps = 0;     ///< W, linear warm-up steps (0: none)
  /// What follows the warm-up.
  LrScheduleKind kind = LrScheduleKind::constant;
};

/// The learning rate of optimizer step `step` (0-based). A constant schedule without
/// warm-up returns base_lr itself, so training is bit for bit that of a fixed rate.
/// Throws std::invalid_argument for step < 0, total_steps < 1 or warmup_steps < 0.
double lr_at(const LrSchedule& schedule, std::int64_t step);

/// The base rate for `batch` under a scaling rule tuned at `reference_batch`:
/// none: lr; linear: lr * batch / reference; sqrt: lr * sqrt(batch / reference).
/// Throws std::invalid_argument unless both batches are positive.
double scaled_learning_rate(double lr, LrScale scale, std::int64_t batch,
                            std::int64_t reference_batch);

std::string lr_schedule_name(LrScheduleKind kind);  ///< "constant", "cosine"
/// The schedule's setting text (common/settings.hpp): its name.
inline std::string setting_text(LrScheduleKind kind) { return lr_schedule_name(kind); }
std::string lr_scale_name(LrScale scale);           ///< "none", "linear", "sqrt"

}  // namespace bigbatch::nn

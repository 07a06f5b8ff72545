// lr_schedule.cpp: warm-up, cosine decay and the batch-size scaling rules.
#include "nn/lr_schedule.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace bigbatch::nn {

double lr_at(const LrSchedule& schedule, std::int64_t step) {
  if (step < 0 || schedule.total_steps < 1 || schedule.warmup_steps < 0) {
    throw std::invalid_argument(
        "lr_at: need step >= 0, total_steps >= 1 and warmup_steps >= 0, got step " +
        std::to_string(step) + ", total_steps " + std::to_string(schedule.total_steps) +
        ", warmup_steps " + std::to_string(schedule.warmup_steps));
  }
  const double lr = schedule.base_lr;
  const std::int64_t warmup = schedule.warmup_steps;
  if (step < warmup) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  if (schedule.kind == LrScheduleKind::constant) return lr;
  // Cosine over the steps after the warm-up: T_cur = step - W of T_max = T - W.
  const double t_cur = static_cast<double>(step - warmup);
  const double t_max = static_cast<double>(schedule.total_steps - warmup);
  return lr * (1.0 + std::cos(std::numbers::pi * t_cur / t_max)) / 2.0;
}

double scaled_learning_rate(double lr, LrScale scale, std::int64_t batch,
                            std::int64_t reference_batch) {
  if (batch < 1 || reference_batch < 1) {
    throw std::invalid_argument("scaled_learning_rate: batch and reference batch must be "
                                "positive, got " + std::to_string(batch) + " and " +
                                std::to_string(reference_batch));
  }
  const double ratio = static_cast<double>(batch) / static_cast<double>(reference_batch);
  switch (scale) {
    case LrScale::none: return lr;
    case LrScale::linear: return lr * ratio;
    case LrScale::sqrt: return lr * std::sqrt(ratio);
  }
  return lr;
}

std::string lr_schedule_name(LrScheduleKind kind) {
  return kind == LrScheduleKind::cosine ? "cosine" : "constant";
}

std::string lr_scale_name(LrScale scale) {
  switch (scale) {
    case LrScale::none: return "none";
    case LrScale::linear: return "linear";
    case LrScale::sqrt: return "sqrt";
  }
  return "none";
}

}  // namespace bigbatch::nn

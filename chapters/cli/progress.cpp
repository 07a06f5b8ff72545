// progress.cpp: the progress line, the log line and the memory report.
#include "chapters/cli/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "common/cuda_runtime.hpp"
#include "common/format.hpp"
#include "common/json.hpp"

namespace bigbatch::cli {
namespace {

/// {"parameters":123,"master_weights":0,...}: the device's categories (not host_data).
Json bytes_json(const MemoryStats::PerCategory& bytes) {
  Json object = Json::object();
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    if (counts_on_device(category)) object[category_name(category)] = bytes[c];
  }
  return object;
}

}  // namespace

Json log_line(const train::StepRecord& record, double elapsed_seconds, bool norm_measured,
              bool ranked) {
  Json line = {{"step", record.step},
               {"epoch", record.epoch},
               {"loss", json_float(record.loss)},
               {"lr", record.learning_rate},
               {"samples", record.samples},
               {"time_s", elapsed_seconds},
               {"step_time_s", record.seconds},
               {"loss_scale", json_float(record.loss_scale)},
               {"skipped", record.skipped}};
  if (norm_measured) {
    line["grad_norm"] = json_float(record.grad_norm);
    line["clip_factor"] = json_float(record.clip_factor);
  }
  if (ranked) line["reduce_time_s"] = record.reduce_seconds;
  line["peak_bytes_total"] = record.memory.peak_total;
  line["peak_bytes"] = bytes_json(record.memory.at_peak);
  return line;
}

std::string clock_time(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60,
                  total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

Progress::Progress(std::int64_t total_steps, std::int64_t print_every, bool show_scale,
                   bool show_norm)
    : total_(total_steps),
      show_scale_(show_scale),
      show_norm_(show_norm),
      terminal_(::isatty(STDOUT_FILENO) != 0),
      every_(print_every > 0 ? print_every : std::max<std::int64_t>(1, total_steps / 20)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(const train::StepRecord& record) {
  window_steps_ += 1;
  window_samples_ += record.batch_samples;
  window_seconds_ += record.seconds;
  const bool first_or_last = !printed_ || record.step == total_;  // this process's first
  printed_ = true;
  const double now = elapsed();
  if (terminal_ ? !(first_or_last || now - last_draw_ >= 0.1)
                : !(first_or_last || record.step % every_ == 0)) {
    return;
  }
  const double seconds_per_step = window_seconds_ / static_cast<double>(window_steps_);
  const double samples_per_second =
      window_seconds_ > 0 ? static_cast<double>(window_samples_) / window_seconds_ : 0.0;
  const double eta = seconds_per_step * static_cast<double>(total_ - record.step);
  char numbers[200];
  std::snprintf(numbers, sizeof numbers,
                "epoch %.2f  loss %.4f  lr %.3g  %.1f ms/step  %.0f samples/s  elapsed %s  "
                "ETA %s",
                record.epoch, record.loss, record.learning_rate, 1e3 * seconds_per_step,
                samples_per_second, clock_time(now).c_str(), clock_time(eta).c_str());
  std::string scale;
  if (show_scale_) {
    char text[64];
    std::snprintf(text, sizeof text, "  scale %g  skipped %lld",
                  static_cast<double>(record.loss_scale),
                  static_cast<long long>(record.skipped_steps));
    scale = text;
  }
  if (show_norm_) {
    char text[64];
    std::snprintf(text, sizeof text, "  norm %.3g%s", static_cast<double>(record.grad_norm),
                  record.clip_factor < 1.0f ? " (clipped)" : "");
    scale += text;
  }
  const std::string counter =
      "step " + std::to_string(record.step) + "/" + std::to_string(total_);
  if (terminal_) {
    constexpr int kWidth = 20;
    const auto filled = static_cast<std::size_t>(kWidth * record.step / total_);
    std::cout << '\r' << counter << " [" << std::string(filled, '=')
              << std::string(kWidth - filled, ' ') << "] " << numbers << scale << "\033[K"
              << std::flush;
    dirty_ = true;
  } else {
    std::cout << counter << "  " << numbers << scale << "\n" << std::flush;
  }
  last_draw_ = now;
  window_steps_ = 0;
  window_samples_ = 0;
  window_seconds_ = 0;
}

void Progress::break_line() {
  if (dirty_) std::cout << '\n';
  dirty_ = false;
}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

nn::EvaluationResult evaluate_in_run(nn::Network& model, const Dataset& data,
                                     train::Trainer& trainer) {
  nn::MicroBatchBuffer& staging = trainer.staging();
  if (staging.holds(data)) return nn::evaluate(model, data, staging);
  return nn::evaluate(model, data, staging.rows());
}

void evaluate_at_step(nn::Network& model, const Splits& splits, std::int64_t eval_every,
                      train::Trainer& trainer, const train::StepRecord& record,
                      const char* accuracy, Progress& progress, Json& line) {
  if (eval_every <= 0 || !splits.test || record.step % eval_every != 0) return;
  const nn::EvaluationResult test = evaluate_in_run(model, *splits.test, trainer);
  progress.break_line();
  std::cout << "step " << record.step << ": " << splits.evaluated() << " loss " << test.loss
            << ", " << accuracy << " " << test.accuracy << "\n";
  line[std::string(splits.evaluated()) + "_loss"] = test.loss;
  line[std::string(splits.evaluated()) + "_accuracy"] = test.accuracy;
}

std::string step_memory_report(Device device, const MemoryStats& step, std::int64_t steps) {
  const TrackingAllocator& allocator = allocator_for(device);
  const MemoryStats now = allocator.stats();
  std::ostringstream out;
  out << "memory on " << device.name();
  if (const auto cap = allocator.cap()) out << " (capped at " << format_bytes(*cap) << ")";
  out << ": the training step's peak (the highest of the " << steps
      << " steps), by category at that moment, and what is live now\n";
  char line[192];
  std::snprintf(line, sizeof line, "  %-16s %16s %12s\n", "category", "at step's peak",
                "live now");
  out << line;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    const bool on_device = counts_on_device(category);
    std::snprintf(line, sizeof line, "  %-16s %16s %12s  %s\n",
                  std::string(category_name(category)).c_str(),
                  on_device ? format_bytes(step.at_peak[c]).c_str() : "-",
                  format_bytes(now.live[c]).c_str(),
                  std::string(category_remark(category)).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %16s %12s\n", "total",
                format_bytes(step.peak_total).c_str(), format_bytes(now.live_total).c_str());
  out << line;
  if (device.is_cuda()) {
    const auto info = cuda_rt::mem_info();
    out << "  cudaMemGetInfo: " << format_bytes(info.free_bytes) << " free of "
        << format_bytes(info.total_bytes) << "\n";
  }
  return out.str();
}


}  // namespace bigbatch::cli

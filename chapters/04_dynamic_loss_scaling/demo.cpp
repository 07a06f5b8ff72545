// Chapter 04: dynamic loss scaling. The rule on a scripted sequence, then chapter 01's
// model trained in fp16 from a scale far too large: the scale finds itself, overflowing
// steps are skipped, and the run trains. Last, the optimizer boundary in order, with
// gradient clipping and the three mistakes it avoids, measured. See README.md in this folder; --quick is the
// CTest setting.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"
#include "chapters/04_dynamic_loss_scaling/gradient_clipping.hpp"
#include "nn/lr_schedule.hpp"
#include "common/report.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bb = bigbatch;
using bb::loss_scaling::DynamicLossScaler;
using bb::loss_scaling::DynamicScalerOptions;

namespace {

std::string number(double value, const char* format = "%g") {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

/// 4194304 as "2^22"; other values as numbers.
std::string scale_text(double scale) {
  int exponent = 0;
  if (std::frexp(scale, &exponent) == 0.5) return "2^" + std::to_string(exponent - 1);
  return number(scale);
}

void the_rule(bb::SelfCheck& report) {
  report.section("(a) The rule: x2 after N clean steps, x0.5 and a skipped step on an overflow");
  // GradScaler's factors with an interval of 3 (instead of 2000) and hysteresis 1, on a
  // scripted run: 3 clean (grow), 1 clean, 1 overflow (back off, count restarts), 3 clean
  // (grow), 2 overflows (back off twice).
  DynamicLossScaler scaler({.initial_scale = 1024, .growth_interval = 3, .min_scale = 1,
                            .max_scale = 65536});
  const std::vector<bool> overflows = {false, false, false, false, true,
                                       false, false, false, true,  true};
  const std::vector<float> expected_next = {1024, 1024, 2048, 2048, 1024,
                                            1024, 1024, 2048, 1024, 512};
  std::string line = "scale after each step:";
  bool as_expected = true;
  for (std::size_t k = 0; k < overflows.size(); ++k) {
    const auto update = scaler.update(overflows[k]);
    line.append(" ").append(number(update.next_scale)).append(update.overflow ? "(skip)" : "");
    as_expected &= update.next_scale == expected_next[k];
  }
  report.note(line);
  report.check(as_expected, "the scales follow the hand-derived sequence");
  report.check(scaler.skipped_steps() == 3, "every overflow skipped its step (3)");
}

/// figure_data gets the run's trajectory (per step: the scale used, whether the step was
/// skipped, the loss) for notebooks/mixed_precision.ipynb.
void trains_from_a_scale_too_large(bb::SelfCheck& report, const bb::baseline::Data& data,
                                   bool quick, bb::Json& figure_data) {
  namespace base = bb::baseline;
  const std::int64_t batch = base::kBatchThatFits, micro = 64, steps = quick ? 30 : 120;
  report.section("(b) fp16, batch " + std::to_string(batch) + " as micro-batches of " +
                 std::to_string(micro) + ", starting from S = 2^30");
  bb::nn::ModelConfig config = base::model_config();
  config.precision = bb::nn::Precision::fp16;
  bb::nn::Model model(config, bb::Device::cpu());
  bb::nn::Optimizer optimizer(model.parameters(), base::adamw_options());
  base::BaselineLoop loop(model, optimizer, data.train, batch, micro, /*seed=*/7);
  // Growth every 10 clean steps, so that a short run shows growth attempts too.
  DynamicLossScaler scaler({.initial_scale = 0x1p30f, .growth_interval = 10, .min_scale = 1,
                            .max_scale = 0x1p30f});
  std::vector<float> losses;  // of the steps taken
  std::int64_t backoffs = 0, first_taken = -1;
  std::string trajectory;
  for (std::int64_t k = 0; k < steps; ++k) {
    const float scale = scaler.scale();  // constant over the step's micro-batches
    bool skipped = false;
    const float loss = loop.step(k, scale, [&] {
      const auto update = scaler.unscale_and_update(model);  // the boundary: once per step
      skipped = update.overflow;
      backoffs += update.next_scale < update.scale_used;
      return !update.overflow;
    });
    figure_data.push_back({{"step", k + 1},
                           {"scale", bb::json_float(scale)},
                           {"skipped", skipped},
                           {"loss", bb::json_float(loss)}});
    if (!skipped) {
      losses.push_back(loss);
      if (first_taken < 0) first_taken = k;
    }
    if (k < 12 || skipped || scaler.scale() != scale) {
      trajectory += " " + std::to_string(k + 1) + ":" + scale_text(scale) + (skipped ? "x" : "");
    }
  }
  report.note("step:scale (x = skipped) while the scale moved:" + trajectory);
  report.note("first step taken: " + std::to_string(first_taken + 1) + " at S = " +
              scale_text(0x1p30 / std::pow(2.0, static_cast<double>(first_taken))) + "; " +
              std::to_string(scaler.skipped_steps()) + " of " + std::to_string(steps) +
              " steps skipped, final scale " + scale_text(scaler.scale()));
  report.check(first_taken > 0, "the first steps overflow and are skipped");
  report.check(backoffs == scaler.skipped_steps(),
               "with hysteresis 1 every skipped step backed the scale off once");
  bool finite = true;
  for (const auto& p : model.parameters()) {
    for (const float v : p.value.to_vector<float>()) finite &= std::isfinite(v);
  }
  report.check(finite, "no overflow reached the weights: every master weight is finite");
  const std::size_t n = losses.size(), window = 5;
  double first = 0, last = 0;
  for (std::size_t i = 0; i < window && n >= 2 * window; ++i) {
    first += losses[i] / window;
    last += losses[n - window + i] / window;
  }
  report.note("mean loss of the first and last " + std::to_string(window) +
              " steps taken: " + number(first, "%.4f") + " -> " + number(last, "%.4f"));
  report.check(n >= 2 * window && last < first, "the run trains: the loss falls");
}

/// The first `rows` training samples as device tensors.
struct Rows {
  bb::Tensor x, labels;
};
Rows first_rows(const bb::Dataset& data, std::int64_t rows) {
  return {data.features.rows(0, rows).to(bb::Device::cpu()),
          data.labels.rows(0, rows).to(bb::Device::cpu())};
}

void the_boundary(bb::SelfCheck& report, const bb::baseline::Data& data) {
  namespace base = bb::baseline;
  namespace clip = bb::clipping;
  const std::int64_t batch = base::kBatchThatFits, micro = 64;
  const float max_norm = 0.5f;
  report.section("(c) The optimizer boundary, in order: clip once, after the unscale");
  report.note("last micro-batch backward -> unscale (x 1/S), check, measure the norm (one "
              "pass) -> overflow? skip: no clip, no step, the schedule stays, S backs off -> "
              "clip to the norm limit -> optimizer step at the schedule's rate -> the schedule "
              "advances -> the scale's growth counter -> zero the gradients");
  const Rows rows = first_rows(data.train, batch);
  const bb::nn::ForwardContext context{true, 11, 0};
  bb::nn::Model model(base::model_config(), bb::Device::cpu());
  bb::loss_scaling::UnscalePass check;

  // The right way, with and without micro-batches: one norm, of the step's gradient.
  model.zero_grad();
  bb::nn::accumulate_gradients(model, rows.x, rows.labels, batch, context);
  const clip::GradientStats whole = check.unscale_and_measure(model, 1.0f);
  clip::clip_gradients(model, whole.norm, max_norm);
  const clip::Gradients clipped_whole = clip::gradients_of(model);
  model.zero_grad();
  bb::nn::accumulate_gradients(model, rows.x, rows.labels, micro, context);
  const clip::GradientStats parts = check.unscale_and_measure(model, 1.0f);
  clip::clip_gradients(model, parts.norm, max_norm);
  report.note("batch " + std::to_string(batch) + ": gradient norm " + number(whole.norm) +
              ", clipped to " + number(max_norm) + " (factor " +
              number(clip::clip_factor(whole.norm, max_norm)) + ")");
  report.check(whole.norm > max_norm && parts.norm == whole.norm &&
                   clip::gradients_of(model) == clipped_whole,
               "micro-batches of " + std::to_string(micro) +
                   " clip to the same bits as the whole batch (one norm, of the sum)");

  // Mistake 1: clipping the running gradient after every micro-batch.
  std::vector<clip::Gradients> contributions;
  for (std::int64_t begin = 0; begin < batch; begin += micro) {
    model.zero_grad();
    bb::nn::ForwardContext part = context;
    part.first_row = begin;
    bb::nn::accumulate_gradients(model, rows.x.rows(begin, begin + micro),
                                 rows.labels.rows(begin, begin + micro), micro, part, batch);
    contributions.push_back(clip::gradients_of(model));
  }
  model.zero_grad();
  clip::accumulate_clipping_each_micro_batch(model, rows.x, rows.labels, micro, context, batch,
                                             max_norm);
  const clip::Gradients mistaken = clip::gradients_of(model);
  const double off = clip::largest_difference(mistaken, clipped_whole);
  const double off_prediction = clip::largest_difference(
      mistaken, clip::predict_clipping_each_micro_batch(contributions, max_norm));
  report.note("mistake 1, clip every micro-batch: the same norm (the last clip sets it) in "
              "another direction: " +
              number(100 * clip::distance(mistaken, clipped_whole) / clip::norm_of(clipped_whole),
                     "%.1f%%") +
              " of the update off, an element by up to " + number(off) +
              "; the float64 replay of the rule predicts every element to " +
              number(off_prediction));
  // The replay differs by float roundings only (test_gradient_clipping bounds it by 1e-6
  // of the limit); the mistake is many orders larger.
  report.check(off_prediction <= 1e-6 * max_norm && off > 1e3 * off_prediction,
               "clipping every micro-batch gives what its replay predicts, not the step's clip");

  // Mistake 2: clipping before unscaling holds the true gradient to max_norm / S.
  const float scale = 1024.0f;
  model.zero_grad();
  bb::nn::accumulate_gradients(model, rows.x, rows.labels, micro, context, batch, scale);
  const clip::GradientStats scaled = check.unscale_and_measure(model, 1.0f);  // no unscale yet
  clip::clip_gradients(model, scaled.norm, max_norm);
  const clip::GradientStats after = check.unscale_and_measure(model, scale);
  report.note("mistake 2, clip before unscaling (S = 1024): norm " + number(after.norm) +
              " after the step's unscale, the limit was " + number(max_norm) +
              ": predicted " + number(max_norm / scale) + " (the limit / S)");
  report.check(std::fabs(after.norm - max_norm / scale) <= 1e-5 * max_norm / scale,
               "clipping before unscaling clips at the limit / S, as predicted");

  // Mistake 3: a schedule that counts steps run instead of steps taken.
  const bb::nn::LrSchedule warmup{1e-3, 8, 4, bb::nn::LrScheduleKind::constant};
  const std::vector<bool> skipped = {true, true, false, false, false};
  std::string right = "lr by steps taken:", wrong = "lr by steps run:  ";
  std::int64_t taken = 0;
  bool first_taken_is_warm_up_start = false;
  for (std::size_t k = 0; k < skipped.size(); ++k) {
    const double by_taken = bb::nn::lr_at(warmup, taken);
    const double by_run = bb::nn::lr_at(warmup, static_cast<std::int64_t>(k));
    right += " " + number(by_taken) + (skipped[k] ? "(skip)" : "");
    wrong += " " + number(by_run) + (skipped[k] ? "(skip)" : "");
    if (!skipped[k] && taken == 0) first_taken_is_warm_up_start = by_taken == warmup.base_lr / 4;
    if (!skipped[k]) ++taken;
  }
  report.note("mistake 3, 4 warm-up steps, the first 2 skipped on an overflow:");
  report.note("  " + right);
  report.note("  " + wrong + "  (the warm-up's first half lost)");
  report.check(first_taken_is_warm_up_start,
               "the first step taken gets the warm-up's first rate, lr / 4");
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (const auto status = bb::parse_demo_options(
          argc, argv,
          "  Shows and checks dynamic loss scaling (see\n"
          "  chapters/04_dynamic_loss_scaling/README.md).\n"
          "  --write-data FILE  the trajectory of (b) as JSON, for notebooks/mixed_precision.ipynb",
          options)) {
    return *status;
  }
  const bool quick = options.quick;
  std::printf("Chapter 04: dynamic loss scaling\n");
  const bb::baseline::Data data = bb::baseline::load_data(quick);
  bb::SelfCheck report("chapter 04");
  the_rule(report);
  bb::Json figure_data = bb::Json::array();
  trains_from_a_scale_too_large(report, data, quick, figure_data);
  the_boundary(report, data);
  if (!bb::write_demo_data(options, {{"trajectory", figure_data}})) return 1;
  return report.finish();
}

// Chapter 04: dynamic loss scaling. The rule on a scripted sequence, then chapter 01's
// model trained in fp16 from a scale far too large: the scale finds itself, overflowing
// steps are skipped, and the run trains. See README.md in this folder; --quick is the
// CTest setting.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"
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
    line += " " + number(update.next_scale) + (update.overflow ? "(skip)" : "");
    as_expected &= update.next_scale == expected_next[k];
  }
  report.note(line);
  report.check(as_expected, "the scales follow the hand-derived sequence");
  report.check(scaler.skipped_steps() == 3, "every overflow skipped its step (3)");
}

/// figure_data gets the run's trajectory (per step: the scale used, whether the step was
/// skipped, the loss) for notebooks/mixed_precision.ipynb.
void trains_from_a_scale_too_large(bb::SelfCheck& report, const bb::baseline::Data& data,
                                   bool quick, std::ostringstream& figure_data) {
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
    figure_data << (k == 0 ? "" : ",") << "{\"step\":" << k + 1 << ",\"scale\":" << scale
                << ",\"skipped\":" << (skipped ? "true" : "false") << ",\"loss\":" << loss
                << "}";
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
  std::ostringstream figure_data;
  figure_data.precision(9);  // scales and losses as floats print back exactly
  trains_from_a_scale_too_large(report, data, quick, figure_data);
  if (!bb::write_demo_data(options, "{\"trajectory\":[" + figure_data.str() + "]}")) return 1;
  return report.finish();
}

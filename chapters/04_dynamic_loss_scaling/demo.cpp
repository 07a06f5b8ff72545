// Chapter 04: dynamic loss scaling. The rule on a scripted sequence, then chapter 01's
// model trained in fp16 from a scale far too large: the scale finds itself, overflowing
// steps are skipped, and the run trains. Then the optimizer boundary in order, with
// gradient clipping and the three mistakes it avoids, measured. Last, bf16: why it needs
// no scaler, what it costs instead (measured against predictions), and the three
// precisions side by side. See README.md in this folder; --quick is the CTest setting.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "chapters/04_dynamic_loss_scaling/bf16_costs.hpp"
#include "chapters/04_dynamic_loss_scaling/dynamic_loss_scaler.hpp"
#include "chapters/04_dynamic_loss_scaling/gradient_clipping.hpp"
#include "nn/lr_schedule.hpp"
#include "common/format.hpp"
#include "common/report.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/elementwise.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
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

// ---- bf16 ------------------------------------------------------------------------------

namespace costs = bb::bf16_costs;
using bb::nn::Precision;

bb::nn::ModelConfig config_in(Precision precision) {
  bb::nn::ModelConfig config = bb::baseline::model_config();
  config.precision = precision;
  return config;
}

std::string percent(double share) { return number(100 * share, "%.2f") + "%"; }

void bf16_needs_no_scaler(bb::SelfCheck& report, const bb::baseline::Data& data,
                          bb::Json& figure_data) {
  report.section("(d) bf16 needs no scaler: fp32's exponent range, so no gradient underflows");
  // Chapter 03's measurement again: dlogits = (p - y) / B for 256 samples counted in a batch
  // of B, at S = 1, rounded to f16 and to bf16.
  bb::nn::Model model(config_in(Precision::fp32), bb::Device::cpu());
  const Rows rows = first_rows(data.train, 256);
  const bb::Tensor logits = model.forward(rows.x, {false, 0, 0});
  const bb::Tensor dlogits(logits.shape(), bb::DType::f32);
  bool bf16_keeps_all = true;
  double fp16_lost_at_largest = 0;
  bb::Json& rows_json = figure_data["dlogits"] = bb::Json::array();
  for (const std::int64_t b : {256, 4096, 65536}) {
    bb::cross_entropy_backward(logits, rows.labels, dlogits, static_cast<float>(b));
    const auto f16 = bb::loss_scaling::range_shares(dlogits, bb::DType::f16);
    const auto bf16 = bb::loss_scaling::range_shares(dlogits, bb::DType::bf16);
    report.note("B = " + std::to_string(b) + ", S = 1: fp16 flushes " + percent(f16.zero) +
                " to zero and keeps " + percent(f16.subnormal) + " as subnormals; bf16 " +
                percent(bf16.zero) + " and " + percent(bf16.subnormal));
    rows_json.push_back({{"batch", b}, {"fp16_zero", f16.zero},
                         {"fp16_subnormal", f16.subnormal}, {"bf16_zero", bf16.zero},
                         {"bf16_subnormal", bf16.subnormal}});
    bf16_keeps_all &= bf16.zero == 0 && bf16.subnormal == 0;
    fp16_lost_at_largest = f16.zero + f16.subnormal;
  }
  report.check(fp16_lost_at_largest > 0.5,
               "at B = 65536, fp16 at S = 1 holds most of them only as subnormals or zeros");
  report.check(bf16_keeps_all, "bf16 keeps every one as a normal number, at every B");

  // The whole backward of 64 samples counted in a batch of 2^16, without any scale.
  const std::int64_t global_count = std::int64_t{1} << 16;
  const Rows small = first_rows(data.train, 64);
  const auto gradients = [&](Precision precision) {
    bb::nn::Model m(config_in(precision), bb::Device::cpu());
    m.zero_grad();
    bb::nn::accumulate_gradients(m, small.x, small.labels, 64, {true, 1, 0}, global_count);
    std::vector<std::vector<float>> g;
    for (const auto& p : m.parameters()) g.push_back(p.grad.to_vector<float>());
    return g;
  };
  const auto reference = gradients(Precision::fp32);
  const auto error_of = [&](const std::vector<std::vector<float>>& g) {
    return bb::loss_scaling::worst_normalised_error(g, reference);
  };
  const double fp16 = error_of(gradients(Precision::fp16));
  const double bf16 = error_of(gradients(Precision::bf16));
  report.note("batch 2^16, S = 1: gradients off fp32's by " + number(fp16) + " in fp16, " +
              number(bf16) + " in bf16 (worst tensor, normalised)");
  // Chapter 03 measured fp16 with S = 2^16 at 1e-3 to 1e-2 of this; bf16 gets there with
  // no scale at all, at its own rounding (u = 2^-8, 8 times fp16's).
  report.check(bf16 * 10 < fp16, "unscaled bf16 is more than 10x closer to fp32 than fp16");
}

void accumulating_in_bf16(bb::SelfCheck& report, const bb::baseline::Data& data, bool quick,
                          bb::Json& figure_data) {
  const std::int64_t micro = 16, most = quick ? 64 : 256;
  report.section("(e) What bf16 costs: 8 significant bits. (1) Gradients of N micro-batches "
                 "of " + std::to_string(micro) + " summed in a 16-bit buffer");
  bb::nn::Model model(config_in(Precision::bf16), bb::Device::cpu());
  costs::Accumulation in_bf16(bb::DType::bf16), in_fp16(bb::DType::f16);
  bb::Json& curve = figure_data["accumulation"] = bb::Json::array();
  bool follows = true, grows = true;
  double previous = 0;
  for (std::int64_t n = 0; n < most; ++n) {
    model.zero_grad();
    const bb::Tensor x = data.train.features.rows(n * micro, (n + 1) * micro);
    const bb::Tensor labels = data.train.labels.rows(n * micro, (n + 1) * micro);
    bb::nn::accumulate_gradients(model, x, labels, micro, {true, 1, n * micro}, most * micro);
    std::vector<bb::Tensor> term;
    for (const auto& p : model.parameters()) term.push_back(p.grad);
    in_bf16.add(term);
    in_fp16.add(term);
    const std::int64_t count = n + 1;
    if ((count & (count - 1)) != 0 || count < 4) continue;  // 4, 8, 16, ...
    const double measured = in_bf16.error(), predicted = in_bf16.predicted();
    report.note("N = " + std::to_string(count) + ": bf16 gets " + percent(measured) +
                " of the update wrong (predicted " + percent(predicted) + "); fp16 " +
                percent(in_fp16.error()) + " (predicted " + percent(in_fp16.predicted()) +
                "); f32: exact to 2^-24");
    curve.push_back({{"micro_batches", count}, {"bf16", measured}, {"bf16_predicted", predicted},
                     {"fp16", in_fp16.error()}, {"fp16_predicted", in_fp16.predicted()}});
    // The prediction is first order, with a rounding model (kRmsRelativeRounding) that
    // assumes evenly spread significands: held to within a factor of 1.5 either way.
    follows &= measured < 1.5 * predicted && predicted < 1.5 * measured;
    grows &= measured > previous;
    previous = measured;
  }
  report.check(follows, "the measured error follows the prediction (within 1.5x) at every N");
  report.check(grows, "and grows with N: accumulate in f32, as nn::Model does in every precision");
}

void weights_without_masters(bb::SelfCheck& report, const bb::baseline::Data& data,
                             bb::Json& figure_data) {
  report.section("(e) (2) Weights kept only in bf16, no f32 master: updates that round away");
  // AdamW's first step moves every weight whose gradient is nonzero by lr (m / sqrt(v) is
  // the gradient's sign at step 1), so the share lost is that of the weights whose half ulp
  // exceeds lr; the Linear weights start uniform in +-1/sqrt(fan_in).
  const Rows rows = first_rows(data.train, 256);
  bb::Json& shares = figure_data["lost_updates"] = bb::Json::array();
  bool predicted_well = true;
  double lost_at_smallest = 0;
  for (const double lr : {1e-3, 3e-4, 1e-4, 3e-5, 1e-5}) {
    bb::nn::Model model(config_in(Precision::bf16), bb::Device::cpu());
    std::vector<bb::Tensor> before;
    double predicted = 0, weights = 0;
    for (const auto& p : model.parameters()) {
      if (!p.half.defined()) continue;
      bb::cast(p.half, p.value);  // the master is its bf16 value: a model with none
      before.push_back(p.value.clone());
      const double n = static_cast<double>(p.value.numel());
      predicted += n * costs::predicted_lost_share(1.0 / std::sqrt(p.value.dim(1)), lr);
      weights += n;
    }
    bb::AdamWOptions options = bb::baseline::adamw_options();
    options.lr = lr;
    options.weight_decay = 0;  // only the gradient's step
    bb::nn::Optimizer optimizer(model.parameters(), options);
    model.zero_grad();
    bb::nn::accumulate_gradients(model, rows.x, rows.labels, 256, {true, 1, 0});
    optimizer.step();
    double lost = 0, moved = 0;
    std::size_t k = 0;
    for (const auto& p : model.parameters()) {
      if (!p.half.defined()) continue;
      const double n = static_cast<double>(p.value.numel());
      lost += n * costs::lost_update_share(before[k++], p.value);
      moved += n;
    }
    lost /= moved;
    predicted /= weights;
    report.note("lr " + number(lr) + ": " + percent(lost) + " of the updates round away (predicted " +
                percent(predicted) + "); the f32 masters keep every one");
    shares.push_back({{"lr", lr}, {"lost", lost}, {"predicted", predicted}});
    // Uniform weights, and an exact update size except where |g| is near AdamW's eps:
    // held to 2 points (the share of weights at an exact power of two, where the spacing
    // below is half the spacing above, is 1/128 of a binade).
    predicted_well &= std::abs(lost - predicted) < 0.02;
    lost_at_smallest = lost;
  }
  report.check(predicted_well, "the measured share matches the prediction within 2 points");
  report.check(lost_at_smallest > 0.5, "at lr 1e-5 most updates vanish without f32 masters");
}

struct PrecisionRun {
  std::string name;
  double final_loss = 0, test_accuracy = 0, ms_per_step = 0;
  std::int64_t skipped = 0;
  double bytes_per_parameter = 0;  // parameters, masters, gradients, AdamW's state
  double activation_bytes_per_sample = 0;
};

PrecisionRun train_in(Precision precision, bool dynamic_scale, const bb::baseline::Data& data,
                      std::int64_t steps) {
  namespace base = bb::baseline;
  const bb::nn::ModelConfig config = config_in(precision);
  bb::nn::Model model(config, bb::Device::cpu());
  bb::nn::Optimizer optimizer(model.parameters(), base::adamw_options());
  base::BaselineLoop loop(model, optimizer, data.train, base::kBatchThatFits, 64, /*seed=*/7);
  DynamicLossScaler scaler(DynamicScalerOptions{});  // GradScaler's: 2^16, x2 / 2000, x0.5
  PrecisionRun run;
  run.name = bb::nn::precision_name(precision) + (dynamic_scale ? " + dynamic scale" : "");
  std::vector<float> losses;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t k = 0; k < steps; ++k) {
    const float scale = dynamic_scale ? scaler.scale() : 1.0f;
    losses.push_back(loop.step(k, scale, [&] {
      if (!dynamic_scale) return true;
      return !scaler.unscale_and_update(model).overflow;
    }));
  }
  const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
  run.ms_per_step = elapsed.count() / static_cast<double>(steps);
  run.skipped = dynamic_scale ? scaler.skipped_steps() : 0;
  for (std::size_t i = losses.size() - 5; i < losses.size(); ++i) run.final_loss += losses[i] / 5;
  run.test_accuracy = bb::nn::evaluate(model, data.test, 1000).accuracy;
  const bb::nn::PredictedBytes bytes = bb::nn::predict_memory(config, 1);
  run.bytes_per_parameter =
      static_cast<double>(bytes.parameters + bytes.master_weights + bytes.gradients +
                          bytes.adamw_state) /
      static_cast<double>(model.parameter_count());
  run.activation_bytes_per_sample = static_cast<double>(bytes.activations);
  return run;
}

void three_precisions(bb::SelfCheck& report, const bb::baseline::Data& data, bool quick,
                      bb::Json& figure_data) {
  const std::int64_t steps = quick ? 30 : 120;
  report.section("(f) fp32, fp16 + dynamic scaling and bf16: chapter 01's model, batch 256 "
                 "as 4 micro-batches, " + std::to_string(steps) + " steps each");
  const PrecisionRun runs[] = {train_in(Precision::fp32, false, data, steps),
                               train_in(Precision::fp16, true, data, steps),
                               train_in(Precision::bf16, false, data, steps)};
  report.note("| precision | bytes per parameter | activation bytes per sample | skipped "
              "steps | loss (last 5 steps) | test accuracy | ms per step (this CPU) |");
  bb::Json& table = figure_data["precisions"] = bb::Json::array();
  for (const PrecisionRun& r : runs) {
    report.note("| " + r.name + " | " + number(r.bytes_per_parameter, "%.2f") + " | " +
                number(r.activation_bytes_per_sample, "%.0f") + " | " + std::to_string(r.skipped) +
                " | " + number(r.final_loss, "%.4f") + " | " + number(r.test_accuracy, "%.4f") +
                " | " + number(r.ms_per_step, "%.1f") + " |");
    table.push_back({{"precision", r.name}, {"bytes_per_parameter", r.bytes_per_parameter},
                     {"activation_bytes_per_sample", r.activation_bytes_per_sample},
                     {"skipped", r.skipped}, {"final_loss", r.final_loss},
                     {"test_accuracy", r.test_accuracy}, {"ms_per_step", r.ms_per_step}});
  }
  const PrecisionRun &fp32 = runs[0], &fp16 = runs[1], &bf16 = runs[2];
  report.check(bf16.skipped == 0, "bf16 runs without a scaler and skips no step");
  report.check(bf16.activation_bytes_per_sample == fp16.activation_bytes_per_sample &&
                   bf16.bytes_per_parameter == fp16.bytes_per_parameter,
               "bf16 costs fp16's bytes, to the byte (nn::predict_memory)");
  // Not derived: both are one run of a few dozen steps; the difference in loss they show
  // is a few hundredths at most here (measured), a tenth is a broken recipe's scale.
  report.check(std::abs(bf16.final_loss - fp32.final_loss) < 0.1 &&
                   std::abs(fp16.final_loss - fp32.final_loss) < 0.1,
               "fp16 + scaler and bf16 train as fp32 does (final loss within 0.1)");
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (const auto status = bb::parse_demo_options(
          argc, argv,
          "  Shows and checks dynamic loss scaling (see\n"
          "  chapters/04_dynamic_loss_scaling/README.md).\n"
          "  --write-data FILE  the trajectory of (b) and the bf16 measurements of (d) to (f)\n"
          "                     as JSON, for notebooks/mixed_precision.ipynb",
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
  bb::Json bf16_data = bb::Json::object();
  bf16_needs_no_scaler(report, data, bf16_data);
  accumulating_in_bf16(report, data, quick, bf16_data);
  weights_without_masters(report, data, bf16_data);
  three_precisions(report, data, quick, bf16_data);
  if (!bb::write_demo_data(options, {{"trajectory", figure_data}, {"bf16", bf16_data}})) return 1;
  return report.finish();
}

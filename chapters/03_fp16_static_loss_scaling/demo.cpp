// Chapter 03: fp16 mixed precision with a static loss scale, on chapter 01's model and
// data. What fp16 saves, why the loss must be scaled (and why more so at a large effective
// batch), and what a scale too large does. See README.md in this folder; --quick is the
// CTest setting.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/report.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/elementwise.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bb = bigbatch;
using bb::MemoryCategory;
using bb::Tensor;
using bb::nn::Model;
using bb::nn::ModelConfig;
using bb::nn::Precision;

namespace {

std::string number(double value, const char* format = "%.3g") {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

ModelConfig config_in(Precision precision) {
  ModelConfig config = bb::baseline::model_config();
  config.precision = precision;
  return config;
}

/// The first `rows` training samples, on the CPU device.
struct Batch {
  Tensor x, labels;
};

Batch first_rows(const bb::Dataset& data, std::int64_t rows) {
  return {data.features.rows(0, rows), data.labels.rows(0, rows)};
}

void memory_halves(bb::SelfCheck& report, const bb::baseline::Data& data) {
  report.section("(a) What fp16 saves: one step of batch 256, by category");
  bb::TrackingAllocator& cpu = bb::allocator_for(bb::Device::cpu());
  const Batch batch = first_rows(data.train, bb::baseline::kBatchThatFits);
  std::size_t activations[2] = {0, 0};
  int i = 0;
  for (const Precision precision : {Precision::fp32, Precision::fp16}) {
    const ModelConfig config = config_in(precision);
    const bb::MemoryStats before = cpu.stats();
    Model model(config, bb::Device::cpu());
    bb::nn::Optimizer optimizer(model.parameters(), bb::baseline::adamw_options());
    const bb::MemoryStats built = cpu.stats();
    const auto grew = [&](MemoryCategory c) { return built.live_of(c) - before.live_of(c); };
    cpu.reset_peak();
    const std::size_t live = cpu.stats().live_of(MemoryCategory::activations);
    model.zero_grad();
    bb::nn::accumulate_gradients(model, batch.x, batch.labels, batch.x.dim(0), {true, 1, 0});
    activations[i] = cpu.stats().peak_of(MemoryCategory::activations) - live;
    const bb::nn::PredictedBytes want = bb::nn::predict_memory(config, batch.x.dim(0));
    const std::string name = bb::nn::precision_name(precision);
    report.note(name + ": parameters " + bb::format_bytes(grew(MemoryCategory::parameters)) +
                ", master weights " + bb::format_bytes(grew(MemoryCategory::master_weights)) +
                ", gradients " + bb::format_bytes(grew(MemoryCategory::gradients)) +
                ", AdamW state " + bb::format_bytes(grew(MemoryCategory::optimizer_state)) +
                ", activations " + bb::format_bytes(activations[i]));
    report.check(grew(MemoryCategory::parameters) == want.parameters &&
                     grew(MemoryCategory::master_weights) == want.master_weights &&
                     grew(MemoryCategory::gradients) == want.gradients &&
                     grew(MemoryCategory::optimizer_state) == want.adamw_state &&
                     activations[i] == want.activations,
                 name + ": every category equals nn::predict_memory, to the byte");
    ++i;
  }
  // Not half exactly: the statistics and the logits stay f32, and fp16 keeps an f16 copy
  // of the 784-wide input (fp32 reads x itself): nn::predict_memory has every term.
  report.note("activations fp16 / fp32: " +
              number(static_cast<double>(activations[1]) / static_cast<double>(activations[0])) +
              " (f32 statistics and logits, and the input's f16 copy); the Linear weights "
              "cost 6 bytes each instead of 4 (an f16 copy beside the f32 master)");
}

/// floor(log2 |v|) of every nonzero element, counted: a histogram of magnitudes.
std::map<int, std::int64_t> log2_histogram(const Tensor& x) {
  std::map<int, std::int64_t> counts;
  for (const float v : x.to_vector<float>()) {
    if (v != 0.0f) ++counts[static_cast<int>(std::floor(std::log2(std::abs(v))))];
  }
  return counts;
}

/// {"-12": 3, "-11": 40, ...}: the histogram as a JSON object keyed by the exponent.
bb::Json json_histogram(const std::map<int, std::int64_t>& counts) {
  bb::Json object = bb::Json::object();
  for (const auto& [exponent, count] : counts) object[std::to_string(exponent)] = count;
  return object;
}

/// For the figure (notebooks/mixed_precision.ipynb): per effective batch B, the log2
/// histogram of |dlogits| without scaling and with S = B, and the shares lost in f16.
void underflow_grows_with_the_batch(bb::SelfCheck& report, const bb::baseline::Data& data,
                                    bb::Json& figure_data) {
  report.section("(b) The problem: the loss's gradient carries 1/B, and fp16 stops at 2^-24");
  // dlogits = S (p - y) / B for 256 real samples of a batch of B (the global count), as the
  // first gradient of the backward pass; the f16 cast is where small values are lost.
  Model model(config_in(Precision::fp32), bb::Device::cpu());
  const Batch batch = first_rows(data.train, 256);
  const Tensor logits = model.forward(batch.x, {false, 0, 0});
  const Tensor dlogits(logits.shape(), bb::DType::f32);
  report.note("fraction of the nonzero dlogits that become 0 / subnormal in f16:");
  double lost_at[3] = {0, 0, 0};
  int i = 0;
  bb::Json& rows = figure_data["dlogits"] = bb::Json::array();
  for (const std::int64_t b : {256, 4096, 65536}) {
    bb::cross_entropy_backward(logits, batch.labels, dlogits, static_cast<float>(b));
    const auto unscaled = bb::loss_scaling::range_shares(dlogits, bb::DType::f16);
    const bb::Json unscaled_histogram = json_histogram(log2_histogram(dlogits));
    const float scale = static_cast<float>(b);  // S = B makes dlogits S (p - y) / B = p - y
    bb::cross_entropy_backward(logits, batch.labels, dlogits, static_cast<float>(b), scale);
    const auto scaled = bb::loss_scaling::range_shares(dlogits, bb::DType::f16);
    rows.push_back({{"batch", b},
                    {"scale", bb::json_float(scale)},
                    {"zero", unscaled.zero},
                    {"subnormal", unscaled.subnormal},
                    {"scaled_zero", scaled.zero},
                    {"scaled_subnormal", scaled.subnormal},
                    {"log2_histogram", unscaled_histogram},
                    {"scaled_log2_histogram", json_histogram(log2_histogram(dlogits))}});
    report.note("  B = " + std::to_string(b) + ":  S = 1: " + number(100 * unscaled.zero, "%.1f") +
                "% zero, " + number(100 * unscaled.subnormal, "%.1f") + "% subnormal;  S = " +
                std::to_string(b) + ": " + number(100 * scaled.zero, "%.1f") + "% zero, " +
                number(100 * scaled.subnormal, "%.1f") + "% subnormal");
    lost_at[i++] = unscaled.zero + unscaled.subnormal;
  }
  report.check(lost_at[0] < lost_at[1] && lost_at[1] < lost_at[2],
               "the share lost to f16 grows with the effective batch");

  // The whole backward: gradients of 64 samples counted as a share of a batch of 2^16,
  // fp16 against fp32, without and with a static scale.
  const std::int64_t global_count = std::int64_t{1} << 16;
  const Batch small = first_rows(data.train, 64);
  const auto gradients = [&](Precision precision, float scale) {
    Model m(config_in(precision), bb::Device::cpu());
    m.zero_grad();
    bb::nn::accumulate_gradients(m, small.x, small.labels, 64, {true, 1, 0}, global_count,
                                 scale);
    bb::loss_scaling::StaticLossScaler(scale).unscale_and_check(m);
    std::vector<std::vector<float>> g;
    for (const auto& p : m.parameters()) g.push_back(p.grad.to_vector<float>());
    return g;
  };
  const auto reference = gradients(Precision::fp32, 1.0f);
  const auto error_of = [&](const std::vector<std::vector<float>>& g) {
    return bb::loss_scaling::worst_normalised_error(g, reference);
  };
  const double unscaled = error_of(gradients(Precision::fp16, 1.0f));
  const double scaled = error_of(gradients(Precision::fp16, 65536.0f));
  report.note("batch 2^16: fp16 gradients off fp32's by " + number(unscaled) +
              " without scaling, " + number(scaled) + " with S = 2^16 (worst tensor, normalised)");
  // Empirical thresholds (measured in tests/test_loss_scaling.cpp on a small model: 0.73
  // and 1.4e-3); here the gap is what matters: more than 10x.
  report.check(scaled * 10 < unscaled, "a static scale S = 2^16 rescues them (error > 10x smaller)");
}

void scale_too_large(bb::SelfCheck& report, const bb::baseline::Data& data) {
  report.section("(c) A scale too large overflows: check, and skip the step");
  const Batch batch = first_rows(data.train, 256);
  const float scale = 0x1p30f;  // S (p - y) / 256 reaches 2^22, far past f16's 65504
  Model model(config_in(Precision::fp16), bb::Device::cpu());
  bb::nn::Optimizer optimizer(model.parameters(), bb::baseline::adamw_options());
  model.zero_grad();
  bb::nn::accumulate_gradients(model, batch.x, batch.labels, 256, {true, 1, 0}, 0, scale);
  bb::loss_scaling::StaticLossScaler scaler(scale);
  const bool step_allowed = scaler.unscale_and_check(model);
  report.note("S = 2^30: the unscale-and-check " +
              std::string(step_allowed ? "found every gradient finite" : "found inf/NaN"));
  report.check(!step_allowed, "the overflow is detected at the boundary: the step is skipped");
  // Without the check: the update writes the non-finite gradients into the weights.
  optimizer.step();
  std::int64_t non_finite = 0;
  for (const auto& p : model.parameters()) {
    for (const float v : p.value.to_vector<float>()) non_finite += !std::isfinite(v);
  }
  report.note("stepping anyway leaves " + std::to_string(non_finite) + " of " +
              std::to_string(model.parameter_count()) + " weights inf or NaN");
  report.check(non_finite > 0, "without the check, one overflowing step destroys the weights");
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (const auto status = bb::parse_demo_options(
          argc, argv,
          "  Shows and checks fp16 mixed precision with a static loss scale (see\n"
          "  chapters/03_fp16_static_loss_scaling/README.md).\n"
          "  --write-data FILE  the histograms of (b) as JSON, for notebooks/mixed_precision.ipynb",
          options)) {
    return *status;
  }
  const bool quick = options.quick;
  std::printf("Chapter 03: fp16 mixed precision, static loss scaling\n");
  const bb::baseline::Data data = bb::baseline::load_data(quick);
  bb::SelfCheck report("chapter 03");
  memory_halves(report, data);
  bb::Json figure_data = bb::Json::object();
  underflow_grows_with_the_batch(report, data, figure_data);
  scale_too_large(report, data);
  if (!bb::write_demo_data(options, figure_data)) return 1;
  return report.finish();
}

// Chapter 01: the large-batch baseline. Train with one big batch per step, count where a
// step's bytes go, and hit the wall: on a device of fixed size the batch we want does not
// fit. See README.md in this folder; --quick is the CTest setting.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/report.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bb = bigbatch;
using bb::MemoryCategory;
using bb::nn::Model;
using bb::nn::ModelConfig;

namespace {

using bb::baseline::kBatchThatFits;
using bb::baseline::kDeviceBytes;
using bb::baseline::kWantedBatch;
constexpr std::int64_t kBatch = kBatchThatFits;

struct Setup {
  ModelConfig config = bb::baseline::model_config();
  bb::AdamWOptions adamw = bb::baseline::adamw_options();
  bb::baseline::Data data;
  std::int64_t steps = 0;  // optimizer steps of the training run
  std::int64_t print_every = 0;
  // The data sets, held by the host (MemoryCategory::host_data): a GPU keeps them in
  // host memory and copies one micro-batch at a time, so the allocator leaves them out of
  // the device's totals and cap. Printed for information only.
  std::size_t host_bytes = 0;
};

Setup make_setup(bool quick) {
  Setup s;
  s.data = bb::baseline::load_data(quick);
  if (quick) {
    s.steps = 30;
    s.print_every = 5;
  } else {
    const std::int64_t epochs = 2;
    // Whole passes, as PyTorch's DataLoader makes them: ceil(N / B) steps per epoch.
    s.steps = epochs * ((s.data.train.size() + kBatch - 1) / kBatch);
    s.print_every = 50;
  }
  s.host_bytes =
      bb::allocator_for(bb::Device::cpu()).stats().live_of(MemoryCategory::host_data);
  return s;
}

/// The parameter count of the residual MLP, by hand from its configuration (model.hpp).
std::int64_t predicted_parameters(const ModelConfig& c) {
  const std::int64_t d = c.inputs, h = c.hidden, inner = c.expansion * c.hidden, k = c.classes;
  const std::int64_t stem = d * h + h;                                       // Linear(D, H)
  const std::int64_t block = 2 * h + (h * inner + inner) + (inner * h + h);  // ln, fc1, fc2
  const std::int64_t head = 2 * h + (h * k + k);                             // ln, Linear(H, C)
  return stem + c.depth * block + head;
}

std::string row(const char* name, std::size_t measured, const std::string& remark) {
  char line[160];
  std::snprintf(line, sizeof line, "%-16s %12zu B  %10s   %s", name, measured,
                bb::format_bytes(measured).c_str(), remark.c_str());
  return line;
}

/// Trains the baseline, printing the loss; returns the allocator's books for step 1
/// (peak measured from what was live when the step began).
bb::MemoryStats train_baseline(bb::SelfCheck& report, const Setup& s, bool quick) {
  report.section("(a) The baseline: one batch of " + std::to_string(kBatch) + " per step, " +
                 std::to_string(s.steps) + " steps on " + s.data.train.name + " (" +
                 std::to_string(s.data.train.size()) + " samples)");
  bb::TrackingAllocator& cpu = bb::allocator_for(bb::Device::cpu());
  Model model(s.config, bb::Device::cpu());
  bb::nn::Optimizer optimizer(model.parameters(), s.adamw);
  bb::baseline::BaselineLoop loop(model, optimizer, s.data.train, kBatch, kBatch, /*seed=*/7);

  bb::MemoryStats first_step;
  double first_losses = 0, last_losses = 0;
  const std::int64_t window = 5;  // steps averaged at each end, to compare the loss
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t k = 0; k < s.steps; ++k) {
    const std::int64_t step = k + 1;
    if (k == 0) cpu.reset_peak();
    const float loss = loop.step(k);
    if (k == 0) first_step = cpu.stats();
    if (step <= window) first_losses += loss / window;
    if (step > s.steps - window) last_losses += loss / window;
    if (step == 1 || step % s.print_every == 0 || step == s.steps) {
      char line[96];
      std::snprintf(line, sizeof line, "step %4lld  epoch %.2f  loss %.4f",
                    static_cast<long long>(step),
                    static_cast<double>(step) / static_cast<double>(loop.steps_per_epoch()),
                    static_cast<double>(loss));
      report.note(line);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bb::nn::EvaluationResult result = bb::nn::evaluate(model, s.data.test, 1000);
  char line[160];
  std::snprintf(
      line, sizeof line,
      "trained in %.1f s (%.1f ms per step); test (%s, %lld samples): loss %.4f, accuracy %.4f",
      seconds, 1e3 * seconds / static_cast<double>(s.steps), s.data.test.name.c_str(),
      static_cast<long long>(result.samples), result.loss, result.accuracy);
  report.note(line);
  report.check(last_losses < first_losses,
               "the loss went down: mean of the last " + std::to_string(window) + " steps " +
                   std::to_string(last_losses) + " < first " + std::to_string(window) + " " +
                   std::to_string(first_losses));
  if (quick) {
    report.note("(--quick: too few steps for an accuracy threshold)");
  } else if (!s.data.fashion_mnist) {
    report.note("(synthetic data: the accuracy threshold is Fashion-MNIST's)");
  } else {
    report.check(result.accuracy >= 0.85, "test accuracy >= 0.85 after 2 epochs");
  }
  return first_step;
}

void where_the_bytes_go(bb::SelfCheck& report, const Setup& s, const bb::MemoryStats& step) {
  report.section("(b) Where one step's bytes go (batch " + std::to_string(kBatch) +
                 ", at the step's peak)");
  const std::int64_t parameters = predicted_parameters(s.config);
  const std::size_t parameter_bytes = static_cast<std::size_t>(parameters) * sizeof(float);
  const std::size_t gradient_bytes = parameter_bytes;       // one fp32 gradient each
  const std::size_t optimizer_bytes = 2 * parameter_bytes;  // AdamW: exp_avg, exp_avg_sq
  const std::size_t device_data = step.at_peak_of(MemoryCategory::data);
  const ModelConfig& c = s.config;
  report.note("by hand: D*H+H + depth*(2H + H*EH+EH + EH*H+H) + 2H + H*C+C = " +
              std::to_string(parameters) + " parameters (D " + std::to_string(c.inputs) + ", H " +
              std::to_string(c.hidden) + ", E " + std::to_string(c.expansion) + ", depth " +
              std::to_string(c.depth) + ", C " + std::to_string(c.classes) + ")");
  report.note(row("parameters", step.at_peak_of(MemoryCategory::parameters),
                  "predicted " + std::to_string(parameter_bytes) + " B (4 per parameter)"));
  report.note(row("gradients", step.at_peak_of(MemoryCategory::gradients),
                  "predicted " + std::to_string(gradient_bytes) + " B (4 per parameter)"));
  report.note(
      row("optimizer_state", step.at_peak_of(MemoryCategory::optimizer_state),
          "predicted " + std::to_string(optimizer_bytes) + " B (AdamW: 2 x 4 per parameter)"));
  const std::size_t activations = step.at_peak_of(MemoryCategory::activations);
  report.note(row("activations", activations,
                  "measured: " + std::to_string(activations / kBatch) + " B per sample"));
  report.note(row("workspace", step.at_peak_of(MemoryCategory::workspace), "measured"));
  report.note(row("data", device_data, "the batch's features and labels on the device"));
  const std::size_t total = step.peak_total;
  report.note(
      row("total", total,
          "(the data set itself, " + bb::format_bytes(s.host_bytes) + ", stays on the host)"));
  report.check(step.at_peak_of(MemoryCategory::parameters) == parameter_bytes,
               "parameters: the allocator's count equals the prediction, to the byte");
  report.check(step.at_peak_of(MemoryCategory::gradients) == gradient_bytes,
               "gradients: the allocator's count equals the prediction, to the byte");
  report.check(step.at_peak_of(MemoryCategory::optimizer_state) == optimizer_bytes,
               "optimizer state: the allocator's count equals the prediction, to the byte");
  const std::size_t fixed = parameter_bytes + gradient_bytes + optimizer_bytes;
  report.note("parameters + gradients + optimizer state = " + bb::format_bytes(fixed) +
              ": they scale with the model, whatever the batch");
  report.note("activations scale with the batch: at " + std::to_string(kWantedBatch) +
              " they would be about " + bb::format_bytes(activations / kBatch * kWantedBatch) +
              " (" + std::to_string(kWantedBatch / kBatch) + " x)");
}

/// What one training step under the cap did: its out-of-memory message, or its peak.
struct CappedStep {
  std::optional<std::string> out_of_memory;  ///< the error's message when it failed
  std::size_t peak = 0;                      ///< device bytes at the step's peak
};

/// One training step at `batch` on a fresh model, with everything (model, optimizer state,
/// batch) allocated while the cap holds, as it would be on the small device.
CappedStep one_capped_step(const Setup& s, std::int64_t batch) {
  bb::TrackingAllocator& cpu = bb::allocator_for(bb::Device::cpu());
  cpu.reset_peak();
  CappedStep result;
  try {
    Model model(s.config, bb::Device::cpu());
    bb::nn::Optimizer optimizer(model.parameters(), s.adamw);
    bb::baseline::BaselineLoop loop(model, optimizer, s.data.train, batch, batch, /*seed=*/0);
    loop.step(0);
  } catch (const bb::OutOfMemoryError& error) {
    result.out_of_memory = error.what();
  }
  result.peak = cpu.stats().peak_total;
  return result;
}

void the_batch_we_want_does_not_fit(bb::SelfCheck& report, const Setup& s) {
  report.section("(c) The batch we want does not fit");
  // The cap counts what a GPU would hold; the data sets stay on the host, outside it.
  bb::ScopedMemoryCap device(bb::Device::cpu(), kDeviceBytes);
  report.note("the device: the allocator capped at " + bb::format_bytes(kDeviceBytes) +
              " (the " + bb::format_bytes(s.host_bytes) +
              " of data sets are host memory, outside the cap)");

  const CappedStep wanted = one_capped_step(s, kWantedBatch);
  report.note("one step at batch " + std::to_string(kWantedBatch) + ":");
  report.note("  " + wanted.out_of_memory.value_or("(no error)"));
  report.check(wanted.out_of_memory.has_value(), "batch " + std::to_string(kWantedBatch) +
                                                     " fails with OutOfMemoryError on the " +
                                                     bb::format_bytes(kDeviceBytes) + " device");

  const CappedStep baseline = one_capped_step(s, kBatch);
  report.note("one step at batch " + std::to_string(kBatch) + ": peak " +
              bb::format_bytes(baseline.peak) + " of " + bb::format_bytes(kDeviceBytes));
  report.check(!baseline.out_of_memory.has_value(),
               "batch " + std::to_string(kBatch) + " trains under the same cap");
  report.note("the way out (chapter 02): a batch of " + std::to_string(kWantedBatch) +
              " as micro-batches of " + std::to_string(kBatch) + ", one optimizer step per " +
              std::to_string(kWantedBatch / kBatch) + " micro-batches.");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (argc > 1 && !quick) {
    std::printf(
        "usage: %s [--quick]\n  Trains the large-batch baseline on Fashion-MNIST, counts where a "
        "step's memory goes,\n  and shows the batch we want running out of memory "
        "(see chapters/01_large_batch_baseline/README.md).\n"
        "  --quick  30 steps on 4096 samples, no accuracy threshold (the CTest setting)\n",
        argv[0]);
    return std::string(argv[1]) == "--help" ? 0 : 2;
  }
  std::printf("Chapter 01: the large-batch baseline\n");
  const Setup setup = make_setup(quick);
  std::printf(
      "model: residual MLP, D %lld, H %lld, expansion %lld, depth %lld, GELU, LayerNorm; "
      "AdamW lr %g\n",
      static_cast<long long>(setup.config.inputs), static_cast<long long>(setup.config.hidden),
      static_cast<long long>(setup.config.expansion), static_cast<long long>(setup.config.depth),
      setup.adamw.lr);
  bb::SelfCheck report("chapter 01");
  const bb::MemoryStats step = train_baseline(report, setup, quick);
  where_the_bytes_go(report, setup, step);
  the_batch_we_want_does_not_fit(report, setup);
  return report.finish();
}

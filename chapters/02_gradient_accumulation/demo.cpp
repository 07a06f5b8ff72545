// Chapter 02: gradient accumulation, the memory-free way and the naive way, and the classic
// mistakes, shown and checked. See README.md in this folder; --quick is the CTest setting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/02_gradient_accumulation/accumulation.hpp"
#include "common/data/dataset.hpp"
#include "common/format.hpp"
#include "common/report.hpp"
#include "kernels/elementwise.hpp"

namespace bb = bigbatch;
namespace acc = bigbatch::accumulation;
using bb::MemoryCategory;
using bb::Tensor;
using bb::nn::ForwardContext;
using bb::nn::Model;
using bb::nn::ModelConfig;

namespace {

using PerParameter = std::vector<std::vector<double>>;

struct Setup {
  ModelConfig config;
  bb::Dataset data;
  std::int64_t batch = 0, micro_batch = 0;
};

Setup make_setup(bool quick) {
  Setup s;
  s.config.inputs = 64;
  s.config.hidden = quick ? 32 : 64;
  s.config.expansion = 4;
  s.config.classes = 10;
  s.config.depth = 2;
  s.config.dropout = 0.1f;
  s.config.seed = 2;
  s.batch = quick ? 256 : 1024;
  s.micro_batch = s.batch / 8;
  bb::SyntheticOptions options;
  options.samples = std::max<std::int64_t>(s.batch, 1000);
  options.features = s.config.inputs;
  options.classes = s.config.classes;
  s.data = bb::make_synthetic(options);
  return s;
}

PerParameter as_doubles(const std::vector<Tensor>& tensors) {
  PerParameter result;
  for (const Tensor& t : tensors) {
    const auto v = t.to(bb::Device::cpu()).to_vector<float>();
    result.emplace_back(v.begin(), v.end());
  }
  return result;
}

bool bitwise_equal(const PerParameter& x, const PerParameter& y) {
  for (std::size_t k = 0; k < x.size(); ++k) {
    for (std::size_t e = 0; e < x[k].size(); ++e) {
      // Compared as the floats they came from: equal values, and equal signs of zero.
      if (x[k][e] != y[k][e] || std::signbit(x[k][e]) != std::signbit(y[k][e])) return false;
    }
  }
  return true;
}

/// max over elements of |a - b| / (the largest |b| of the same tensor).
double max_relative_difference(const PerParameter& a, const PerParameter& b) {
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    double scale = 0, diff = 0;
    for (std::size_t e = 0; e < a[k].size(); ++e) {
      scale = std::max(scale, std::abs(b[k][e]));
      diff = std::max(diff, std::abs(a[k][e] - b[k][e]));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

std::string number(double value, const char* format = "%.3g") {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string peaks(const acc::StepCost& cost) {
  return "activations " + bb::format_bytes(cost.peak_of(MemoryCategory::activations)) +
         ", workspace " + bb::format_bytes(cost.peak_of(MemoryCategory::workspace)) +
         ", gradients " + bb::format_bytes(cost.peak_of(MemoryCategory::gradients)) +
         ", total " + bb::format_bytes(cost.peak_total);
}

/// What a few optimizer steps at chapter 01's wanted batch did.
struct WantedBatchRun {
  std::vector<float> losses;           ///< the batch's mean loss at every step
  PerParameter parameters;             ///< after the last step
  acc::StepCost first_step;            ///< peak bytes by category of step 1
};

WantedBatchRun train_wanted_batch(const bb::baseline::Data& data, std::int64_t micro_batch,
                                  std::int64_t steps) {
  namespace base = bb::baseline;
  WantedBatchRun run;
  Model model(base::model_config(), bb::Device::cpu());
  bb::nn::Optimizer optimizer(model.parameters(), base::adamw_options());
  base::BaselineLoop loop(model, optimizer, data.train, base::kWantedBatch, micro_batch,
                          /*seed=*/7);
  for (std::int64_t k = 0; k < steps; ++k) {
    const auto cost = acc::measure(bb::Device::cpu(), [&] { run.losses.push_back(loop.step(k)); });
    if (k == 0) run.first_step = cost;
  }
  std::vector<Tensor> values;
  for (const auto& p : model.parameters()) values.push_back(p.value);
  run.parameters = as_doubles(values);
  return run;
}

void the_wanted_batch_as_micro_batches(bb::SelfCheck& report, const bb::baseline::Data& data,
                                       bool quick) {
  namespace base = bb::baseline;
  const std::int64_t micro = base::kBatchThatFits;
  const std::int64_t count = base::kWantedBatch / micro, steps = quick ? 2 : 6;
  report.section("(a) Chapter 01's batch of " + std::to_string(base::kWantedBatch) + " on its " +
                 bb::format_bytes(base::kDeviceBytes) + " device: " + std::to_string(count) +
                 " micro-batches of " + std::to_string(micro));
  std::optional<std::string> out_of_memory;
  WantedBatchRun accumulated;
  {
    bb::ScopedMemoryCap device(bb::Device::cpu(), base::kDeviceBytes);
    try {
      train_wanted_batch(data, base::kWantedBatch, 1);
    } catch (const bb::OutOfMemoryError& error) {
      out_of_memory = error.what();
    }
    report.note("in one piece: " + out_of_memory.value_or("(no error)"));
    report.check(out_of_memory.has_value(),
                 "in one piece, the batch runs out of memory under the cap, as in chapter 01");
    accumulated = train_wanted_batch(data, micro, steps);  // under the same cap
  }
  report.note("as micro-batches, step 1 peaks at: " + peaks(accumulated.first_step));
  report.check(accumulated.first_step.peak_total <= base::kDeviceBytes,
               "as micro-batches it trains under the same cap (" + std::to_string(steps) +
                   " optimizer steps)");
  // The reference: the same steps in one piece, on a device without the cap.
  const WantedBatchRun whole = train_wanted_batch(data, base::kWantedBatch, steps);
  report.note("one piece, no cap, step 1 peaks at: " + peaks(whole.first_step));
  std::string losses;
  for (const float loss : accumulated.losses) losses.append(" ").append(number(loss, "%.4f"));
  report.note("loss per step (micro-batches):" + losses);
  // An independent check that real gradients flowed: a backward that wrote nothing would
  // leave both runs equal and the loss flat (AdamW's decay alone does not train).
  report.check(accumulated.losses.back() < accumulated.losses.front(),
               "the loss falls: the steps are training");
  report.check(bitwise_equal(accumulated.parameters, whole.parameters),
               "after " + std::to_string(steps) +
                   " steps, the parameters equal those of the batch in one piece, bit for bit");
  // The reported loss is a sum of B non-negative terms loss_i / B, added per micro-batch
  // and then across micro-batches (kernels/cross_entropy.hpp): another order than one
  // piece's, so it may differ in the last bits. Each order's result has at most B + 2N
  // rounded operations on non-negative terms, so each is within gamma(B + 2N) x loss of
  // the exact value, and the two within 2 gamma(B + 2N) x loss of each other.
  const double u = 0x1p-24, n = static_cast<double>(base::kWantedBatch + 2 * count);
  const double gamma = n * u / (1 - n * u);
  bool losses_within = true;
  double worst = 0;
  for (std::size_t k = 0; k < whole.losses.size(); ++k) {
    const double difference = std::abs(double{accumulated.losses[k]} - whole.losses[k]);
    worst = std::max(worst, difference / whole.losses[k]);
    losses_within &= difference <= 2 * gamma * whole.losses[k];
  }
  report.check(losses_within, "the reported losses agree within 2 gamma(B + 2N) x loss (" +
                                  number(2 * gamma) + " relative; measured " + number(worst) +
                                  "): the loss is summed per micro-batch, a rounding, not a "
                                  "difference in training");
}

void naive_versus_memory_free(bb::SelfCheck& report, const Setup& s) {
  report.section("(b) Naive (a buffer, each micro-batch's mean, / N) vs memory-free");
  const Tensor x = s.data.features.rows(0, s.batch), labels = s.data.labels.rows(0, s.batch);
  const ForwardContext context{true, 23, 0};
  Model model(s.config, bb::Device::cpu());
  // Each way runs twice and the second run is measured: the first one warms the caches.
  acc::StepCost free_cost, naive_cost;
  for (int run = 0; run < 2; ++run) {
    free_cost = acc::measure(bb::Device::cpu(), [&] {
      acc::memory_free_gradients(model, x, labels, s.micro_batch, context);
    });
  }
  const auto memory_free = as_doubles(acc::copy_gradients(model));
  acc::NaiveAccumulator naive(model);
  for (int run = 0; run < 2; ++run) {
    naive_cost = acc::measure(bb::Device::cpu(), [&] {
      naive.gradients(model, x, labels, s.micro_batch, context);
    });
  }
  const auto naive_gradients = as_doubles(acc::copy_gradients(model));
  const std::size_t parameter_bytes = static_cast<std::size_t>(model.parameter_count()) * 4;
  report.note("memory-free: " + number(free_cost.seconds * 1e3, "%.1f") + " ms, peak " + peaks(free_cost));
  report.note("naive:       " + number(naive_cost.seconds * 1e3, "%.1f") + " ms, peak " + peaks(naive_cost));
  report.check(naive.buffer_bytes() == parameter_bytes &&
                   naive_cost.peak_of(MemoryCategory::gradients) ==
                       free_cost.peak_of(MemoryCategory::gradients) + parameter_bytes,
               "the naive buffer costs one more gradients' worth: " +
                   bb::format_bytes(naive.buffer_bytes()) + " (4 bytes x " +
                   std::to_string(model.parameter_count()) + " parameters)");

  // Both sum the same per-sample terms (N = 8 makes the loss factors 1/m and 1/(8m) exact
  // scalings), in another order: they differ by at most 2 gamma(B + N) M per element.
  const std::int64_t count = acc::micro_batch_count(s.batch, s.micro_batch);
  const PerParameter magnitude = acc::per_sample_magnitude(model, x, labels, s.batch, context);
  const double u = 0x1p-24, n = static_cast<double>(s.batch + count);
  const double gamma = n * u / (1 - n * u);
  bool within = true;
  for (std::size_t k = 0; k < memory_free.size(); ++k) {
    for (std::size_t e = 0; e < memory_free[k].size(); ++e) {
      within &= std::abs(naive_gradients[k][e] - memory_free[k][e]) <= 2 * gamma * magnitude[k][e];
    }
  }
  report.note("max relative difference (of each tensor's largest element): " +
              number(max_relative_difference(naive_gradients, memory_free)));
  report.check(within, "naive and memory-free agree within 2 gamma(B + N) x the per-sample magnitude "
                       "(not bit for bit: the summation order differs)");
}

void uneven_split(bb::SelfCheck& report, const Setup& s) {
  constexpr std::int64_t kBatch = 1000, kMicro = 64;
  report.section("(c) 1000 = 15 x 64 + 40: normalise by the global count, not per micro-batch");
  const Tensor x = s.data.features.rows(0, kBatch), labels = s.data.labels.rows(0, kBatch);
  const ForwardContext context{true, 29, 0};
  Model model(s.config, bb::Device::cpu());
  acc::memory_free_gradients(model, x, labels, kBatch, context);
  const PerParameter whole = as_doubles(acc::copy_gradients(model));
  acc::memory_free_gradients(model, x, labels, kMicro, context);
  const PerParameter right = as_doubles(acc::copy_gradients(model));
  report.check(bitwise_equal(right, whole),
               "memory-free (every loss / 1000): 15 x 64 + 40 equals one batch of 1000, bit for bit");

  // The prediction: per-micro-batch averaging leaves (1/16) sum_k g_k, so its error is
  // sum_k (1/16 - n_k/1000) g_k: the 40-sample micro-batch weighs 1.5625 times too much.
  const std::int64_t count = acc::micro_batch_count(kBatch, kMicro);
  PerParameter predicted_error;
  for (std::int64_t begin = 0; begin < kBatch; begin += kMicro) {
    const std::int64_t end = std::min(kBatch, begin + kMicro);
    ForwardContext micro_context = context;
    micro_context.first_row = begin;
    acc::memory_free_gradients(model, x.rows(begin, end), labels.rows(begin, end), end - begin,
                               micro_context);
    const PerParameter gk = as_doubles(acc::copy_gradients(model));
    const double weight = 1.0 / static_cast<double>(count) - static_cast<double>(end - begin) / kBatch;
    predicted_error.resize(gk.size());
    for (std::size_t k = 0; k < gk.size(); ++k) {
      predicted_error[k].resize(gk[k].size());
      for (std::size_t e = 0; e < gk[k].size(); ++e) predicted_error[k][e] += weight * gk[k][e];
    }
  }
  acc::NaiveAccumulator(model).gradients(model, x, labels, kMicro, context);
  const PerParameter wrong = as_doubles(acc::copy_gradients(model));
  PerParameter measured_error = wrong;
  for (std::size_t k = 0; k < wrong.size(); ++k) {
    for (std::size_t e = 0; e < wrong[k].size(); ++e) measured_error[k][e] -= right[k][e];
  }
  const double measured = max_relative_difference(wrong, right);
  const double predicted = max_relative_difference(
      [&] {
        PerParameter p = right;
        for (std::size_t k = 0; k < p.size(); ++k) {
          for (std::size_t e = 0; e < p[k].size(); ++e) p[k][e] += predicted_error[k][e];
        }
        return p;
      }(),
      right);
  report.note("per-micro-batch averaging: max relative error predicted " + number(predicted) +
              ", measured " + number(measured));
  // "Beyond rounding", derived: two correct orders of the B per-sample terms differ by at
  // most 2 gamma(B + N) M per element ((b) above); the error here is measured against that.
  const PerParameter magnitude = acc::per_sample_magnitude(model, x, labels, kBatch, context);
  const double u = 0x1p-24, n = static_cast<double>(kBatch + count);
  const double gamma = n * u / (1 - n * u);
  double beyond = 0;  // the largest |error| / rounding bound over all elements
  for (std::size_t k = 0; k < measured_error.size(); ++k) {
    for (std::size_t e = 0; e < measured_error[k].size(); ++e) {
      const double bound = 2 * gamma * magnitude[k][e];
      if (bound > 0) beyond = std::max(beyond, std::abs(measured_error[k][e]) / bound);
    }
  }
  report.note("its largest error is " + number(beyond) + " times the rounding bound 2 gamma(B + N) M");
  report.check(beyond > 100, "per-micro-batch averaging is wrong far beyond rounding (> 100 x the bound)");
  // Empirical: the prediction is formed in double from fp32 gradients, the measurement in
  // fp32, so they differ by rounding; measured 3e-5 of the error here, checked at 1%.
  const double off = max_relative_difference(measured_error, predicted_error);
  report.check(off < 1e-2, "its error is the predicted sum_k (1/N - n_k/B) g_k (to " + number(off) +
                               " of the error, checked at 1%; "
                               "tests/test_gradient_accumulation.cpp derives the exact bound)");
}

void classic_mistakes(bb::SelfCheck& report, const Setup& s) {
  report.section("(d) The classic mistakes, predicted and measured");
  const std::int64_t half = s.batch / 2, micro = half / 4;
  const Tensor x = s.data.features.rows(0, s.batch), labels = s.data.labels.rows(0, s.batch);
  const ForwardContext first{true, 31, 0}, second{true, 31, half};

  // 1. No zero_grad: step 2's gradient is g1 + g2; the error is g1.
  Model model(s.config, bb::Device::cpu());
  acc::memory_free_gradients(model, x.rows(0, half), labels.rows(0, half), micro, first);
  const PerParameter g1 = as_doubles(acc::copy_gradients(model));
  acc::forgotten_zero_grad(model, x.rows(half, s.batch), labels.rows(half, s.batch), micro, second);
  const PerParameter forgot = as_doubles(acc::copy_gradients(model));
  Model fresh(s.config, bb::Device::cpu());
  acc::memory_free_gradients(fresh, x.rows(half, s.batch), labels.rows(half, s.batch), micro, second);
  const PerParameter g2 = as_doubles(acc::copy_gradients(fresh));
  PerParameter error = forgot;
  for (std::size_t k = 0; k < error.size(); ++k) {
    for (std::size_t e = 0; e < error[k].size(); ++e) error[k][e] -= g2[k][e];
  }
  const double off_by_g1 = max_relative_difference(error, g1);
  report.note("forgotten zero_grad: predicted error g1; measured (g - g2) differs from g1 by " +
              number(off_by_g1) + " (rounding), and from g2 by " +
              number(max_relative_difference(forgot, g2)));
  // Empirical: g - g2 differs from g1 by rounding (measured about 1e-6 of max|g1|, checked
  // at 1e-5); the gap to g2 (order 1) is what the mistake costs.
  report.check(off_by_g1 < 1e-5, "without zero_grad, step 2's gradient is g1 + g2");

  // 2. No 1/N: sum of per-micro-batch means = N times the gradient, exactly for N = 2^k.
  const std::int64_t count = acc::micro_batch_count(s.batch, s.micro_batch);
  acc::memory_free_gradients(model, x, labels, s.micro_batch, first);
  const auto g = acc::copy_gradients(model);
  acc::sum_of_micro_batch_means(model, x, labels, s.micro_batch, first);
  for (const Tensor& t : g) bb::scale(t, static_cast<float>(count));
  report.check(bitwise_equal(as_doubles(acc::copy_gradients(model)), as_doubles(g)),
               "no 1/N: the gradient is exactly N = " + std::to_string(count) +
                   " times the right one, bit for bit (N a power of two)");

  // 3. An optimizer step per micro-batch: to first order, N times the step.
  bb::SgdOptions sgd;
  sgd.lr = 1e-3;
  auto update_norm = [&](bool every_micro_batch) {
    Model m(s.config, bb::Device::cpu());
    std::vector<Tensor> before;
    for (const auto& p : m.parameters()) before.push_back(p.value.clone());
    bb::nn::Optimizer optimizer(m.parameters(), sgd);
    if (every_micro_batch) {
      acc::step_every_micro_batch(m, optimizer, x, labels, s.micro_batch, first);
    } else {
      acc::memory_free_gradients(m, x, labels, s.micro_batch, first);
      optimizer.step();
    }
    const PerParameter a = as_doubles(before);
    double sum = 0;
    const auto params = m.parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      const auto after = params[k].value.to_vector<float>();
      for (std::size_t e = 0; e < after.size(); ++e) sum += std::pow(after[e] - a[k][e], 2);
    }
    return std::sqrt(sum);
  };
  const double ratio = update_norm(true) / update_norm(false);
  report.note("an optimizer step per micro-batch: update norm predicted " + std::to_string(count) +
              "x the big-batch step (lr effectively x N), measured " + number(ratio, "%.3f") + "x");
  // Empirical: N steps of lr g_k move N times as far only to first order (the gradient
  // changes between them); measured within 0.5% of N here, checked at 5%.
  report.check(std::abs(ratio - static_cast<double>(count)) < 0.05 * static_cast<double>(count),
               "stepping every micro-batch takes N small steps: ~N times the update");
}

void batchnorm_versus_layernorm(bb::SelfCheck& report, const Setup& s) {
  report.section("(e) BatchNorm breaks the equivalence, LayerNorm keeps it");
  const std::int64_t batch = 128, micro = 8;
  const Tensor x = s.data.features.rows(0, batch), labels = s.data.labels.rows(0, batch);
  const ForwardContext context{true, 37, 0};
  for (const bb::nn::Norm norm : {bb::nn::Norm::batch, bb::nn::Norm::layer}) {
    ModelConfig config = s.config;
    config.norm = norm;
    config.dropout = 0;
    Model whole_model(config, bb::Device::cpu()), micro_model(config, bb::Device::cpu());
    acc::memory_free_gradients(whole_model, x, labels, batch, context);
    acc::memory_free_gradients(micro_model, x, labels, micro, context);
    const PerParameter micro_grads = as_doubles(acc::copy_gradients(micro_model));
    const PerParameter whole_grads = as_doubles(acc::copy_gradients(whole_model));
    const double difference = max_relative_difference(micro_grads, whole_grads);
    const std::string name = bb::nn::norm_name(norm) + "norm";
    report.note(name + ": 16 micro-batches of 8 vs one batch of 128, max relative gradient difference " +
                number(difference));
    if (norm == bb::nn::Norm::batch) {
      // Empirical: a different function, not rounding (measured ~1, checked at 1e-3,
      // far above fp32's rounding of these sums, ~1e-6 as in (b)).
      report.check(difference > 1e-3, "BatchNorm: each micro-batch normalises with its own statistics");
    } else {
      report.check(bitwise_equal(micro_grads, whole_grads),
                   "LayerNorm: per-sample statistics, bit for bit");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (argc > 1 && !quick) {
    std::printf("usage: %s [--quick]\n  Shows and checks gradient accumulation "
                "(see chapters/02_gradient_accumulation/README.md).\n", argv[0]);
    return std::string(argv[1]) == "--help" ? 0 : 2;
  }
  std::printf("Chapter 02: gradient accumulation\n");
  const Setup setup = make_setup(quick);
  std::printf("(a) continues chapter 01: its model, its data, its 48 MiB device.\n");
  bb::SelfCheck report("chapter 02");
  const bb::baseline::Data data = bb::baseline::load_data(quick);
  the_wanted_batch_as_micro_batches(report, data, quick);
  std::printf("\n(b) to (e) use a small model (D 64, H %lld, dropout 0.1) on synthetic data: (b)'s\n"
              "rounding bound takes one backward per sample, and (c) to (e) run many variants.\n",
              static_cast<long long>(setup.config.hidden));
  naive_versus_memory_free(report, setup);
  uneven_split(report, setup);
  classic_mistakes(report, setup);
  batchnorm_versus_layernorm(report, setup);
  return report.finish();
}

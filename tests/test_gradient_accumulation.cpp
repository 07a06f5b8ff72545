// test_gradient_accumulation.cpp: chapter 02's component (chapters/02_gradient_accumulation).
// The naive accumulator against the memory-free one (equal within a bound derived from
// the summation order; its extra memory to the byte), and every classic mistake shown
// failing by exactly the error it predicts.
//
// Already proven in tests/test_model.cpp and not repeated here: micro-batches give the big
// batch's gradients bit for bit (with dropout keyed by the global sample index, and with an
// uneven last micro-batch), 50 optimizer steps stay bit for bit, and BatchNorm breaks the
// equivalence where LayerNorm keeps it.
//
// CPU only: the bit-for-bit predictions rest on the CPU kernels' sample-order reductions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "chapters/02_gradient_accumulation/accumulation.hpp"
#include "common/data/dataset.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"
#include "kernels/elementwise.hpp"
#include "tests/harness.hpp"
#include "tests/model_oracle.hpp"

namespace bigbatch {
namespace {

using nn::ForwardContext;
using nn::Model;
using nn::ModelConfig;
using PerParameter = std::vector<std::vector<double>>;  // one vector per parameter
using testing::Gradients;
using testing::Oracle;
using testing::OracleBatch;

ModelConfig small_config(std::int64_t depth, float dropout) {
  return {.inputs = 12, .hidden = 16, .expansion = 4, .classes = 5, .depth = depth,
          .dropout = dropout, .seed = 7};
}

Dataset synthetic(std::int64_t samples) {
  SyntheticOptions options;
  options.samples = samples;
  options.features = 12;
  options.classes = 5;
  options.teacher_hidden = 16;
  options.seed = 202;
  return make_synthetic(options);
}

PerParameter to_doubles(const std::vector<Tensor>& tensors) {
  PerParameter result;
  for (const Tensor& t : tensors) result.push_back(testing::to_doubles(t));
  return result;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (const double e : v) m = std::max(m, std::abs(e));
  return m;
}

/// The model's parameters in double, by name (exact), to start the float64 oracle from.
Gradients parameter_values(const Model& model) {
  Gradients values;
  for (const auto& p : model.parameters()) values[p.name] = testing::to_doubles(p.value);
  return values;
}

/// Rows [begin, end) of `data` for the oracle, with `context` (its first_row is the
/// global row of `begin`).
OracleBatch oracle_rows(const Dataset& data, std::int64_t begin, std::int64_t end,
                        const ForwardContext& context) {
  OracleBatch batch{testing::to_doubles(data.features.rows(begin, end)), {}, end - begin, context};
  for (const double label : testing::to_doubles(data.labels.rows(begin, end))) {
    batch.labels.push_back(static_cast<int>(label));
  }
  return batch;
}

/// accumulation::per_sample_magnitude on a model of its own.
PerParameter per_sample_magnitude(const ModelConfig& config, const Tensor& x, const Tensor& labels,
                                  std::int64_t global_count, const ForwardContext& context) {
  Model model(config, Device::cpu());
  return accumulation::per_sample_magnitude(model, x, labels, global_count, context);
}

/// Roundings along one sample's path from the input to the loss and back, counted as in
/// test_model.cpp's comparison with the float64 oracle.
std::int64_t path_roundings(const ModelConfig& c) {
  const std::int64_t H = c.hidden, E = c.expansion * c.hidden;
  return 2 * ((c.inputs + 12) + c.depth * ((3 * H + 5) + (H + 1) + 12 + 1 + (E + 1) + 1) +
              (3 * H + 5 + H + 1) + (2 * c.classes + 5));
}

void expect_close(const std::vector<Tensor>& got, const PerParameter& want,
                  const PerParameter& tolerance, const Model& names, const std::string& what) {
  const auto parameters = names.parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got[k]), want[k],
                                   [&](std::size_t i) { return tolerance[k][i]; }))
        << parameters[k].name << ": " << what;
  }
}

// ---- the two ways, side by side -------------------------------------------------------

// The naive accumulator sums the same per-sample terms as the memory-free one, in another
// order: each micro-batch's sum from 0, then the N partial sums. With N a power of two the
// terms are even the same up to an exact power of two (the loss factor 1/m vs 1/(N m)),
// and the final division by N is exact, so only the order differs: each result is within
// gamma(B + N) * M of the exact sum of the terms, and they are within twice that of each
// other.
TEST(GradientAccumulationWays, NaiveMatchesMemoryFreeWithinTheSummationOrderBound) {
  constexpr std::int64_t kBatch = 128, kMicro = 16, kCount = kBatch / kMicro;
  const ModelConfig config = small_config(2, 0.1f);
  const Dataset data = synthetic(kBatch);
  const ForwardContext context{true, 5, 0};

  Model model(config, Device::cpu());
  accumulation::memory_free_gradients(model, data.features, data.labels, kMicro, context);
  const auto memory_free = accumulation::copy_gradients(model);
  accumulation::NaiveAccumulator naive(model);
  naive.gradients(model, data.features, data.labels, kMicro, context);
  const auto naive_gradients = accumulation::copy_gradients(model);

  PerParameter tolerance = per_sample_magnitude(config, data.features, data.labels, kBatch, context);
  const double bound = 2 * testing::gamma(kBatch + kCount, DType::f32);
  for (auto& t : tolerance) {
    for (double& e : t) e *= bound;
  }
  expect_close(naive_gradients, to_doubles(memory_free), tolerance, model, "naive vs memory-free");
  bool any_bits_differ = false;
  for (std::size_t k = 0; k < memory_free.size(); ++k) {
    any_bits_differ |= !testing::bitwise_equal(naive_gradients[k], memory_free[k]);
  }
  EXPECT_TRUE(any_bits_differ) << "the orders differ, so some rounding should too";
}

TEST(GradientAccumulationWays, TheNaiveBufferIsOneMoreGradientsWorthOfMemory) {
  const ModelConfig config = small_config(2, 0.0f);
  const Dataset data = synthetic(64);
  const ForwardContext context{true, 1, 0};
  Model model(config, Device::cpu());
  const std::size_t gradient_bytes = static_cast<std::size_t>(model.parameter_count()) * sizeof(float);
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const std::size_t live_gradients = allocator.stats().live_of(MemoryCategory::gradients);

  const auto memory_free = accumulation::measure(Device::cpu(), [&] {
    accumulation::memory_free_gradients(model, data.features, data.labels, 16, context);
  });
  EXPECT_EQ(memory_free.peak_of(MemoryCategory::gradients), live_gradients)
      << "memory-free accumulation allocates no gradient memory";

  accumulation::NaiveAccumulator naive(model);
  EXPECT_EQ(naive.buffer_bytes(), gradient_bytes);
  EXPECT_EQ(allocator.stats().live_of(MemoryCategory::gradients), live_gradients + gradient_bytes);
  const auto naive_cost = accumulation::measure(Device::cpu(), [&] {
    naive.gradients(model, data.features, data.labels, 16, context);
  });
  EXPECT_EQ(naive_cost.peak_of(MemoryCategory::gradients), live_gradients + gradient_bytes);
}

// ---- the classic mistakes -------------------------------------------------------------

// Forgetting zero_grad: the backward GEMMs continue the sum already in the gradients, so
// step 2 leaves g1 + g2. Exactly: every per-sample term is that sample's loss gradient
// times 1/B, added in sample order from 0, so another split of the same 2B rows gives the
// same bits: one pass over both batches in micro-batches of 7, which straddle the two
// batches (64 = 9 x 7 + 1), with the loss factor 1/B (bit for bit, by the CPU kernels'
// batch invariance and sample-order reductions). And within the summation bound of the
// float sum g1 + g2 of two separate models' gradients.
TEST(GradientAccumulationMistakes, ForgottenZeroGradLeavesTheSumOfBothSteps) {
  constexpr std::int64_t kBatch = 64, kMicro = 16;
  const ModelConfig config = small_config(2, 0.1f);
  const Dataset data = synthetic(2 * kBatch);
  const Dataset first = slice(data, 0, kBatch), second = slice(data, kBatch, 2 * kBatch);
  const ForwardContext first_context{true, 9, 0}, second_context{true, 9, kBatch};

  Model model(config, Device::cpu());
  accumulation::memory_free_gradients(model, first.features, first.labels, kMicro, first_context);
  const auto g1 = accumulation::copy_gradients(model);
  accumulation::forgotten_zero_grad(model, second.features, second.labels, kMicro, second_context);
  const auto got = accumulation::copy_gradients(model);

  Model fresh(config, Device::cpu());
  accumulation::memory_free_gradients(fresh, second.features, second.labels, kMicro, second_context);
  const auto g2 = accumulation::copy_gradients(fresh);

  constexpr std::int64_t kStraddling = 7;
  static_assert(kBatch % kStraddling != 0 && kMicro % kStraddling != 0);
  Model chained(config, Device::cpu());
  chained.zero_grad();
  nn::accumulate_gradients(chained, data.features, data.labels, kStraddling, first_context,
                           kBatch);
  const auto chained_gradients = accumulation::copy_gradients(chained);
  for (std::size_t k = 0; k < got.size(); ++k) {
    EXPECT_TRUE(testing::bitwise_equal(got[k], chained_gradients[k])) << "parameter " << k;
  }

  PerParameter want = to_doubles(g1), tolerance = per_sample_magnitude(
      config, data.features, data.labels, kBatch, first_context);
  const auto g2_values = to_doubles(g2);
  const double bound = 2 * testing::gamma(2 * kBatch + 1, DType::f32);
  for (std::size_t k = 0; k < want.size(); ++k) {
    for (std::size_t e = 0; e < want[k].size(); ++e) {
      want[k][e] += g2_values[k][e];
      tolerance[k][e] *= bound;
    }
  }
  expect_close(got, want, tolerance, model, "g1 + g2");
  // And the error is real: step 2's gradient is off by g1, far beyond the tolerance.
  const auto g1_values = to_doubles(g1);
  EXPECT_GT(max_abs(g1_values[0]), 1e3 * max_abs(tolerance[0]));
}

// No 1/N: micro-batch k's loss is its own mean, factor 1/m instead of 1/(N m). For N a
// power of two the two factors differ by an exact power of two, and every later operation
// of the backward (products, sums, LayerNorm's means) commutes exactly with such a scaling
// (no overflow or underflow at these magnitudes): the result is N * g bit for bit.
TEST(GradientAccumulationMistakes, NoOneOverNGivesExactlyNTimesTheGradient) {
  constexpr std::int64_t kBatch = 128;
  const ModelConfig config = small_config(2, 0.1f);
  const Dataset data = synthetic(kBatch);
  const ForwardContext context{true, 3, 0};
  for (const std::int64_t micro : {32, 16, 8}) {
    const std::int64_t count = kBatch / micro;
    Model model(config, Device::cpu());
    accumulation::memory_free_gradients(model, data.features, data.labels, micro, context);
    const auto g = accumulation::copy_gradients(model);
    accumulation::sum_of_micro_batch_means(model, data.features, data.labels, micro, context);
    const auto got = accumulation::copy_gradients(model);
    for (std::size_t k = 0; k < g.size(); ++k) {
      scale(g[k], static_cast<float>(count));  // exact: a power of two
      EXPECT_TRUE(testing::bitwise_equal(got[k], g[k])) << "N = " << count << ", parameter " << k;
    }
  }
}

// Per-micro-batch averaging on an uneven split, 1000 = 15 x 64 + 40 (N = 16): the naive
// accumulator weights micro-batch k by 1/(N n_k) instead of 1/B. Predicted: (1/N) sum_k g_k
// with g_k each micro-batch's own mean gradient, computed by the float64 oracle
// (model_oracle.hpp), not by the model. The accumulator's fp32 g_k is within
// gamma(P + n_k) (|g_k,i| + max_j |g_k,j|) of the exact one (P: the roundings along one
// sample's path, path_roundings; the bound and its magnitude as in test_model.cpp's
// MatchFloat64Oracle), its float sum of the N buffers adds gamma(N) relative, and the
// division by 16 is exact: by (1 + theta_a)(1 + theta_b) = 1 + theta_(a+b) (Higham,
// Lemma 3.3), within (1/N) sum_k gamma(P + n_k + N) (|g_k,i| + max_j |g_k,j|).
// Its error against the true gradient is predicted as sum_k (1/N - n_k/B) g_k: the last
// micro-batch, 40 samples, counts 1.5625 times too much (1/16 vs 40/1000), the others
// 0.977 times (1/16 vs 64/1000).
TEST(GradientAccumulationMistakes, PerMicroBatchAveragingWithAnUnevenSplitIsPredictablyWrong) {
  constexpr std::int64_t kBatch = 1000, kMicro = 64, kCount = 16;
  const ModelConfig config = small_config(1, 0.0f);
  const Dataset data = synthetic(kBatch);
  const ForwardContext context{true, 11, 0};
  ASSERT_EQ(accumulation::micro_batch_count(kBatch, kMicro), kCount);

  Model model(config, Device::cpu());
  const Oracle oracle(config, parameter_values(model));
  const auto names = model.parameters();
  PerParameter predicted, tolerance, predicted_error;
  for (const auto& p : names) {
    predicted.emplace_back(p.grad.numel(), 0.0);
    tolerance.emplace_back(p.grad.numel(), 0.0);
    predicted_error.emplace_back(p.grad.numel(), 0.0);
  }
  for (std::int64_t begin = 0; begin < kBatch; begin += kMicro) {
    const std::int64_t end = std::min(kBatch, begin + kMicro), rows = end - begin;
    ForwardContext micro_context = context;
    micro_context.first_row = context.first_row + begin;
    Gradients gk;
    oracle.loss(oracle_rows(data, begin, end, micro_context), &gk);
    const double wrong_weight = 1.0 / kCount, right_weight = static_cast<double>(rows) / kBatch;
    const double g = testing::gamma(path_roundings(config) + rows + kCount, DType::f32);
    for (std::size_t k = 0; k < names.size(); ++k) {
      const auto& values = gk.at(names[k].name);
      const double largest = max_abs(values);
      for (std::size_t e = 0; e < values.size(); ++e) {
        predicted[k][e] += wrong_weight * values[e];
        tolerance[k][e] += wrong_weight * g * (std::abs(values[e]) + largest);
        predicted_error[k][e] += (wrong_weight - right_weight) * values[e];
      }
    }
  }
  accumulation::NaiveAccumulator(model).gradients(model, data.features, data.labels, kMicro, context);
  const auto got = accumulation::copy_gradients(model);
  expect_close(got, predicted, tolerance, model, "(1/N) sum_k g_k, g_k from the oracle");

  // Against the true gradient (memory-free, global count 1000): the error is the predicted
  // one. predicted_error is exact (up to float64 rounding) since it comes from the oracle's
  // g_k, so the measured error got - truth differs from it by got's error (the tolerance
  // above) plus truth's: B per-sample terms, each carrying its own path's rounding, summed
  // in order: within gamma(P + B) times the per-sample magnitude (sum_i |term_i|, the
  // stand-in for the magnitude of the absolute-value computation, as in test_model.cpp).
  accumulation::memory_free_gradients(model, data.features, data.labels, kMicro, context);
  const auto truth = to_doubles(accumulation::copy_gradients(model));
  const PerParameter per_sample =
      per_sample_magnitude(config, data.features, data.labels, kBatch, context);
  const auto got_values = to_doubles(got);
  const double bound = testing::gamma(path_roundings(config) + kBatch, DType::f32);
  for (std::size_t k = 0; k < got_values.size(); ++k) {
    std::vector<double> measured_error(got_values[k].size());
    for (std::size_t e = 0; e < measured_error.size(); ++e) {
      measured_error[e] = got_values[k][e] - truth[k][e];
    }
    EXPECT_TRUE(testing::all_close(measured_error, predicted_error[k], [&](std::size_t e) {
      return tolerance[k][e] + bound * per_sample[k][e];
    })) << names[k].name << ": the error of per-micro-batch averaging";
  }
  // The error is far above rounding: of the order of a percent of the gradient.
  EXPECT_GT(max_abs(predicted_error[0]), 1e-3 * max_abs(truth[0]));
}

/// The parameters of a model as doubles, flattened.
std::vector<double> flat_parameters(const Model& model) {
  std::vector<double> values;
  for (const auto& p : model.parameters()) {
    const auto v = testing::to_doubles(p.value);
    values.insert(values.end(), v.begin(), v.end());
  }
  return values;
}

// An optimizer step after every micro-batch: N steps of batch B/N, not the step on B.
//
// Against the float64 oracle: N plain SGD steps (no momentum, no weight decay), step k
// w -= lr g_k(w) with g_k micro-batch k's mean-loss gradient (dropout on, keyed by the
// global row), all in double. Per step, the fp32 gradient is within
// gamma(P + m) (|g_k,i| + max_j |g_k,j|) of the exact one at the fp32 parameters
// (test_model.cpp's MatchFloat64Oracle bound and its magnitude, m = B/N rows), and the
// update w - float(lr) * g rounds three times (lr to float, the product, the difference):
// 3u (|w_i| + lr |g_k,i|). These add up over the N steps. A parameter error delta left
// by step k also changes the later gradients by H delta: the errors grow by at most
// (1 + lr ||H||)^N, which we take to be at most 2 (N = 8, lr = 1e-3: ||H|| <= 86). That
// factor is an assumption about the loss surface, not derived. Measured: largest
// error / tolerance 0.074 (printed).
//
// With equal micro-batches sum_k g_k(theta_0) = N g(theta_0), so to first order in lr the
// N small steps move the parameters N times as far as the one big step (the learning rate
// silently multiplied by N). The update norm ratio checked against N within 5% is
// empirical: the second-order part, lr^2 sum_{j<k} H_k g_j, is not bounded a priori;
// measured ratio 7.88 (printed), 1.5% from N = 8, a third of the 5% allowed.
TEST(GradientAccumulationMistakes, SteppingEveryMicroBatchIsNSmallStepsNotOneBigOne) {
  constexpr std::int64_t kBatch = 128, kMicro = 16, kCount = kBatch / kMicro;
  const ModelConfig config = small_config(2, 0.1f);
  const Dataset data = synthetic(kBatch);
  const ForwardContext context{true, 4, 0};
  SgdOptions sgd;
  sgd.lr = 1e-3;

  Model wrong(config, Device::cpu());
  const auto initial = flat_parameters(wrong);
  nn::Optimizer wrong_optimizer(wrong.parameters(), sgd);
  accumulation::step_every_micro_batch(wrong, wrong_optimizer, data.features, data.labels, kMicro,
                                       context);
  EXPECT_EQ(wrong_optimizer.steps_taken(), kCount);

  // The same N steps in float64, and the tolerance above, per element.
  Oracle oracle(config, parameter_values(Model(config, Device::cpu())));
  const auto names = wrong.parameters();
  const double u = testing::unit_roundoff(DType::f32);
  std::vector<double> tolerance(initial.size(), 0.0);
  for (std::int64_t begin = 0; begin < kBatch; begin += kMicro) {
    ForwardContext step_context = context;
    step_context.first_row = context.first_row + begin;
    Gradients g;
    oracle.loss(oracle_rows(data, begin, begin + kMicro, step_context), &g);
    const double gradient_bound = testing::gamma(path_roundings(config) + kMicro, DType::f32);
    std::size_t offset = 0;
    for (const auto& p : names) {
      auto& w = oracle.parameters().at(p.name);
      const auto& gk = g.at(p.name);
      const double largest = max_abs(gk);
      for (std::size_t e = 0; e < w.size(); ++e) {
        w[e] -= sgd.lr * gk[e];
        tolerance[offset + e] += 2 * (sgd.lr * gradient_bound * (std::abs(gk[e]) + largest) +
                                      3 * u * (std::abs(w[e]) + sgd.lr * std::abs(gk[e])));
      }
      offset += w.size();
    }
  }
  std::vector<double> want;
  for (const auto& p : names) {
    const auto& w = oracle.parameters().at(p.name);
    want.insert(want.end(), w.begin(), w.end());
  }
  const auto after_wrong = flat_parameters(wrong);
  EXPECT_TRUE(testing::all_close(after_wrong, want, [&](std::size_t i) { return tolerance[i]; }))
      << "N steps of SGD on the micro-batches, against the same steps in float64";
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(after_wrong[i] - want[i]) / tolerance[i]);
  }
  std::printf("N small steps against float64: largest error / tolerance %.3f\n", worst);

  // The one big step, for the ratio of update norms.
  Model right(config, Device::cpu());
  nn::Optimizer right_optimizer(right.parameters(), sgd);
  accumulation::memory_free_gradients(right, data.features, data.labels, kMicro, context);
  right_optimizer.step();
  const auto after_right = flat_parameters(right);
  double wrong_norm = 0, right_norm = 0;
  for (std::size_t i = 0; i < initial.size(); ++i) {
    wrong_norm += (after_wrong[i] - initial[i]) * (after_wrong[i] - initial[i]);
    right_norm += (after_right[i] - initial[i]) * (after_right[i] - initial[i]);
  }
  const double ratio = std::sqrt(wrong_norm / right_norm);
  std::printf("update norm ratio, N small steps / one big step: %.4f (N = %lld)\n", ratio,
              static_cast<long long>(kCount));
  EXPECT_NEAR(ratio, static_cast<double>(kCount), 0.05 * kCount) << "update norm ratio";
}

}  // namespace
}  // namespace bigbatch

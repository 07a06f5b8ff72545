// test_model.cpp: the residual MLP (nn/): gradients against a float64 oracle of the
// whole model (itself checked by finite differences), the equivalence of gradient
// accumulation with one big batch (bit for bit, on the CPU, with LayerNorm; not with
// BatchNorm), parameter names and shapes, and safetensors round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "nn/model.hpp"
#include "nn/training.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/dropout.hpp"
#include "tests/dropout_sites.hpp"
#include "tests/finite_difference.hpp"
#include "tests/harness.hpp"
#include "tests/model_oracle.hpp"
#include "tests/temp_files.hpp"

namespace bigbatch {
namespace {

using nn::Activation;
using nn::ForwardContext;
using nn::Model;
using nn::ModelConfig;
using nn::Norm;
using testing::bitwise_equal;

using testing::Gradients;
using testing::Oracle;
using testing::OracleBatch;

// ---- helpers -----------------------------------------------------------------------

struct Batch {
  Tensor x;       // [rows, D] f32, MemoryCategory::data
  Tensor labels;  // [rows] i32
};

Batch make_batch(const ModelConfig& config, std::int64_t rows, std::uint64_t seed,
                 Device device = Device::cpu()) {
  const auto x = testing::random_values(rows * config.inputs, seed, -2.0, 2.0);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    labels[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(random_bits(seed, 1, i) % config.classes);
  }
  return {testing::make_tensor(x, {rows, config.inputs}, DType::f32, device, MemoryCategory::data),
          Tensor::from_vector(labels, {rows}, device, MemoryCategory::data)};
}

OracleBatch oracle_batch(const Batch& batch, const ForwardContext& context) {
  OracleBatch result{testing::to_doubles(batch.x), {}, batch.x.dim(0), context};
  for (const double label : testing::to_doubles(batch.labels)) {
    result.labels.push_back(static_cast<int>(label));
  }
  return result;
}

Gradients parameter_values(const Model& model) {
  Gradients values;
  for (const auto& p : model.parameters()) values[p.name] = testing::to_doubles(p.value);
  return values;
}

/// The model's gradients of one batch, accumulated in micro-batches of `micro_batch`.
std::vector<Tensor> accumulated_gradients(const ModelConfig& config, const Batch& batch,
                                          std::int64_t micro_batch, const ForwardContext& context,
                                          Device device = Device::cpu()) {
  Model model(config, device);
  model.zero_grad();
  nn::accumulate_gradients(model, batch.x, batch.labels, micro_batch, context);
  std::vector<Tensor> grads;
  for (const auto& p : model.parameters()) grads.push_back(p.grad.clone());
  return grads;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (const double e : v) m = std::max(m, std::abs(e));
  return m;
}

ModelConfig tiny_config(std::int64_t depth, float dropout, Activation act = Activation::gelu) {
  return {.inputs = 5, .hidden = 6, .expansion = 2, .classes = 3, .depth = depth,
          .dropout = dropout, .activation = act, .seed = 42};
}

// ---- 1. gradients against the float64 oracle ---------------------------------------

// The oracle's own backward against Richardson-extrapolated central differences of its
// loss, for every parameter element. The loss is O(1) and computed with a few hundred
// double operations, so each evaluation is within 1e-13 of the exact value; h = 2^-10
// makes the rounding part of the error 1.5e-13 / h = 1.5e-10, and the truncation part
// h^4/30 |f^(5)| stays below 1e-10 for |f^(5)| <= 3e3. That bound on the fifth derivative
// is an ASSUMPTION (these are smooth compositions of O(1) weights and tanh), not derived;
// the test checks it by an estimate: R(h) - R(2h) = (h^4/2) f^(5) + O(h^6), so with a
// larger step h' = 2^-6 (rounding noise ~1e-11 / (h'^4/2) ~ 3e-4) each element's fifth
// derivative is estimated as 2 (R(h') - R(2h')) / h'^4, and the largest estimate must stay
// below the assumed 3e3. Measured (printed): largest |f^(5)| estimate 634 (depth 0) and
// 300 (depth 2), a margin of 4.7x; largest |analytic - R| / tolerance 0.083 and 0.039.
// GELU only: ReLU's kink would make a difference quotient lie.
TEST(ModelOracle, BackwardMatchesFiniteDifferencesOfItsLoss) {
  for (const std::int64_t depth : {0, 2}) {
    const ModelConfig config = tiny_config(depth, depth == 0 ? 0.0f : 0.25f);
    const Model model(config, Device::cpu());
    const ForwardContext context{true, 7, 3};
    const OracleBatch batch = oracle_batch(make_batch(config, 7, 11), context);
    Oracle oracle(config, parameter_values(model));
    Gradients analytic;
    oracle.loss(batch, &analytic);
    constexpr double kFifthDerivativeBound = 3e3;
    const double h = 0x1p-10, h_estimate = 0x1p-6;
    const double tolerance = testing::richardson_error(h, 1e-13, kFifthDerivativeBound);
    std::int64_t checked = 0;
    double largest_fifth = 0, worst_ratio = 0;
    for (auto& [name, values] : oracle.parameters()) {
      for (std::size_t k = 0; k < values.size(); ++k) {
        const auto loss = [&] { return oracle.loss(batch); };
        const double numeric = testing::richardson_derivative(loss, values[k], h);
        ASSERT_NEAR(analytic[name][k], numeric, tolerance) << name << "[" << k << "], depth " << depth;
        worst_ratio = std::max(worst_ratio, std::abs(analytic[name][k] - numeric) / tolerance);
        const double fifth = 2 *
                             (testing::richardson_derivative(loss, values[k], h_estimate) -
                              testing::richardson_derivative(loss, values[k], 2 * h_estimate)) /
                             std::pow(h_estimate, 4);
        largest_fifth = std::max(largest_fifth, std::abs(fifth));
        ++checked;
      }
    }
    EXPECT_EQ(checked, model.parameter_count());
    EXPECT_LE(largest_fifth, kFifthDerivativeBound) << "depth " << depth;
    std::printf("oracle, depth %lld: largest |f^(5)| estimate %.3g (assumed <= %.0f), largest "
                "|analytic - numeric| / tolerance %.3f\n",
                static_cast<long long>(depth), largest_fifth, kFifthDerivativeBound, worst_ratio);
  }
}

class ModelGradients : public testing::DeviceTest {};

/// The number of rounded fp32 operations on one gradient element's path (see below).
std::int64_t rounding_path_length(const ModelConfig& config, std::int64_t batch) {
  const std::int64_t D = config.inputs, H = config.hidden, E = config.expansion * H,
                     C = config.classes;
  return 2 * ((D + 12) + config.depth * ((3 * H + 5) + (H + 1) + 12 + 1 + (E + 1) + 1) +
              (3 * H + 5 + H + 1) + (2 * C + 5)) + batch;
}

// The fp32 model against the oracle. Every gradient element is the result of a chain of
// rounded fp32 operations: the forward path from the input to the loss and back, each
// step a dot product or reduction of length at most the widths below, then the sum over
// the batch. Counting one rounding per term, a path has at most
//   n = 2 * (stem (D + 12) + depth * (LN 3H + 5, fc1 H + 1, act 12, dropout 1, fc2 E*H + 1,
//            residual 1) + head (3H + 5 + H + 1) + loss (2C + 5)) + batch
// roundings (x2: the backward retraces the forward; act 12 covers tanh's formula). The
// first-order error bound of such a computation is gamma(n) times the same computation in
// absolute values (Higham, ch. 3). That magnitude is NOT computed here: we stand in for it
// by |g| plus the largest |g| of the same tensor, on the heuristic that a gradient element
// near 0 is a cancellation of terms the size of its neighbours. So the path length and
// gamma(n) are derived, the magnitude is a heuristic, and the bound is not a proof: an
// element whose absolute-value computation is far larger than its tensor's largest
// gradient could exceed it without a bug. Measured (printed, CPU): the largest error is
// 0.010 to 0.022 of this tolerance over the four cases (depth 0 and 2, GELU and ReLU).
TEST_P(ModelGradients, MatchFloat64Oracle) {
  for (const std::int64_t depth : {0, 2}) {
    for (const Activation act : {Activation::gelu, Activation::relu}) {
      const ModelConfig config = tiny_config(depth, depth == 0 ? 0.0f : 0.25f, act);
      Model model(config, device());
      const ForwardContext context{true, 7, 3};
      const Batch batch = make_batch(config, 7, 11, device());
      model.zero_grad();
      const float loss = nn::accumulate_gradients(model, batch.x, batch.labels, 7, context);

      Oracle oracle(config, parameter_values(model));
      Gradients want;
      const double want_loss = oracle.loss(oracle_batch(batch, context), &want);
      const double g = testing::gamma(rounding_path_length(config, 7), DType::f32);
      EXPECT_NEAR(loss, want_loss, g * std::abs(want_loss));
      double worst_ratio = 0;
      for (const auto& p : model.parameters()) {
        const auto& w = want.at(p.name);
        const double scale = max_abs(w);
        EXPECT_GT(scale, 0) << p.name << " has an all-zero gradient: the test would be vacuous";
        const auto got = testing::to_doubles(p.grad);
        const auto tolerance = [&](std::size_t i) { return g * (std::abs(w[i]) + scale); };
        EXPECT_TRUE(testing::all_close(got, w, tolerance))
            << p.name << ", depth " << depth << ", " << nn::activation_name(act);
        for (std::size_t i = 0; i < w.size(); ++i) {
          worst_ratio = std::max(worst_ratio, std::abs(got[i] - w[i]) / tolerance(i));
        }
      }
      std::printf("%s, depth %lld, %s: largest gradient error / tolerance %.4f\n",
                  device().name().c_str(), static_cast<long long>(depth),
                  nn::activation_name(act).c_str(), worst_ratio);
    }
  }
}

// Accumulated micro-batches against the whole batch on every backend. On the CPU the
// kernels keep the reduction order, so the gradients are equal bit for bit (the tests
// below prove it at larger sizes). cuBLAS promises no order: there each result is within
// the bound of MatchFloat64Oracle of the exact gradient, so by the triangle inequality the
// two are within twice that bound of each other, which is what is checked.
TEST_P(ModelGradients, MicroBatchesMatchTheBatchWithinRounding) {
  for (const std::int64_t depth : {0, 2}) {
    const ModelConfig config = tiny_config(depth, depth == 0 ? 0.0f : 0.25f);
    const ForwardContext context{true, 7, 3};
    const Batch batch = make_batch(config, 7, 11, device());
    const auto whole = accumulated_gradients(config, batch, 7, context, device());
    Oracle oracle(config, parameter_values(Model(config, device())));
    Gradients exact;
    oracle.loss(oracle_batch(batch, context), &exact);
    const double g = testing::gamma(rounding_path_length(config, 7), DType::f32);
    const auto names = Model(config, Device::cpu()).parameters();
    for (const std::int64_t micro_batch : {1, 3}) {
      const auto micro = accumulated_gradients(config, batch, micro_batch, context, device());
      for (std::size_t k = 0; k < names.size(); ++k) {
        const auto& w = exact.at(names[k].name);
        const double scale = max_abs(w);
        if (device().is_cpu()) {
          EXPECT_TRUE(bitwise_equal(micro[k], whole[k])) << names[k].name << ", micro-batch " << micro_batch;
        }
        EXPECT_TRUE(testing::all_close(testing::to_doubles(micro[k]), testing::to_doubles(whole[k]),
                                       [&](std::size_t i) { return 2 * g * (std::abs(w[i]) + scale); }))
            << names[k].name << ", depth " << depth << ", micro-batch " << micro_batch;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelGradients, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- 2. the equivalence: micro-batches give the big batch's gradients, bit for bit ----

ModelConfig equivalence_config(std::int64_t depth, float dropout, Norm norm = Norm::layer) {
  return {.inputs = 12, .hidden = 16, .expansion = 4, .classes = 5, .depth = depth,
          .dropout = dropout, .norm = norm, .seed = 2024};
}

void expect_same_gradients(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                           const Model& names, const std::string& what) {
  const auto parameters = names.parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    EXPECT_TRUE(bitwise_equal(got[k], want[k])) << parameters[k].name << ": " << what;
  }
}

TEST(GradientAccumulation, MicroBatchesGiveTheBatchGradientsBitForBit) {
  constexpr std::int64_t kBatch = 128;
  for (const std::int64_t depth : {0, 4}) {
    for (const float dropout : {0.0f, 0.1f}) {
      const ModelConfig config = equivalence_config(depth, dropout);
      const Batch batch = make_batch(config, kBatch, 5);
      const ForwardContext context{true, 99, 1000};
      const std::vector<Tensor> whole = accumulated_gradients(config, batch, kBatch, context);
      const Model names(config, Device::cpu());
      for (const std::int64_t micro : {1, 7, 64}) {
        expect_same_gradients(accumulated_gradients(config, batch, micro, context), whole, names,
                              "depth " + std::to_string(depth) + ", dropout " +
                                  std::to_string(dropout) + ", micro-batch " + std::to_string(micro));
      }
      if (dropout > 0 && depth > 0) {
        // Dropout is really on: without it the gradients differ.
        const auto undropped = accumulated_gradients(equivalence_config(depth, 0.0f), batch,
                                                     kBatch, context);
        EXPECT_FALSE(bitwise_equal(undropped[0], whole[0]));
      }
    }
  }
}

TEST(GradientAccumulation, UnevenLastMicroBatch) {
  // 1000 = 15 x 64 + 40: the last micro-batch is shorter and still weighs 40/1000. At
  // depth 0 without dropout, and at depth 4 with dropout, whose masks the short last
  // micro-batch must draw for its own global rows 960..999.
  for (const auto& [depth, dropout] : {std::pair{std::int64_t{0}, 0.0f}, std::pair{std::int64_t{4}, 0.1f}}) {
    const ModelConfig config = equivalence_config(depth, dropout);
    const Batch batch = make_batch(config, 1000, 8);
    const ForwardContext context{true, 1, 0};
    const Model names(config, Device::cpu());
    const auto whole = accumulated_gradients(config, batch, 1000, context);
    const std::string what = "1000 as 15 x 64 + 40, depth " + std::to_string(depth);
    expect_same_gradients(accumulated_gradients(config, batch, 64, context), whole, names, what);
    if (dropout > 0) {
      // Dropout is really on: without it the gradients differ.
      const auto undropped = accumulated_gradients(equivalence_config(depth, 0.0f), batch, 1000, context);
      EXPECT_FALSE(bitwise_equal(undropped[0], whole[0])) << what;
    }
  }
}

// Each residual block's dropout draws from a stream of its own (tests/dropout_sites.hpp):
// the blocks' hidden tensors have one shape, so two blocks on one stream would drop the same
// elements of each.
TEST(ModelDropout, EveryBlockOfAStepDrawsFromAStreamOfItsOwn) {
  const ModelConfig config = equivalence_config(4, 0.1f);
  Model model(config, Device::cpu());
  const Batch batch = make_batch(config, 8, 9);
  std::vector<DropoutSpec> drawn;
  ForwardContext context;
  context.dropout_seed = 23;
  context.first_row = 40;
  context.drawn_dropouts = &drawn;
  const Tensor logits = model.forward(batch.x, context);
  model.backward(Tensor::zeros(logits.shape(), DType::f32));
  testing::expect_independent_dropout_sites(drawn, static_cast<std::size_t>(config.depth),
                                            config.dropout, 23, 40);
}

// Above the CPU GEMM's parallel threshold (kParallelMinFlops = 2^22 flops in
// kernels/gemm.cpp: a product of 2 M N K >= 2^22 flops is cut into one block per thread).
// With D = H = 64, E = 4 (E H = 256) and a batch of 512, every GEMM of the forward and
// backward is 2 * 512 * 64 * 64 = 2^22 (the stem) or 2 * 512 * 256 * 64 = 2^24 flops:
// the multi-threaded path. Micro-batches of 32 run every GEMM below the threshold, on one
// thread; micro-batches of 200 (512 = 2 x 200 + 112) run the first two micro-batches'
// fc1 and fc2 GEMMs threaded (2 * 200 * 256 * 64 = 6.6e6 flops) and the rest on one
// thread. All must give the whole batch's bits. The thread count is set
// to 4 for the test (restored after), so the threaded path runs on any machine with
// OpenMP, whatever its core count.
TEST(GradientAccumulation, AboveTheGemmParallelThresholdBitForBit) {
#if defined(_OPENMP)
  constexpr std::int64_t kBatch = 512, kParallelMinFlops = std::int64_t{1} << 22;
  const ModelConfig config = {.inputs = 64, .hidden = 64, .expansion = 4, .classes = 10,
                              .depth = 2, .dropout = 0.1f, .seed = 31};
  const std::int64_t H = config.hidden, E = config.expansion * config.hidden;
  ASSERT_GE(2 * kBatch * config.inputs * H, kParallelMinFlops);
  ASSERT_GE(2 * kBatch * E * H, kParallelMinFlops);
  ASSERT_GE(2 * 200 * E * H, kParallelMinFlops);
  ASSERT_LT(2 * 112 * E * H, kParallelMinFlops);
  ASSERT_LT(2 * 32 * E * H, kParallelMinFlops);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(4);
  const Batch batch = make_batch(config, kBatch, 17);
  const ForwardContext context{true, 5, 64};
  const Model names(config, Device::cpu());
  const auto whole = accumulated_gradients(config, batch, kBatch, context);
  for (const std::int64_t micro : {32, 200}) {
    expect_same_gradients(accumulated_gradients(config, batch, micro, context), whole, names,
                          "batch 512 in micro-batches of " + std::to_string(micro));
  }
  omp_set_num_threads(saved);
#else
  GTEST_SKIP() << "built without OpenMP: the GEMM has no multi-threaded path";
#endif
}

TEST(GradientAccumulation, BatchNormBreaksTheEquivalence) {
  // BatchNorm normalises each micro-batch with its own statistics: the gradients differ in
  // value, not only in rounding. The same model with LayerNorm stays bit for bit.
  constexpr std::int64_t kBatch = 128;
  const ForwardContext context{true, 3, 0};
  for (const Norm norm : {Norm::batch, Norm::layer}) {
    const ModelConfig config = equivalence_config(2, 0.0f, norm);
    const Batch batch = make_batch(config, kBatch, 21);
    const auto whole = accumulated_gradients(config, batch, kBatch, context);
    const auto micro = accumulated_gradients(config, batch, 8, context);
    double largest_relative = 0;
    for (std::size_t k = 0; k < whole.size(); ++k) {
      const auto a = testing::to_doubles(micro[k]), b = testing::to_doubles(whole[k]);
      for (std::size_t i = 0; i < a.size(); ++i) {
        largest_relative = std::max(largest_relative, std::abs(a[i] - b[i]) / max_abs(b));
      }
    }
    if (norm == Norm::batch) {
      // Far beyond rounding (2^-24 ~ 6e-8): the statistics of 8 samples are not those of 128.
      EXPECT_GT(largest_relative, 1e-3) << "BatchNorm: micro-batches of 8 vs a batch of 128";
      std::printf("BatchNorm, micro-batches of 8 vs one batch of 128: largest gradient "
                  "difference %.3g of the tensor's largest element\n", largest_relative);
    } else {
      EXPECT_EQ(largest_relative, 0) << "LayerNorm";
    }
  }
}

/// The parameters after `steps` steps of `options`, each step one batch of `batch_size`
/// fresh samples accumulated in micro-batches of `micro_batch`.
std::vector<Tensor> train(const ModelConfig& config, const nn::Optimizer::Options& options,
                          std::int64_t steps, std::int64_t batch_size, std::int64_t micro_batch) {
  Model model(config, Device::cpu());
  nn::Optimizer optimizer(model.parameters(), options);
  for (std::int64_t step = 0; step < steps; ++step) {
    const Batch batch = make_batch(config, batch_size, 1000 + static_cast<std::uint64_t>(step));
    model.zero_grad();
    nn::accumulate_gradients(model, batch.x, batch.labels, micro_batch,
                             ForwardContext{true, 77, step * batch_size});
    optimizer.step();
  }
  EXPECT_EQ(optimizer.steps_taken(), steps);
  std::vector<Tensor> values;
  for (const auto& p : model.parameters()) values.push_back(p.value.clone());
  return values;
}

TEST(GradientAccumulation, FiftyOptimizerStepsGiveTheSameParameters) {
  constexpr std::int64_t kSteps = 50, kBatch = 128;
  SgdOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-4;
  AdamWOptions adamw;
  adamw.lr = 3e-3;
  const ModelConfig config = equivalence_config(4, 0.1f);
  const Model initial(config, Device::cpu());
  for (const nn::Optimizer::Options& options : {nn::Optimizer::Options(sgd), nn::Optimizer::Options(adamw)}) {
    const std::string name = std::holds_alternative<SgdOptions>(options) ? "SGD" : "AdamW";
    const auto big = train(config, options, kSteps, kBatch, kBatch);
    const auto micro = train(config, options, kSteps, kBatch, 7);
    const auto parameters = initial.parameters();
    for (std::size_t k = 0; k < big.size(); ++k) {
      EXPECT_TRUE(bitwise_equal(micro[k], big[k])) << name << ": " << parameters[k].name;
    }
    EXPECT_FALSE(bitwise_equal(big[0], parameters[0].value)) << name << " did not train";
  }
}

// ---- 3. names, shapes, initialisation, files ----------------------------------------

TEST(ModelParameters, NamesAndShapesAreThoseOfThePyTorchModule) {
  ModelConfig config = equivalence_config(2, 0.0f);  // D 12, H 16, E 4, C 5
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"stem.weight", {16, 12}},        {"stem.bias", {16}},
      {"blocks.0.ln.weight", {16}},     {"blocks.0.ln.bias", {16}},
      {"blocks.0.fc1.weight", {64, 16}}, {"blocks.0.fc1.bias", {64}},
      {"blocks.0.fc2.weight", {16, 64}}, {"blocks.0.fc2.bias", {16}},
      {"blocks.1.ln.weight", {16}},     {"blocks.1.ln.bias", {16}},
      {"blocks.1.fc1.weight", {64, 16}}, {"blocks.1.fc1.bias", {64}},
      {"blocks.1.fc2.weight", {16, 64}}, {"blocks.1.fc2.bias", {16}},
      {"head.weight", {5, 16}},         {"head.bias", {5}},
      {"head.ln.weight", {16}},         {"head.ln.bias", {16}},
  };
  const Model model(config, Device::cpu());
  const auto parameters = model.parameters();
  ASSERT_EQ(parameters.size(), expected.size());
  std::int64_t count = 0;
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(parameters[k].name, expected[k].first);
    EXPECT_EQ(parameters[k].value.shape(), expected[k].second) << expected[k].first;
    EXPECT_EQ(parameters[k].grad.shape(), expected[k].second) << expected[k].first;
    EXPECT_EQ(parameters[k].value.category(), MemoryCategory::parameters);
    EXPECT_EQ(parameters[k].grad.category(), MemoryCategory::gradients);
    count += shape_numel(expected[k].second);
  }
  EXPECT_EQ(model.parameter_count(), count);

  // BatchNorm adds its running statistics to the state_dict, after the norm's parameters.
  config.norm = Norm::batch;
  const Model with_batchnorm(config, Device::cpu());
  EXPECT_EQ(with_batchnorm.parameters().size(), expected.size());
  const auto state = with_batchnorm.state_dict();
  ASSERT_EQ(state.size(), expected.size() + 6);
  EXPECT_EQ(state[4].first, "blocks.0.ln.running_mean");
  EXPECT_EQ(state[5].first, "blocks.0.ln.running_var");
  EXPECT_EQ(state.back().first, "head.ln.running_var");
}

TEST(ModelParameters, InitialisationIsPyTorchsDefaultAndDeterministic) {
  ModelConfig config = equivalence_config(1, 0.0f);
  const Model a(config, Device::cpu()), b(config, Device::cpu());
  config.seed += 1;
  const Model other(config, Device::cpu());
  const auto pa = a.parameters(), pb = b.parameters(), po = other.parameters();
  for (std::size_t k = 0; k < pa.size(); ++k) {
    EXPECT_TRUE(bitwise_equal(pa[k].value, pb[k].value)) << pa[k].name;
    const auto values = testing::to_doubles(pa[k].value);
    if (pa[k].name.find("ln.") != std::string::npos) {
      const double want = pa[k].name.ends_with("weight") ? 1.0 : 0.0;
      for (const double v : values) EXPECT_EQ(v, want) << pa[k].name;
      continue;
    }
    EXPECT_FALSE(bitwise_equal(pa[k].value, po[k].value)) << pa[k].name << " ignores the seed";
    const std::int64_t fan_in = pa[k].name.find("fc2.") != std::string::npos ? 64
                                : pa[k].name.starts_with("stem.")           ? 12
                                                                            : 16;
    const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
    EXPECT_LE(max_abs(values), bound) << pa[k].name;
    EXPECT_GT(max_abs(values), 0.5 * bound) << pa[k].name;  // spread over the range
  }
}

TEST(ModelFiles, SaveAndLoadRoundTripBitForBit) {
  ModelConfig config = equivalence_config(2, 0.0f, Norm::batch);
  Model trained(config, Device::cpu());
  // A forward in training moves the running statistics away from 0 and 1.
  trained.forward(make_batch(config, 16, 4).x, ForwardContext{});
  testing::TemporaryPath path("model.safetensors");
  trained.save(path.str());

  config.seed += 1;
  Model loaded(config, Device::cpu());
  loaded.load(path.str());
  const auto want = trained.state_dict(), got = loaded.state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got[k].first, want[k].first);
    EXPECT_TRUE(bitwise_equal(got[k].second, want[k].second)) << want[k].first;
  }

  // A file of another architecture is refused, naming the tensor at fault.
  Model shallow(equivalence_config(0, 0.0f, Norm::batch), Device::cpu());
  EXPECT_TRUE(testing::mentions(testing::error_of([&] { shallow.load(path.str()); }),
                                {"blocks.0.", "not part of this model"}));
  Model deeper(equivalence_config(3, 0.0f, Norm::batch), Device::cpu());
  EXPECT_TRUE(testing::mentions(testing::error_of([&] { deeper.load(path.str()); }),
                                {"no tensor named blocks.2.ln.weight"}));
}

TEST(ModelMemory, ActivationsAreSavedByForwardAndReleasedByBackward) {
  const ModelConfig config = equivalence_config(3, 0.1f);
  Model model(config, Device::cpu());
  const Batch batch = make_batch(config, 32, 9);
  const auto& allocator = allocator_for(Device::cpu());
  const std::size_t before = allocator.stats().live_of(MemoryCategory::activations);
  const Tensor logits = model.forward(batch.x, ForwardContext{});
  ASSERT_EQ(model.saved_activations().blocks.size(), 3u);
  // Allocated per block: normed and the output [b, H], mean and rstd [b], pre-activation and
  // hidden [b, E*H] (its input is the previous output); outside the blocks: the stem's
  // pre-activation and h [b, H], the head's normed input [b, H], stats [b], the logits.
  const std::size_t b = 32, H = 16, E = 64, C = 5;
  const std::size_t per_block = 4 * (2 * b * H + 2 * b + 2 * b * E);
  const std::size_t outside = 4 * (2 * b * H + b * H + 2 * b + b * C);
  EXPECT_EQ(allocator.stats().live_of(MemoryCategory::activations) - before,
            3 * per_block + outside);
  const Tensor dlogits = Tensor::zeros(logits.shape(), DType::f32);
  model.backward(dlogits);
  EXPECT_FALSE(model.has_saved_activations());
  EXPECT_EQ(allocator.stats().live_of(MemoryCategory::activations) - before, 4 * b * C)
      << "only the logits, which the caller holds, stay";
  EXPECT_TRUE(testing::mentions(testing::error_of([&] { model.backward(dlogits); }),
                                {"no saved activations"}));
}

// Released gradients (ZeRO stage 2's way to hold none between backwards): their bytes go,
// parameters() shows them undefined, zero_grad leaves them so, and the next backward
// allocates each group again as zeros just before adding into it, so it computes the bits
// of a model whose gradients were zeroed. A group told final has been allocated.
TEST(ModelMemory, ReleasedGradientsComeBackAsZerosInTheNextBackward) {
  const ModelConfig config = equivalence_config(3, 0.1f);
  Model kept(config, Device::cpu()), released(config, Device::cpu());
  const Batch batch = make_batch(config, 32, 9);
  const auto& allocator = allocator_for(Device::cpu());
  const std::size_t before = allocator.stats().live_of(MemoryCategory::gradients);
  const std::size_t all = 4 * static_cast<std::size_t>(released.parameter_count());
  released.release_gradients(0, released.parameters().size());
  EXPECT_EQ(before - allocator.stats().live_of(MemoryCategory::gradients), all);
  for (const nn::NamedParameter& p : released.parameters()) EXPECT_FALSE(p.grad.defined()) << p.name;
  released.zero_grad();
  EXPECT_EQ(before - allocator.stats().live_of(MemoryCategory::gradients), all);

  const auto step = [&batch](Model& model) {
    const Tensor logits = model.forward(batch.x, ForwardContext{});
    Tensor dlogits(logits.shape(), DType::f32, Device::cpu(), MemoryCategory::workspace);
    cross_entropy_backward(logits, batch.labels, dlogits, 32.0f, 1.0f);
    model.backward(dlogits);
  };
  kept.zero_grad();
  step(kept);
  std::size_t told = 0;
  released.set_gradients_ready([&](std::size_t first, std::size_t end) {
    const std::vector<nn::NamedParameter> parameters = released.parameters();
    for (std::size_t i = first; i < end; ++i) EXPECT_TRUE(parameters[i].grad.defined());
    told += end - first;
  });
  step(released);
  released.set_gradients_ready({});
  EXPECT_EQ(told, released.parameters().size());
  const std::vector<nn::NamedParameter> want = kept.parameters(), got = released.parameters();
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].grad.to_vector<float>(), want[i].grad.to_vector<float>()) << want[i].name;
  }
  EXPECT_EQ(allocator.stats().live_of(MemoryCategory::gradients), before)
      << "every gradient is allocated again";
  EXPECT_TRUE(testing::mentions(testing::error_of([&] { released.release_gradients(2, 99); }),
                                {"release_gradients", "[2, 99)"}));
}

// Under mixed precision the forward and backward read only the 16-bit working copies, so a
// model whose f32 masters are released (ZeRO's ranks hold shards of them, chapter 07)
// computes the bits of one that keeps them, its gradients included when they were released
// too (allocated again in the parameters' shapes). Nothing reads the missing masters:
// state_dict refuses until they are allocated again.
TEST(ModelMemory, ReleasedMastersLeaveTheWorkingCopiesToTrainOn) {
  ModelConfig config = equivalence_config(3, 0.1f);
  config.precision = nn::Precision::fp16;
  Model kept(config, Device::cpu()), released(config, Device::cpu());
  const Batch batch = make_batch(config, 32, 9);
  const auto& allocator = allocator_for(Device::cpu());
  const std::size_t before = allocator.stats().live_of(MemoryCategory::master_weights);
  std::size_t masters = 0;
  for (const nn::NamedParameter& p : released.parameters()) {
    if (p.half.defined()) masters += p.value.nbytes();
  }
  ASSERT_GT(masters, 0u);
  const std::int64_t count = released.parameter_count();
  released.release_master_weights();
  released.release_gradients(0, released.parameters().size());
  EXPECT_FALSE(released.holds_master_weights());
  EXPECT_EQ(before - allocator.stats().live_of(MemoryCategory::master_weights), masters);
  for (const nn::NamedParameter& p : released.parameters()) {
    EXPECT_EQ(p.value.defined(), !p.half.defined()) << p.name;
  }
  EXPECT_EQ(released.parameter_count(), count);
  EXPECT_TRUE(testing::mentions(testing::error_of([&] { (void)released.state_dict(); }),
                                {"master weights are released"}));

  kept.zero_grad();
  for (Model* model : {&kept, &released}) {
    const Tensor logits = model->forward(batch.x, ForwardContext{});
    Tensor dlogits(logits.shape(), DType::f32, Device::cpu(), MemoryCategory::workspace);
    cross_entropy_backward(logits, batch.labels, dlogits, 32.0f, 1.0f);
    model->backward(dlogits);
  }
  const std::vector<nn::NamedParameter> want = kept.parameters(), got = released.parameters();
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].grad.shape(), want[i].shape()) << want[i].name;
    EXPECT_EQ(got[i].grad.to_vector<float>(), want[i].grad.to_vector<float>()) << want[i].name;
  }
  released.allocate_master_weights();
  EXPECT_TRUE(released.holds_master_weights());
  EXPECT_EQ(allocator.stats().live_of(MemoryCategory::master_weights), before);
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(released.parameters()[i].value.shape(), want[i].value.shape()) << want[i].name;
  }
  EXPECT_EQ(released.state_dict().size(), kept.state_dict().size());
}

}  // namespace
}  // namespace bigbatch

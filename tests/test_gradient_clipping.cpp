// test_gradient_clipping.cpp: clipping by the global norm at the optimizer boundary
// (chapters/04_dynamic_loss_scaling/gradient_clipping.hpp) and the fused pass under it
// (kernels/elementwise.hpp: unscale, check and squared norm in one pass):
// - the squared norm follows the stated float64 order to the bit, on both backends, and
//   lies within the summation bound of a float64 oracle;
// - clipping with micro-batches (1, 7: uneven) equals clipping the large batch, bit for bit;
// - the boundary's order: a power-of-two loss scale clips exactly as no scale (the norm is
//   the unscaled gradients'), and without a scaler a NaN loss stops the run
//   (test_trainer: an overflow neither clips nor steps nor advances the schedule);
// - the mistakes, measured against their predictions: clipping the running gradient after
//   every micro-batch, and clipping before unscaling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "chapters/04_dynamic_loss_scaling/gradient_clipping.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/dataset.hpp"
#include "kernels/elementwise.hpp"
#include "tests/harness.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

// ---- the fused pass's squared norm ------------------------------------------------------

/// The order kernels/elementwise.hpp states, written out independently of the kernels:
/// chunks of 4096, 256 lanes each summing every 256th element, the warp tree (every lane
/// i < d adding lane i + d at once, d = 16 .. 1) within each group of 32 lanes and then
/// over the 8 group sums padded to 32; the chunk sums combined the same way (lane c % 256
/// adds chunk sum c in order, then the same trees).
double stated_order_squared_norm(const std::vector<std::vector<float>>& tensors) {
  const auto tree = [](std::vector<double> lanes) {  // 32 values, by value: a copy per round
    for (int d = 16; d > 0; d /= 2) {
      const std::vector<double> before = lanes;
      for (int i = 0; i < d; ++i) lanes[static_cast<std::size_t>(i)] =
          before[static_cast<std::size_t>(i)] + before[static_cast<std::size_t>(i + d)];
    }
    return lanes[0];
  };
  const auto combine = [&](const std::vector<double>& lanes) {  // 256 lane sums
    std::vector<double> groups(32, 0.0);
    for (std::size_t w = 0; w < 8; ++w) {
      groups[w] = tree(std::vector<double>(lanes.begin() + static_cast<long>(32 * w),
                                           lanes.begin() + static_cast<long>(32 * w + 32)));
    }
    return tree(groups);
  };
  std::vector<double> chunk_sums;
  for (const std::vector<float>& t : tensors) {
    const std::size_t n = t.size();
    for (std::size_t begin = 0; begin < n; begin += 4096) {
      std::vector<double> lanes(256, 0.0);
      for (std::size_t i = begin; i < std::min(n, begin + 4096); ++i) {
        lanes[(i - begin) % 256] += static_cast<double>(t[i]) * static_cast<double>(t[i]);
      }
      chunk_sums.push_back(combine(lanes));
    }
  }
  std::vector<double> lanes(256, 0.0);
  for (std::size_t c = 0; c < chunk_sums.size(); ++c) lanes[c % 256] += chunk_sums[c];
  return combine(lanes);
}

class GlobalNorm : public testing::DeviceTest {
 protected:
  /// Sizes around the chunk (4096) and lane (256) boundaries, one of several chunks and
  /// one of a million, values of both signs over 2^-20 .. 2^8 in magnitude.
  std::vector<Tensor> gradients(std::uint64_t seed) const {
    std::vector<Tensor> tensors;
    for (const std::int64_t n : {1, 255, 257, 4096, 4097, 3 * 4096 + 300, (1 << 20) + 3}) {
      std::vector<double> values = testing::random_values(n, seed + static_cast<std::uint64_t>(n), -1.0, 1.0);
      const std::vector<double> exponents =
          testing::random_values(n, seed + 7 * static_cast<std::uint64_t>(n), -20.0, 8.0);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] *= std::exp2(std::floor(exponents[i]));
      tensors.push_back(testing::make_tensor(values, {n}, DType::f32, device()));
    }
    return tensors;
  }
  Tensor scalar(DType dtype) const {
    const Tensor t({1}, dtype, device());
    fill(t, 0.0);
    return t;
  }
};

TEST_P(GlobalNorm, FollowsTheStatedOrderToTheBitAndUnscalesAsThePlainPass) {
  const float inv_scale = 1.0f / 3.0f;  // not a power of two: every element is rounded
  const std::vector<Tensor> tensors = gradients(11);
  std::vector<Tensor> plain;
  for (const Tensor& t : tensors) plain.push_back(t.clone());
  const Tensor found_inf = scalar(DType::f32), squared_norm = scalar(DType::f64);
  unscale_and_check_finite(tensors, inv_scale, found_inf, squared_norm);
  const Tensor plain_flag = scalar(DType::f32);
  unscale_and_check_finite(plain, inv_scale, plain_flag);

  std::vector<std::vector<float>> unscaled;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    ASSERT_TRUE(testing::bitwise_equal(tensors[k], plain[k])) << "tensor " << k;
    unscaled.push_back(tensors[k].to_vector<float>());
  }
  EXPECT_EQ(found_inf.to_vector<float>()[0], 0.0f);
  const double got = squared_norm.to_vector<double>()[0];
  const double want = stated_order_squared_norm(unscaled);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
      << "got " << got << ", the stated order gives " << want;
}

TEST_P(GlobalNorm, TheEightGroupSumsMeetInTheStatedTree) {
  // One chunk whose group sums are g0 = 1 (element 0 = 1), g2 = g6 = 2^-53 (two elements
  // of 2^-27 each, in lanes 64, 65 and 192, 193), the others 0. The stated tree adds
  // g2 + g6 = 2^-52 first, then 1 + 2^-52: exactly 1 + 2^-52. Any order that adds a lone
  // 2^-53 to 1 first (in sequence: 1 + 0 + 2^-53 ...) rounds to even and ends at 1.
  std::vector<double> values(4096, 0.0);
  values[0] = 1.0;
  for (const std::size_t i : {64u, 65u, 192u, 193u}) values[i] = 0x1p-27;
  const Tensor t = testing::make_tensor(values, {4096}, DType::f32, device());
  const Tensor found_inf = scalar(DType::f32), squared_norm = scalar(DType::f64);
  unscale_and_check_finite({t}, 1.0f, found_inf, squared_norm);
  EXPECT_EQ(squared_norm.to_vector<double>()[0], 1.0 + 0x1p-52);
  EXPECT_EQ(stated_order_squared_norm({t.to_vector<float>()}), 1.0 + 0x1p-52);
}

TEST_P(GlobalNorm, TheChunkSumsMeetInTheStatedTreeNotInSequence) {
  // Four chunks with sums c0 = 1, c1 = c3 = 2^-53 (two elements of 2^-27 each), c2 = 0. In
  // the stated order they sit in lanes 0..3, whose tree adds c1 + c3 = 2^-52 first, then
  // 1 + 2^-52: exactly 1 + 2^-52. Added in sequence, each lone 2^-53 rounds away against 1.
  std::vector<double> values(4 * 4096, 0.0);
  values[0] = 1.0;
  for (const std::size_t i : {4096u, 4097u, 3 * 4096u, 3 * 4096u + 1}) values[i] = 0x1p-27;
  const Tensor t = testing::make_tensor(values, {4 * 4096}, DType::f32, device());
  const Tensor found_inf = scalar(DType::f32), squared_norm = scalar(DType::f64);
  unscale_and_check_finite({t}, 1.0f, found_inf, squared_norm);
  EXPECT_EQ(squared_norm.to_vector<double>()[0], 1.0 + 0x1p-52);
  EXPECT_EQ(stated_order_squared_norm({t.to_vector<float>()}), 1.0 + 0x1p-52);
}

TEST_P(GlobalNorm, IsWithinTheSummationBoundOfAnExtendedPrecisionOracle) {
  const std::vector<Tensor> tensors = gradients(21);
  long double exact = 0;  // 64-bit significand: its own error is far below the bound
  std::int64_t n = 0;
  for (const Tensor& t : tensors) {
    for (const double v : testing::to_doubles(t)) exact += static_cast<long double>(v) * v;
    n += t.numel();
  }
  const Tensor found_inf = scalar(DType::f32), squared_norm = scalar(DType::f64);
  unscale_and_check_finite(tensors, 1.0f, found_inf, squared_norm);
  // Every term is an exact square (a float's square fits a double), all non-negative, so
  // any order of n - 1 float64 additions is within gamma(n - 1) of the sum (Higham,
  // Accuracy and Stability of Numerical Algorithms, 4.2).
  const double bound = testing::gamma(n - 1, DType::f64) * static_cast<double>(exact);
  EXPECT_LE(std::fabs(static_cast<double>(squared_norm.to_vector<double>()[0] - exact)), bound);
}

TEST_P(GlobalNorm, FlagsAnInfOrANanAndRefusesBadOutputs) {
  std::vector<Tensor> tensors = gradients(31);
  tensors[3].rows(5, 6).copy_from(
      testing::make_tensor({std::numeric_limits<double>::infinity()}, {1}, DType::f32, device()));
  const Tensor found_inf = scalar(DType::f32), squared_norm = scalar(DType::f64);
  unscale_and_check_finite(tensors, 0.5f, found_inf, squared_norm);
  EXPECT_EQ(found_inf.to_vector<float>()[0], 1.0f);
  EXPECT_TRUE(std::isinf(squared_norm.to_vector<double>()[0]));
  // A NaN, alone, in another tensor: flagged as well, and the norm is NaN.
  tensors[3].rows(5, 6).copy_from(testing::make_tensor({1.0}, {1}, DType::f32, device()));
  tensors[5].rows(0, 1).copy_from(
      testing::make_tensor({std::numeric_limits<double>::quiet_NaN()}, {1}, DType::f32, device()));
  const Tensor nan_flag = scalar(DType::f32);
  unscale_and_check_finite(tensors, 0.5f, nan_flag, squared_norm);
  EXPECT_EQ(nan_flag.to_vector<float>()[0], 1.0f);
  EXPECT_TRUE(std::isnan(squared_norm.to_vector<double>()[0]));

  EXPECT_THROW(unscale_and_check_finite(tensors, 1.0f, found_inf, scalar(DType::f32)),
               std::invalid_argument);
  const Tensor two({2}, DType::f64, device());
  EXPECT_THROW(unscale_and_check_finite(tensors, 1.0f, found_inf, two), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, GlobalNorm, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- the clip factor --------------------------------------------------------------------

TEST(ClipFactor, IsPyTorchsClampedCoefficientInFloat) {
  // clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1.
  EXPECT_EQ(clipping::clip_factor(4.0f, 1.0f), 1.0f / (4.0f + 1e-6f));
  EXPECT_EQ(clipping::clip_factor(0.5f, 1.0f), 1.0f);
  EXPECT_LT(clipping::clip_factor(1.0f, 1.0f), 1.0f) << "a norm equal to the limit is scaled "
                                                        "by 1 / (1 + 1e-6), as in PyTorch";
  EXPECT_EQ(clipping::clip_factor(0.0f, 1.0f), 1.0f);
  EXPECT_THROW(clipping::clip_factor(1.0f, 0.0f), std::invalid_argument);
}

// ---- through the trainer ----------------------------------------------------------------

using testing::tiny_data;
using testing::tiny_model;

struct ClippedRun {
  std::vector<std::vector<float>> parameters;
  std::vector<train::StepRecord> records;
};

/// 8 steps of batch 32 over 100 samples (short batches of 4 at each epoch's end), clipped
/// at max_norm, with the given micro-batch and loss scaling.
ClippedRun train_clipped(std::int64_t micro_batch, float max_norm,
                  train::LossScaling scaling = train::LossScaling::none, float scale = 1.0f) {
  const Dataset data = tiny_data(100);
  nn::Model model(tiny_model(2, 0.25f), Device::cpu());
  nn::Optimizer optimizer(model.parameters(), SgdOptions{.lr = 0.1, .momentum = 0.9});
  train::TrainConfig config;
  config.batch = 32;
  config.micro_batch = micro_batch;
  config.steps = 8;
  config.seed = 3;
  config.clip_grad_norm = max_norm;
  config.loss_scaling = scaling;
  config.fixed_scale = scale;
  train::Trainer trainer(model, optimizer, data, config);
  ClippedRun run;
  trainer.run([&](const train::StepRecord& record) { run.records.push_back(record); });
  for (const nn::NamedParameter& p : model.parameters()) {
    run.parameters.push_back(p.value.to_vector<float>());
  }
  return run;
}

TEST(TrainerClipping, MicroBatchesClipExactlyAsTheLargeBatch) {
  // The norm is taken once per step, of the accumulated gradient, which the CPU backend
  // computes bit for bit whatever the micro-batch (test_trainer): so the norm, the factor
  // and the clipped update agree to the bit too. The limit is below every step's norm,
  // so every step is clipped.
  const ClippedRun whole = train_clipped(32, 0.05f);
  for (const train::StepRecord& r : whole.records) {
    ASSERT_LT(r.clip_factor, 1.0f) << "step " << r.step << " was not clipped (norm "
                                   << r.grad_norm << "): the test would be vacuous";
  }
  for (const std::int64_t micro : {1, 7}) {
    const ClippedRun parts = train_clipped(micro, 0.05f);
    EXPECT_EQ(parts.parameters, whole.parameters) << "micro-batch " << micro;
    for (std::size_t k = 0; k < whole.records.size(); ++k) {
      EXPECT_EQ(parts.records[k].grad_norm, whole.records[k].grad_norm) << "step " << k + 1;
    }
  }
  EXPECT_NE(whole.parameters, train_clipped(32, 0.0f).parameters) << "clipping changed nothing";
}

TEST(TrainerClipping, APowerOfTwoLossScaleClipsExactlyAsNoScale) {
  // In fp32, S = 2^10 multiplies every gradient exactly and 1/S divides it out exactly,
  // so the norm that clipping sees must be the unscaled one: clipping before unscaling
  // (the norm of S g) would clip these steps to MAX / S instead.
  const ClippedRun plain = train_clipped(7, 0.05f);
  const ClippedRun scaled = train_clipped(7, 0.05f, train::LossScaling::fixed, 1024.0f);
  EXPECT_EQ(scaled.parameters, plain.parameters);
  for (std::size_t k = 0; k < plain.records.size(); ++k) {
    EXPECT_EQ(scaled.records[k].grad_norm, plain.records[k].grad_norm) << "step " << k + 1;
    EXPECT_EQ(scaled.records[k].clip_factor, plain.records[k].clip_factor) << "step " << k + 1;
  }
}

TEST(TrainerClipping, WithoutALossScalerANaNStopsTheRunBeforeTheStep) {
  // A NaN feature makes its row's logits, and so the batch's mean loss, NaN. Without a
  // loss scaler nothing can skip the step: the trainer stops, naming the step, before the
  // optimizer writes NaN into the weights (with clipping on and off).
  for (const float max_norm : {0.0f, 1.0f}) {
    Dataset data = tiny_data(100);
    data.features.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();  // sample 0
    nn::Model model(tiny_model(2, 0.25f), Device::cpu());
    nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
    train::TrainConfig config;
    config.batch = 100;
    config.steps = 1;
    config.clip_grad_norm = max_norm;
    train::Trainer trainer(model, optimizer, data, config);
    const Tensor weight_before = model.parameters()[0].value.clone();
    try {
      trainer.step();
      FAIL() << "a NaN loss was stepped into the weights (max_norm " << max_norm << ")";
    } catch (const train::NonFiniteLossError& error) {
      EXPECT_TRUE(testing::mentions(error.what(), {"step 1", "the loss is nan"}));
    }
    EXPECT_TRUE(testing::bitwise_equal(model.parameters()[0].value, weight_before));
    EXPECT_EQ(optimizer.steps_taken(), 0);
  }
}

// ---- the mistakes, measured ---------------------------------------------------------------

TEST(ClippingMistakes, ClippingEveryMicroBatchIsTheReplayOfItsRunningSums) {
  // One batch of 64 in micro-batches of 8. The mistake clips the running sum after every
  // micro-batch; its result is predicted exactly by replaying that rule in float64 on the
  // micro-batches' own contributions c_i (each computed alone, with the global count 64):
  // a_i = clip(a_{i-1} + c_i). The right rule clips once: clip(sum of c_i).
  const Dataset data = tiny_data(64);
  const nn::ModelConfig config = tiny_model(2, 0.25f);
  const nn::ForwardContext context{true, 99, 0};
  const float max_norm = 0.05f;
  const Tensor x = data.features, labels = data.labels;

  nn::Model model(config, Device::cpu());
  std::vector<clipping::Gradients> parts;
  for (std::int64_t begin = 0; begin < 64; begin += 8) {
    model.zero_grad();
    nn::ForwardContext part = context;
    part.first_row = begin;
    nn::accumulate_gradients(model, x.rows(begin, begin + 8), labels.rows(begin, begin + 8), 8,
                             part, 64);
    parts.push_back(clipping::gradients_of(model));
  }
  model.zero_grad();
  clipping::accumulate_clipping_each_micro_batch(model, x, labels, 8, context, 64, max_norm);
  const clipping::Gradients mistaken = clipping::gradients_of(model);
  const double off_prediction = clipping::largest_difference(
      mistaken, clipping::predict_clipping_each_micro_batch(parts, max_norm));
  const double off_right =
      clipping::largest_difference(mistaken, clipping::predict_clipping_the_step(parts, max_norm));
  std::printf("clipping each micro-batch: largest difference from the step's clip %.3g "
              "(%.1f%% of the clipped norm), from the replayed prediction %.3g\n",
              off_right, 100 * off_right / max_norm, off_prediction);
  // The float computation differs from the float64 replay by roundings only: 8 micro-
  // batches, each a few float operations per element on values below max_norm = 0.05;
  // the bound, 1e-6 of max_norm (5e-8), is empirical: 38 times the largest difference
  // measured (1.3e-9), while the mistake itself is 13% of max_norm.
  EXPECT_LE(off_prediction, 1e-6 * max_norm);
  EXPECT_GT(off_right, 0.1 * max_norm) << "the mistake should be large here";
}

TEST(ClippingMistakes, ClippingBeforeUnscalingClipsAtMaxOverS) {
  // With the scaled gradients S g, a clip at MAX leaves norm MAX, that is MAX / S after
  // unscaling: the true gradient is held to MAX / S, not MAX.
  const Dataset data = tiny_data(64);
  const float max_norm = 0.05f, scale = 1024.0f;
  nn::Model model(tiny_model(2, 0.25f), Device::cpu());
  model.zero_grad();
  nn::accumulate_gradients(model, data.features, data.labels, 16, {true, 1, 0}, 64, scale);
  loss_scaling::UnscalePass check;
  const clipping::GradientStats scaled = check.unscale_and_measure(model, 1.0f);  // no unscale
  clipping::clip_gradients(model, scaled.norm, max_norm);
  const clipping::GradientStats after = check.unscale_and_measure(model, scale);
  std::printf("clipping before unscaling: norm %.6g after, the limit was %.6g (%.6g / S)\n",
              after.norm, max_norm, max_norm / scale);
  // MAX (S ||g|| / (S ||g|| + 1e-6)) / S: within 1e-6 / (S ||g||) relative, plus roundings.
  EXPECT_NEAR(after.norm, max_norm / scale, 1e-5 * max_norm / scale);
  ASSERT_GT(scaled.norm / scale, max_norm) << "the gradient must need clipping";
}

}  // namespace
}  // namespace bigbatch

// test_roofline.cpp: chapter 06's spec-sheet cost model (chapters/06_planner/roofline.hpp)
// against its formula worked by hand, one term at a time: a device whose memory is
// infinitely fast leaves the FLOPs at the peak, one whose arithmetic and memory are both
// infinitely fast leaves the launches, one whose arithmetic is leaves the bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "chapters/06_planner/roofline.hpp"
#include "nn/model.hpp"

namespace bigbatch {
namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();

nn::ModelConfig model(nn::Precision precision) {
  return {.inputs = 12, .hidden = 8, .expansion = 4, .classes = 5, .depth = 3,
          .dropout = 0.0f, .precision = precision};
}

planning::DeviceSpec device(double flops, double bandwidth, double launch) {
  return {"test device", flops, 2 * flops, 4 * flops, bandwidth, launch};
}

// A sum of a few dozen terms: within a few ulps of the hand's (1e-12 relative).
constexpr double kRelative = 1e-12;

TEST(Roofline, ComputeBoundPassesCostTheirFlopsAtThePrecisionsPeak) {
  const double r = 32, d = 12, h = 8, inner = 32, c = 5, depth = 3;
  // Forward: the stem, two GEMMs per block, the head.
  const double forward = 2 * r * (d * h + depth * 2 * h * inner + h * c);
  // Backward: each GEMM's input and weight gradients, but the stem's input needs none.
  const double backward = 2 * forward - 2 * r * d * h;
  for (const auto& [precision, peak] : {std::pair{nn::Precision::fp32, 1e12},
                                       std::pair{nn::Precision::fp16, 2e12},
                                       std::pair{nn::Precision::bf16, 4e12}}) {
    const planning::DeviceSpec spec = device(1e12, kInfinite, 0);
    const nn::ModelConfig m = model(precision);
    EXPECT_NEAR(planning::roofline_micro_batch_seconds(m, 32, spec, true), forward / peak,
                kRelative * forward / peak);
    EXPECT_NEAR(planning::roofline_micro_batch_seconds(m, 32, spec, false),
                (forward + backward) / peak, kRelative * (forward + backward) / peak);
  }
}

TEST(Roofline, EveryKernelPaysOneLaunch) {
  const planning::DeviceSpec spec = device(kInfinite, kInfinite, 1e-6);
  // fp32 forward: stem GEMM and activation, 5 per block, head norm, GEMM and loss.
  const double forward = 2 + 5 * 3 + 3;
  // Backward: the loss, the head's linear (3) and norm, per block 2 linears (3 each), the
  // activation and the norm, then the stem's activation, weight and bias gradients.
  const double backward = 1 + 3 + 1 + 3 * 8 + 3;
  const nn::ModelConfig fp32 = model(nn::Precision::fp32);
  EXPECT_NEAR(planning::roofline_micro_batch_seconds(fp32, 7, spec, true), forward * 1e-6,
              kRelative);
  EXPECT_NEAR(planning::roofline_micro_batch_seconds(fp32, 7, spec, false),
              (forward + backward) * 1e-6, kRelative);
  // Mixed precision adds the input's cast forward and the logits' gradient's backward.
  EXPECT_NEAR(planning::roofline_micro_batch_seconds(model(nn::Precision::bf16), 7, spec, false),
              (forward + backward + 2) * 1e-6, kRelative);
}

TEST(Roofline, TheOptimizerMovesItsBytesAtTheBandwidthAndLaunchesOncePerTensor) {
  // The parameters and their tensors as the model has them.
  const nn::Model real(model(nn::Precision::fp32), Device::cpu());
  const auto parameters = static_cast<double>(real.parameter_count());
  const auto tensors = static_cast<double>(real.parameters().size());
  const planning::DeviceSpec spec = device(kInfinite, 1e9, 0);
  // AdamW: value and gradient read, value written (12 bytes), two moments read and
  // written (16); SGD with momentum: one buffer (8); a 16-bit working copy written (2).
  EXPECT_NEAR(planning::roofline_optimizer_seconds(model(nn::Precision::fp32), AdamWOptions{}, spec),
              parameters * 28 / 1e9, kRelative);
  SgdOptions momentum;
  momentum.momentum = 0.9;
  EXPECT_NEAR(planning::roofline_optimizer_seconds(model(nn::Precision::fp16), momentum, spec),
              parameters * 22 / 1e9, kRelative);
  EXPECT_NEAR(planning::roofline_optimizer_seconds(model(nn::Precision::fp32), SgdOptions{}, spec),
              parameters * 12 / 1e9, kRelative);
  EXPECT_NEAR(planning::roofline_optimizer_seconds(model(nn::Precision::fp32), AdamWOptions{},
                                                   device(kInfinite, kInfinite, 1e-6)),
              tensors * 1e-6, kRelative);
}

TEST(Roofline, SixteenBitPassesMoveHalfTheBytesOfTheirActivations) {
  // Arithmetic free, no launches: a pass costs its bytes. The f32 parts (the loss over
  // f32 logits, the weight gradients' f32 accumulation) and the casts mixed precision adds
  // keep the 16-bit forward above half of fp32's, and below it.
  const planning::DeviceSpec spec = device(kInfinite, 1e9, 0);
  const double fp32 = planning::roofline_micro_batch_seconds(model(nn::Precision::fp32), 64, spec, true);
  const double fp16 = planning::roofline_micro_batch_seconds(model(nn::Precision::fp16), 64, spec, true);
  EXPECT_GT(fp16, fp32 / 2);
  EXPECT_LT(fp16, fp32);
}

TEST(Roofline, TheCostModelIsFittedAtTheCalibrationRowsAndSaysItIsModelled) {
  const planning::DeviceSpec spec = planning::h200_spec();
  const nn::ModelConfig m = model(nn::Precision::fp32);
  const planning::CostModel cost = planning::roofline_cost_model(m, AdamWOptions{}, spec, 4096);
  EXPECT_EQ(cost.key.rfind("modelled, not measured: ", 0), 0u) << cost.key;
  EXPECT_NE(cost.key.find(spec.name), std::string::npos) << cost.key;
  // The line passes through the model's own seconds at the two rows it was fitted at.
  const auto [r1, r2] = planning::calibration_rows(4096);
  for (const std::int64_t rows : {r1, r2}) {
    const double at = planning::roofline_micro_batch_seconds(m, rows, spec, false);
    EXPECT_NEAR(cost.fp32.micro_batch.fixed + cost.fp32.micro_batch.per_row * static_cast<double>(rows),
                at, 1e-9 * at);
  }
  EXPECT_EQ(cost.fp16.optimizer,
            planning::roofline_optimizer_seconds(model(nn::Precision::fp16), AdamWOptions{}, spec));
}

}  // namespace
}  // namespace bigbatch

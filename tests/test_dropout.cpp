// dropout: the mask is the RNG's, keyed by the global element index, so micro-batches
// and recomputations draw the batch's mask; groups of four indices straddling rows;
// backward recomputes it; p = 0 and p = 1; the keep fraction; finite differences;
// every SIMD path; CUDA against the CPU. The fused backward of dropout(act(x)) against
// the unfused calls it replaces, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/bfloat16.hpp"
#include "kernels/activation.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dropout.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

/// The definition in dropout.hpp, in the test's own words: element (i, j) of an [M, N]
/// tensor is kept iff random_uniform(seed, stream, (first_row + i) N + j) >= p, and kept
/// values are multiplied by 1/(1-p) rounded to float. The product x * s of a float (or a
/// 16-bit value) and a float is exact in double; rounding it to float gives the float
/// product, which a 16-bit tensor stores rounded once more, to nearest even.
std::vector<double> dropout_oracle(const std::vector<double>& x, std::int64_t row_length,
                                   const DropoutSpec& spec, DType dtype) {
  const float scale =
      spec.p < 1 ? static_cast<float>(1.0 / static_cast<float>(1.0f - spec.p)) : 0.0f;
  std::vector<double> y(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) {
    const auto row = static_cast<std::int64_t>(e) / row_length,
               col = static_cast<std::int64_t>(e) % row_length;
    const auto index = static_cast<std::uint64_t>((spec.first_row + row) * row_length + col);
    const bool kept = random_uniform(spec.seed, spec.stream, index) >= spec.p;
    const float product = static_cast<float>(x[e] * (kept ? scale : 0.0f));
    y[e] = dtype == DType::f16    ? static_cast<double>(static_cast<f16>(product))
           : dtype == DType::bf16 ? static_cast<double>(to_float(to_bf16(product)))
                                  : product;
  }
  return y;
}

class Dropout : public DeviceTest {};

TEST_P(Dropout, ForwardAndBackwardFollowTheDefinition) {
  const std::vector<Shape> shapes = {{1}, {7}, {1025}, {(1 << 20) + 3}, {7, 1025}, {1025, 3, 5}};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape& shape : shapes) {
      const DropoutSpec spec{0.3f, 42, 7, 5};
      const std::int64_t row_length = shape_numel(shape) / shape[0];
      const Tensor x = testing::random_tensor(shape, dtype, device(), 1, -3.0, 3.0);
      const Tensor dy = testing::random_tensor(shape, dtype, device(), 2, -3.0, 3.0);
      Tensor y(shape, dtype, device()), dx(shape, dtype, device());
      testing::poison(y);
      testing::poison(dx);
      dropout_forward(x, y, spec);
      dropout_backward(dy, dx, spec);
      EXPECT_TRUE(testing::same_bits_or_both_nan(
          testing::to_doubles(y), dropout_oracle(testing::to_doubles(x), row_length, spec, dtype)))
          << dtype_name(dtype) << " " << shape_string(shape);
      EXPECT_TRUE(testing::same_bits_or_both_nan(
          testing::to_doubles(dx),
          dropout_oracle(testing::to_doubles(dy), row_length, spec, dtype)))
          << dtype_name(dtype) << " " << shape_string(shape);
    }
  }
}

// Rows [64, 128) as their own micro-batch, with first_row = 64, draw rows 64..127 of the
// batch's mask; so does any other split, uneven ones included.
TEST_P(Dropout, MicroBatchesDrawTheBatchMaskBitForBit) {
  const std::int64_t batch = 128, features = 33;
  const Tensor x = testing::random_tensor({batch, features}, DType::f32, device(), 3);
  const DropoutSpec whole_spec{0.5f, 9, 1, 0};
  Tensor whole({batch, features}, DType::f32, device());
  dropout_forward(x, whole, whole_spec);
  for (const std::int64_t micro : {64, 7, 1}) {
    for (std::int64_t begin = 0; begin < batch; begin += micro) {
      const std::int64_t end = std::min(begin + micro, batch);
      DropoutSpec spec = whole_spec;
      spec.first_row = begin;
      const Tensor part = x.rows(begin, end).clone();
      Tensor y(part.shape(), DType::f32, device());
      testing::poison(y);
      dropout_forward(part, y, spec);
      ASSERT_TRUE(testing::bitwise_equal(y, whole.rows(begin, end).clone()))
          << "rows [" << begin << ", " << end << ")";
    }
  }
  // and a recomputation (checkpointing) draws it again
  Tensor again({batch, features}, DType::f32, device());
  dropout_forward(x, again, whole_spec);
  EXPECT_TRUE(testing::bitwise_equal(again, whole));
}

// The gradient goes through exactly the elements the forward pass kept, scaled alike.
TEST_P(Dropout, BackwardRecomputesTheForwardMask) {
  const Shape shape = {513, 129};
  const DropoutSpec spec{0.25f, 5, 3, 1000};
  const Tensor ones =
      testing::make_tensor(std::vector<double>(513 * 129, 1.0), shape, DType::f32, device());
  const Tensor dy = testing::random_tensor(shape, DType::f32, device(), 4);
  Tensor factor(shape, DType::f32, device()), dx(shape, DType::f32, device());
  dropout_forward(ones, factor, spec);  // the mask times 1/(1-p)
  dropout_backward(dy, dx, spec);
  const auto f = testing::to_doubles(factor), g = testing::to_doubles(dy);
  std::vector<double> want(f.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(g[i] * f[i]);
  EXPECT_TRUE(testing::same_bits_or_both_nan(testing::to_doubles(dx), want));
}

// One Philox evaluation serves the four indices 4q..4q+3 (common/rng.hpp), and those
// may lie in two rows, or partly before the tensor's first element or after its last:
// with N not a multiple of 4 and first_row = 1, 3, 5, groups straddle every row
// boundary and both ends. Each element must still get random_uniform of its own index
// (the oracle draws element by element). On the CPU every vector level is checked,
// since the AVX-512 path takes whole groups and leaves the partial ones to the others.
TEST_P(Dropout, GroupsStraddlingRowsDrawTheElementMask) {
  std::vector<Shape> shapes;
  for (const std::int64_t rows : {1, 2, 9}) {
    for (const std::int64_t row_length : {1, 2, 3, 5, 6, 7, 13}) {
      shapes.push_back({rows, row_length});
    }
  }
  shapes.push_back({37, 1021});  // whole AVX-512 blocks between partial ones
  shapes.push_back({3, 4099});
  std::vector<cpu::SimdLevel> levels = {cpu::simd_level()};  // CUDA: the level is irrelevant
  if (device().is_cpu()) {
    levels = {cpu::SimdLevel::baseline, cpu::SimdLevel::avx2, cpu::SimdLevel::avx512};
  }
  for (const cpu::SimdLevel level : levels) {
    if (level > cpu::simd_level_supported()) continue;
    const cpu::SimdLevel previous = cpu::set_simd_level_cap(level);
    for (const Shape& shape : shapes) {
      for (const std::int64_t first_row : {0, 1, 3, 5}) {
        const DropoutSpec spec{0.5f, 31, 4, first_row};
        const Tensor x = testing::random_tensor(shape, DType::f32, device(), 10, -3.0, 3.0);
        Tensor y(shape, DType::f32, device());
        testing::poison(y);
        dropout_forward(x, y, spec);
        EXPECT_TRUE(testing::same_bits_or_both_nan(
            testing::to_doubles(y),
            dropout_oracle(testing::to_doubles(x), shape[1], spec, DType::f32)))
            << shape_string(shape) << " first_row " << first_row << " "
            << cpu::simd_level_name(level);
      }
    }
    cpu::set_simd_level_cap(previous);
  }
}

// K kept of n is Binomial(n, q) with q = P(u >= p) = 1 - ceil(p 2^24) / 2^24 (u takes the
// values k 2^-24). |K - n q| > 6 sqrt(n q (1 - q)) has probability below 2e-9 for a true
// binomial; Philox passes far stronger tests (TestU01's BigCrush), so a failure here
// means the mask is wrong, not unlucky.
TEST_P(Dropout, KeepsTheExpectedFraction) {
  const std::int64_t n = 1 << 20;
  const Tensor ones = testing::make_tensor(std::vector<double>(n, 1.0), {n}, DType::f32, device());
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    Tensor y({n}, DType::f32, device());
    dropout_forward(ones, y, DropoutSpec{p, 123, 4, 0});
    double kept = 0;
    for (const double v : testing::to_doubles(y)) kept += v != 0.0;
    const double q = 1.0 - std::ceil(static_cast<double>(p) * 0x1p24) * 0x1p-24;
    const double sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(kept, n * q, 6 * sd) << "p = " << p;
  }
}

TEST_P(Dropout, ZeroAndOne) {
  const std::int64_t n = 1025;
  auto values = testing::random_values(n, 5, -2.0, 2.0);
  values[0] = -0.0;
  values[1] = std::nan("");
  values[2] = -3.5;
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Tensor x = testing::make_tensor(values, {n}, dtype, device());
    Tensor y({n}, dtype, device());
    testing::poison(y);
    dropout_forward(x, y, DropoutSpec{0.0f, 1, 2, 3});
    EXPECT_TRUE(testing::bitwise_equal(y, x)) << "p = 0 is the identity, -0 and NaN included";
    testing::poison(y);
    dropout_forward(x, y, DropoutSpec{1.0f, 1, 2, 3});
    const auto ys = testing::to_doubles(y);
    for (std::size_t i = 0; i < ys.size(); ++i) {
      if (i == 1) {
        EXPECT_TRUE(std::isnan(ys[i])) << "as PyTorch: NaN * 0";
      } else {
        ASSERT_EQ(ys[i], 0.0) << "p = 1 drops everything, i = " << i;
      }
    }
    EXPECT_TRUE(std::signbit(ys[2])) << "as PyTorch: -3.5 * 0 = -0";
  }
}

// The global indices run across 2^34, where the group number's high word steps.
TEST(DropoutCuda, MatchesTheCpuBitForBit) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const Shape shape = {1027, 1021};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const DropoutSpec spec{0.2f, 0x1234567890abcdefULL, 0xfedcba0987654321ULL,
                           (std::int64_t{1} << 34) / 1021};
    const Tensor x = testing::random_tensor(shape, dtype, device, 6);
    Tensor y(shape, dtype, device), y_cpu(shape, dtype);
    dropout_forward(x, y, spec);
    dropout_forward(x.to(Device::cpu()), y_cpu, spec);
    EXPECT_TRUE(testing::bitwise_equal(y, y_cpu)) << dtype_name(dtype);
  }
}

TEST_P(Dropout, RejectsBadArguments) {
  const Tensor x({4, 3}, DType::f32, device());
  const Tensor y({4, 3}, DType::f32, device());
  EXPECT_THROW(dropout_forward(x, y, DropoutSpec{-0.1f, 0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, y, DropoutSpec{1.5f, 0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, y, DropoutSpec{std::nanf(""), 0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, y, DropoutSpec{0.5f, 0, 0, -1}), std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, y, DropoutSpec{0.5f, 0, 0, std::int64_t{1} << 62}),
               std::invalid_argument);  // (first_row + i) * 3 + j would pass 2^63
  EXPECT_THROW(dropout_forward(x, Tensor({3, 4}, DType::f32, device()), DropoutSpec{}),
               std::invalid_argument);
  EXPECT_THROW(dropout_forward(x, Tensor({4, 3}, DType::f16, device()), DropoutSpec{}),
               std::invalid_argument);
  EXPECT_THROW(dropout_backward(Tensor({4, 3}, DType::i32, device()),
                                Tensor({4, 3}, DType::i32, device()), DropoutSpec{}),
               std::invalid_argument);
  if (device().is_cuda()) {
    EXPECT_THROW(dropout_forward(x, Tensor({4, 3}, DType::f32), DropoutSpec{}),
                 std::invalid_argument);
  }
}

/// The fused backward and the calls it replaces, on one input: {dx, y} each way.
struct FusedAndUnfused {
  Tensor fused_dx, fused_y, dx, y;
};

FusedAndUnfused fused_and_unfused(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                  const DropoutSpec& spec, bool in_place) {
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  const Device device = x.device();
  FusedAndUnfused r{Tensor(shape, dtype, device), Tensor(shape, dtype, device),
                    Tensor(shape, dtype, device), Tensor(shape, dtype, device)};
  const bool gelu = act == PointwiseActivation::gelu;
  // Unfused, as the model's block_backward ran it: dropout's backward into dx, then the
  // activation's backward in place; the forward output: activation, then dropout in place.
  dropout_backward(dy, r.dx, spec);
  (gelu ? gelu_backward : relu_backward)(x, r.dx, r.dx);
  (gelu ? gelu_forward : relu_forward)(x, r.y);
  dropout_forward(r.y, r.y, spec);
  if (in_place) {
    r.fused_dx.copy_from(dy);
    activation_dropout_backward(act, x, r.fused_dx, r.fused_dx, spec, r.fused_y);
  } else {
    testing::poison(r.fused_dx);
    testing::poison(r.fused_y);
    activation_dropout_backward(act, x, dy, r.fused_dx, spec, r.fused_y);
  }
  return r;
}

TEST_P(Dropout, FusedActivationBackwardGivesTheUnfusedBits) {
  // 37 x 29: blocks and groups of four straddle rows; values past +-64 and the
  // infinities exercise GELU's limits; p = 0 (no dropout), 0.3 and 1 (nothing kept).
  const Shape shape = {37, 29};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<double> values =
        testing::to_doubles(testing::random_tensor(shape, dtype, Device::cpu(), 21, -6.0, 6.0));
    values[3] = 80.0;
    values[4] = -80.0;
    values[5] = INFINITY;
    values[6] = -INFINITY;
    values[7] = 0.0;
    const Tensor x = testing::make_tensor(values, shape, dtype, device());
    const Tensor dy = testing::random_tensor(shape, dtype, device(), 22, -3.0, 3.0);
    for (const PointwiseActivation act : {PointwiseActivation::gelu, PointwiseActivation::relu}) {
      for (const float p : {0.0f, 0.3f, 1.0f}) {
        for (const bool in_place : {false, true}) {
          const DropoutSpec spec{p, 91, 4, 1000003};
          const FusedAndUnfused r = fused_and_unfused(act, x, dy, spec, in_place);
          const std::string what = std::string(dtype_name(dtype)) +
                                   (act == PointwiseActivation::gelu ? " gelu" : " relu") +
                                   " p " + std::to_string(p) + (in_place ? " in place" : "");
          EXPECT_TRUE(testing::bitwise_equal(r.fused_dx, r.dx)) << what;
          EXPECT_TRUE(testing::bitwise_equal(r.fused_y, r.y)) << what;
        }
      }
    }
  }
}

TEST_P(Dropout, FusedActivationBackwardRejectsBadArguments) {
  const Tensor x({4, 3}, DType::f32, device()), dy({4, 3}, DType::f32, device());
  const Tensor dx({4, 3}, DType::f32, device());
  const auto gelu = PointwiseActivation::gelu;
  EXPECT_THROW(activation_dropout_backward(gelu, x, dy, dx, DropoutSpec{}, dx),
               std::invalid_argument);  // y and dx: two outputs, one tensor
  EXPECT_THROW(activation_dropout_backward(gelu, Tensor({4, 3}, DType::f16, device()), dy, dx,
                                           DropoutSpec{}),
               std::invalid_argument);
  EXPECT_THROW(activation_dropout_backward(gelu, x, dy, dx, DropoutSpec{},
                                           Tensor({3, 4}, DType::f32, device())),
               std::invalid_argument);
  EXPECT_THROW(activation_dropout_backward(gelu, x, dy, dx, DropoutSpec{2.0f, 0, 0, 0}),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, Dropout, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// Dropout is linear in x: L(x) = sum w * dropout(x) has dL/dx = dropout_backward(w).
// Central differences of a linear function have no truncation error; the rounding of
// the forward values (2^-53 relative, |x / (1 - p)| < 1.7) over 2h = 2e-3 leaves at most
// 2e-13 (times |w| <= 1).
TEST(DropoutGradients, BackwardIsTheDerivativeOfForward) {
  const std::int64_t n = 1025;
  const double h = 1e-3;
  const DropoutSpec spec{0.4f, 77, 2, 9};
  auto points = testing::random_values(n, 7);
  const Tensor w = testing::random_tensor({n}, DType::f64, Device::cpu(), 8);
  Tensor plus({n}, DType::f64), minus({n}, DType::f64), dx({n}, DType::f64);
  std::vector<double> plus_points = points, minus_points = points;
  for (double& p : plus_points) p += h;
  for (double& p : minus_points) p -= h;
  // elementwise: one shifted tensor gives every element's difference at once
  dropout_forward(testing::make_tensor(plus_points, {n}, DType::f64, Device::cpu()), plus, spec);
  dropout_forward(testing::make_tensor(minus_points, {n}, DType::f64, Device::cpu()), minus, spec);
  testing::poison(dx);
  dropout_backward(w, dx, spec);
  const auto f_plus = testing::to_doubles(plus), f_minus = testing::to_doubles(minus);
  const auto weights = testing::to_doubles(w);
  std::vector<double> want(points.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    want[i] = weights[i] * (f_plus[i] - f_minus[i]) / (2 * h);
  EXPECT_TRUE(testing::all_close(testing::to_doubles(dx), want, [](std::size_t) { return 1e-11; }));
}

TEST(DropoutCuda, FusedActivationBackwardMatchesTheCpuBitForBit) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const Shape shape = {1027, 1021};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const DropoutSpec spec{0.2f, 0x1234567890abcdefULL, 3, (std::int64_t{1} << 34) / 1021};
    const Tensor x = testing::random_tensor(shape, dtype, device, 6, -8.0, 8.0);
    const Tensor dy = testing::random_tensor(shape, dtype, device, 7);
    for (const PointwiseActivation act : {PointwiseActivation::gelu, PointwiseActivation::relu}) {
      Tensor dx(shape, dtype, device), y(shape, dtype, device);
      Tensor dx_cpu(shape, dtype), y_cpu(shape, dtype);
      activation_dropout_backward(act, x, dy, dx, spec, y);
      activation_dropout_backward(act, x.to(Device::cpu()), dy.to(Device::cpu()), dx_cpu, spec,
                                  y_cpu);
      EXPECT_TRUE(testing::bitwise_equal(dx, dx_cpu)) << dtype_name(dtype);
      EXPECT_TRUE(testing::bitwise_equal(y, y_cpu)) << dtype_name(dtype);
    }
  }
}

TEST(DropoutSimd, FusedActivationBackwardGivesTheBaselineBitsAtEveryLevel) {
  const Shape shape = {301, 33};
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    const Tensor x = testing::random_tensor(shape, dtype, Device::cpu(), 31, -5.0, 5.0);
    const Tensor dy = testing::random_tensor(shape, dtype, Device::cpu(), 32);
    const DropoutSpec spec{0.25f, 5, 6, 7};
    const auto run = [&] {
      Tensor dx(shape, dtype), y(shape, dtype);
      activation_dropout_backward(PointwiseActivation::gelu, x, dy, dx, spec, y);
      return std::pair{dx, y};
    };
    const cpu::SimdLevel previous = cpu::set_simd_level_cap(cpu::SimdLevel::baseline);
    const auto baseline = run();
    // The baseline against the unfused calls (f64 included: the tests' finite differences)
    const FusedAndUnfused unfused =
        fused_and_unfused(PointwiseActivation::gelu, x, dy, spec, false);
    EXPECT_TRUE(testing::bitwise_equal(baseline.first, unfused.dx)) << dtype_name(dtype);
    EXPECT_TRUE(testing::bitwise_equal(baseline.second, unfused.y)) << dtype_name(dtype);
    for (const cpu::SimdLevel level : {cpu::SimdLevel::avx2, cpu::SimdLevel::avx512}) {
      if (level > cpu::simd_level_supported()) continue;
      cpu::set_simd_level_cap(level);
      const auto vectorised = run();
      EXPECT_TRUE(testing::bitwise_equal(vectorised.first, baseline.first))
          << cpu::simd_level_name(level) << " " << dtype_name(dtype);
      EXPECT_TRUE(testing::bitwise_equal(vectorised.second, baseline.second))
          << cpu::simd_level_name(level) << " " << dtype_name(dtype);
    }
    cpu::set_simd_level_cap(previous);
  }
}

// The AVX-512 path draws 32 groups (128 masks) at a time and handles the step of the
// group number's high word (at indices that are multiples of 2^34) itself; across that
// step, from group-aligned and unaligned starts, every level must give the baseline
// bits (which the definition test above ties to random_uniform).
TEST(DropoutSimd, EveryLevelGivesTheBaselineBits) {
  const std::int64_t rows = 3001, row_length = 1;
  for (const std::int64_t first_row :
       {std::int64_t{0}, std::int64_t{1}, (std::int64_t{1} << 34) - 1500,
        (std::int64_t{1} << 34) - 1499, (std::int64_t{5} << 34) - 17}) {
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const DropoutSpec spec{0.3f, 0xdeadbeefcafeULL, 0x123456789ULL, first_row};
      const Tensor x = testing::random_tensor({rows, row_length}, dtype, Device::cpu(), 9);
      const auto run = [&] {
        Tensor y({rows, row_length}, dtype);
        dropout_forward(x, y, spec);
        return y;
      };
      const cpu::SimdLevel previous = cpu::set_simd_level_cap(cpu::SimdLevel::baseline);
      const Tensor baseline = run();
      EXPECT_TRUE(testing::same_bits_or_both_nan(
          testing::to_doubles(baseline),
          dropout_oracle(testing::to_doubles(x), row_length, spec, dtype)));
      for (const cpu::SimdLevel level : {cpu::SimdLevel::avx2, cpu::SimdLevel::avx512}) {
        if (level > cpu::simd_level_supported()) continue;
        cpu::set_simd_level_cap(level);
        EXPECT_TRUE(testing::bitwise_equal(run(), baseline))
            << cpu::simd_level_name(level) << " first_row " << first_row;
      }
      cpu::set_simd_level_cap(previous);
    }
  }
}

}  // namespace
}  // namespace bigbatch

// activation: GELU (tanh approximation) and ReLU against a float64 oracle, their
// backward passes against central differences, the exp they rest on against libm,
// every SIMD build against the baseline, and CUDA against the CPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <numbers>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/cpu_vector.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<std::int64_t> kOddSizes = {1, 7, 1025, (1 << 20) + 3};

// ---- the float64 oracle ------------------------------------------------------------

// PyTorch's definition, gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// in double. 1 + tanh(u) = 2 sigmoid(2u) is an identity; the oracle uses the sigmoid
// side because the tanh side cancels for negative x even in double (checked against
// the literal form below, where that is accurate).
struct GeluOracle {
  double z;            // 2u
  double s;            // sigmoid(z)
  double one_minus_s;  // sigmoid(-z), computed on its own (no cancellation)
  double dz_dx;        // z'(x)
  double value;        // gelu(x) = x s
  double slope_term;   // x s (1 - s) z'(x)
  double derivative;   // gelu'(x) = s + slope_term

  explicit GeluOracle(double x) {
    const double k = 2 * std::sqrt(2 / std::numbers::pi);
    z = k * (x + 0.044715 * x * x * x);
    s = 1 / (1 + std::exp(-z));
    one_minus_s = 1 / (1 + std::exp(z));
    dz_dx = k * (1 + 3 * 0.044715 * x * x);
    value = x * s;
    slope_term = x * s * one_minus_s * dz_dx;
    derivative = s + slope_term;
  }
};

// ---- tolerances, derived ---------------------------------------------------------
//
// The float kernel (activation_math.hpp) computes z with 5 roundings plus 2 rounded
// constants (0.044715 and sqrt(8/pi)); x and 0.044715 x^3 have the same sign, so the
// relative error of z is at most 7u (u = 2^-24, to first order). From z:
//   e = exp(-|z|)   at most kExpMaxUlp = 1.25 ulp, i.e. 2.5u relative (see ExpIsAccurate)
//   p = 1/(1+e)     at most 2.5u/2 + u + u = 3.25u     m = e p   at most 2.5u + 3.25u + u = 6.75u
//   gelu = x * (p or m)   one more rounding: at most 7.75u, so 8u.
// The error in z moves sigmoid(z) by (1 - s) |dz| relative, at most 7u |z| (1 - s): the
// conditioning of gelu itself, large for very negative x, where gelu is tiny.
//   gelu'(x) = s + t with t = x z' p m: z' has 6 roundings with its constants, p m has
// 6.75u + 3.25u + u, two more products: t is within 19u plus |1 - 2s| 7u |z|.
// The sum and the product with dy round twice more. Below 2^-126, exp may flush to
// zero: an absolute error of at most 2^-125 times the factor that multiplies e. A
// result in float's subnormal range rounds with an absolute error of up to 2^-150: the
// floor 2^-149 (times 1 + |dy| in the backward pass, whose slope term also rounds).
// For f16, the float result is rounded once more: u16 = 2^-11 relative, or 2^-25
// absolute in the subnormal range.
// Checked once, offline, over every float x in [-10, 10] (f32, dy = 1): the largest
// error is 0.50 of the tolerance forward, 0.48 backward.

constexpr double kU32 = 0x1p-24, kU16 = 0x1p-11;
// Empirical, not derived from the algorithm: the largest error of exp_nonpositive over
// EVERY float y in [-87.3, 0], measured exhaustively (1.2122 ulp, see ExpIsAccurate),
// rounded up with a 3% margin. Exhaustive over that domain, so it holds for every input
// the kernels give it there; it says nothing about another implementation of exp.
constexpr double kExpMaxUlp = 1.25;

double f16_rounding(double magnitude) { return kU16 * magnitude + 0x1p-25; }

double gelu_tolerance(double x, DType dtype) {
  const GeluOracle g(x);
  const double flush = std::exp(-std::fabs(g.z)) < 0x1p-125 ? std::fabs(x) * 0x1p-125 : 0.0;
  const double f32 =
      kU32 * std::fabs(g.value) * (8 + 7 * std::fabs(g.z) * g.one_minus_s) + flush + 0x1p-149;
  return dtype == DType::f16 ? f32 + f16_rounding(std::fabs(g.value) + f32) : f32;
}

double gelu_backward_tolerance(double x, double dy, DType dtype) {
  const GeluOracle g(x);
  const double want = dy * g.derivative;
  const double s_error = (8 + 7 * std::fabs(g.z) * g.one_minus_s) * g.s;
  const double t_error =
      (19 + 7 * std::fabs(g.z) * std::fabs(1 - 2 * g.s)) * std::fabs(g.slope_term);
  const double flush = std::exp(-std::fabs(g.z)) < 0x1p-125
                           ? (1 + std::fabs(x) + std::fabs(x * g.dz_dx)) * 0x1p-125 * std::fabs(dy)
                           : 0.0;
  const double f32 = kU32 * (std::fabs(dy) * (s_error + t_error) + 2 * std::fabs(want)) + flush +
                     (1 + std::fabs(dy)) * 0x1p-149;
  return dtype == DType::f16 ? f32 + f16_rounding(std::fabs(want) + f32) : f32;
}

/// Random x in [-12, 12] (|z| > 88 below -10.1: exp underflows there) plus special
/// points: zeros, tiny values, gelu's minimum, large values. (Infinities have their own
/// test: the oracle's formula gives NaN for gelu'(+-inf), whose limits the kernel returns.)
std::vector<double> gelu_inputs(std::int64_t n, std::uint64_t seed, DType dtype) {
  auto values = testing::random_values(n, seed, -12.0, 12.0);
  std::vector<double> special = {0.0, -0.0, 1e-30, -1e-30, 1e-40, -0.75, 40.0, -40.0, 1e4, -1e4};
  // f32 only: cubes that overflow, and a subnormal whose half rounds
  if (dtype == DType::f32) special.insert(special.end(), {1e20, -1e20, 3 * 0x1p-149});
  for (std::size_t i = 0; i < special.size() && i < values.size(); ++i) {
    values[(i * 7919) % values.size()] = special[i];
  }
  return values;
}

// ---- exp -----------------------------------------------------------------------------

double ulp_of(double value) {  // the float spacing at a value (normal range)
  int exponent = 0;
  std::frexp(static_cast<float>(value), &exponent);
  return std::ldexp(1.0, exponent - 24);
}

// Measured offline, over every float y in [-87.3, 0] (1.1e9 of them; the results stay
// normal there), against std::exp in double: at most 1.212227 ulp from the exact e^y
// (worst at y = -71.0456161; re-measured 2026-11-30, same figure). The test takes every
// 61st of them, the worst one, and the edges, against the bound 1.25 ulp.
TEST(ActivationMath, ExpIsAccurate) {
  const auto first = std::bit_cast<std::uint32_t>(-0.0f);
  const auto last = std::bit_cast<std::uint32_t>(-87.3f);
  double worst = 0;
  const auto check = [&](float y) {
    const double exact = std::exp(static_cast<double>(y));
    const double error = std::fabs(activation_math::exp_nonpositive(y) - exact) / ulp_of(exact);
    worst = std::max(worst, error);
    ASSERT_LE(error, kExpMaxUlp) << "y = " << y;
  };
  for (std::uint32_t bits = first; bits <= last; bits += 61) check(std::bit_cast<float>(bits));
  check(-71.0456161f);
  check(-87.3f);
  std::cout << "exp_nonpositive: worst error in this sample " << worst << " ulp\n";
  EXPECT_EQ(activation_math::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(activation_math::exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(activation_math::exp_nonpositive(-88.0f), 0.0f);  // below 2^-126: flushed
  EXPECT_EQ(activation_math::exp_nonpositive(-1000.0f), 0.0f);
  EXPECT_EQ(activation_math::exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(
      std::isnan(activation_math::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

// The oracle's sigmoid form is PyTorch's literal tanh form: where the literal form is
// accurate in double (x >= -3, where 1 + tanh(u) >= 2e-3 loses at most 9 of 53 bits,
// i.e. 2^-44 = 6e-14 relative), the two agree to 1e-12.
TEST(ActivationMath, OracleIsPyTorchsTanhForm) {
  for (const double x : testing::random_values(10001, 3, -3.0, 10.0)) {
    const double u = std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x);
    const double literal = 0.5 * x * (1 + std::tanh(u));
    EXPECT_NEAR(GeluOracle(x).value, literal, 1e-12 * std::fabs(literal)) << "x = " << x;
  }
}

// ---- GELU ------------------------------------------------------------------------------

class Gelu : public DeviceTest {};

TEST_P(Gelu, ForwardMatchesTheOracle) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const std::int64_t n : kOddSizes) {
      const Tensor x = testing::make_tensor(gelu_inputs(n, 1, dtype), {n}, dtype, device());
      const auto xs = testing::to_doubles(x);  // the values the kernel sees
      Tensor y({n}, dtype, device());
      testing::poison(y);
      gelu_forward(x, y);
      std::vector<double> want(xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) want[i] = GeluOracle(xs[i]).value;
      ASSERT_TRUE(testing::all_close(testing::to_doubles(y), want,
                                     [&](std::size_t i) { return gelu_tolerance(xs[i], dtype); }))
          << dtype_name(dtype) << " n = " << n;
    }
  }
}

TEST_P(Gelu, BackwardMatchesTheOracle) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const std::int64_t n : kOddSizes) {
      const Tensor x = testing::make_tensor(gelu_inputs(n, 2, dtype), {n}, dtype, device());
      const Tensor dy = testing::random_tensor({n}, dtype, device(), 3);
      const auto xs = testing::to_doubles(x), dys = testing::to_doubles(dy);
      Tensor dx({n}, dtype, device());
      testing::poison(dx);
      gelu_backward(x, dy, dx);
      std::vector<double> want(xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) want[i] = dys[i] * GeluOracle(xs[i]).derivative;
      ASSERT_TRUE(testing::all_close(
          testing::to_doubles(dx), want,
          [&](std::size_t i) { return gelu_backward_tolerance(xs[i], dys[i], dtype); }))
          << dtype_name(dtype) << " n = " << n;
    }
  }
}

TEST_P(Gelu, SpecialValues) {
  const std::vector<double> xs = {kInf, -kInf, std::nan(""), 0.0, -0.0};
  const Tensor x = testing::make_tensor(xs, {5}, DType::f32, device());
  Tensor y({5}, DType::f32, device()), dx({5}, DType::f32, device());
  gelu_forward(x, y);
  const auto ys = testing::to_doubles(y);
  EXPECT_EQ(ys[0], kInf);
  EXPECT_TRUE(std::isnan(ys[1])) << "as PyTorch: -inf * 0";
  EXPECT_TRUE(std::isnan(ys[2]));
  EXPECT_EQ(ys[3], 0.0);
  EXPECT_TRUE(ys[4] == 0.0 && std::signbit(ys[4])) << "gelu(-0) = -0 * 1/2";
  gelu_backward(x, testing::make_tensor({2, 2, 2, 2, 2}, {5}, DType::f32, device()), dx);
  const auto dxs = testing::to_doubles(dx);
  EXPECT_EQ(dxs[0], 2.0) << "the limit gelu'(inf) = 1";
  EXPECT_EQ(dxs[1], 0.0) << "the limit gelu'(-inf) = 0";
  EXPECT_TRUE(std::isnan(dxs[2]));
  EXPECT_EQ(dxs[3], 1.0) << "gelu'(0) = 1/2";
}

TEST_P(Gelu, InPlaceIsAllowed) {
  const std::int64_t n = 1025;
  const Tensor x = testing::random_tensor({7, n}, DType::f32, device(), 4, -5.0, 5.0);
  Tensor y({7, n}, DType::f32, device());
  gelu_forward(x, y);
  gelu_forward(x, x);
  EXPECT_TRUE(testing::bitwise_equal(x, y));
}

TEST(GeluCuda, MatchesTheCpuBitForBit) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  // Both backends evaluate activation_math.hpp with one rounding per operation: the same
  // bits, NaN payloads aside.
  const std::int64_t n = (1 << 20) + 3;
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Tensor x = testing::make_tensor(gelu_inputs(n, 5, dtype), {n}, dtype, device);
    const Tensor dy = testing::random_tensor({n}, dtype, device, 6);
    Tensor y({n}, dtype, device), dx({n}, dtype, device);
    Tensor y_cpu({n}, dtype), dx_cpu({n}, dtype);
    gelu_forward(x, y);
    gelu_forward(x.to(Device::cpu()), y_cpu);
    EXPECT_TRUE(testing::same_bits_or_both_nan(y, y_cpu)) << dtype_name(dtype);
    gelu_backward(x, dy, dx);
    gelu_backward(x.to(Device::cpu()), dy.to(Device::cpu()), dx_cpu);
    EXPECT_TRUE(testing::same_bits_or_both_nan(dx, dx_cpu)) << dtype_name(dtype);
  }
}

// ---- ReLU ------------------------------------------------------------------------------

class Relu : public DeviceTest {};

TEST_P(Relu, ForwardAndBackwardAreExact) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const std::int64_t n : kOddSizes) {
      auto values = testing::random_values(n, 7, -3.0, 3.0);
      values[0] = 0.0;  // relu'(0) = 0
      const Tensor x = testing::make_tensor(values, {n}, dtype, device());
      const Tensor dy = testing::random_tensor({n}, dtype, device(), 8);
      const auto xs = testing::to_doubles(x), dys = testing::to_doubles(dy);
      Tensor y({n}, dtype, device()), dx({n}, dtype, device());
      testing::poison(y);
      testing::poison(dx);
      relu_forward(x, y);
      relu_backward(x, dy, dx);
      std::vector<double> want_y(xs.size()), want_dx(xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) {
        want_y[i] = xs[i] > 0 ? xs[i] : 0.0;
        want_dx[i] = xs[i] > 0 ? dys[i] : 0.0;
      }
      const auto exact = [](std::size_t) { return 0.0; };  // nothing rounds
      ASSERT_TRUE(testing::all_close(testing::to_doubles(y), want_y, exact)) << dtype_name(dtype);
      ASSERT_TRUE(testing::all_close(testing::to_doubles(dx), want_dx, exact)) << dtype_name(dtype);
    }
  }
}

TEST_P(Relu, SpecialValues) {
  const Tensor x =
      testing::make_tensor({-0.0, std::nan(""), kInf, -kInf}, {4}, DType::f32, device());
  Tensor y({4}, DType::f32, device()), dx({4}, DType::f32, device());
  relu_forward(x, y);
  const auto ys = testing::to_doubles(y);
  EXPECT_TRUE(ys[0] == 0.0 && !std::signbit(ys[0])) << "relu(-0) = +0";
  EXPECT_TRUE(std::isnan(ys[1])) << "NaN passes through, as torch.relu";
  EXPECT_EQ(ys[2], kInf);
  EXPECT_EQ(ys[3], 0.0);
  relu_backward(x, testing::make_tensor({5, 5, 5, 5}, {4}, DType::f32, device()), dx);
  EXPECT_EQ(testing::to_doubles(dx), (std::vector<double>{0, 5, 5, 0}));
}

TEST(ReluCuda, MatchesTheCpuBitForBit) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const std::int64_t n = (1 << 20) + 3;
  const Tensor x = testing::random_tensor({n}, DType::f16, device, 9, -2.0, 2.0);
  const Tensor dy = testing::random_tensor({n}, DType::f16, device, 10);
  Tensor y({n}, DType::f16, device), dx({n}, DType::f16, device);
  Tensor y_cpu({n}, DType::f16), dx_cpu({n}, DType::f16);
  relu_forward(x, y);
  relu_forward(x.to(Device::cpu()), y_cpu);
  relu_backward(x, dy, dx);
  relu_backward(x.to(Device::cpu()), dy.to(Device::cpu()), dx_cpu);
  EXPECT_TRUE(testing::bitwise_equal(y, y_cpu));
  EXPECT_TRUE(testing::bitwise_equal(dx, dx_cpu));
}

// ---- argument checks ---------------------------------------------------------------

class ActivationArguments : public DeviceTest {};

TEST_P(ActivationArguments, AreChecked) {
  const Tensor x({4, 5}, DType::f32, device());
  const Tensor good({4, 5}, DType::f32, device());
  for (const auto& forward : {gelu_forward, relu_forward}) {
    EXPECT_THROW(forward(x, Tensor({5, 4}, DType::f32, device())), std::invalid_argument);
    EXPECT_THROW(forward(x, Tensor({4, 5}, DType::f16, device())), std::invalid_argument);
    EXPECT_THROW(forward(Tensor({4}, DType::i32, device()), Tensor({4}, DType::i32, device())),
                 std::invalid_argument);
    EXPECT_THROW(forward(x.reshaped({20}).rows(0, 10), x.reshaped({20}).rows(5, 15)),
                 std::invalid_argument);  // partly overlapping
  }
  for (const auto& backward : {gelu_backward, relu_backward}) {
    EXPECT_THROW(backward(x, Tensor({4, 4}, DType::f32, device()), good), std::invalid_argument);
    EXPECT_THROW(backward(x, good, Tensor({4, 5}, DType::f16, device())), std::invalid_argument);
    EXPECT_THROW(
        backward(x, Tensor({4, 5}, DType::f16, device()), Tensor({4, 5}, DType::f16, device())),
        std::invalid_argument);
  }
  if (device().is_cuda()) {
    EXPECT_THROW(gelu_forward(x, Tensor({4, 5}, DType::f32)), std::invalid_argument);
    EXPECT_THROW(gelu_backward(x, Tensor({4, 5}, DType::f32), good), std::invalid_argument);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Gelu, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);
INSTANTIATE_TEST_SUITE_P(Backends, Relu, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);
INSTANTIATE_TEST_SUITE_P(Backends, ActivationArguments, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- backward = derivative of forward (CPU, float64) --------------------------------
//
// The f64 kernels run the same formulas with std::exp. Central differences with
// h = 1e-5 err by at most h^2/6 max|gelu'''| (max|gelu'''| = 1.08, so 2e-11) plus the
// rounding of f(x +- h) over 2h (|gelu| <= 6 here: 4 * 2^-53 * 6 / 2e-5 = 1.3e-10), so a
// difference of 1e-9 (times |dy|) would be a wrong derivative.

TEST(ActivationGradients, BackwardIsTheDerivativeOfForward) {
  const std::int64_t n = 1025;
  const double h = 1e-5;
  auto points = testing::random_values(n, 11, -6.0, 6.0);
  points[0] = 0.0;
  points[1] = -0.75;  // near gelu's minimum, where gelu' crosses 0
  for (double& p : points) {
    if (std::fabs(p) < 1e-3) p += 2e-3;  // keep ReLU's kink out of [x - h, x + h]
  }
  const Tensor x = testing::make_tensor(points, {n}, DType::f64, Device::cpu());
  const Tensor dy = testing::random_tensor({n}, DType::f64, Device::cpu(), 12);
  const auto dys = testing::to_doubles(dy);
  using Forward = void (*)(const Tensor&, const Tensor&);
  using Backward = void (*)(const Tensor&, const Tensor&, const Tensor&);
  const std::pair<Forward, Backward> ops[] = {{gelu_forward, gelu_backward},
                                              {relu_forward, relu_backward}};
  for (const auto& [forward, backward] : ops) {
    std::vector<double> plus_points = points, minus_points = points;
    for (double& p : plus_points) p += h;
    for (double& p : minus_points) p -= h;
    Tensor plus({n}, DType::f64), minus({n}, DType::f64), dx({n}, DType::f64);
    // Each output depends on its own input only, so one shifted tensor gives every
    // element's difference at once.
    forward(testing::make_tensor(plus_points, {n}, DType::f64, Device::cpu()), plus);
    forward(testing::make_tensor(minus_points, {n}, DType::f64, Device::cpu()), minus);
    testing::poison(dx);
    backward(x, dy, dx);
    const auto f_plus = testing::to_doubles(plus), f_minus = testing::to_doubles(minus);
    std::vector<double> want(points.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = dys[i] * (f_plus[i] - f_minus[i]) / (2 * h);
    EXPECT_TRUE(testing::all_close(testing::to_doubles(dx), want,
                                   [&](std::size_t i) { return 1e-9 * std::fabs(dys[i]); }));
  }
}

// ---- every vector instruction set computes the same bits -----------------------------

TEST(ActivationSimd, EveryLevelGivesTheBaselineBits) {
  std::cout << "SIMD levels compared: baseline up to "
            << cpu::simd_level_name(cpu::simd_level_supported()) << "\n";
  const std::int64_t n = (1 << 16) + 77;
  for (const DType dtype : {DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto values = gelu_inputs(n, 13, dtype);
    values[100] = std::nan("");
    values[101] = kInf;
    const Tensor x = testing::make_tensor(values, {n}, dtype, Device::cpu());
    const Tensor dy = testing::random_tensor({n}, dtype, Device::cpu(), 14);
    // Outputs: gelu, gelu', relu, relu'. The NaN input may come out with another payload.
    testing::expect_every_simd_level_agrees(
        [&] {
          std::vector<Tensor> outputs;
          for (int k = 0; k < 4; ++k) outputs.emplace_back(Shape{n}, dtype);
          gelu_forward(x, outputs[0]);
          gelu_backward(x, dy, outputs[1]);
          relu_forward(x, outputs[2]);
          relu_backward(x, dy, outputs[3]);
          return outputs;
        },
        [](const Tensor& got, const Tensor& want) {
          return testing::same_bits_or_both_nan(got, want);
        });
  }
}

}  // namespace
}  // namespace bigbatch

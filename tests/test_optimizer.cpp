// optimizer: sgd_step and adamw_step against PyTorch's update rules, three ways:
//   1. bit for bit against PyTorch itself (reference vectors made with torch),
//   2. bit for bit against the same float32 op sequence written plainly below,
//   3. within a proven error bound of a float64 oracle, over several steps,
// plus the semantics that are easy to get wrong (the momentum buffer starts as the
// gradient, Nesterov, decoupled weight decay, AdamW's first step), the fp16 copy, odd
// sizes, and the argument checks. On CUDA the results must equal the CPU's bit for bit
// (the kernels use explicitly rounded intrinsics, see kernels/optimizer_math.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/optimizer.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

constexpr double kUnitRoundoff = 0x1p-24;  // fp32

// ---- problems and runs --------------------------------------------------------------

/// A parameter tensor's initial values and one gradient per step.
struct Problem {
  Shape shape;
  std::vector<float> param;
  std::vector<std::vector<float>> grads;
};

std::vector<float> random_floats(std::int64_t n, std::uint64_t seed, double lo = -1,
                                 double hi = 1) {
  const auto values = testing::random_values(n, seed, lo, hi);
  return {values.begin(), values.end()};
}

Problem random_problem(Shape shape, int steps, std::uint64_t seed) {
  const std::int64_t n = shape_numel(shape);
  Problem problem{shape, random_floats(n, seed), {}};
  for (int s = 0; s < steps; ++s) problem.grads.push_back(random_floats(n, seed + 1 + s));
  return problem;
}

/// The state after some steps, read back to the host.
struct OptimizerState {
  std::vector<float> param;
  std::vector<float> buffer1;  // SGD: momentum buffer; AdamW: exp_avg
  std::vector<float> buffer2;  // AdamW: exp_avg_sq
  std::vector<f16> half_copy;  // the last step's fp16 copy
};

/// sgd_step on `device`, one step per gradient. The momentum buffer is poisoned
/// before step 1 (which must overwrite it unread) and the fp16 copy before every step.
OptimizerState run_sgd(const Problem& problem, const SgdOptions& options, Device device) {
  const Tensor param = Tensor::from_vector(problem.param, problem.shape, device);
  const Tensor buffer(problem.shape, DType::f32, device);
  const Tensor half_copy(problem.shape, DType::f16, device);
  testing::poison(buffer);
  for (std::size_t s = 0; s < problem.grads.size(); ++s) {
    const Tensor grad = Tensor::from_vector(problem.grads[s], problem.shape, device);
    testing::poison(half_copy);
    sgd_step(param, grad, options.momentum != 0 ? buffer : Tensor{}, options,
             static_cast<std::int64_t>(s) + 1, half_copy);
  }
  return {param.to_vector<float>(), buffer.to_vector<float>(), {}, half_copy.to_vector<f16>()};
}

/// adamw_step on `device`, one step per gradient, moments starting at zero.
OptimizerState run_adamw(const Problem& problem, const AdamWOptions& options, Device device) {
  const Tensor param = Tensor::from_vector(problem.param, problem.shape, device);
  const Tensor exp_avg = Tensor::zeros(problem.shape, DType::f32, device);
  const Tensor exp_avg_sq = Tensor::zeros(problem.shape, DType::f32, device);
  const Tensor half_copy(problem.shape, DType::f16, device);
  for (std::size_t s = 0; s < problem.grads.size(); ++s) {
    const Tensor grad = Tensor::from_vector(problem.grads[s], problem.shape, device);
    testing::poison(half_copy);
    adamw_step(param, grad, exp_avg, exp_avg_sq, options, static_cast<std::int64_t>(s) + 1,
               half_copy);
  }
  return {param.to_vector<float>(), exp_avg.to_vector<float>(), exp_avg_sq.to_vector<float>(),
          half_copy.to_vector<f16>()};
}

template <class T>
::testing::AssertionResult same_bits(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  std::size_t failures = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && failures++ == 0) first = i;
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << got.size() << " elements differ in their bits; first at ["
         << first << "]: got " << std::hexfloat << static_cast<double>(got[first]) << ", want "
         << static_cast<double>(want[first]);
}

std::vector<f16> rounded_to_half(const std::vector<float>& values) {
  std::vector<f16> half(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) half[i] = static_cast<f16>(values[i]);
  return half;
}

// ---- the float32 op sequence, written plainly ---------------------------------------
// PyTorch's torch.optim code, op by op; each op rounds to float, and its Python scalar
// is rounded to float first. Where PyTorch's CPU kernels (AVX2) fuse a multiply-add,
// std::fma does (this file is compiled with -ffp-contract=off, so nothing else fuses):
// a.add(b, alpha=s) = fma(b, s, a); a.addcmul(b, c, value=s) = fma(s*b, c, a);
// a.lerp(b, w) = fma(w, b-a, a) for |w| < 0.5, else fma(w-1, b-a, b).

void plain_sgd_step(std::vector<float>& param, const std::vector<float>& grad,
                    std::vector<float>& buffer, const SgdOptions& o, std::int64_t step) {
  const auto weight_decay = static_cast<float>(o.weight_decay);
  const auto momentum = static_cast<float>(o.momentum);
  const auto one_minus_dampening = static_cast<float>(1 - o.dampening);
  const auto negative_lr = static_cast<float>(-o.lr);
  for (std::size_t i = 0; i < param.size(); ++i) {
    float d = grad[i];
    if (o.weight_decay != 0) d = std::fma(param[i], weight_decay, d);  // d.add(p, alpha=wd)
    if (o.momentum != 0) {
      buffer[i] = step == 1 ? d  // torch.clone(d)
                            : std::fma(d, one_minus_dampening, buffer[i] * momentum);
      d = o.nesterov ? std::fma(buffer[i], momentum, d) : buffer[i];
    }
    param[i] = std::fma(d, negative_lr, param[i]);  // p.add_(d, alpha=-lr)
  }
}

void plain_adamw_step(std::vector<float>& param, const std::vector<float>& grad,
                      std::vector<float>& exp_avg, std::vector<float>& exp_avg_sq,
                      const AdamWOptions& o, std::int64_t step) {
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  const auto decay = static_cast<float>(1 - o.lr * o.weight_decay);
  const auto weight = static_cast<float>(1 - o.beta1);
  const auto beta2 = static_cast<float>(o.beta2);
  const auto one_minus_beta2 = static_cast<float>(1 - o.beta2);
  const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const auto eps = static_cast<float>(o.eps);
  const auto negative_step_size = static_cast<float>(-(o.lr / bias_correction1));
  for (std::size_t i = 0; i < param.size(); ++i) {
    if (o.weight_decay != 0) param[i] = param[i] * decay;
    const float difference = grad[i] - exp_avg[i];
    exp_avg[i] = std::abs(weight) < 0.5f ? std::fma(weight, difference, exp_avg[i])
                                         : std::fma(weight - 1, difference, grad[i]);
    exp_avg_sq[i] = std::fma(one_minus_beta2 * grad[i], grad[i], exp_avg_sq[i] * beta2);
    const float denominator = std::sqrt(exp_avg_sq[i]) / bias_correction2_sqrt + eps;
    param[i] = param[i] + negative_step_size * exp_avg[i] / denominator;
  }
}

OptimizerState plain_sgd(const Problem& problem, const SgdOptions& options) {
  OptimizerState state{problem.param, std::vector<float>(problem.param.size()), {}, {}};
  for (std::size_t s = 0; s < problem.grads.size(); ++s) {
    plain_sgd_step(state.param, problem.grads[s], state.buffer1, options,
                   static_cast<std::int64_t>(s) + 1);
  }
  state.half_copy = rounded_to_half(state.param);
  return state;
}

OptimizerState plain_adamw(const Problem& problem, const AdamWOptions& options) {
  const std::vector<float> zeros(problem.param.size(), 0.0f);
  OptimizerState state{problem.param, zeros, zeros, {}};
  for (std::size_t s = 0; s < problem.grads.size(); ++s) {
    plain_adamw_step(state.param, problem.grads[s], state.buffer1, state.buffer2, options,
                     static_cast<std::int64_t>(s) + 1);
  }
  state.half_copy = rounded_to_half(state.param);
  return state;
}

// ---- the float64 oracle, with a running error bound ---------------------------------
// The oracle evaluates the same formulas in double and carries, for every value, a
// bound on how far the fp32 computation can be from it (running error analysis,
// Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.3).
// Each fp32 op adds the error propagated from its operands (the condition factor:
// |a|*err(b) + |b|*err(a) for a product, err(a)/|b| for a quotient, ...) plus its own
// rounding, at most u = 2^-24 times its result; a Python scalar rounded to float
// brings its own rounding error. So the bound is u times the number of ops per step
// and per step taken, each weighted by how much the formula amplifies it, and it
// stays tight where a relative tolerance would fail (lr*d cancelling most of param).
// The bound is rigorous (second-order terms included; no fp32 result here is
// subnormal, where rounding errors are absolute); the oracle's own double roundings
// (2^-53 relative each) are covered by 2^-50 |value|.

struct Bounded {
  double value;
  double error;  // |fp32 result - value| <= error
};

Bounded exact(float x) { return {x, 0}; }

/// A Python scalar as the fp32 kernel receives it.
Bounded float_scalar(double c) {
  return {c, std::abs(static_cast<double>(static_cast<float>(c)) - c)};
}

/// The result of one fp32 op whose exact value is `value` and whose operands' errors
/// move it by at most `propagated`.
Bounded rounded(double value, double propagated) {
  return {value, propagated + kUnitRoundoff * (std::abs(value) + propagated)};
}

double product_error(const Bounded& a, const Bounded& b) {
  return std::abs(a.value) * b.error + std::abs(b.value) * a.error + a.error * b.error;
}

Bounded operator*(const Bounded& a, const Bounded& b) {
  return rounded(a.value * b.value, product_error(a, b));
}
Bounded operator+(const Bounded& a, const Bounded& b) {
  return rounded(a.value + b.value, a.error + b.error);
}
Bounded operator-(const Bounded& a, const Bounded& b) {
  return rounded(a.value - b.value, a.error + b.error);
}
Bounded operator/(const Bounded& a, const Bounded& b) {
  const double quotient = a.value / b.value;
  const double margin = std::abs(b.value) - b.error;  // how far the divisor stays from 0
  EXPECT_GT(margin, 0) << "oracle: divisor's error bound reaches zero";
  return rounded(quotient, (a.error + std::abs(quotient) * b.error) / margin);
}
/// a*b + c rounded once.
Bounded fused(const Bounded& a, const Bounded& b, const Bounded& c) {
  return rounded(a.value * b.value + c.value, product_error(a, b) + c.error);
}
Bounded square_root(const Bounded& a) {
  const double root = std::sqrt(a.value);
  // |sqrt(a + d) - sqrt(a)| <= min(sqrt(|d|), |d| / sqrt(a))
  const double propagated =
      root > 0 ? std::min(std::sqrt(a.error), a.error / root) : std::sqrt(a.error);
  return rounded(root, propagated);
}

struct OracleState {
  std::vector<Bounded> param, buffer1, buffer2;
};

OracleState start_oracle(const Problem& problem) {
  OracleState state;
  for (const float p : problem.param) {
    state.param.push_back(exact(p));
    state.buffer1.push_back(exact(0));
    state.buffer2.push_back(exact(0));
  }
  return state;
}

OracleState oracle_sgd(const Problem& problem, const SgdOptions& o) {
  OracleState state = start_oracle(problem);
  const Bounded weight_decay = float_scalar(o.weight_decay), momentum = float_scalar(o.momentum);
  const Bounded one_minus_dampening = float_scalar(1 - o.dampening);
  const Bounded negative_lr = float_scalar(-o.lr);
  for (std::size_t s = 0; s < problem.grads.size(); ++s) {
    for (std::size_t i = 0; i < problem.param.size(); ++i) {
      Bounded& p = state.param[i];
      Bounded& buffer = state.buffer1[i];
      Bounded d = exact(problem.grads[s][i]);
      if (o.weight_decay != 0) d = fused(p, weight_decay, d);
      if (o.momentum != 0) {
        buffer = s == 0 ? d : fused(d, one_minus_dampening, buffer * momentum);
        d = o.nesterov ? fused(buffer, momentum, d) : buffer;
      }
      p = fused(d, negative_lr, p);
    }
  }
  return state;
}

OracleState oracle_adamw(const Problem& problem, const AdamWOptions& o) {
  OracleState state = start_oracle(problem);
  const Bounded decay = float_scalar(1 - o.lr * o.weight_decay);
  const Bounded weight = float_scalar(1 - o.beta1);
  const Bounded weight_minus_one = {weight.value - 1, weight.error};  // exact in fp32 (Sterbenz)
  const bool weight_is_small = static_cast<float>(weight.value) < 0.5f;
  const Bounded beta2 = float_scalar(o.beta2), one_minus_beta2 = float_scalar(1 - o.beta2);
  const Bounded eps = float_scalar(o.eps);
  for (std::size_t s = 0; s < problem.grads.size(); ++s) {
    const double step = static_cast<double>(s + 1);
    const Bounded bias_correction2_sqrt = float_scalar(std::sqrt(1 - std::pow(o.beta2, step)));
    const Bounded negative_step_size = float_scalar(-o.lr / (1 - std::pow(o.beta1, step)));
    for (std::size_t i = 0; i < problem.param.size(); ++i) {
      Bounded& p = state.param[i];
      Bounded& m = state.buffer1[i];
      Bounded& v = state.buffer2[i];
      const Bounded g = exact(problem.grads[s][i]);
      if (o.weight_decay != 0) p = p * decay;
      m = weight_is_small ? fused(weight, g - m, m) : fused(weight_minus_one, g - m, g);
      v = fused(one_minus_beta2 * g, g, v * beta2);
      p = p + negative_step_size * m / (square_root(v) / bias_correction2_sqrt + eps);
    }
  }
  return state;
}

::testing::AssertionResult within_bounds(const std::vector<float>& got,
                                         const std::vector<Bounded>& want) {
  std::vector<double> got_values(got.begin(), got.end()), want_values;
  for (const Bounded& b : want) want_values.push_back(b.value);
  return testing::all_close(got_values, want_values, [&](std::size_t i) {
    return want[i].error + 0x1p-50 * std::abs(want[i].value);
  });
}

// ---- the option sets the tests sweep ------------------------------------------------

struct SgdCase {
  const char* name;
  SgdOptions options;
};
std::vector<SgdCase> sgd_cases() {
  return {{"plain", {.lr = 0.1}},
          {"weight decay", {.lr = 0.1, .weight_decay = 0.05}},
          {"momentum", {.lr = 0.1, .momentum = 0.9}},
          {"momentum, dampening, weight decay",
           {.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 1e-2}},
          {"nesterov, weight decay",
           {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true}}};
}

struct AdamWCase {
  const char* name;
  AdamWOptions options;
};
std::vector<AdamWCase> adamw_cases() {
  return {
      {"defaults", {}},
      {"no weight decay", {.weight_decay = 0}},
      // 1 - beta1 = 0.5 and 1: the lerp takes its other branch, from the gradient
      {"beta1 0.5", {.lr = 1e-2, .beta1 = 0.5, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1}},
      {"beta1 0", {.lr = 1e-2, .beta1 = 0, .beta2 = 0.9, .weight_decay = 0.1}}};
}

// ---- tests ----------------------------------------------------------------------------

class Optimizer : public DeviceTest {};

/// The CPU instruction-set paths to test on `device`: every one this CPU supports
/// (portable included); CUDA has just one.
std::vector<cpu::OptimizerPath> paths_for(Device device) {
  if (device.is_cpu()) return cpu::optimizer_paths_supported();
  return {cpu::optimizer_path()};
}

// The deliberately odd sizes, as tensors of several ranks and non-square shapes.
std::vector<Shape> odd_shapes() { return {{1}, {7}, {25, 41}, {3, 5, 7}, {(1 << 20) + 3}}; }

TEST_P(Optimizer, SgdEqualsThePlainFloat32OpSequenceBitForBit) {
  for (const cpu::OptimizerPath path : paths_for(device())) {
    const cpu::ScopedOptimizerPath scoped_path(path);
    for (const Shape& shape : odd_shapes()) {
      const Problem problem = random_problem(shape, 3, 100);
      for (const SgdCase& c : sgd_cases()) {
        SCOPED_TRACE(::testing::Message() << c.name << " " << shape_string(shape) << " "
                                          << cpu::optimizer_path_name(path));
        const OptimizerState got = run_sgd(problem, c.options, device());
        const OptimizerState want = plain_sgd(problem, c.options);
        EXPECT_TRUE(same_bits(got.param, want.param));
        if (c.options.momentum != 0) {
          EXPECT_TRUE(same_bits(got.buffer1, want.buffer1));
        }
        EXPECT_TRUE(same_bits(got.half_copy, want.half_copy));
      }
    }
  }
}

TEST_P(Optimizer, AdamWEqualsThePlainFloat32OpSequenceBitForBit) {
  for (const cpu::OptimizerPath path : paths_for(device())) {
    const cpu::ScopedOptimizerPath scoped_path(path);
    for (const Shape& shape : odd_shapes()) {
      const Problem problem = random_problem(shape, 3, 200);
      for (const AdamWCase& c : adamw_cases()) {
        SCOPED_TRACE(::testing::Message() << c.name << " " << shape_string(shape) << " "
                                          << cpu::optimizer_path_name(path));
        const OptimizerState got = run_adamw(problem, c.options, device());
        const OptimizerState want = plain_adamw(problem, c.options);
        EXPECT_TRUE(same_bits(got.param, want.param));
        EXPECT_TRUE(same_bits(got.buffer1, want.buffer1));
        EXPECT_TRUE(same_bits(got.buffer2, want.buffer2));
        EXPECT_TRUE(same_bits(got.half_copy, want.half_copy));
      }
    }
  }
}

TEST_P(Optimizer, SgdStaysWithinTheErrorBoundOfTheFloat64Oracle) {
  const Problem problem = random_problem({25, 41}, 6, 300);
  for (const SgdCase& c : sgd_cases()) {
    SCOPED_TRACE(c.name);
    const OptimizerState got = run_sgd(problem, c.options, device());
    const OracleState want = oracle_sgd(problem, c.options);
    EXPECT_TRUE(within_bounds(got.param, want.param));
    if (c.options.momentum != 0) {
      EXPECT_TRUE(within_bounds(got.buffer1, want.buffer1));
    }
  }
}

TEST_P(Optimizer, AdamWStaysWithinTheErrorBoundOfTheFloat64Oracle) {
  const Problem problem = random_problem({25, 41}, 6, 400);
  for (const AdamWCase& c : adamw_cases()) {
    SCOPED_TRACE(c.name);
    const OptimizerState got = run_adamw(problem, c.options, device());
    const OracleState want = oracle_adamw(problem, c.options);
    EXPECT_TRUE(within_bounds(got.param, want.param));
    EXPECT_TRUE(within_bounds(got.buffer1, want.buffer1));
    EXPECT_TRUE(within_bounds(got.buffer2, want.buffer2));
  }
}

// torch.optim.SGD initialises the momentum buffer to the first direction (gradient
// plus weight decay), not to zero: the first step moves by lr*d, as plain SGD would.
TEST_P(Optimizer, SgdFirstStepStartsTheMomentumBufferAtTheGradient) {
  const Shape shape{1025};
  const auto param0 = random_floats(1025, 500), grad = random_floats(1025, 501);
  for (const double weight_decay : {0.0, 0.1}) {
    const SgdOptions options{.lr = 0.5, .momentum = 0.9, .weight_decay = weight_decay};
    const Tensor param = Tensor::from_vector(param0, shape, device());
    const Tensor buffer(shape, DType::f32, device());
    testing::poison(buffer);  // NaN: reading it at step 1 would show
    sgd_step(param, Tensor::from_vector(grad, shape, device()), buffer, options, 1);
    const auto got_param = param.to_vector<float>(), got_buffer = buffer.to_vector<float>();
    for (std::size_t i = 0; i < grad.size(); ++i) {
      const float d = weight_decay == 0 ? grad[i] : std::fma(param0[i], 0.1f, grad[i]);
      ASSERT_EQ(got_buffer[i], d) << i;
      ASSERT_EQ(got_param[i], std::fma(d, -0.5f, param0[i])) << i;
    }
  }
}

// Nesterov looks ahead: direction = d + momentum*buf, so step 1 (buf = g) moves by
// lr*(1 + momentum)*g rather than lr*g. Three roundings: u*(|g| + |p|) per op bounds them.
TEST_P(Optimizer, SgdNesterovFirstStepMovesByOnePlusMomentumTimesTheGradient) {
  const Shape shape{7};
  const auto param0 = random_floats(7, 600), grad = random_floats(7, 601);
  const SgdOptions options{.lr = 0.5, .momentum = 0.9, .nesterov = true};
  const Tensor param = Tensor::from_vector(param0, shape, device());
  const Tensor buffer(shape, DType::f32, device());
  sgd_step(param, Tensor::from_vector(grad, shape, device()), buffer, options, 1);
  const auto got = param.to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = param0[i] - 0.5 * 1.9 * grad[i];
    EXPECT_NEAR(got[i], want, testing::gamma(4, DType::f32) * (std::abs(grad[i]) + std::abs(want)))
        << i;
  }
}

// Without a gradient, SGD's weight decay alone shrinks param by (1 - lr*wd): the decay
// is added to the gradient, d = g + wd*p. Tolerance: two roundings, gamma(3) of |p|.
TEST_P(Optimizer, SgdWeightDecayShrinksTheParameter) {
  const Shape shape{7};
  const auto param0 = random_floats(7, 700);
  const SgdOptions options{.lr = 0.5, .weight_decay = 0.1};
  const Tensor param = Tensor::from_vector(param0, shape, device());
  sgd_step(param, Tensor::zeros(shape, DType::f32, device()), Tensor{}, options, 1);
  const auto got = param.to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], param0[i] * 0.95, testing::gamma(3, DType::f32) * std::abs(param0[i])) << i;
  }
}

// AdamW decouples the decay from the gradient: with a zero gradient the moments stay
// zero, the Adam update is 0/eps = 0, and param is exactly param*(1 - lr*wd) in fp32.
// (Coupled decay, Adam's g + wd*p, would instead move each param by about lr.)
TEST_P(Optimizer, AdamWWeightDecayIsDecoupled) {
  const Shape shape{1025};
  const auto param0 = random_floats(1025, 800);
  const AdamWOptions options{.lr = 0.1, .weight_decay = 0.5};
  const Tensor param = Tensor::from_vector(param0, shape, device());
  const Tensor exp_avg = Tensor::zeros(shape, DType::f32, device());
  const Tensor exp_avg_sq = Tensor::zeros(shape, DType::f32, device());
  adamw_step(param, Tensor::zeros(shape, DType::f32, device()), exp_avg, exp_avg_sq, options, 1);
  const auto got = param.to_vector<float>();
  const auto decay = static_cast<float>(1 - 0.1 * 0.5);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], param0[i] * decay) << i;
  for (const double m : testing::to_doubles(exp_avg)) ASSERT_EQ(m, 0.0);
  for (const double v : testing::to_doubles(exp_avg_sq)) ASSERT_EQ(v, 0.0);
}

// Bias correction makes AdamW's first step lr*sign(g), whatever the gradient's scale:
// m = (1-b1)g and v = (1-b2)g^2 divided by (1-b1) and sqrt(1-b2) give g/(|g| + eps).
// Tolerance: about ten fp32 roundings in the update (gamma(10) of lr), the eps term
// (lr*eps/|g|), and the roundings of p*decay and the final add (2u|p|).
TEST_P(Optimizer, AdamWFirstStepMovesEachParameterByLrTimesTheGradientSign) {
  const std::int64_t n = 1025;
  const auto param0 = random_floats(n, 900);
  const auto magnitudes = random_floats(n, 901, 0.25, 1.0);
  for (const float scale : {1e-3f, 1.0f, 1e3f}) {
    std::vector<float> grad(n);
    for (std::int64_t i = 0; i < n; ++i) grad[i] = (i % 2 ? -scale : scale) * magnitudes[i];
    const AdamWOptions options{.lr = 1e-2, .weight_decay = 0.1};
    const Tensor param = Tensor::from_vector(param0, {n}, device());
    const Tensor exp_avg = Tensor::zeros({n}, DType::f32, device());
    const Tensor exp_avg_sq = Tensor::zeros({n}, DType::f32, device());
    adamw_step(param, Tensor::from_vector(grad, {n}, device()), exp_avg, exp_avg_sq, options, 1);
    const auto got = param.to_vector<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      const double want = param0[i] * (1 - 1e-2 * 0.1) - 1e-2 * (grad[i] > 0 ? 1 : -1);
      const double tolerance = 1e-2 * (testing::gamma(10, DType::f32) + 1e-8 / std::abs(grad[i])) +
                               2 * kUnitRoundoff * std::abs(param0[i]);
      ASSERT_NEAR(got[i], want, tolerance) << "scale " << scale << ", element " << i;
    }
  }
}

// The fp16 working copy is the updated param rounded to nearest even, across the whole
// fp16 range: values that flush to zero, subnormals, normals, overflow to infinity.
// Parameters and gradients span 2^-30 .. 2^17 together, and the steps are small
// (SGD: lr 1e-3 of a gradient of the parameter's size; AdamW: lr 1e-10), so the
// updated parameters still span that range.
TEST_P(Optimizer, HalfCopyIsTheUpdatedParameterRoundedToHalf) {
  const std::int64_t n = 1025;
  Problem problem = random_problem({n}, 2, 1000);
  for (std::int64_t i = 0; i < n; ++i) {
    const float scale = std::ldexp(1.0f, static_cast<int>(i % 48) - 30);
    problem.param[i] *= scale;
    for (auto& grad : problem.grads) grad[i] *= scale;
  }
  const SgdOptions sgd{.lr = 1e-3, .momentum = 0.9};
  EXPECT_TRUE(
      same_bits(run_sgd(problem, sgd, device()).half_copy, plain_sgd(problem, sgd).half_copy));
  const AdamWOptions adamw{.lr = 1e-10};
  EXPECT_TRUE(same_bits(run_adamw(problem, adamw, device()).half_copy,
                        plain_adamw(problem, adamw).half_copy));
}

TEST_P(Optimizer, HalfCopyDoesNotChangeTheUpdate) {
  const Problem problem = random_problem({1025}, 2, 1100);
  for (const bool with_half : {false, true}) {
    const Tensor param = Tensor::from_vector(problem.param, problem.shape, device());
    const Tensor exp_avg = Tensor::zeros(problem.shape, DType::f32, device());
    const Tensor exp_avg_sq = Tensor::zeros(problem.shape, DType::f32, device());
    const Tensor half = with_half ? Tensor(problem.shape, DType::f16, device()) : Tensor{};
    for (std::int64_t s = 0; s < 2; ++s) {
      const Tensor grad = Tensor::from_vector(problem.grads[s], problem.shape, device());
      adamw_step(param, grad, exp_avg, exp_avg_sq, AdamWOptions{}, s + 1, half);
    }
    EXPECT_TRUE(same_bits(param.to_vector<float>(), plain_adamw(problem, {}).param)) << with_half;
  }
}

// Without momentum the buffer is neither read nor written: a poisoned one stays poisoned.
TEST_P(Optimizer, SgdWithoutMomentumLeavesTheBufferAlone) {
  const Problem problem = random_problem({7}, 2, 1200);
  const SgdOptions options{.lr = 0.1, .weight_decay = 0.01};
  const Tensor param = Tensor::from_vector(problem.param, problem.shape, device());
  const Tensor buffer(problem.shape, DType::f32, device());
  testing::poison(buffer);
  for (std::int64_t s = 0; s < 2; ++s) {
    sgd_step(param, Tensor::from_vector(problem.grads[s], problem.shape, device()), buffer, options,
             s + 1);
  }
  EXPECT_TRUE(same_bits(param.to_vector<float>(), plain_sgd(problem, options).param));
  for (const double b : testing::to_doubles(buffer)) EXPECT_TRUE(std::isnan(b));
}

TEST_P(Optimizer, EmptyTensorsAreANoOp) {
  const Tensor empty({0, 3}, DType::f32, device());
  const Tensor empty_half({0, 3}, DType::f16, device());
  sgd_step(empty, empty.clone(), empty.clone(), {.momentum = 0.9}, 1, empty_half);
  adamw_step(empty, empty.clone(), empty.clone(), empty.clone(), {}, 1, empty_half);
}

// ---- PyTorch's own results --------------------------------------------------------------
// Made with PyTorch 1.13.1 (Debian python3-torch, CPU, AVX2 kernels) by this script:
//
//   import math, torch
//   torch.set_num_threads(1)
//   n = 19  # 16 elements go through PyTorch's AVX2 vector loop, 3 through its scalar tail
//   gen = torch.Generator().manual_seed(2024)
//   param0 = torch.randn(n, generator=gen)
//   grads = [torch.randn(n, generator=gen) for _ in range(3)]
//   def sgd(**options):
//       p = param0.clone().requires_grad_()
//       opt = torch.optim.SGD([p], foreach=False, **options)
//       for g in grads:
//           p.grad = g.clone()
//           opt.step()
//       return p.detach(), opt.state[p]['momentum_buffer']
//   def adamw_pytorch2(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
//       # PyTorch 2.x's _single_tensor_adam(w), op for op; torch 1.13's own AdamW uses
//       # exp_avg.mul_(beta1).add_(grad, alpha=1-beta1) instead of lerp_
//       p, m, v = param0.clone(), torch.zeros(n), torch.zeros(n)
//       for step, g in enumerate(grads, 1):
//           p.mul_(1 - lr * weight_decay)
//           m.lerp_(g, 1 - beta1)
//           v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
//           step_size = lr / (1 - beta1 ** float(step))
//           denom = (v.sqrt() / math.sqrt(1 - beta2 ** float(step))).add_(eps)
//           p.addcdiv_(m, denom, value=-step_size)
//       return p, m, v
//   # printed with float.hex: param0, grads, then
//   #   sgd(lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=False)     -> kSgdMomentum*
//   #   sgd(lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)      -> kSgdNesterov*
//   #   sgd(lr=0.1, momentum=0.9, weight_decay=1e-4, dampening=0.5)      -> kSgdDampening*
//   #   adamw_pytorch2()                                                  -> kAdamW*
namespace pytorch {
constexpr float kParam0[19] = {-0x1.39ea92p+0f, -0x1.313a5ep-7f, 0x1.8abdc2p+0f,  0x1.a857f2p-2f,
                               0x1.db51eep+0f,  0x1.fa42dap+0f,  -0x1.ba871ap-2f, 0x1.5de136p+0f,
                               0x1.6d1852p-1f,  -0x1.8c3afap-2f, -0x1.038f92p-2f, -0x1.4ef7dp+0f,
                               0x1.fe0bbcp-1f,  0x1.e0ceb8p-1f,  0x1.6a2d3ap+0f,  0x1.44c7aap-1f,
                               -0x1.3e08dp-4f,  -0x1.1e1746p+0f, -0x1.4bd46ep-1f};
constexpr float kGrad1[19] = {0x1.9848d2p-5f,  0x1.49cf2p+0f,  -0x1.4c53a6p-1f, -0x1.98b4e4p-1f,
                              0x1.0b531cp+0f,  0x1.22b996p+0f, 0x1.b03ec8p-1f,  0x1.759f52p+0f,
                              0x1.5f0d02p-3f,  0x1.ecd344p-3f, -0x1.e8e1fcp-1f, -0x1.63a288p-5f,
                              0x1.12ba18p-1f,  0x1.381b6ep+1f, -0x1.6b88e2p-1f, 0x1.165fep-1f,
                              -0x1.e77bbap+0f, 0x1.213b98p-1f, 0x1.498cd8p-1f};
constexpr float kGrad2[19] = {0x1.92fa12p-4f,  -0x1.37355cp-3f, -0x1.d19804p+0f, -0x1.40f9fp-1f,
                              0x1.cd4dep-1f,   -0x1.cc8e4cp-1f, 0x1.0081a2p-2f,  -0x1.0072e6p-1f,
                              -0x1.4cf9bcp-1f, -0x1.9087d8p-3f, 0x1.7da584p-1f,  0x1.ec685p-2f,
                              0x1.0a9ed6p-4f,  -0x1.21c36ap-1f, 0x1.5af4e2p+0f,  -0x1.6db954p-4f,
                              0x1.0b740ep-2f,  0x1.0e738cp-1f,  0x1.e44c22p-1f};
constexpr float kGrad3[19] = {0x1.211838p+0f,  0x1.a40a64p-6f,  0x1.b021ep+0f,   0x1.12bed4p+0f,
                              0x1.5d201ep+0f,  0x1.05ccfep-2f,  -0x1.75ba66p+0f, 0x1.54e4a6p-1f,
                              0x1.1891c6p-1f,  -0x1.ff15e2p-3f, 0x1.91316p-2f,   0x1.a95f52p+0f,
                              -0x1.973296p-1f, -0x1.bf44acp-1f, 0x1.2ea92cp+0f,  -0x1.78715ap-6f,
                              0x1.9248e8p+0f,  -0x1.9fd1fp+0f,  -0x1.5de3fep+0f};
constexpr float kSgdMomentumParam[19] = {
    -0x1.5f0d12p+0f, -0x1.541b42p-2f, 0x1.e4ff74p+0f,  0x1.48f432p-1f, 0x1.441cfcp+0f,
    0x1.d0a7aap+0f,  -0x1.2002b8p-1f, 0x1.ffdbp-1f,    0x1.787fcep-1f, -0x1.8f616cp-2f,
    -0x1.677082p-3f, -0x1.8ddd2cp+0f, 0x1.d5f47p-1f,   0x1.e47c42p-2f, 0x1.3b3a26p+0f,
    0x1.032f82p-1f,  0x1.da6192p-3f,  -0x1.356048p+0f, -0x1.bb27eap-1f};
constexpr float kSgdMomentumBuffer[19] = {
    0x1.4202d4p+0f, 0x1.dd6044p-1f,  -0x1.e58348p-2f, -0x1.1978ep-3f, 0x1.82aeap+1f,
    0x1.77463ep-2f, -0x1.19fbacp-1f, 0x1.65c3aap+0f,  0x1.a0a1fp-4f,  -0x1.d8996p-3f,
    0x1.281db4p-2f, 0x1.0789p+1f,    -0x1.35167p-2f,  0x1.2f4526p-1f, 0x1.d3ca3ap+0f,
    0x1.595p-2f,    0x1.0e6e8p-2f,   -0x1.621f0cp-1f, 0x1.7582p-8f};
constexpr float kSgdNesterovParam[19] = {
    -0x1.7c083p+0f,  -0x1.aa0776p-2f, 0x1.efebap+0f,   0x1.4f48eap-1f, 0x1.fd0612p-1f,
    0x1.c83648p+0f,  -0x1.06a156p-1f, 0x1.bf75dcp-1f,  0x1.73cfd8p-1f, -0x1.7a1ceap-2f,
    -0x1.9cbedep-3f, -0x1.bd4cd4p+0f, 0x1.e3dd6cp-1f,  0x1.ade7dcp-2f, 0x1.11203ap+0f,
    0x1.e74b8ap-2f,  0x1.a9b058p-3f,  -0x1.257098p+0f, -0x1.bb6a9cp-1f};
constexpr float kSgdNesterovBuffer[19] = {
    0x1.4202b8p+0f, 0x1.dd5db8p-1f,  -0x1.e57c28p-2f, -0x1.196f2p-3f, 0x1.82addp+1f,
    0x1.77438cp-2f, -0x1.19fdc2p-1f, 0x1.65c268p+0f,  0x1.a0a53p-4f,  -0x1.d89a82p-3f,
    0x1.282002p-2f, 0x1.0788e2p+1f,  -0x1.3518dcp-2f, 0x1.2f40a2p-1f, 0x1.d3ca3p+0f,
    0x1.594de4p-2f, 0x1.0e75f8p-2f,  -0x1.6220dep-1f, 0x1.7446p-8f};
constexpr float kSgdDampeningParam[19] = {
    -0x1.4e355p+0f,  -0x1.61942ap-2f, 0x1.ce6124p+0f,  0x1.45f096p-1f, 0x1.6b7cd4p+0f,
    0x1.be0edap+0f,  -0x1.39341ap-1f, 0x1.f88bep-1f,   0x1.66e682p-1f, -0x1.af306p-2f,
    -0x1.5c9956p-4f, -0x1.6ce7d4p+0f, 0x1.c4c496p-1f,  0x1.80b69p-2f,  0x1.6b538ep+0f,
    0x1.fc846ap-2f,  0x1.570ed4p-2f,  -0x1.3d533ep+0f, -0x1.b0247cp-1f};
constexpr float kSgdDampeningBuffer[19] = {
    0x1.4c520ap-1f,  0x1.f9d53ep-1f,  -0x1.ffe1b4p-2f, -0x1.9167ap-2f, 0x1.eef7eep+0f,
    0x1.49587ap-1f,  0x1.10791p-4f,   0x1.4a368ap+0f,  0x1.ecc76cp-4f, -0x1.25e858p-6f,
    -0x1.efe422p-3f, 0x1.03055ap+0f,  0x1.101b2p-4f,   0x1.48a23ap+0f, 0x1.4096e8p-1f,
    0x1.8e2a6ap-2f,  -0x1.47413ep-1f, -0x1.df8d1p-4f,  0x1.0dd448p-2f};
constexpr float kAdamWParam[19] = {
    -0x1.3a9776p+0f, -0x1.73fdb6p-7f, 0x1.8b40bp+0f,   0x1.aa6d0ep-2f, 0x1.da8a68p+0f,
    0x1.f9eeep+0f,   -0x1.bc33a4p-2f, 0x1.5d6072p+0f,  0x1.6cd094p-1f, -0x1.8cea34p-2f,
    -0x1.029b26p-2f, -0x1.4f1226p+0f, 0x1.fd3c2p-1f,   0x1.dff5bep-1f, 0x1.6a2d92p+0f,
    0x1.43c806p-1f,  -0x1.37e71cp-4f, -0x1.1e87e6p+0f, -0x1.4cd744p-1f};
constexpr float kAdamWExpAvg[19] = {
    0x1.01ad6ap-3f, 0x1.7dea82p-4f,  -0x1.84c84p-5f,  -0x1.c2d13p-7f, 0x1.354c52p-2f,
    0x1.2bcc9cp-5f, -0x1.c30e3ep-5f, 0x1.1e249ap-3f,  0x1.4caac2p-7f, -0x1.79e652p-6f,
    0x1.d9ddd8p-6f, 0x1.a5bac8p-3f,  -0x1.eef4ecp-6f, 0x1.e51334p-5f, 0x1.7626f2p-3f,
    0x1.141ef4p-5f, 0x1.b0a44cp-6f,  -0x1.1b2a1p-4f,  0x1.35774cp-11f};
constexpr float kAdamWExpAvgSq[19] = {
    0x1.517ccap-10f, 0x1.b8722p-10f, 0x1.aedab2p-8f,  0x1.1dc8fcp-9f,  0x1.ecb5f8p-9f,
    0x1.1b38a8p-9f,  0x1.7ccafap-9f, 0x1.71955ap-9f,  0x1.8a55fap-11f, 0x1.4bee98p-13f,
    0x1.a846a4p-10f, 0x1.88685cp-9f, 0x1.e47caep-11f, 0x1.cbd8b8p-8f,  0x1.e9abb8p-9f,
    0x1.3e4132p-12f, 0x1.9376d8p-8f, 0x1.a817ap-9f,   0x1.a031d8p-9f};
}  // namespace pytorch

TEST_P(Optimizer, MatchesPyTorchBitForBit) {
  const auto vec = [](const float(&values)[19]) { return std::vector<float>(values, values + 19); };
  const Problem problem{{19},
                        vec(pytorch::kParam0),
                        {vec(pytorch::kGrad1), vec(pytorch::kGrad2), vec(pytorch::kGrad3)}};
  struct SgdExpectation {
    SgdOptions options;
    const float (&param)[19];
    const float (&buffer)[19];
  };
  const SgdExpectation sgd_expectations[] = {
      {{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4},
       pytorch::kSgdMomentumParam,
       pytorch::kSgdMomentumBuffer},
      {{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true},
       pytorch::kSgdNesterovParam,
       pytorch::kSgdNesterovBuffer},
      {{.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 1e-4},
       pytorch::kSgdDampeningParam,
       pytorch::kSgdDampeningBuffer}};
  for (const cpu::OptimizerPath path : paths_for(device())) {
    const cpu::ScopedOptimizerPath scoped_path(path);
    SCOPED_TRACE(cpu::optimizer_path_name(path));
    for (const SgdExpectation& e : sgd_expectations) {
      const OptimizerState got = run_sgd(problem, e.options, device());
      EXPECT_TRUE(same_bits(got.param, vec(e.param)))
          << "nesterov " << e.options.nesterov << ", dampening " << e.options.dampening;
      EXPECT_TRUE(same_bits(got.buffer1, vec(e.buffer)));
    }
    const OptimizerState got = run_adamw(problem, AdamWOptions{}, device());
    EXPECT_TRUE(same_bits(got.param, vec(pytorch::kAdamWParam)));
    EXPECT_TRUE(same_bits(got.buffer1, vec(pytorch::kAdamWExpAvg)));
    EXPECT_TRUE(same_bits(got.buffer2, vec(pytorch::kAdamWExpAvgSq)));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Optimizer, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- argument checks (on the CPU: they run before any dispatch) -------------------------

template <class Call>
void expect_invalid(Call call, const std::string& message_part) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning \"" << message_part << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
  }
}

TEST(OptimizerChecks, RejectsMismatchedTensors) {
  const Tensor p = Tensor::zeros({4, 3}, DType::f32), g = Tensor::zeros({4, 3}, DType::f32);
  const Tensor m = Tensor::zeros({4, 3}, DType::f32), v = Tensor::zeros({4, 3}, DType::f32);
  const Tensor wrong_shape = Tensor::zeros({3, 4}, DType::f32);
  const Tensor wrong_dtype = Tensor::zeros({4, 3}, DType::f64);
  const SgdOptions momentum{.momentum = 0.9};
  expect_invalid([&] { sgd_step(p, wrong_shape, m, momentum, 1); }, "grad must have shape [4, 3]");
  expect_invalid([&] { sgd_step(p, g, wrong_dtype, momentum, 1); }, "momentum_buffer must be f32");
  expect_invalid([&] { sgd_step(p, g, Tensor{}, momentum, 1); }, "needs a momentum_buffer");
  expect_invalid([&] { sgd_step(wrong_dtype, g, m, momentum, 1); }, "param must be f32");
  expect_invalid([&] { sgd_step(Tensor{}, g, m, momentum, 1); }, "param is an undefined tensor");
  expect_invalid([&] { sgd_step(p, g, m, momentum, 1, wrong_dtype); }, "half_copy must be f16");
  expect_invalid([&] { sgd_step(p, g, m, momentum, 1, Tensor::zeros({12}, DType::f16)); },
                 "half_copy must have shape [4, 3]");
  expect_invalid([&] { adamw_step(p, g, m, wrong_shape, {}, 1); }, "exp_avg_sq must have shape");
  expect_invalid([&] { adamw_step(p, g, Tensor{}, v, {}, 1); }, "exp_avg is an undefined tensor");
  expect_invalid([&] { adamw_step(p, p, m, v, {}, 1); }, "param and grad share memory");
  expect_invalid([&] { adamw_step(p, g, m, m, {}, 1); }, "exp_avg and exp_avg_sq share memory");
  const Tensor view_of_p = p.reshaped({4, 3});
  expect_invalid([&] { sgd_step(p, g, view_of_p, momentum, 1); },
                 "param and momentum_buffer share memory");
}

TEST(OptimizerChecks, RejectsWhatPyTorchRejects) {
  const Tensor p = Tensor::zeros({5}, DType::f32), g = Tensor::zeros({5}, DType::f32);
  const Tensor m = Tensor::zeros({5}, DType::f32), v = Tensor::zeros({5}, DType::f32);
  expect_invalid([&] { sgd_step(p, g, m, {.lr = -0.1}, 1); }, "invalid learning rate");
  expect_invalid([&] { sgd_step(p, g, m, {.lr = std::nan("")}, 1); }, "invalid learning rate");
  expect_invalid([&] { sgd_step(p, g, m, {.momentum = -0.5}, 1); }, "invalid momentum");
  expect_invalid([&] { sgd_step(p, g, m, {.weight_decay = -1e-4}, 1); }, "invalid weight_decay");
  expect_invalid([&] { sgd_step(p, g, m, {.nesterov = true}, 1); }, "Nesterov momentum requires");
  expect_invalid(
      [&] { sgd_step(p, g, m, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}, 1); },
      "Nesterov momentum requires");
  expect_invalid([&] { sgd_step(p, g, m, {}, 0); }, "step counts optimizer steps from 1");
  expect_invalid([&] { adamw_step(p, g, m, v, {.lr = -1e-3}, 1); }, "invalid learning rate");
  expect_invalid([&] { adamw_step(p, g, m, v, {.eps = -1e-8}, 1); }, "invalid eps");
  expect_invalid([&] { adamw_step(p, g, m, v, {.beta1 = 1.0}, 1); }, "invalid beta1");
  expect_invalid([&] { adamw_step(p, g, m, v, {.beta1 = -0.1}, 1); }, "invalid beta1");
  expect_invalid([&] { adamw_step(p, g, m, v, {.beta2 = 1.0}, 1); }, "invalid beta2");
  expect_invalid([&] { adamw_step(p, g, m, v, {.weight_decay = -0.1}, 1); },
                 "invalid weight_decay");
  expect_invalid([&] { adamw_step(p, g, m, v, {}, -3); }, "step counts optimizer steps from 1");
}

TEST(OptimizerChecks, ThePortablePathIsAlwaysAvailable) {
  const auto paths = cpu::optimizer_paths_supported();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), cpu::OptimizerPath::portable);
  EXPECT_EQ(cpu::optimizer_path(), paths.back());
}

TEST(OptimizerChecks, RejectsTensorsOnAnotherDevice) {
  std::string why_not;
  if (!cuda_rt::available(&why_not)) GTEST_SKIP() << "CUDA test skipped: " << why_not;
  const Tensor p = Tensor::zeros({5}, DType::f32), m = Tensor::zeros({5}, DType::f32);
  const Tensor g_on_gpu = Tensor::zeros({5}, DType::f32, Device::cuda());
  expect_invalid([&] { sgd_step(p, g_on_gpu, m, {.momentum = 0.9}, 1); }, "grad must be on cpu");
}

}  // namespace
}  // namespace bigbatch

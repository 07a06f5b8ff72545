// Softmax cross-entropy: the loss and its gradient against a float64 oracle, the gradient
// against finite differences of the loss, large logits, label checks, the global count and
// the loss scale (micro-batch gradients bit for bit, exact power-of-two scaling), accuracy
// counting, and known answers from PyTorch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/data/dataset.hpp"
#include "kernels/cross_entropy.hpp"
#include "tests/finite_difference.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

/// The precision the kernel computes in: f64 for f64 logits, f32 otherwise.
DType compute_dtype(DType data) { return data == DType::f64 ? DType::f64 : DType::f32; }

double gamma(double n, DType dtype) { return testing::gamma(static_cast<std::int64_t>(n), dtype); }

/// Relative error of one call to exp or log: 2 ulps, the largest documented maximum error of
/// expf and logf in glibc and in CUDA (one ulp is at most 2u).
double function_error(DType compute) { return 4 * testing::unit_roundoff(compute); }

/// The smallest subnormal. A product or quotient that lands among the subnormals is off by
/// at most half of it (absolute), on top of the relative error u of normal results; exp and
/// log, by at most all of it.
double underflow(DType compute) { return compute == DType::f64 ? 0x1p-1074 : 0x1p-149; }

// ---- the problem ------------------------------------------------------------------------

struct Problem {
  std::int64_t M = 0, C = 0;
  DType dtype = DType::f32;
  std::vector<double> logits;       // [M, C], exactly the values the kernel sees
  std::vector<std::int32_t> labels;  // [M]
};

/// Logits uniform in [-spread, spread) rounded to the dtype, labels uniform in [0, C).
Problem make_problem(std::int64_t M, std::int64_t C, DType dtype, std::uint64_t seed,
                     double spread = 4) {
  Problem p{M, C, dtype, {}, {}};
  p.logits = testing::to_doubles(testing::make_tensor(
      testing::random_values(M * C, seed, -spread, spread), {M * C}, dtype, Device::cpu()));
  for (const double u : testing::random_values(M, seed + 1, 0, 1)) {
    p.labels.push_back(static_cast<std::int32_t>(u * static_cast<double>(C)));
  }
  return p;
}

Tensor logits_tensor(const Problem& p, Device device) {
  return testing::make_tensor(p.logits, {p.M, p.C}, p.dtype, device);
}
Tensor labels_tensor(const Problem& p, Device device) {
  return Tensor::from_vector(p.labels, {p.M}, device);
}

// ---- the oracle and its error bounds --------------------------------------------------------
//
// Per row, with m the max logit, t_c = z_c - m, s = sum exp(t_c), unit roundoff u and
// phi = function_error() (the kernel's steps, as in cross_entropy.hpp):
//  - fl(t_c) = t_c (1 + d), |d| <= u, so fl(exp(fl(t_c))) = exp(t_c)(1 + alpha_c) with
//    alpha_c <= expm1(u |t_c|) + phi (1 + expm1(u |t_c|)), plus an underflow of at most the
//    smallest subnormal ("tiny");
//  - the sum of C such terms: |s^ - s| <= E_s = sum(alpha_c e_c + tiny) + gamma(C - 1)(s + ...),
//    rho = E_s / s (s >= 1, the max's term being exp(0) = 1 exactly);
//  - fl(log(s^)) is off from log(s) by at most rho / (1 - rho) + phi (|log s| + rho/(1 - rho));
//  - loss_i = fl(fl(m - z_label) + log): (e_log + u |m - z_label|)(1 + u) + u |loss_i|;
//  - the total over rows (any order): sum e_i + gamma(M - 1) sum(|loss_i| + e_i);
//  - loss += total * factor, factor = fl(scale / count): |f| e_total (1 + gamma(3)) +
//    gamma(3)(|total f| + |loss0|);
//  - the gradient p_c = fl(e_c^ / s^) has relative error pi_c = (1 + alpha_c)(1 + rho')(1 + u) - 1,
//    rho' = rho / (1 - rho), and absolute underflow errors of tiny (exp) + tiny/2 (division):
//    e_p = pi_c p + 1.5 tiny; then fl(fl(p - onehot) f^) is off by
//    |f| [(e_p (1 + u) + u |p - onehot|)(1 + gamma(2)) + gamma(2) |p - onehot|] + tiny/2
//    (the last term: the product's own underflow, not scaled by f; see gradient_error()).
struct Reference {
  std::vector<double> row_loss, row_loss_error;  // [M]
  std::vector<double> dlogits, dlogits_error;    // [M, C] (for factor 1)
};

Reference reference(const Problem& p, DType compute) {
  const double u = testing::unit_roundoff(compute), phi = function_error(compute);
  const double tiny = underflow(compute);
  Reference ref;
  for (std::int64_t i = 0; i < p.M; ++i) {
    const double* z = &p.logits[i * p.C];
    const double m = *std::max_element(z, z + p.C);
    std::vector<double> e(p.C), alpha(p.C);
    double s = 0, s_error = 0;
    for (std::int64_t c = 0; c < p.C; ++c) {
      const double t = z[c] - m;
      e[c] = std::exp(t);
      alpha[c] = std::expm1(u * std::abs(t)) + phi * (1 + std::expm1(u * std::abs(t)));
      s += e[c];
      s_error += alpha[c] * e[c] + tiny;
    }
    s_error += gamma(p.C - 1, compute) * (s + s_error);
    const double rho = s_error / s;
    const double rho_prime = rho / (1 - rho);
    const double log_error = rho_prime + phi * (std::abs(std::log(s)) + rho_prime);
    const double gap = m - z[p.labels[i]];
    const double loss = gap + std::log(s);
    ref.row_loss.push_back(loss);
    ref.row_loss_error.push_back((log_error + u * gap) * (1 + u) + u * std::abs(loss) + tiny);
    for (std::int64_t c = 0; c < p.C; ++c) {
      const double probability = e[c] / s;
      const double target = c == p.labels[i] ? 1.0 : 0.0;
      const double pi = (1 + alpha[c]) * (1 + rho_prime) * (1 + u) - 1;
      const double e_p = pi * probability + 1.5 * tiny;
      const double difference = std::abs(probability - target);
      ref.dlogits.push_back(probability - target);
      ref.dlogits_error.push_back((e_p * (1 + u) + u * difference) * (1 + gamma(2, compute)) +
                                  gamma(2, compute) * difference);
    }
  }
  return ref;
}

/// The bound on |dlogits[k] - exact| for the multiplier `factor`, from reference(p, compute).
double gradient_error(const Reference& ref, std::size_t k, double factor, DType compute) {
  return std::abs(factor) * ref.dlogits_error[k] + 0.5 * underflow(compute);
}

/// The loss after `loss += total * scale / count`, and its error bound (kernel + oracle).
struct ExpectedLoss {
  double value, error;
};

ExpectedLoss expected_loss(const Problem& p, double loss0, float count, float scale) {
  const double factor = static_cast<double>(scale) / static_cast<double>(count);
  ExpectedLoss out{loss0, 0};
  double total = 0;
  for (const double l : reference(p, compute_dtype(p.dtype)).row_loss) total += l;
  out.value += total * factor;
  for (const DType d : {compute_dtype(p.dtype), DType::f64}) {  // the kernel's, the oracle's
    const Reference ref = reference(p, d);
    double error = 0, magnitude = 0;
    for (std::int64_t i = 0; i < p.M; ++i) {
      error += ref.row_loss_error[i];
      magnitude += std::abs(ref.row_loss[i]) + ref.row_loss_error[i];
    }
    error += gamma(p.M - 1, d) * magnitude;
    out.error += std::abs(factor) * error * (1 + gamma(3, d)) +
                 gamma(3, d) * (std::abs(total * factor) + std::abs(loss0));
  }
  return out;
}

double run_loss(const Problem& p, Device device, double loss0, float count, float scale) {
  const Tensor loss = testing::make_tensor({loss0}, {1}, compute_dtype(p.dtype), device);
  cross_entropy_forward(logits_tensor(p, device), labels_tensor(p, device), loss, count, scale);
  return testing::to_doubles(loss)[0];
}

Tensor run_gradient(const Problem& p, Device device, float count, float scale) {
  const Tensor dlogits({p.M, p.C}, compute_dtype(p.dtype), device);
  testing::poison(dlogits);
  cross_entropy_backward(logits_tensor(p, device), labels_tensor(p, device), dlogits, count,
                         scale);
  return dlogits;
}

class CrossEntropy : public DeviceTest {};

const std::vector<std::pair<std::int64_t, std::int64_t>> kShapes = {
    {1, 1}, {1, 10}, {7, 10}, {7, 1000}, {1025, 10}, {1025, 1000}};

// ---- forward and backward against the oracle -------------------------------------------------

void expect_loss_matches_oracle(const Problem& p, Device device, float count, float scale) {
  SCOPED_TRACE(::testing::Message() << dtype_name(p.dtype) << " [" << p.M << ", " << p.C
                                    << "] count " << count << " scale " << scale << " on "
                                    << device.name());
  const double loss0 = 0.25;  // the loss accumulates
  const ExpectedLoss want = expected_loss(p, loss0, count, scale);
  const double got = run_loss(p, device, loss0, count, scale);
  EXPECT_TRUE(testing::all_close({got}, {want.value}, [&](std::size_t) { return want.error; }));
  if (device.is_cuda()) {
    const double cpu = run_loss(p, Device::cpu(), loss0, count, scale);
    EXPECT_TRUE(testing::all_close({got}, {cpu}, [&](std::size_t) { return 2 * want.error; }));
  }
}

void expect_gradient_matches_oracle(const Problem& p, Device device, float count, float scale) {
  SCOPED_TRACE(::testing::Message() << dtype_name(p.dtype) << " [" << p.M << ", " << p.C
                                    << "] count " << count << " scale " << scale << " on "
                                    << device.name());
  const double factor = static_cast<double>(scale) / static_cast<double>(count);
  const Reference ref = reference(p, compute_dtype(p.dtype));
  const Reference oracle = reference(p, DType::f64);
  std::vector<double> want(ref.dlogits.size());
  for (std::size_t k = 0; k < want.size(); ++k) want[k] = ref.dlogits[k] * factor;
  const auto tolerance = [&](std::size_t k) {
    return gradient_error(ref, k, factor, compute_dtype(p.dtype)) +
           gradient_error(oracle, k, factor, DType::f64);
  };
  const Tensor got = run_gradient(p, device, count, scale);
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got), want, tolerance));
  if (device.is_cuda()) {
    const Tensor cpu = run_gradient(p, Device::cpu(), count, scale);
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got), testing::to_doubles(cpu),
                                   [&](std::size_t k) { return 2 * tolerance(k); }));
  }
}

TEST_P(CrossEntropy, LossMatchesFloat64Oracle) {
  std::uint64_t seed = 100;
  for (const DType dtype : {DType::f32, DType::f16, DType::f64}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;  // f64 is CPU-only
    for (const auto& [M, C] : kShapes) {
      const Problem p = make_problem(M, C, dtype, seed++);
      expect_loss_matches_oracle(p, device(), static_cast<float>(M), 1.0f);
      // A micro-batch of a larger batch (global count 3M + 1), under a loss scale.
      expect_loss_matches_oracle(p, device(), static_cast<float>(3 * M + 1), 1000.0f);
    }
  }
}

TEST_P(CrossEntropy, GradientMatchesFloat64Oracle) {
  std::uint64_t seed = 200;
  for (const DType dtype : {DType::f32, DType::f16, DType::f64}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;
    for (const auto& [M, C] : kShapes) {
      const Problem p = make_problem(M, C, dtype, seed++);
      expect_gradient_matches_oracle(p, device(), static_cast<float>(M), 1.0f);
      expect_gradient_matches_oracle(p, device(), static_cast<float>(3 * M + 1), 1000.0f);
    }
  }
}

// Logits of magnitude up to 1e4 (f16 holds them: its largest value is 65504): exp of the
// unshifted logits would overflow; with the max subtracted everything stays finite, and
// forming (max - z_label) before adding log(s) keeps the result accurate.
TEST_P(CrossEntropy, LargeLogitsStayFiniteAndAccurate) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const std::int64_t C : {10, 1000}) {
      const Problem p = make_problem(7, C, dtype, 300 + C, /*spread=*/1e4);
      const double loss = run_loss(p, device(), 0.0, 7.0f, 1.0f);
      EXPECT_TRUE(std::isfinite(loss)) << loss;
      EXPECT_GT(loss, 1.0);  // labels are random: most rows miss by thousands
      expect_loss_matches_oracle(p, device(), 7.0f, 1.0f);
      const auto gradient = testing::to_doubles(run_gradient(p, device(), 7.0f, 1.0f));
      EXPECT_TRUE(std::all_of(gradient.begin(), gradient.end(),
                              [](double g) { return std::isfinite(g); }));
      expect_gradient_matches_oracle(p, device(), 7.0f, 1.0f);
    }
  }
}

// The label holds the max 1e4 and a runner-up sits 8 below: the loss is log(1 + e^-8), about
// 3.4e-4. Computed as (m + log s) - z_label it would be lost against m (the spacing of floats
// near 1e4 is 2^-10, about 1e-3); as (m - z_label) + log s it keeps its relative accuracy,
// which the bound (no term in |m| here, since m - z_label = 0) demands.
TEST_P(CrossEntropy, SmallLossBesideALargeMaxKeepsItsDigits) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Problem p{2, 3, dtype, {1e4, 1e4 - 8, -1e4, -1e4, 1e4 - 8, 1e4}, {0, 2}};
    expect_loss_matches_oracle(p, device(), 2.0f, 1.0f);
    expect_gradient_matches_oracle(p, device(), 2.0f, 1.0f);
  }
}

// A NaN or +inf logit (an fp16 overflow upstream) must reach the loss and its row's gradient
// as NaN, never be masked by the max subtraction, so that dynamic loss scaling sees it.
TEST_P(CrossEntropy, NonFiniteLogitsPoisonTheirRowOnly) {
  for (const double bad : {std::nan(""), HUGE_VAL}) {
    for (const DType dtype : {DType::f32, DType::f16}) {
      Problem p = make_problem(3, 10, dtype, 650);
      p.logits[1 * 10 + 4] = bad;  // row 1
      EXPECT_TRUE(std::isnan(run_loss(p, device(), 0.0, 3.0f, 1.0f))) << bad;
      const auto gradient = testing::to_doubles(run_gradient(p, device(), 3.0f, 1.0f));
      for (std::int64_t k = 0; k < 30; ++k) {
        EXPECT_EQ(std::isnan(gradient[k]), k / 10 == 1)
            << bad << " " << dtype_name(dtype) << " " << k;
      }
    }
  }
}

// ---- the gradient against finite differences of the loss (CPU, f64) --------------------------

// Richardson-extrapolated central differences (finite_difference.hpp), whose error is at
// most 1.5 eps_f / h + h^4/30 max|f^(5)| when every evaluation of f is within eps_f.
// Truncation, proved rather than assumed: along one logit, the loss is factor times
// log(exp(z) + rest) minus a linear term, whose k-th derivative is the k-th cumulant of a
// Bernoulli(softmax) variable; those are at most 1 in magnitude (k <= 5), so
// |f^(5)| <= |factor| and the term is h^4/30 |factor|. h = 2^-12 (x +- h exact in double).
// The analytic gradient's own error is the f64 bound of GradientMatchesFloat64Oracle.
TEST(CrossEntropyGradient, GradientMatchesFiniteDifferencesInFloat64) {
  constexpr double h = 0x1p-12;
  const float count = 5.0f, scale = 3.0f;
  const double factor = 3.0 / 5.0;
  std::uint64_t seed = 400;
  for (const auto& [M, C] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {1, 10}, {7, 10}, {3, 1000}}) {
    SCOPED_TRACE(::testing::Message() << "[" << M << ", " << C << "]");
    Problem p = make_problem(M, C, DType::f64, seed++);
    const auto loss = [&] { return run_loss(p, Device::cpu(), 0.0, count, scale); };
    // The error of one evaluation, doubled to cover the nearby points x +- 2h.
    const double evaluation_error = 2 * expected_loss(p, 0.0, count, scale).error;
    const Reference analytic_error = reference(p, DType::f64);
    const auto dlogits = testing::to_doubles(run_gradient(p, Device::cpu(), count, scale));
    for (std::size_t k = 0; k < p.logits.size(); ++k) {
      const double numeric = testing::richardson_derivative(loss, p.logits[k], h);
      const double tolerance = testing::richardson_error(h, evaluation_error, factor) +
                               gradient_error(analytic_error, k, factor, DType::f64);
      EXPECT_NEAR(dlogits[k], numeric, tolerance) << "logit " << k;
    }
  }
}

// ---- global count and loss scale ------------------------------------------------------------

// A batch of 1000 samples as 15 micro-batches of 64 and one of 40, each called with the
// global count 1000: every gradient row depends only on its own logits and the factor, so
// the micro-batch gradients are the big batch's rows bit for bit. The loss is a sum of 16
// partial totals instead of one: equal within the loss bound, not necessarily in its bits.
TEST_P(CrossEntropy, MicroBatchesWithTheGlobalCountGiveTheBigBatch) {
  const std::int64_t M = 1000, C = 10, slice = 64;
  const float count = static_cast<float>(M), scale = 1.0f;
  const Problem p = make_problem(M, C, DType::f32, 500);
  const Tensor logits = logits_tensor(p, device()), labels = labels_tensor(p, device());
  const Tensor big_gradient({M, C}, DType::f32, device());
  const Tensor micro_gradient({M, C}, DType::f32, device());
  testing::poison(big_gradient);
  testing::poison(micro_gradient);
  const Tensor big_loss = Tensor::zeros({1}, DType::f32, device());
  const Tensor micro_loss = Tensor::zeros({1}, DType::f32, device());
  cross_entropy_forward(logits, labels, big_loss, count, scale);
  cross_entropy_backward(logits, labels, big_gradient, count, scale);
  for (std::int64_t begin = 0; begin < M; begin += slice) {
    const std::int64_t end = std::min(begin + slice, M);
    cross_entropy_forward(logits.rows(begin, end), labels.rows(begin, end), micro_loss, count,
                          scale);
    cross_entropy_backward(logits.rows(begin, end), labels.rows(begin, end),
                           micro_gradient.rows(begin, end), count, scale);
  }
  EXPECT_TRUE(testing::bitwise_equal(micro_gradient, big_gradient));
  // Both are within a bound of the exact loss. The big batch: want.error. The micro-batches:
  // the 16 partial totals are sums over disjoint rows, so their errors add up to at most the
  // big total's bound; each is then multiplied by the factor (2 roundings) and added into
  // the loss (16 additions of nonnegative terms): gamma(18) |loss| more.
  const ExpectedLoss want = expected_loss(p, 0.0, count, scale);
  EXPECT_NEAR(testing::to_doubles(micro_loss)[0], testing::to_doubles(big_loss)[0],
              2 * want.error + gamma(18, DType::f32) * std::abs(want.value));
}

// A power-of-two loss scale multiplies every rounded quantity by the same power of two
// (barring overflow and underflow), so the scaled results are exactly the unscaled ones
// times the scale: loss scaling changes no bit of information.
TEST_P(CrossEntropy, PowerOfTwoScaleIsExact) {
  const Problem p = make_problem(33, 100, DType::f16, 600);
  const float count = 33.0f, scale = 1024.0f;
  const auto unscaled = testing::to_doubles(run_gradient(p, device(), count, 1.0f));
  const auto scaled = testing::to_doubles(run_gradient(p, device(), count, scale));
  for (std::size_t k = 0; k < scaled.size(); ++k) ASSERT_EQ(scaled[k], unscaled[k] * scale) << k;
  EXPECT_EQ(run_loss(p, device(), 0.0, count, scale),
            run_loss(p, device(), 0.0, count, 1.0f) * scale);
}

// ---- labels ---------------------------------------------------------------------------------

// An out-of-range label is never read past its row. On the CPU the op refuses it, naming the
// row, before writing anything. On CUDA, where labels are checked once on their way to the
// device (check_labels, gather_rows) and not in every call, check_labels names the row, and
// the op makes that row's loss and gradient NaN (the overflow check then sees it).
TEST_P(CrossEntropy, RejectsOutOfRangeLabelsNamingTheRow) {
  Problem p = make_problem(7, 10, DType::f32, 700);
  const Tensor loss = testing::make_tensor({0.5}, {1}, DType::f32, device());
  const Tensor dlogits({7, 10}, DType::f32, device());
  for (const std::int32_t bad : {-1, 10, 1 << 30}) {
    p.labels[3] = bad;
    const Tensor logits = logits_tensor(p, device()), labels = labels_tensor(p, device());
    const std::string expected = "label " + std::to_string(bad) + " of row 3 is outside [0, 10)";
    try {
      if (device().is_cuda()) {
        check_labels(labels, 10, "labels");
      } else {
        cross_entropy_forward(logits, labels, loss, 7.0f);
      }
      ADD_FAILURE() << "label " << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    if (device().is_cuda()) {
      cross_entropy_forward(logits, labels, loss, 7.0f);
      EXPECT_TRUE(std::isnan(testing::to_doubles(loss)[0]));
      fill(loss, 0.5);
      testing::poison(dlogits);
      cross_entropy_backward(logits, labels, dlogits, 7.0f);
      const auto gradient = testing::to_doubles(dlogits);
      for (std::size_t k = 0; k < gradient.size(); ++k) {
        EXPECT_EQ(std::isnan(gradient[k]), k / 10 == 3) << "element " << k;
      }
      EXPECT_LE(count_correct(logits, labels), 6) << "the bad row is never correct";
      continue;
    }
    EXPECT_THROW(cross_entropy_backward(logits, labels, dlogits, 7.0f), std::invalid_argument);
    EXPECT_THROW(count_correct(logits, labels), std::invalid_argument);
    // Checked before anything is written: the accumulated loss is untouched.
    EXPECT_EQ(testing::to_doubles(loss)[0], 0.5);
  }
}

// Rows labelled kIgnoredLabel (padding) count for nothing: the loss and the other rows'
// gradients are those of the problem without them, and their own gradient rows are zeros,
// even under NaN logits. The CPU sums the rows in order and adding an ignored row's 0 changes
// no partial sum, so its loss is bit for bit that of the shorter problem; CUDA's tree pairs
// the rows differently once some are removed, so its loss agrees within the reordering
// bound gamma(M) * sum |loss_i| (relative to the total of these positive row losses).
TEST_P(CrossEntropy, IgnoredRowsHaveNoLossAndNoGradient) {
  const Problem full = make_problem(9, 6, DType::f32, 900);
  Problem padded = full, kept = full;
  kept.M = 0;
  kept.logits.clear();
  kept.labels.clear();
  for (std::int64_t i = 0; i < full.M; ++i) {
    if (i % 3 == 1) {
      padded.labels[i] = kIgnoredLabel;
      padded.logits[i * full.C + 2] = std::nan("");
      continue;
    }
    kept.labels.push_back(full.labels[i]);
    kept.logits.insert(kept.logits.end(), full.logits.begin() + i * full.C,
                       full.logits.begin() + (i + 1) * full.C);
    ++kept.M;
  }
  const float count = static_cast<float>(kept.M);
  const double with_padding = run_loss(padded, device(), 0.25, count, 1.0f);
  const double without = run_loss(kept, device(), 0.25, count, 1.0f);
  if (device().is_cpu()) {
    EXPECT_EQ(with_padding, without);
  } else {
    EXPECT_NEAR(with_padding, without, gamma(static_cast<double>(full.M), DType::f32) * without);
  }
  const std::vector<double> gradient =
      testing::to_doubles(run_gradient(padded, device(), count, 1.0f));
  const std::vector<double> kept_gradient =
      testing::to_doubles(run_gradient(kept, device(), count, 1.0f));
  std::int64_t k = 0;
  for (std::int64_t i = 0; i < full.M; ++i) {
    for (std::int64_t c = 0; c < full.C; ++c) {
      const double want = i % 3 == 1 ? 0.0 : kept_gradient[k * full.C + c];
      EXPECT_EQ(gradient[i * full.C + c], want) << "row " << i << " class " << c;
    }
    if (i % 3 != 1) ++k;
  }
  // An ignored row is never counted correct: every row's argmax is its label here.
  Problem certain = padded;
  for (std::int64_t i = 0; i < full.M; ++i) {
    for (std::int64_t c = 0; c < full.C; ++c) certain.logits[i * full.C + c] = c == 0 ? 1.0 : 0.0;
    if (certain.labels[i] != kIgnoredLabel) certain.labels[i] = 0;
  }
  EXPECT_EQ(count_correct(logits_tensor(certain, device()), labels_tensor(certain, device())),
            kept.M);
}

// The ignored label passes the cross-entropy's check but not a classification data set's:
// Fashion-MNIST has a class for every sample, and -100 there is a bug to report.
TEST(CrossEntropyLabels, TheIgnoredLabelIsRefusedWhereEverySampleHasAClass) {
  const Tensor labels = Tensor::from_vector(std::vector<std::int32_t>{3, kIgnoredLabel}, {2});
  EXPECT_NO_THROW(check_labels(labels, 10, "tokens", IgnoredLabels::allowed));
  EXPECT_THROW(check_labels(labels, 10, "classes"), std::invalid_argument);
  const Tensor near_miss = Tensor::from_vector(std::vector<std::int32_t>{3, -99}, {2});
  EXPECT_THROW(check_labels(near_miss, 10, "tokens", IgnoredLabels::allowed),
               std::invalid_argument);
}

TEST_P(CrossEntropy, RejectsBadArguments) {
  const Problem p = make_problem(4, 10, DType::f32, 800);
  const Tensor logits = logits_tensor(p, device()), labels = labels_tensor(p, device());
  const Tensor loss = Tensor::zeros({1}, DType::f32, device());
  const Tensor half_loss = Tensor::zeros({1}, DType::f16, device());
  const Tensor half_gradient({4, 10}, DType::f16, device());
  EXPECT_THROW(cross_entropy_forward(logits, labels, loss, 0.0f), std::invalid_argument);
  EXPECT_THROW(cross_entropy_forward(logits, labels, loss, -4.0f), std::invalid_argument);
  EXPECT_THROW(cross_entropy_forward(logits, labels, loss, 4.0f, INFINITY), std::invalid_argument);
  EXPECT_THROW(cross_entropy_forward(logits, labels, half_loss, 4.0f), std::invalid_argument);
  EXPECT_THROW(cross_entropy_backward(logits, labels, half_gradient, 4.0f), std::invalid_argument);
  EXPECT_THROW(cross_entropy_forward(logits, labels.rows(0, 3), loss, 4.0f), std::invalid_argument);
}

// ---- accuracy ---------------------------------------------------------------------------------

/// torch.argmax's rule, in double: the first NaN, else the first maximum.
std::int64_t reference_argmax(const double* row, std::int64_t C) {
  std::int64_t best = 0;
  for (std::int64_t c = 0; c < C; ++c) {
    if (std::isnan(row[c])) return c;
    if (row[c] > row[best]) best = c;
  }
  return best;
}

TEST_P(CrossEntropy, CountCorrectMatchesArgmax) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const auto& [M, C] : kShapes) {
      Problem p = make_problem(M, C, dtype, 900 + M + C);
      // Make about half the rows correct, so the count is not trivially near zero.
      for (std::int64_t i = 0; i < M; i += 2) {
        const double* row = &p.logits[i * C];
        p.labels[i] = static_cast<std::int32_t>(reference_argmax(row, C));
      }
      std::int64_t want = 0;
      for (std::int64_t i = 0; i < M; ++i) {
        want += reference_argmax(&p.logits[i * C], C) == p.labels[i] ? 1 : 0;
      }
      EXPECT_EQ(count_correct(logits_tensor(p, device()), labels_tensor(p, device())), want)
          << dtype_name(dtype) << " [" << M << ", " << C << "]";
    }
  }
}

// Ties go to the lowest index; a NaN counts as the maximum (torch.argmax).
TEST_P(CrossEntropy, CountCorrectBreaksTiesTowardTheLowestIndexAndPrefersNaN) {
  const double nan = std::nan("");
  const Problem p{5, 4, DType::f32,
                  {
                      1, 3, 3, 0,      // tie between 1 and 2: argmax 1
                      2, 2, 2, 2,      // all equal: argmax 0
                      0, nan, 5, nan,  // first NaN: argmax 1
                      -1, -1, -2, -1,  // tie between 0, 1 and 3: argmax 0
                      0, 1, 2, 3,      // argmax 3
                  },
                  {1, 0, 1, 0, 3}};
  EXPECT_EQ(count_correct(logits_tensor(p, device()), labels_tensor(p, device())), 5);
  Problem wrong = p;
  wrong.labels = {2, 3, 2, 3, 0};  // the other maxima, the non-NaN maximum: all wrong
  EXPECT_EQ(count_correct(logits_tensor(wrong, device()), labels_tensor(wrong, device())), 0);
}

// ---- known answers ----------------------------------------------------------------------------

// torch 1.13: F.cross_entropy(z, [2, 0]) (mean over 2 samples) for
// z = [[1, 2, 0.5], [0, -3, 4]] in float32, its value and z.grad, printed with repr().
// PyTorch's float result and ours are each within the bound of the exact value (assuming
// PyTorch's float arithmetic meets the same bound): twice ours.
TEST_P(CrossEntropy, MatchesPyTorch) {
  const Problem p{2, 3, DType::f32, {1, 2, 0.5, 0, -3, 4}, {2, 0}};
  const double torch_loss = 2.9917068481445312;
  const std::vector<double> torch_gradient = {0.11561194062232971,   0.3142658472061157,
                                              -0.4298778176307678,   -0.49101492762565613,
                                              0.0004473398148547858, 0.4905676245689392};
  const ExpectedLoss want = expected_loss(p, 0.0, 2.0f, 1.0f);
  EXPECT_NEAR(run_loss(p, device(), 0.0, 2.0f, 1.0f), torch_loss, 2 * want.error);
  const Reference ref = reference(p, DType::f32);
  const double factor = 1.0 / 2.0;
  EXPECT_TRUE(testing::all_close(testing::to_doubles(run_gradient(p, device(), 2.0f, 1.0f)),
                                 torch_gradient,
                                 [&](std::size_t k) {
                                   return 2 * gradient_error(ref, k, factor, DType::f32);
                                 }));
}

INSTANTIATE_TEST_SUITE_P(Backends, CrossEntropy, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace bigbatch

// LayerNorm: the forward against a float64 oracle, the backward against the oracle and
// against finite differences of the forward, the accumulation contract (micro-batches
// give the big batch's parameter gradients bit for bit) and known answers from PyTorch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/layernorm.hpp"
#include "kernels/reduction_order.hpp"
#include "tests/harness.hpp"
#include "tests/normalization_testing.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;
using namespace testing::normalization;  // kEps, Problem, BackwardReference, gamma, ...

// ---- the float64 oracle ---------------------------------------------------------------

struct RowStatistics {
  double mean = 0, variance = 0, rstd = 0;
  double mean_abs = 0;  // mean of |x| over the row: the scale of the mean's rounding error
};

/// Two-pass mean and biased variance of x[0..n) in double.
RowStatistics statistics_of(const double* x, std::int64_t n) {
  RowStatistics s;
  for (std::int64_t k = 0; k < n; ++k) {
    s.mean += x[k];
    s.mean_abs += std::abs(x[k]);
  }
  s.mean /= static_cast<double>(n);
  s.mean_abs /= static_cast<double>(n);
  for (std::int64_t k = 0; k < n; ++k) s.variance += (x[k] - s.mean) * (x[k] - s.mean);
  s.variance /= static_cast<double>(n);
  s.rstd = 1.0 / std::sqrt(s.variance + kEps);
  return s;
}

struct LayerNormReference {
  std::vector<RowStatistics> rows;  // [M]
  std::vector<double> xhat, y;      // [M, N]
};

LayerNormReference layernorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                       const std::vector<double>& b, std::int64_t M,
                                       std::int64_t N) {
  LayerNormReference ref;
  ref.xhat.resize(x.size());
  ref.y.resize(x.size());
  for (std::int64_t i = 0; i < M; ++i) {
    const RowStatistics s = statistics_of(&x[i * N], N);
    ref.rows.push_back(s);
    for (std::int64_t j = 0; j < N; ++j) {
      ref.xhat[i * N + j] = (x[i * N + j] - s.mean) * s.rstd;
      ref.y[i * N + j] = ref.xhat[i * N + j] * w[j] + b[j];
    }
  }
  return ref;
}

// ---- error bounds of the forward --------------------------------------------------------
//
// The kernel's forward for one row of n values, computed with unit roundoff u
// (gamma(k) = k u / (1 - k u), Higham Lemma 3.1), compared with exact arithmetic:
//  - mean: n - 1 additions and one division: |mean^ - mean| <= gamma(n) * mean|x| =: dm.
//  - variance: sum of n terms fl(fl(x - mean^)^2), each off by (1+u)^2, n - 1 additions,
//    one division: V^ = V' (1 + theta), |theta| <= gamma(n + 3), where V' = V + delta^2
//    is the exact variance about mean^ (the cross term vanishes since sum(x - mean) = 0).
//    So fl(V^ + eps) = (V + eps)(1 + t) with
//    t <= gamma(n + 4) + dm^2 (1 + gamma(n + 4)) / (V + eps).
//  - rstd = fl(1 / fl(sqrt(.))): for |t| <= 1/2, |1/sqrt(1 + t) - 1| <= |t|, plus two
//    roundings: relative error rel_r <= t + gamma(2) (1 + t).
//  - xhat = fl(fl(x - mean^) rstd^): |xhat^ - xhat| <= dm rstd + (|xhat| + dm rstd) q,
//    q = rel_r + gamma(2) + rel_r gamma(2).
//  - y = fl(fl(xhat^ w) + b) (or one fused multiply-add on the GPU, whose error is smaller):
//    |y^ - y| <= |w| e_xhat (1 + gamma(2)) + gamma(2) (|w xhat| + |b|).
// A sum in any order obeys the same gamma(n) bound, so this holds for the GPU's tree sums.
struct RowErrorBound {
  double mean = 0;           // absolute
  double rstd_relative = 0;  // relative
  double xhat_q = 0;         // q above
};

RowErrorBound row_error_bound(const RowStatistics& s, std::int64_t n, DType compute) {
  RowErrorBound e;
  e.mean = gamma(n, compute) * s.mean_abs;
  const double g = gamma(n + 4, compute);
  const double t = g + e.mean * e.mean * (1 + g) / (s.variance + kEps);
  EXPECT_LE(t, 0.5) << "the rstd bound needs t <= 1/2";
  e.rstd_relative = t + gamma(2, compute) * (1 + t);
  e.xhat_q = e.rstd_relative + gamma(2, compute) + e.rstd_relative * gamma(2, compute);
  return e;
}

double xhat_error(const RowErrorBound& e, const RowStatistics& s, double xhat) {
  return e.mean * s.rstd + (std::abs(xhat) + e.mean * s.rstd) * e.xhat_q;
}

double y_error(const RowErrorBound& e, const RowStatistics& s, double xhat, double w, double b,
               DType compute) {
  return std::abs(w) * xhat_error(e, s, xhat) * (1 + gamma(2, compute)) +
         gamma(2, compute) * (std::abs(w * xhat) + std::abs(b));
}

// ---- the problem and the kernel's outputs -------------------------------------------------

/// x in [offset - 1, offset + 1), weight in [-2, 2), bias in [-1, 1), dy in [-1, 1),
/// rounded to their dtypes (so the oracle sees what the kernel sees).
Problem make_problem(std::int64_t M, std::int64_t N, DType dtype, std::uint64_t seed,
                     double offset = 0) {
  Problem p{M, N, dtype, {}, {}, {}, {}};
  p.x = rounded_to(testing::random_values(M * N, seed, offset - 1, offset + 1), dtype);
  p.w = rounded_to(testing::random_values(N, seed + 1, -2, 2), compute_dtype(dtype));
  p.b = rounded_to(testing::random_values(N, seed + 2, -1, 1), compute_dtype(dtype));
  p.dy = rounded_to(testing::random_values(M * N, seed + 3, -1, 1), dtype);
  return p;
}

struct ForwardOutputs {
  Tensor y, mean, rstd;
};

ForwardOutputs run_forward(const Problem& p, Device device) {
  const DType stats = compute_dtype(p.dtype);
  const Tensor x = testing::make_tensor(p.x, {p.M, p.N}, p.dtype, device);
  const Tensor w = testing::make_tensor(p.w, {p.N}, stats, device);
  const Tensor b = testing::make_tensor(p.b, {p.N}, stats, device);
  ForwardOutputs out{Tensor({p.M, p.N}, p.dtype, device), Tensor({p.M}, stats, device),
                     Tensor({p.M}, stats, device)};
  testing::poison(out.y);
  testing::poison(out.mean);
  testing::poison(out.rstd);
  layernorm_forward(x, w, b, out.y, out.mean, out.rstd);
  return out;
}

// ---- forward --------------------------------------------------------------------------

class LayerNorm : public DeviceTest {};

/// Checks one backend's forward against the oracle; on CUDA also against the CPU.
void expect_forward_matches_oracle(const Problem& p, Device device) {
  const DType compute = compute_dtype(p.dtype);
  const LayerNormReference ref = layernorm_reference(p.x, p.w, p.b, p.M, p.N);
  // Per element: the kernel's bound plus the oracle's own (the same bound in f64).
  std::vector<RowErrorBound> kernel_bound, oracle_bound;
  for (const RowStatistics& s : ref.rows) {
    kernel_bound.push_back(row_error_bound(s, p.N, compute));
    oracle_bound.push_back(row_error_bound(s, p.N, DType::f64));
  }
  const auto y_tolerance = [&](std::size_t k) {
    const std::size_t i = k / p.N, j = k % p.N;
    const RowStatistics& s = ref.rows[i];
    const double e = y_error(kernel_bound[i], s, ref.xhat[k], p.w[j], p.b[j], compute) +
                     y_error(oracle_bound[i], s, ref.xhat[k], p.w[j], p.b[j], DType::f64);
    return with_store_rounding(e, ref.y[k], p.dtype);
  };
  std::vector<double> want_mean, want_rstd;
  for (const RowStatistics& s : ref.rows) {
    want_mean.push_back(s.mean);
    want_rstd.push_back(s.rstd);
  }
  const auto mean_tolerance = [&](std::size_t i) {
    return kernel_bound[i].mean + oracle_bound[i].mean;
  };
  const auto rstd_tolerance = [&](std::size_t i) {
    return (kernel_bound[i].rstd_relative + oracle_bound[i].rstd_relative) * want_rstd[i];
  };

  const ForwardOutputs got = run_forward(p, device);
  SCOPED_TRACE(::testing::Message() << dtype_name(p.dtype) << " [" << p.M << ", " << p.N
                                    << "] on " << device.name());
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.y), ref.y, y_tolerance));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.mean), want_mean, mean_tolerance));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.rstd), want_rstd, rstd_tolerance));

  if (device.is_cuda()) {
    // Both backends are within the bound of the exact value, so within twice it of each other.
    const ForwardOutputs cpu = run_forward(p, Device::cpu());
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got.y), testing::to_doubles(cpu.y),
                                   [&](std::size_t k) { return 2 * y_tolerance(k); }));
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got.rstd), testing::to_doubles(cpu.rstd),
                                   [&](std::size_t i) { return 2 * rstd_tolerance(i); }));
  }
}

TEST_P(LayerNorm, ForwardMatchesFloat64Oracle) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {1, 7}, {7, 1}, {7, 7}, {1025, 7}, {7, 1025}, {3, 1025}};
  for (const DType dtype : {DType::f32, DType::f16, DType::f64}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;  // f64 is CPU-only
    std::uint64_t seed = 100;
    for (const auto& [M, N] : shapes) {
      expect_forward_matches_oracle(make_problem(M, N, dtype, seed++), device());
    }
  }
}

// A row whose mean is large against its spread: the one-pass E[x^2] - E[x]^2 loses the
// variance here (f32: E[x^2] ~ 1e6, where floats are 0.0625 apart, summed over 1025 terms,
// carries an error of order 1; the variance is ~0.33); the two-pass form keeps the bound.
// (Replacing the two-pass variance with the one-pass formula fails this test.)
TEST_P(LayerNorm, TwoPassVarianceSurvivesALargeMean) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;
    expect_forward_matches_oracle(make_problem(5, 1025, dtype, 7, /*offset=*/1000), device());
  }
}

// ---- backward ---------------------------------------------------------------------------

// The kernel's backward given mean and rstd (exact inputs here), with G = dy w and
// X = (x - mean) rstd, computes a = sum(G)/N, b = sum(G X)/N and dx = rstd ((G - a) - X b).
// Rounding bounds, in the style of the forward's:
//   e_a = gamma(N + 1) sum|G| / N; e_b = gamma(N + 5) sum|G X| / N (each term carries
//   the roundings of G, of X (two) and of the product);
//   e_dx = rstd (1 + gamma(4)) [e_a + |X| e_b (1 + gamma(4)) + gamma(4) (|G| + |a| + |X b|)]
//   (every quantity that enters a subtraction carries at most four roundings, and the final
//   product one more).
//   dweight = dweight0 + sum_i fl(dy fl(X)): M additions of terms carrying three roundings:
//   e <= gamma(M + 3) (|dweight0| + sum|dy X|); dbias: gamma(M) (|dbias0| + sum|dy|).
BackwardReference layernorm_backward_reference(const Problem& p, const std::vector<double>& mean,
                                               const std::vector<double>& rstd,
                                               const std::vector<double>& dweight0,
                                               const std::vector<double>& dbias0,
                                               DType compute) {
  const std::int64_t M = p.M, N = p.N;
  BackwardReference ref;
  ref.dx.resize(M * N);
  ref.dx_error.resize(M * N);
  ref.dweight = dweight0;
  ref.dbias = dbias0;
  std::vector<double> dweight_magnitude(N), dbias_magnitude(N);
  for (std::int64_t j = 0; j < N; ++j) {
    dweight_magnitude[j] = std::abs(dweight0[j]);
    dbias_magnitude[j] = std::abs(dbias0[j]);
  }
  const double g4 = gamma(4, compute);
  for (std::int64_t i = 0; i < M; ++i) {
    double sum_g = 0, sum_g_x = 0, sum_abs_g = 0, sum_abs_g_x = 0;
    for (std::int64_t j = 0; j < N; ++j) {
      const double X = (p.x[i * N + j] - mean[i]) * rstd[i];
      const double G = p.dy[i * N + j] * p.w[j];
      sum_g += G;
      sum_g_x += G * X;
      sum_abs_g += std::abs(G);
      sum_abs_g_x += std::abs(G * X);
      ref.dweight[j] += p.dy[i * N + j] * X;
      ref.dbias[j] += p.dy[i * N + j];
      dweight_magnitude[j] += std::abs(p.dy[i * N + j] * X);
      dbias_magnitude[j] += std::abs(p.dy[i * N + j]);
    }
    const double a = sum_g / N, b = sum_g_x / N;
    const double e_a = gamma(N + 1, compute) * sum_abs_g / N;
    const double e_b = gamma(N + 5, compute) * sum_abs_g_x / N;
    for (std::int64_t j = 0; j < N; ++j) {
      const double X = (p.x[i * N + j] - mean[i]) * rstd[i];
      const double G = p.dy[i * N + j] * p.w[j];
      const std::int64_t k = i * N + j;
      ref.dx[k] = rstd[i] * ((G - a) - X * b);
      const double e = rstd[i] * (1 + g4) *
                       (e_a + std::abs(X) * e_b * (1 + g4) +
                        g4 * (std::abs(G) + std::abs(a) + std::abs(X * b)));
      ref.dx_error[k] = with_store_rounding(e, ref.dx[k], p.dtype);
    }
  }
  for (std::int64_t j = 0; j < N; ++j) {
    ref.dweight_error.push_back(gamma(M + 3, compute) * dweight_magnitude[j]);
    ref.dbias_error.push_back(gamma(M, compute) * dbias_magnitude[j]);
  }
  return ref;
}

/// Backward on `device` from the given statistics, into parameter gradients that start at
/// dweight0 and dbias0 (they accumulate).
BackwardOutputs run_backward(const Problem& p, const std::vector<double>& mean,
                             const std::vector<double>& rstd, const std::vector<double>& dweight0,
                             const std::vector<double>& dbias0, Device device) {
  const DType stats = compute_dtype(p.dtype);
  const Tensor x = testing::make_tensor(p.x, {p.M, p.N}, p.dtype, device);
  const Tensor w = testing::make_tensor(p.w, {p.N}, stats, device);
  const Tensor dy = testing::make_tensor(p.dy, {p.M, p.N}, p.dtype, device);
  BackwardOutputs out{Tensor({p.M, p.N}, p.dtype, device),
                      testing::make_tensor(dweight0, {p.N}, stats, device),
                      testing::make_tensor(dbias0, {p.N}, stats, device)};
  testing::poison(out.dx);
  layernorm_backward(x, w, testing::make_tensor(mean, {p.M}, stats, device),
                     testing::make_tensor(rstd, {p.M}, stats, device), dy, out.dx, out.dweight,
                     out.dbias);
  return out;
}

TEST_P(LayerNorm, BackwardMatchesFloat64Oracle) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {1, 7}, {7, 1}, {7, 7}, {1025, 7}, {7, 1025}};
  std::uint64_t seed = 300;
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const auto& [M, N] : shapes) {
      const Problem p = make_problem(M, N, dtype, seed++);
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " [" << M << ", " << N << "]");
      // The statistics the forward saved, as the backward receives them in training.
      const ForwardOutputs forward = run_forward(p, Device::cpu());
      const auto mean = testing::to_doubles(forward.mean);
      const auto rstd = testing::to_doubles(forward.rstd);
      expect_backward_matches_oracle(p, mean, rstd, seed, layernorm_backward_reference,
                                     run_backward, device());
    }
  }
}

// ---- backward against finite differences (CPU, f64) ---------------------------------------

// The step, its error bound and why: finite_difference.hpp (NormalizationFiniteDifference).
TEST(LayerNormGradient, BackwardMatchesFiniteDifferencesInFloat64) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {1, 7}, {7, 1}, {3, 7}, {2, 1025}};
  std::uint64_t seed = 500;
  for (const auto& [M, N] : shapes) {
    SCOPED_TRACE(::testing::Message() << "[" << M << ", " << N << "]");
    Problem p = make_problem(M, N, DType::f64, seed++);
    const std::vector<double> g = p.dy;  // L = sum g * y: dL/dy = g
    // L with the f64 kernel; its evaluation error is bounded with the forward's f64 bound:
    // sum |g| e_y, plus the sum's own gamma(MN + 1) sum|g y|.
    const auto loss = [&] { return weighted_sum(g, run_forward(p, Device::cpu()).y); };
    const LayerNormReference ref = layernorm_reference(p.x, p.w, p.b, M, N);
    double evaluation_error = 0, magnitude = 0;
    for (std::int64_t i = 0; i < M; ++i) {
      const RowErrorBound e = row_error_bound(ref.rows[i], N, DType::f64);
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int64_t k = i * N + j;
        // x +- 2h moves the row's statistics slightly; 2x covers the bound at nearby points.
        evaluation_error += 2 * std::abs(g[k]) *
                            y_error(e, ref.rows[i], ref.xhat[k], p.w[j], p.b[j], DType::f64);
        magnitude += std::abs(g[k] * ref.y[k]);
      }
    }
    evaluation_error += gamma(M * N + 1, DType::f64) * 2 * magnitude;
    double smallest_sigma = 1;
    for (const RowStatistics& s : ref.rows) {
      smallest_sigma = std::min(smallest_sigma, std::sqrt(s.variance + kEps));
    }
    const ForwardOutputs forward = run_forward(p, Device::cpu());
    const std::vector<double> zeros(N, 0.0);
    const BackwardOutputs got = run_backward(p, testing::to_doubles(forward.mean),
                                             testing::to_doubles(forward.rstd), zeros, zeros,
                                             Device::cpu());
    expect_gradients_match_finite_differences(got, p, loss, evaluation_error, smallest_sigma);
  }
}

// ---- the accumulation contract ------------------------------------------------------------

// dweight and dbias are exactly the documented sequence of float operations, on both
// backends; LayerNorm's statistics are per row (i).
TEST_P(LayerNorm, ParameterGradientsAreTheDocumentedFloatAdditionsInRowOrder) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Problem p = make_problem(37, 19, dtype, 900);
    const ForwardOutputs forward = run_forward(p, Device::cpu());
    expect_parameter_gradients_are_documented_float_additions(
        p, testing::to_doubles(forward.mean), testing::to_doubles(forward.rstd),
        [](std::int64_t i, std::int64_t) { return i; }, 901, run_backward, device());
  }
}

/// Forward and backward on all rows at once, and again in slices of `slice` rows into the
/// same (accumulating) parameter gradients: every output must be identical, bit for bit.
void expect_micro_batches_match_big_batch(const Problem& p, std::int64_t slice, Device device) {
  SCOPED_TRACE(::testing::Message() << dtype_name(p.dtype) << ": " << p.M << " rows in slices of "
                                    << slice << " on " << device.name());
  const DType stats = compute_dtype(p.dtype);
  const Tensor x = testing::make_tensor(p.x, {p.M, p.N}, p.dtype, device);
  const Tensor w = testing::make_tensor(p.w, {p.N}, stats, device);
  const Tensor b = testing::make_tensor(p.b, {p.N}, stats, device);
  const Tensor dy = testing::make_tensor(p.dy, {p.M, p.N}, p.dtype, device);
  const auto dweight0 = testing::random_values(p.N, 77, -1, 1);
  const auto dbias0 = testing::random_values(p.N, 78, -1, 1);
  struct Run {
    Tensor y, mean, rstd, dx, dweight, dbias;
  };
  const auto make_run = [&] {
    Run r{Tensor({p.M, p.N}, p.dtype, device),  Tensor({p.M}, stats, device),
          Tensor({p.M}, stats, device),         Tensor({p.M, p.N}, p.dtype, device),
          testing::make_tensor(dweight0, {p.N}, stats, device),
          testing::make_tensor(dbias0, {p.N}, stats, device)};
    for (const Tensor* t : {&r.y, &r.mean, &r.rstd, &r.dx}) testing::poison(*t);
    return r;
  };
  const Run big = make_run();
  layernorm_forward(x, w, b, big.y, big.mean, big.rstd);
  layernorm_backward(x, w, big.mean, big.rstd, dy, big.dx, big.dweight, big.dbias);

  const Run micro = make_run();
  for (std::int64_t begin = 0; begin < p.M; begin += slice) {
    const std::int64_t end = std::min(begin + slice, p.M);
    const Tensor xs = x.rows(begin, end), dys = dy.rows(begin, end);
    const Tensor means = micro.mean.rows(begin, end), rstds = micro.rstd.rows(begin, end);
    layernorm_forward(xs, w, b, micro.y.rows(begin, end), means, rstds);
    layernorm_backward(xs, w, means, rstds, dys, micro.dx.rows(begin, end), micro.dweight,
                       micro.dbias);
  }
  EXPECT_TRUE(testing::bitwise_equal(micro.y, big.y));
  EXPECT_TRUE(testing::bitwise_equal(micro.mean, big.mean));
  EXPECT_TRUE(testing::bitwise_equal(micro.rstd, big.rstd));
  EXPECT_TRUE(testing::bitwise_equal(micro.dx, big.dx));
  EXPECT_TRUE(testing::bitwise_equal(micro.dweight, big.dweight));
  EXPECT_TRUE(testing::bitwise_equal(micro.dbias, big.dbias));
}

TEST_P(LayerNorm, MicroBatchesGiveTheBigBatchGradientsBitForBit) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    // 1000 rows: 15 micro-batches of 64 and a last one of 40.
    expect_micro_batches_match_big_batch(make_problem(1000, 33, dtype, 41), 64, device());
    // 1024 rows in slices of 1, 7 (the last one of 2), 32 and 64; on CUDA only the
    // multiples of its 32-row tiles (layernorm.hpp).
    const Problem p = make_problem(1024, 33, dtype, 42);
    for (const std::int64_t slice : {1, 7, 32, 64}) {
      if (device().is_cuda() && slice % reduction_order::kTileRows != 0) continue;
      expect_micro_batches_match_big_batch(p, slice, device());
    }
  }
}

// ---- memory sharing in the backward ------------------------------------------------------------

/// The backward of p with dx written into `shared`, once the same memory as dy and once as
/// x (an in-place backward), against a run with a separate dx: dx, dweight and dbias must be
/// identical bit for bit. The parameter gradients are computed before dx is written; in the
/// opposite order they would be computed from the overwritten dy or x.
void expect_in_place_backward_matches(const Problem& p, Device device) {
  SCOPED_TRACE(::testing::Message() << dtype_name(p.dtype) << " [" << p.M << ", " << p.N
                                    << "] on " << device.name());
  const DType stats = compute_dtype(p.dtype);
  const ForwardOutputs forward = run_forward(p, device);
  const Tensor w = testing::make_tensor(p.w, {p.N}, stats, device);
  const auto dweight0 = testing::random_values(p.N, 61, -1, 1);
  const auto dbias0 = testing::random_values(p.N, 62, -1, 1);
  const auto make_x = [&] { return testing::make_tensor(p.x, {p.M, p.N}, p.dtype, device); };
  const auto make_dy = [&] { return testing::make_tensor(p.dy, {p.M, p.N}, p.dtype, device); };
  struct Gradients {
    Tensor dweight, dbias;
  };
  const auto make_gradients = [&] {
    return Gradients{testing::make_tensor(dweight0, {p.N}, stats, device),
                     testing::make_tensor(dbias0, {p.N}, stats, device)};
  };

  const Tensor dx({p.M, p.N}, p.dtype, device);
  testing::poison(dx);
  const Gradients apart = make_gradients();
  layernorm_backward(make_x(), w, forward.mean, forward.rstd, make_dy(), dx, apart.dweight,
                     apart.dbias);

  const Tensor dy_in_place = make_dy();
  const Gradients over_dy = make_gradients();
  layernorm_backward(make_x(), w, forward.mean, forward.rstd, dy_in_place, dy_in_place,
                     over_dy.dweight, over_dy.dbias);
  EXPECT_TRUE(testing::bitwise_equal(dy_in_place, dx)) << "dx written over dy";
  EXPECT_TRUE(testing::bitwise_equal(over_dy.dweight, apart.dweight)) << "dx written over dy";
  EXPECT_TRUE(testing::bitwise_equal(over_dy.dbias, apart.dbias)) << "dx written over dy";

  const Tensor x_in_place = make_x();
  const Gradients over_x = make_gradients();
  layernorm_backward(x_in_place, w, forward.mean, forward.rstd, make_dy(), x_in_place,
                     over_x.dweight, over_x.dbias);
  EXPECT_TRUE(testing::bitwise_equal(x_in_place, dx)) << "dx written over x";
  EXPECT_TRUE(testing::bitwise_equal(over_x.dweight, apart.dweight)) << "dx written over x";
  EXPECT_TRUE(testing::bitwise_equal(over_x.dbias, apart.dbias)) << "dx written over x";
}

TEST_P(LayerNorm, BackwardInPlaceOverDyOrXGivesTheSameGradients) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    expect_in_place_backward_matches(make_problem(37, 19, dtype, 950), device());
    // 300 x 129: several parallel chunks of rows and of features on the CPU.
    expect_in_place_backward_matches(make_problem(300, 129, dtype, 951), device());
  }
}

TEST_P(LayerNorm, BackwardRefusesMemorySharedOtherwise) {
  const std::int64_t M = 4, N = 8;
  const Tensor x = Tensor::zeros({M, N}, DType::f32, device());
  const Tensor dy = Tensor::zeros({M, N}, DType::f32, device());
  const Tensor w = Tensor::zeros({N}, DType::f32, device());
  const Tensor mean = Tensor::zeros({M}, DType::f32, device());
  const Tensor rstd = Tensor::zeros({M}, DType::f32, device());
  const Tensor dweight = Tensor::zeros({N}, DType::f32, device());
  const Tensor dbias = Tensor::zeros({N}, DType::f32, device());
  const Tensor dx = Tensor::zeros({M, N}, DType::f32, device());
  // dx one row past dy (or x) in the same buffer: row i of dx is row i + 1 of dy.
  const Tensor shared = Tensor::zeros({M + 1, N}, DType::f32, device());
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] {
        layernorm_backward(x, w, mean, rstd, shared.rows(0, M), shared.rows(1, M + 1), dweight,
                           dbias);
      }),
      {"layernorm_backward", "dx", "shares memory with dy"}));
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] {
        layernorm_backward(shared.rows(1, M + 1), w, mean, rstd, dy, shared.rows(0, M), dweight,
                           dbias);
      }),
      {"layernorm_backward", "dx", "shares memory with x"}));
  // dweight and dbias one tensor; dweight inside x; dx over the saved statistics.
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] { layernorm_backward(x, w, mean, rstd, dy, dx, dweight, dweight); }),
      {"layernorm_backward", "dweight", "shares memory with dbias"}));
  EXPECT_TRUE(testing::mentions(testing::error_of([&] {
                                  layernorm_backward(x, w, mean, rstd, dy, dx,
                                                     x.reshaped({M * N}).rows(0, N), dbias);
                                }),
                                {"layernorm_backward", "dweight", "shares memory with x"}));
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] {
        layernorm_backward(x, w, dx.reshaped({M * N}).rows(0, M), rstd, dy, dx, dweight, dbias);
      }),
      {"layernorm_backward", "dx", "shares memory with mean"}));
  // Inputs may share memory among themselves: dy the same tensor as x is accepted.
  EXPECT_NO_THROW(layernorm_backward(x, w, mean, rstd, x, dx, dweight, dbias));
}

// ---- known answers and argument checks ------------------------------------------------------

// torch 1.13: nn.LayerNorm(4) with weight [1, -0.5, 2, 0.25], bias [0.5, 0, -1, 2] on
// [[1, 2, 3, 5], [-1, 0.5, 0.25, 100]] (float32), printed with repr(). PyTorch's float
// result and ours are each within the forward bound of the exact value: within twice it.
TEST_P(LayerNorm, MatchesPyTorch) {
  Problem p{2, 4, DType::f32, {1, 2, 3, 5, -1, 0.5, 0.25, 100}, {1, -0.5, 2, 0.25},
            {0.5, 0, -1, 2}, {}};
  const std::vector<double> torch_y = {-0.6832132339477539, 0.25354570150375366,
                                       -0.6619391441345215, 2.3803186416625977,
                                       -0.0984506607055664, 0.28192073106765747,
                                       -2.139219284057617,  2.4329755306243896};
  const LayerNormReference ref = layernorm_reference(p.x, p.w, p.b, p.M, p.N);
  const ForwardOutputs got = run_forward(p, device());
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.y), torch_y, [&](std::size_t k) {
    const std::size_t i = k / 4, j = k % 4;
    const RowErrorBound e = row_error_bound(ref.rows[i], p.N, DType::f32);
    return 2 * y_error(e, ref.rows[i], ref.xhat[k], p.w[j], p.b[j], DType::f32);
  }));
}

TEST_P(LayerNorm, RejectsMismatchedArguments) {
  const Tensor x({4, 8}, DType::f32, device());
  const Tensor y({4, 8}, DType::f32, device());
  const Tensor w({8}, DType::f32, device()), b({8}, DType::f32, device());
  const Tensor mean({4}, DType::f32, device()), rstd({4}, DType::f32, device());
  const Tensor wrong_w({7}, DType::f32, device());
  const Tensor half_y({4, 8}, DType::f16, device());
  const Tensor wrong_rows({5}, DType::f32, device());
  EXPECT_THROW(layernorm_forward(x, wrong_w, b, y, mean, rstd), std::invalid_argument);
  EXPECT_THROW(layernorm_forward(x, w, b, half_y, mean, rstd), std::invalid_argument);
  EXPECT_THROW(layernorm_forward(x, w, b, y, wrong_rows, rstd), std::invalid_argument);
  try {
    layernorm_forward(x, wrong_w, b, y, mean, rstd);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("weight must have shape [8]"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LayerNorm, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace bigbatch

// BatchNorm1d: training and evaluation forwards against a float64 oracle, the running
// statistics over several updates (PyTorch's formulas, and PyTorch's own numbers), the
// backward against the oracle and against finite differences, the accumulation contract,
// and the pitfall: micro-batches are NOT the big batch for BatchNorm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

#include "kernels/batchnorm.hpp"
#include "tests/harness.hpp"
#include "tests/normalization_testing.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;
using namespace testing::normalization;  // kEps, Problem, BackwardReference, gamma, ...

constexpr double kMomentum = 0.1f;  // the kernel's momentum, as the float it receives

// ---- the float64 oracle ---------------------------------------------------------------

struct FeatureStatistics {
  double mean = 0, variance = 0, unbiased_variance = 0, rstd = 0;
  double mean_abs = 0;  // mean of |x| over the batch: the scale of the mean's rounding error
};

/// Per feature j of x: [M, N]: two-pass mean and variances in double.
std::vector<FeatureStatistics> feature_statistics(const std::vector<double>& x, std::int64_t M,
                                                  std::int64_t N) {
  std::vector<FeatureStatistics> stats(N);
  for (std::int64_t j = 0; j < N; ++j) {
    FeatureStatistics& s = stats[j];
    for (std::int64_t i = 0; i < M; ++i) {
      s.mean += x[i * N + j];
      s.mean_abs += std::abs(x[i * N + j]);
    }
    s.mean /= static_cast<double>(M);
    s.mean_abs /= static_cast<double>(M);
    double squared_deviations = 0;
    for (std::int64_t i = 0; i < M; ++i) {
      squared_deviations += (x[i * N + j] - s.mean) * (x[i * N + j] - s.mean);
    }
    s.variance = squared_deviations / static_cast<double>(M);
    s.unbiased_variance = squared_deviations / static_cast<double>(M - 1);
    s.rstd = 1.0 / std::sqrt(s.variance + kEps);
  }
  return stats;
}

// ---- error bounds (derived as in test_layernorm.cpp, with the batch as the reduction) ------
//
// For one feature over n = M samples, unit roundoff u, gamma(k) = k u / (1 - k u):
//  - mean: |mean^ - mean| <= gamma(n) mean|x| =: dm.
//  - biased variance + eps: relative error t <= gamma(n + 4) + dm^2 (1 + gamma(n + 4)) / (V + eps)
//    (the sum of squares about mean^ exceeds the one about mean by n dm^2 at most).
//  - rstd: rel_r <= t + gamma(2) (1 + t) for t <= 1/2 (|1/sqrt(1+t) - 1| <= |t|).
//  - xhat = fl(fl(x - mean^) rstd^): |error| <= dm rstd + (|xhat| + dm rstd) q,
//    q = rel_r + gamma(2) + rel_r gamma(2).
//  - y = fl(fl(xhat w) + b): |error| <= |w| e_xhat (1 + gamma(2)) + gamma(2) (|w xhat| + |b|).
//  - unbiased variance S/(n-1): |error| <= n dm^2/(n-1) + gamma(n + 2) (Vu + n dm^2/(n-1)).
//  - a running average fl(fl(m s) + fl(fl(1 - m) r)) with s off by e_s and r off by e_r:
//    |error| <= (m e_s + (1-m) e_r)(1 + gamma(3)) + gamma(3)(m |s| + (1-m) |r|).
// The GPU's fused multiply-adds have smaller errors, so the bounds hold there too.
struct FeatureErrorBound {
  double mean = 0, rstd_relative = 0, xhat_q = 0, unbiased_variance = 0;
};

FeatureErrorBound feature_error_bound(const FeatureStatistics& s, std::int64_t n, DType compute) {
  FeatureErrorBound e;
  e.mean = gamma(n, compute) * s.mean_abs;
  const double g = gamma(n + 4, compute);
  const double t = g + e.mean * e.mean * (1 + g) / (s.variance + kEps);
  EXPECT_LE(t, 0.5) << "the rstd bound needs t <= 1/2";
  e.rstd_relative = t + gamma(2, compute) * (1 + t);
  e.xhat_q = e.rstd_relative + gamma(2, compute) + e.rstd_relative * gamma(2, compute);
  const double shift = static_cast<double>(n) * e.mean * e.mean / static_cast<double>(n - 1);
  e.unbiased_variance = shift + gamma(n + 2, compute) * (s.unbiased_variance + shift);
  return e;
}

double y_error(const FeatureErrorBound& e, double rstd, double xhat, double w, double b,
               DType compute) {
  const double xhat_error = e.mean * rstd + (std::abs(xhat) + e.mean * rstd) * e.xhat_q;
  return std::abs(w) * xhat_error * (1 + gamma(2, compute)) +
         gamma(2, compute) * (std::abs(w * xhat) + std::abs(b));
}

double running_average_error(double statistic, double statistic_error, double running,
                             double running_error, DType compute) {
  const double g3 = gamma(3, compute);
  return (kMomentum * statistic_error + (1 - kMomentum) * running_error) * (1 + g3) +
         g3 * (kMomentum * std::abs(statistic) + (1 - kMomentum) * std::abs(running));
}

// ---- the problem and the kernel's outputs -------------------------------------------------

/// x in [-1, 1) + a per-feature offset in [-2, 2), weight in [-2, 2), bias and dy in
/// [-1, 1), each rounded to its dtype (the oracle sees what the kernel sees).
Problem make_problem(std::int64_t M, std::int64_t N, DType dtype, std::uint64_t seed) {
  Problem p{M, N, dtype, {}, {}, {}, {}};
  std::vector<double> x = testing::random_values(M * N, seed, -1, 1);
  const std::vector<double> offset = testing::random_values(N, seed + 4, -2, 2);
  for (std::int64_t k = 0; k < M * N; ++k) x[k] += offset[k % N];
  p.x = rounded_to(x, dtype);
  p.w = rounded_to(testing::random_values(N, seed + 1, -2, 2), compute_dtype(dtype));
  p.b = rounded_to(testing::random_values(N, seed + 2, -1, 1), compute_dtype(dtype));
  p.dy = rounded_to(testing::random_values(M * N, seed + 3, -1, 1), dtype);
  return p;
}

struct TrainOutputs {
  Tensor y, mean, rstd, running_mean, running_var;
};

/// One training forward on `device`, from running statistics `running_mean0`, `running_var0`.
TrainOutputs run_train(const Problem& p, const std::vector<double>& running_mean0,
                       const std::vector<double>& running_var0, Device device) {
  const DType stats = compute_dtype(p.dtype);
  TrainOutputs out{Tensor({p.M, p.N}, p.dtype, device), Tensor({p.N}, stats, device),
                   Tensor({p.N}, stats, device),
                   testing::make_tensor(running_mean0, {p.N}, stats, device),
                   testing::make_tensor(running_var0, {p.N}, stats, device)};
  testing::poison(out.y);
  testing::poison(out.mean);
  testing::poison(out.rstd);
  batchnorm_forward_train(testing::make_tensor(p.x, {p.M, p.N}, p.dtype, device),
                          testing::make_tensor(p.w, {p.N}, stats, device),
                          testing::make_tensor(p.b, {p.N}, stats, device), out.y, out.mean,
                          out.rstd, out.running_mean, out.running_var);
  return out;
}

class BatchNorm : public DeviceTest {};

// ---- training forward -------------------------------------------------------------------

void expect_train_forward_matches_oracle(const Problem& p, Device device) {
  SCOPED_TRACE(::testing::Message() << dtype_name(p.dtype) << " [" << p.M << ", " << p.N
                                    << "] on " << device.name());
  const DType compute = compute_dtype(p.dtype);
  const auto stats = feature_statistics(p.x, p.M, p.N);
  std::vector<FeatureErrorBound> kernel_bound, oracle_bound;
  for (const FeatureStatistics& s : stats) {
    kernel_bound.push_back(feature_error_bound(s, p.M, compute));
    oracle_bound.push_back(feature_error_bound(s, p.M, DType::f64));
  }
  const auto running_mean0 = rounded_to(testing::random_values(p.N, 11, -1, 1), compute);
  const auto running_var0 = rounded_to(testing::random_values(p.N, 12, 0.5, 2), compute);

  std::vector<double> want_y(p.M * p.N), want_mean, want_rstd, want_running_mean, want_running_var;
  std::vector<double> y_tolerance(p.M * p.N), mean_tolerance, rstd_tolerance,
      running_mean_tolerance, running_var_tolerance;
  for (std::int64_t j = 0; j < p.N; ++j) {
    const FeatureStatistics& s = stats[j];
    const FeatureErrorBound &ek = kernel_bound[j], &eo = oracle_bound[j];
    for (std::int64_t i = 0; i < p.M; ++i) {
      const std::int64_t k = i * p.N + j;
      const double xhat = (p.x[k] - s.mean) * s.rstd;
      want_y[k] = xhat * p.w[j] + p.b[j];
      y_tolerance[k] = with_store_rounding(
          y_error(ek, s.rstd, xhat, p.w[j], p.b[j], compute) +
              y_error(eo, s.rstd, xhat, p.w[j], p.b[j], DType::f64),
          want_y[k], p.dtype);
    }
    want_mean.push_back(s.mean);
    mean_tolerance.push_back(ek.mean + eo.mean);
    want_rstd.push_back(s.rstd);
    rstd_tolerance.push_back((ek.rstd_relative + eo.rstd_relative) * s.rstd);
    want_running_mean.push_back(kMomentum * s.mean + (1 - kMomentum) * running_mean0[j]);
    running_mean_tolerance.push_back(
        running_average_error(s.mean, ek.mean, running_mean0[j], 0, compute) +
        running_average_error(s.mean, eo.mean, running_mean0[j], 0, DType::f64));
    want_running_var.push_back(kMomentum * s.unbiased_variance + (1 - kMomentum) * running_var0[j]);
    running_var_tolerance.push_back(
        running_average_error(s.unbiased_variance, ek.unbiased_variance, running_var0[j], 0,
                              compute) +
        running_average_error(s.unbiased_variance, eo.unbiased_variance, running_var0[j], 0,
                              DType::f64));
  }
  const auto from = [](const std::vector<double>& v) {
    return [&v](std::size_t k) { return v[k]; };
  };
  const TrainOutputs got = run_train(p, running_mean0, running_var0, device);
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.y), want_y, from(y_tolerance)));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.mean), want_mean, from(mean_tolerance)));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.rstd), want_rstd, from(rstd_tolerance)));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.running_mean), want_running_mean,
                                 from(running_mean_tolerance)));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got.running_var), want_running_var,
                                 from(running_var_tolerance)));
  if (device.is_cuda()) {
    // The batch statistics are the CPU's terms added in another order (tiles of 32 rows,
    // reduction_order.hpp), the elementwise parts the same formulas: each backend is within
    // the bound of the exact value, so within twice it of the other.
    const TrainOutputs cpu = run_train(p, running_mean0, running_var0, Device::cpu());
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got.mean), testing::to_doubles(cpu.mean),
                                   [&](std::size_t j) { return 2 * mean_tolerance[j]; }));
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got.rstd), testing::to_doubles(cpu.rstd),
                                   [&](std::size_t j) { return 2 * rstd_tolerance[j]; }));
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got.y), testing::to_doubles(cpu.y),
                                   [&](std::size_t k) { return 2 * y_tolerance[k]; }));
    EXPECT_TRUE(testing::all_close(testing::to_doubles(got.running_var),
                                   testing::to_doubles(cpu.running_var),
                                   [&](std::size_t j) { return 2 * running_var_tolerance[j]; }));
  }
}

TEST_P(BatchNorm, TrainingForwardMatchesFloat64Oracle) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {2, 1}, {2, 7}, {7, 1}, {7, 7}, {1025, 7}, {7, 1025}, {2, 1025}};
  for (const DType dtype : {DType::f32, DType::f16, DType::f64}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;  // f64 is CPU-only
    std::uint64_t seed = 100;
    for (const auto& [M, N] : shapes) {
      expect_train_forward_matches_oracle(make_problem(M, N, dtype, seed++), device());
    }
  }
}

// Three updates from PyTorch's initial state (running_mean 0, running_var 1), batches of
// 7, 2 and 1025 samples, against the formulas of batchnorm.hpp in double, with the error
// bound carried from update to update.
TEST_P(BatchNorm, RunningStatisticsFollowThePyTorchFormulasOverThreeUpdates) {
  const std::int64_t N = 7;
  std::vector<double> running_mean(N, 0.0), running_var(N, 1.0);  // the oracle
  // Distance bounds from the exact values: the kernel's (f32) and the oracle's (f64).
  std::vector<double> mean_error(N, 0.0), var_error(N, 0.0);
  std::vector<double> oracle_mean_error(N, 0.0), oracle_var_error(N, 0.0);
  const Tensor got_mean = testing::make_tensor(running_mean, {N}, DType::f32, device());
  const Tensor got_var = testing::make_tensor(running_var, {N}, DType::f32, device());
  std::uint64_t seed = 200;
  for (const std::int64_t M : {7, 2, 1025}) {
    const Problem p = make_problem(M, N, DType::f32, seed++);
    const Tensor y({M, N}, DType::f32, device()), mean({N}, DType::f32, device()),
        rstd({N}, DType::f32, device());
    batchnorm_forward_train(testing::make_tensor(p.x, {M, N}, DType::f32, device()),
                            testing::make_tensor(p.w, {N}, DType::f32, device()),
                            testing::make_tensor(p.b, {N}, DType::f32, device()), y, mean, rstd,
                            got_mean, got_var);
    const auto stats = feature_statistics(p.x, M, N);
    for (std::int64_t j = 0; j < N; ++j) {
      const FeatureStatistics& s = stats[j];
      const FeatureErrorBound ek = feature_error_bound(s, M, DType::f32);
      const FeatureErrorBound eo = feature_error_bound(s, M, DType::f64);
      mean_error[j] =
          running_average_error(s.mean, ek.mean, running_mean[j], mean_error[j], DType::f32);
      var_error[j] = running_average_error(s.unbiased_variance, ek.unbiased_variance,
                                           running_var[j], var_error[j], DType::f32);
      oracle_mean_error[j] = running_average_error(s.mean, eo.mean, running_mean[j],
                                                   oracle_mean_error[j], DType::f64);
      oracle_var_error[j] = running_average_error(s.unbiased_variance, eo.unbiased_variance,
                                                  running_var[j], oracle_var_error[j], DType::f64);
      running_mean[j] = kMomentum * s.mean + (1 - kMomentum) * running_mean[j];
      running_var[j] = kMomentum * s.unbiased_variance + (1 - kMomentum) * running_var[j];
    }
  }
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got_mean), running_mean, [&](std::size_t j) {
    return mean_error[j] + oracle_mean_error[j];
  }));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(got_var), running_var, [&](std::size_t j) {
    return var_error[j] + oracle_var_error[j];
  }));
}

// torch 1.13, printed with repr() (float32 values):
//   bn = nn.BatchNorm1d(3); weight [1, 0.5, 2], bias [0, 1, -1]; bn.train(); three batches
//   (below) through bn; then running_mean, running_var, the last batch's y; then bn.eval()
//   on [[1, 2, 3]]. The third batch has a constant feature (variance 0: y = bias).
// PyTorch's float results and ours are each within the bounds above of the exact values
// (we assume PyTorch's float arithmetic meets the same bounds as ours): twice our bound.
// (The exact values, computed in double here, are what both bounds are measured from.)
TEST_P(BatchNorm, MatchesPyTorch) {
  const std::int64_t N = 3;
  const std::vector<std::vector<double>> batches = {
      {1, 2, -0.5, 3, 5, 0.25, 4, 0, 1.5, -2, 1, 0.75},
      {0.5, -1, 2, 1.5, 4, 2.25, 2.5, 3, -0.25},
      {10, 0, 1, 12, 0.5, 1, 8, 1, 1, 9, 1.5, 1, 11, 2, 1}};
  const std::vector<double> w = {1, 0.5, 2}, b = {0, 1, -1};
  const std::vector<double> torch_running_mean = {1.256500005722046, 0.44199997186660767,
                                                  0.2605000138282776};
  const std::vector<double> torch_running_var = {1.6359999179840088, 1.7994999885559082,
                                                 0.9569998979568481};
  const std::vector<double> torch_last_y = {
      -2.384185791015625e-07, 0.2929002642631531, -1.0, 1.4142098426818848, 0.6464501619338989,
      -1.0, -1.414210319519043, 1.0, -1.0, -0.707105278968811, 1.353549838066101, -1.0,
      0.7071048021316528, 1.7070996761322021, -1.0};
  const std::vector<double> torch_eval = {-0.20053696632385254, 1.5807113647460938,
                                          4.600709438323975};

  const Tensor weight = testing::make_tensor(w, {N}, DType::f32, device());
  const Tensor bias = testing::make_tensor(b, {N}, DType::f32, device());
  const Tensor running_mean = Tensor::zeros({N}, DType::f32, device());
  const Tensor running_var = testing::make_tensor({1, 1, 1}, {N}, DType::f32, device());
  std::vector<double> want_mean(N, 0.0), want_var(N, 1.0), mean_error(N, 0.0), var_error(N, 0.0);
  Tensor y;
  std::vector<FeatureStatistics> last_stats;
  for (const auto& batch : batches) {
    const std::int64_t M = static_cast<std::int64_t>(batch.size()) / N;
    y = Tensor({M, N}, DType::f32, device());
    const Tensor mean({N}, DType::f32, device()), rstd({N}, DType::f32, device());
    batchnorm_forward_train(testing::make_tensor(batch, {M, N}, DType::f32, device()), weight,
                            bias, y, mean, rstd, running_mean, running_var);
    last_stats = feature_statistics(batch, M, N);
    for (std::int64_t j = 0; j < N; ++j) {
      const FeatureStatistics& s = last_stats[j];
      const FeatureErrorBound e = feature_error_bound(s, M, DType::f32);
      mean_error[j] =
          running_average_error(s.mean, e.mean, want_mean[j], mean_error[j], DType::f32);
      var_error[j] = running_average_error(s.unbiased_variance, e.unbiased_variance, want_var[j],
                                           var_error[j], DType::f32);
      want_mean[j] = kMomentum * s.mean + (1 - kMomentum) * want_mean[j];
      want_var[j] = kMomentum * s.unbiased_variance + (1 - kMomentum) * want_var[j];
    }
  }
  EXPECT_TRUE(testing::all_close(testing::to_doubles(running_mean), torch_running_mean,
                                 [&](std::size_t j) { return 2 * mean_error[j]; }));
  EXPECT_TRUE(testing::all_close(testing::to_doubles(running_var), torch_running_var,
                                 [&](std::size_t j) { return 2 * var_error[j]; }));
  const auto& last = batches.back();
  EXPECT_TRUE(testing::all_close(testing::to_doubles(y), torch_last_y, [&](std::size_t k) {
    const std::size_t j = k % N;
    const FeatureStatistics& s = last_stats[j];
    const FeatureErrorBound e = feature_error_bound(s, 5, DType::f32);
    return 2 * y_error(e, s.rstd, (last[k] - s.mean) * s.rstd, w[j], b[j], DType::f32);
  }));

  const Tensor y_eval({1, N}, DType::f32, device());
  batchnorm_forward_eval(testing::make_tensor({1, 2, 3}, {1, N}, DType::f32, device()), weight,
                         bias, running_mean, running_var, y_eval);
  // Evaluation: y = (x - rm) / sqrt(rv + eps) * w + b with rm, rv carrying the errors above;
  // |dy/drm| = |w| rstd, |dy/drv| = |w xhat| rstd^2 / 2 (we allow twice it, for the curvature
  // over the interval), plus the 7 roundings of the evaluation forward (see below).
  EXPECT_TRUE(testing::all_close(testing::to_doubles(y_eval), torch_eval, [&](std::size_t j) {
    const double rstd = 1 / std::sqrt(want_var[j] + kEps);
    const double xhat = (j + 1 - want_mean[j]) * rstd;
    const double propagated = std::abs(w[j]) * rstd *
                              (mean_error[j] + std::abs(xhat) * rstd * var_error[j]);
    return 2 * (propagated + gamma(6, DType::f32) * (std::abs(w[j] * xhat) + std::abs(b[j])));
  }));
}

// ---- evaluation forward ------------------------------------------------------------------

// y = (x - running_mean) * fl(1 / fl(sqrt(fl(running_var + eps)))) * w + b: with exact
// running statistics, rstd carries 3 roundings, xhat 2 more, y 2 more: 7 in all, so
// |error| <= gamma(7) (|w xhat| + |b|) (and f16 stores one more).
TEST_P(BatchNorm, EvaluationForwardMatchesFloat64Oracle) {
  for (const DType dtype : {DType::f32, DType::f16, DType::f64}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;
    for (const auto& [M, N] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 7}, {7, 1025}, {1025, 7}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " [" << M << ", " << N << "]");
      const DType compute = compute_dtype(dtype);
      const Problem p = make_problem(M, N, dtype, 400 + M + N);
      const auto running_mean = rounded_to(testing::random_values(N, 13, -1, 1), compute);
      const auto running_var = rounded_to(testing::random_values(N, 14, 0.5, 2), compute);
      std::vector<double> want(M * N), tolerance(M * N);
      for (std::int64_t k = 0; k < M * N; ++k) {
        const std::int64_t j = k % N;
        const double xhat = (p.x[k] - running_mean[j]) / std::sqrt(running_var[j] + kEps);
        want[k] = xhat * p.w[j] + p.b[j];
        const double magnitude = std::abs(p.w[j] * xhat) + std::abs(p.b[j]);
        tolerance[k] = with_store_rounding(
            (gamma(7, compute) + gamma(7, DType::f64)) * magnitude, want[k], dtype);
      }
      const Tensor y({M, N}, dtype, device());
      testing::poison(y);
      batchnorm_forward_eval(testing::make_tensor(p.x, {M, N}, dtype, device()),
                             testing::make_tensor(p.w, {N}, compute, device()),
                             testing::make_tensor(p.b, {N}, compute, device()),
                             testing::make_tensor(running_mean, {N}, compute, device()),
                             testing::make_tensor(running_var, {N}, compute, device()), y);
      EXPECT_TRUE(testing::all_close(testing::to_doubles(y), want,
                                     [&](std::size_t k) { return tolerance[k]; }));
    }
  }
}

// ---- backward ---------------------------------------------------------------------------

// Given the saved mean and rstd (exact inputs here), with X = (x - mean) rstd, the kernel
// computes a = sum_i dy / M, c = sum_i dy X / M (per feature) and
// dx = fl(w rstd) ((dy - a) - X c). Bounds, counted as in test_layernorm.cpp:
//   e_a = gamma(M + 1) sum|dy| / M; e_c = gamma(M + 4) sum|dy X| / M;
//   e_dx = |w rstd| (1 + gamma(2)) [e_a (1 + gamma(4)) + |X| e_c (1 + gamma(4))
//                                   + gamma(4) (|dy| + |a| + |X c|)];
//   dweight: gamma(M + 3) (|dweight0| + sum|dy X|); dbias: gamma(M) (|dbias0| + sum|dy|).
BackwardReference batchnorm_backward_reference(const Problem& p, const std::vector<double>& mean,
                                               const std::vector<double>& rstd,
                                               const std::vector<double>& dweight0,
                                               const std::vector<double>& dbias0,
                                               DType compute) {
  const std::int64_t M = p.M, N = p.N;
  BackwardReference ref;
  ref.dx.resize(M * N);
  ref.dx_error.resize(M * N);
  const double g2 = gamma(2, compute), g4 = gamma(4, compute);
  for (std::int64_t j = 0; j < N; ++j) {
    double sum_dy = 0, sum_dy_x = 0, sum_abs_dy = 0, sum_abs_dy_x = 0;
    for (std::int64_t i = 0; i < M; ++i) {
      const double X = (p.x[i * N + j] - mean[j]) * rstd[j];
      const double dy = p.dy[i * N + j];
      sum_dy += dy;
      sum_dy_x += dy * X;
      sum_abs_dy += std::abs(dy);
      sum_abs_dy_x += std::abs(dy * X);
    }
    ref.dweight.push_back(dweight0[j] + sum_dy_x);
    ref.dbias.push_back(dbias0[j] + sum_dy);
    ref.dweight_error.push_back(gamma(M + 3, compute) * (std::abs(dweight0[j]) + sum_abs_dy_x));
    ref.dbias_error.push_back(gamma(M, compute) * (std::abs(dbias0[j]) + sum_abs_dy));
    const double a = sum_dy / M, c = sum_dy_x / M;
    const double e_a = gamma(M + 1, compute) * sum_abs_dy / M;
    const double e_c = gamma(M + 4, compute) * sum_abs_dy_x / M;
    for (std::int64_t i = 0; i < M; ++i) {
      const std::int64_t k = i * N + j;
      const double X = (p.x[k] - mean[j]) * rstd[j];
      ref.dx[k] = p.w[j] * rstd[j] * ((p.dy[k] - a) - X * c);
      const double e = std::abs(p.w[j] * rstd[j]) * (1 + g2) *
                       ((e_a + std::abs(X) * e_c) * (1 + g4) +
                        g4 * (std::abs(p.dy[k]) + std::abs(a) + std::abs(X * c)));
      ref.dx_error[k] = with_store_rounding(e, ref.dx[k], p.dtype);
    }
  }
  return ref;
}

BackwardOutputs run_backward(const Problem& p, const std::vector<double>& mean,
                             const std::vector<double>& rstd, const std::vector<double>& dweight0,
                             const std::vector<double>& dbias0, Device device) {
  const DType stats = compute_dtype(p.dtype);
  BackwardOutputs out{Tensor({p.M, p.N}, p.dtype, device),
                      testing::make_tensor(dweight0, {p.N}, stats, device),
                      testing::make_tensor(dbias0, {p.N}, stats, device)};
  testing::poison(out.dx);
  batchnorm_backward(testing::make_tensor(p.x, {p.M, p.N}, p.dtype, device),
                     testing::make_tensor(p.w, {p.N}, stats, device),
                     testing::make_tensor(mean, {p.N}, stats, device),
                     testing::make_tensor(rstd, {p.N}, stats, device),
                     testing::make_tensor(p.dy, {p.M, p.N}, p.dtype, device), out.dx, out.dweight,
                     out.dbias);
  return out;
}

TEST_P(BatchNorm, BackwardMatchesFloat64Oracle) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {2, 1}, {2, 7}, {7, 1}, {7, 7}, {1025, 7}, {7, 1025}};
  std::uint64_t seed = 300;
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const auto& [M, N] : shapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " [" << M << ", " << N << "]");
      const Problem p = make_problem(M, N, dtype, seed++);
      const std::vector<double> ones(N, 1.0), zeros(N, 0.0);
      const TrainOutputs forward = run_train(p, zeros, ones, Device::cpu());
      const auto mean = testing::to_doubles(forward.mean);
      const auto rstd = testing::to_doubles(forward.rstd);
      expect_backward_matches_oracle(p, mean, rstd, seed, batchnorm_backward_reference,
                                     run_backward, device());
    }
  }
}

// Against finite differences of the forward (CPU, f64). The step, its error bound and
// why: finite_difference.hpp (NormalizationFiniteDifference).
TEST(BatchNormGradient, BackwardMatchesFiniteDifferencesInFloat64) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {2, 1}, {2, 7}, {7, 3}, {1025, 2}, {3, 1025}};
  std::uint64_t seed = 500;
  for (const auto& [M, N] : shapes) {
    SCOPED_TRACE(::testing::Message() << "[" << M << ", " << N << "]");
    Problem p = make_problem(M, N, DType::f64, seed++);
    const std::vector<double> g = p.dy;  // L = sum g * y
    const std::vector<double> zeros(N, 0.0), ones(N, 1.0);
    const auto loss = [&] { return weighted_sum(g, run_train(p, zeros, ones, Device::cpu()).y); };
    // Evaluation error of L: sum |g| e_y (f64 bound, doubled to cover the nearby points
    // x +- 2h), plus the sum's own rounding gamma(MN + 1) sum |g y| (doubled likewise).
    const auto stats = feature_statistics(p.x, M, N);
    double evaluation_error = 0, magnitude = 0;
    for (std::int64_t j = 0; j < N; ++j) {
      const FeatureErrorBound e = feature_error_bound(stats[j], M, DType::f64);
      for (std::int64_t i = 0; i < M; ++i) {
        const std::int64_t k = i * N + j;
        const double xhat = (p.x[k] - stats[j].mean) * stats[j].rstd;
        evaluation_error +=
            2 * std::abs(g[k]) * y_error(e, stats[j].rstd, xhat, p.w[j], p.b[j], DType::f64);
        magnitude += std::abs(g[k] * (xhat * p.w[j] + p.b[j]));
      }
    }
    evaluation_error += gamma(M * N + 1, DType::f64) * 2 * magnitude;
    double smallest_sigma = 1;
    for (const FeatureStatistics& s : stats) {
      smallest_sigma = std::min(smallest_sigma, std::sqrt(s.variance + kEps));
    }
    const TrainOutputs forward = run_train(p, zeros, ones, Device::cpu());
    const BackwardOutputs got = run_backward(p, testing::to_doubles(forward.mean),
                                             testing::to_doubles(forward.rstd), zeros, zeros,
                                             Device::cpu());
    expect_gradients_match_finite_differences(got, p, loss, evaluation_error, smallest_sigma);
  }
}

// dweight and dbias are exactly the documented float operations, rows in order, on both
// backends; BatchNorm's statistics are per feature (j).
TEST_P(BatchNorm, ParameterGradientsAreTheDocumentedFloatAdditionsInRowOrder) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Problem p = make_problem(37, 19, dtype, 900);
    const std::vector<double> zeros(p.N, 0.0), ones(p.N, 1.0);
    const TrainOutputs forward = run_train(p, zeros, ones, Device::cpu());
    expect_parameter_gradients_are_documented_float_additions(
        p, testing::to_doubles(forward.mean), testing::to_doubles(forward.rstd),
        [](std::int64_t, std::int64_t j) { return j; }, 901, run_backward, device());
  }
}

// ---- the pitfall --------------------------------------------------------------------------

// 1024 samples as one batch, and as 16 micro-batches of 64 accumulating into the same
// gradient buffers. LayerNorm gives the same bits both ways (test_layernorm.cpp); BatchNorm
// cannot: each micro-batch is normalised with its own mean and variance. The difference is
// measured and must be far above rounding (here it reaches tenths, on values of order 1).
TEST_P(BatchNorm, MicroBatchesAreNotTheBigBatch) {
  const std::int64_t M = 1024, N = 16, slice = 64;
  const Problem p = make_problem(M, N, DType::f32, 31);
  const Tensor x = testing::make_tensor(p.x, {M, N}, DType::f32, device());
  const Tensor dy = testing::make_tensor(p.dy, {M, N}, DType::f32, device());
  const Tensor w = testing::make_tensor(p.w, {N}, DType::f32, device());
  const Tensor b = testing::make_tensor(p.b, {N}, DType::f32, device());
  struct Run {
    Tensor y, dx, dweight, dbias;
  };
  const auto make_run = [&] {
    return Run{Tensor({M, N}, DType::f32, device()), Tensor({M, N}, DType::f32, device()),
               Tensor::zeros({N}, DType::f32, device()), Tensor::zeros({N}, DType::f32, device())};
  };
  // In double, per feature j: sum_i dy X with X = (x - mean) rstd from the statistics each
  // backward was given (the ones its forward saved), and sum_i |dy X|.
  std::vector<double> exact_big(N, 0.0), exact_micro(N, 0.0), magnitude_big(N, 0.0),
      magnitude_micro(N, 0.0);
  const auto run_on = [&](const Run& run, std::int64_t begin, std::int64_t end,
                          std::vector<double>& exact, std::vector<double>& magnitude) {
    const Tensor mean({N}, DType::f32, device()), rstd({N}, DType::f32, device());
    const Tensor running_mean = Tensor::zeros({N}, DType::f32, device());
    const Tensor running_var = testing::make_tensor(std::vector<double>(N, 1.0), {N},
                                                    DType::f32, device());
    batchnorm_forward_train(x.rows(begin, end), w, b, run.y.rows(begin, end), mean, rstd,
                            running_mean, running_var);
    batchnorm_backward(x.rows(begin, end), w, mean, rstd, dy.rows(begin, end),
                       run.dx.rows(begin, end), run.dweight, run.dbias);
    const auto saved_mean = testing::to_doubles(mean), saved_rstd = testing::to_doubles(rstd);
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        const double term = p.dy[i * N + j] * (p.x[i * N + j] - saved_mean[j]) * saved_rstd[j];
        exact[j] += term;
        magnitude[j] += std::abs(term);
      }
    }
  };
  const Run big = make_run(), micro = make_run();
  run_on(big, 0, M, exact_big, magnitude_big);
  for (std::int64_t begin = 0; begin < M; begin += slice) {
    run_on(micro, begin, begin + slice, exact_micro, magnitude_micro);
  }

  const auto largest_difference = [](const Tensor& a, const Tensor& b) {
    const auto va = testing::to_doubles(a), vb = testing::to_doubles(b);
    double largest = 0;
    for (std::size_t k = 0; k < va.size(); ++k) {
      largest = std::max(largest, std::abs(va[k] - vb[k]));
    }
    return largest;
  };
  const double y_difference = largest_difference(micro.y, big.y);
  const double dweight_difference = largest_difference(micro.dweight, big.dweight);
  std::cout << "BatchNorm, 1024 samples vs 16 micro-batches of 64: max |y difference| = "
            << y_difference << ", max |dweight difference| = " << dweight_difference << "\n";
  RecordProperty("max_y_difference", std::to_string(y_difference));
  RecordProperty("max_dweight_difference", std::to_string(dweight_difference));
  // Rounding alone would stay below ~gamma(1024 + 8) (|w xhat| + |b|) ~ 1e-3 for y here.
  EXPECT_GT(y_difference, 1e-2);
  // dweight: each run computes, per feature, one product dy * fl(fl(x - mean) rstd) and one
  // addition per sample, in sample order from 0, with the statistics its forward saved
  // (batchnorm.hpp): M terms of 3 roundings each and M additions, within
  // gamma(M + 3) sum_i |dy X| of the exact sum (as batchnorm_backward_reference bounds it).
  // So the two runs' difference is within e_j = gamma(M + 3) (magnitude_big + magnitude_micro)
  // of the exact difference of the sums, and were the statistics the same, the two runs
  // would differ by at most e_j: a difference above e_j is the statistics, not rounding.
  const auto got_big = testing::to_doubles(big.dweight), got_micro = testing::to_doubles(micro.dweight);
  double largest_excess = 0;
  for (std::int64_t j = 0; j < N; ++j) {
    const double e = testing::gamma(M + 3, DType::f32) * (magnitude_big[j] + magnitude_micro[j]);
    const double got_difference = got_micro[j] - got_big[j];
    EXPECT_NEAR(got_difference, exact_micro[j] - exact_big[j], e) << "dweight difference, feature " << j;
    largest_excess = std::max(largest_excess, std::abs(got_difference) / e);
  }
  std::cout << "largest |dweight difference| / rounding bound: " << largest_excess << "\n";
  EXPECT_GT(largest_excess, 1.0) << "dweight differs by no more than rounding could make it";
  // dbias is a plain sum of dy, unaffected by the statistics: the same either way.
  EXPECT_TRUE(testing::bitwise_equal(micro.dbias, big.dbias));
}

// ---- argument checks ----------------------------------------------------------------------

TEST_P(BatchNorm, RejectsASingleSampleInTraining) {
  const Tensor x({1, 4}, DType::f32, device()), y({1, 4}, DType::f32, device());
  const Tensor w({4}, DType::f32, device()), b({4}, DType::f32, device());
  const Tensor mean({4}, DType::f32, device()), rstd({4}, DType::f32, device());
  const Tensor running_mean({4}, DType::f32, device()), running_var({4}, DType::f32, device());
  try {
    batchnorm_forward_train(x, w, b, y, mean, rstd, running_mean, running_var);
    ADD_FAILURE() << "a batch of one sample was accepted in training";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per feature"), std::string::npos)
        << e.what();
  }
  // Evaluation uses the running statistics: one sample is fine there.
  EXPECT_NO_THROW(batchnorm_forward_eval(x, w, b, running_mean, running_var, y));
}

TEST_P(BatchNorm, RejectsMismatchedArguments) {
  const Tensor x({4, 8}, DType::f32, device()), y({4, 8}, DType::f32, device());
  const Tensor w({8}, DType::f32, device()), b({8}, DType::f32, device());
  const Tensor mean({8}, DType::f32, device()), rstd({8}, DType::f32, device());
  const Tensor running_mean({8}, DType::f32, device()), running_var({8}, DType::f32, device());
  const Tensor per_sample({4}, DType::f32, device());
  const Tensor half_running({8}, DType::f16, device());
  EXPECT_THROW(batchnorm_forward_train(x, w, b, y, per_sample, rstd, running_mean, running_var),
               std::invalid_argument);
  EXPECT_THROW(batchnorm_forward_train(x, w, b, y, mean, rstd, running_mean, half_running),
               std::invalid_argument);
  EXPECT_THROW(batchnorm_backward(x, w, mean, rstd, y, per_sample, w, b), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchNorm, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace bigbatch

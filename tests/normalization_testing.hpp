// normalization_testing.hpp: what the LayerNorm and BatchNorm tests share. Both ops take
// x: [M, N] with weight and bias [N], save a mean and an rstd, and have a backward giving
// dx (=) and dweight, dbias (+=); they differ in the axis they normalise over (a row for
// LayerNorm, a feature for BatchNorm), which stays in each test file: the oracles, the
// forwards and their error bounds. Shared here: the problem, the rounding helpers, the
// backward's outputs and oracle, and the checks of a backward against its oracle, against
// the documented float additions of the parameter gradients and against finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/tensor.hpp"
#include "kernels/reduction_order.hpp"
#include "tests/finite_difference.hpp"
#include "tests/harness.hpp"

namespace bigbatch::testing::normalization {

inline constexpr double kEps = 1e-5f;  // the kernels' default eps, as the float they receive

/// The precision the kernels compute in: f64 for f64 data, f32 otherwise.
inline DType compute_dtype(DType data) { return data == DType::f64 ? DType::f64 : DType::f32; }

/// testing::gamma for a length computed in any integer or floating type.
inline double gamma(double n, DType dtype) {
  return testing::gamma(static_cast<std::int64_t>(n), dtype);
}

/// Adds the rounding of a value of magnitude |v| (off by e) stored in `dtype`: u (|v| + e).
inline double with_store_rounding(double e, double v, DType dtype) {
  return dtype == DType::f16 ? e + unit_roundoff(DType::f16) * (std::abs(v) + e) : e;
}

/// `values` rounded to `dtype` (through a tensor, as the kernel will see them).
inline std::vector<double> rounded_to(const std::vector<double>& values, DType dtype) {
  return to_doubles(
      make_tensor(values, {static_cast<std::int64_t>(values.size())}, dtype, Device::cpu()));
}

struct Problem {
  std::int64_t M = 0, N = 0;
  DType dtype = DType::f32;
  std::vector<double> x, w, b, dy;  // exactly the values the kernel sees
};

struct BackwardOutputs {
  Tensor dx, dweight, dbias;
};

/// The float64 oracle of a backward, with the bounds of a kernel computing in a given dtype.
struct BackwardReference {
  std::vector<double> dx, dweight, dbias;
  std::vector<double> dx_error, dweight_error, dbias_error;
};

/// The op's oracle: reference(p, mean, rstd, dweight0, dbias0, compute).
using BackwardOracle = std::function<BackwardReference(
    const Problem&, const std::vector<double>& mean, const std::vector<double>& rstd,
    const std::vector<double>& dweight0, const std::vector<double>& dbias0, DType compute)>;

/// The op's backward on a device, from the given statistics, into parameter gradients that
/// start at dweight0 and dbias0: run(p, mean, rstd, dweight0, dbias0, device).
using BackwardRun = std::function<BackwardOutputs(
    const Problem&, const std::vector<double>& mean, const std::vector<double>& rstd,
    const std::vector<double>& dweight0, const std::vector<double>& dbias0, Device device)>;

/// Runs the backward on `device` from the statistics the forward saved (`mean`, `rstd`, as
/// the backward receives them in training) and checks every output against the oracle:
/// within the kernel's bound (f32) plus the oracle's own (the same bound in f64). The
/// parameter gradients start nonzero (seeded from `seed`): they must accumulate, not
/// overwrite. On CUDA also against the CPU: each within its bound of the exact values, so
/// within twice the bound of each other (the CPU adds the rows in order, CUDA in tiles).
inline void expect_backward_matches_oracle(const Problem& p, const std::vector<double>& mean,
                                           const std::vector<double>& rstd, std::uint64_t seed,
                                           const BackwardOracle& reference,
                                           const BackwardRun& run_backward, Device device) {
  const auto dweight0 = random_values(p.N, seed + 1000, -1, 1);
  const auto dbias0 = random_values(p.N, seed + 2000, -1, 1);
  const BackwardReference ref = reference(p, mean, rstd, dweight0, dbias0, DType::f32);
  const BackwardReference oracle = reference(p, mean, rstd, dweight0, dbias0, DType::f64);
  const BackwardOutputs got = run_backward(p, mean, rstd, dweight0, dbias0, device);
  EXPECT_TRUE(all_close(to_doubles(got.dx), ref.dx, [&](std::size_t k) {
    return ref.dx_error[k] + oracle.dx_error[k];
  }));
  EXPECT_TRUE(all_close(to_doubles(got.dweight), ref.dweight, [&](std::size_t j) {
    return ref.dweight_error[j] + oracle.dweight_error[j];
  }));
  EXPECT_TRUE(all_close(to_doubles(got.dbias), ref.dbias, [&](std::size_t j) {
    return ref.dbias_error[j] + oracle.dbias_error[j];
  }));
  if (device.is_cuda()) {
    const BackwardOutputs cpu = run_backward(p, mean, rstd, dweight0, dbias0, Device::cpu());
    EXPECT_TRUE(all_close(to_doubles(got.dweight), to_doubles(cpu.dweight),
                          [&](std::size_t j) { return 2 * ref.dweight_error[j]; }));
    EXPECT_TRUE(all_close(to_doubles(got.dbias), to_doubles(cpu.dbias),
                          [&](std::size_t j) { return 2 * ref.dbias_error[j]; }));
    EXPECT_TRUE(all_close(to_doubles(got.dx), to_doubles(cpu.dx),
                          [&](std::size_t k) { return 2 * ref.dx_error[k]; }));
  }
}

/// Runs the backward on `device` from the saved statistics and checks that dweight and dbias
/// are exactly the documented sequence of float operations: one product g * xhat per
/// element (xhat = (x - mean) * rstd in float), added onto the buffer row by row in order
/// (CPU) or tile by tile (CUDA, reduction_order.hpp's order 1) (layernorm.hpp,
/// batchnorm.hpp), recomputed here in float: bit for bit. The buffers start
/// nonzero (from `seed`). `statistic(i, j)` is the index into mean and rstd of element
/// (i, j): the op's normalisation axis (i for LayerNorm's rows, j for BatchNorm's features).
inline void expect_parameter_gradients_are_documented_float_additions(
    const Problem& p, const std::vector<double>& mean, const std::vector<double>& rstd,
    const std::function<std::int64_t(std::int64_t i, std::int64_t j)>& statistic,
    std::uint64_t seed, const BackwardRun& run_backward, Device device) {
  const auto dweight0 = random_values(p.N, seed, -1, 1);
  const auto dbias0 = random_values(p.N, seed + 1, -1, 1);
  const BackwardOutputs got = run_backward(p, mean, rstd, dweight0, dbias0, device);
  std::vector<float> dweight(dweight0.begin(), dweight0.end());
  std::vector<float> dbias(dbias0.begin(), dbias0.end());
  const auto g = [&](std::int64_t i, std::int64_t j) {
    return static_cast<float>(p.dy[static_cast<std::size_t>(i * p.N + j)]);
  };
  const auto g_xhat = [&](std::int64_t i, std::int64_t j) {
    const auto s = static_cast<std::size_t>(statistic(i, j));
    const float xhat =
        (static_cast<float>(p.x[static_cast<std::size_t>(i * p.N + j)]) -
         static_cast<float>(mean[s])) * static_cast<float>(rstd[s]);
    return g(i, j) * xhat;
  };
  for (std::int64_t j = 0; j < p.N; ++j) {
    const auto jj = static_cast<std::size_t>(j);
    if (device.is_cuda()) {
      dweight[jj] = reduction_order::tiled_column_sum(
          dweight[jj], p.M, [&](std::int64_t i) { return g_xhat(i, j); });
      dbias[jj] = reduction_order::tiled_column_sum(dbias[jj], p.M,
                                                    [&](std::int64_t i) { return g(i, j); });
    } else {
      for (std::int64_t i = 0; i < p.M; ++i) {
        dweight[jj] = dweight[jj] + g_xhat(i, j);
        dbias[jj] = dbias[jj] + g(i, j);
      }
    }
  }
  EXPECT_TRUE(bitwise_equal(got.dweight, Tensor::from_vector(dweight, {p.N})))
      << dtype_name(p.dtype);
  EXPECT_TRUE(bitwise_equal(got.dbias, Tensor::from_vector(dbias, {p.N}))) << dtype_name(p.dtype);
}

/// The loss of the finite-difference checks, L = sum_k g[k] y[k], for a forward output y.
inline double weighted_sum(const std::vector<double>& g, const Tensor& y) {
  const auto values = to_doubles(y);
  double sum = 0;
  for (std::size_t k = 0; k < values.size(); ++k) sum += g[k] * values[k];
  return sum;
}

/// Checks the CPU backward's gradients `got` (from zero parameter gradients) against finite
/// differences of `loss` = sum g y, which reads p.x, p.w and p.b (this moves them, and puts
/// them back), each evaluation within `evaluation_error` of the exact value. The step and
/// the bound: finite_difference.hpp (NormalizationFiniteDifference), with `smallest_sigma`
/// the smallest sqrt(variance + eps) over the normalised rows or features.
inline void expect_gradients_match_finite_differences(const BackwardOutputs& got, Problem& p,
                                                      const std::function<double()>& loss,
                                                      double evaluation_error,
                                                      double smallest_sigma) {
  const NormalizationFiniteDifference fd(smallest_sigma);
  fd.expect_gradient("dx", to_doubles(got.dx), p.x, loss, evaluation_error);
  fd.expect_gradient("dweight", to_doubles(got.dweight), p.w, loss, evaluation_error);
  fd.expect_gradient("dbias", to_doubles(got.dbias), p.b, loss, evaluation_error);
}

}  // namespace bigbatch::testing::normalization

// finite_difference.hpp: a backward pass checked against Richardson-extrapolated central
// differences of its forward pass, with a bound on the difference's own error.
//
// With D(h) = (f(x+h) - f(x-h)) / 2h (testing::central_difference):
//   R = (4 D(h) - D(2h)) / 3 = f'(x) - h^4/30 f^(5)(xi).
// Rounding: if every evaluation of f is within eps_f of the exact value, R is off by at
// most (4/3)(eps_f/h) + (1/3)(eps_f/2h) = 1.5 eps_f / h.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/harness.hpp"

namespace bigbatch::testing {

/// R above: f'(x) from four evaluations of f, which reads `x` by reference.
inline double richardson_derivative(const std::function<double()>& f, double& x, double h) {
  return (4 * central_difference(f, x, h) - central_difference(f, x, 2 * h)) / 3;
}

/// Bound on |R - f'(x)| when every evaluation of f is within `evaluation_error` of the
/// exact value and |f^(5)| <= `fifth_derivative_bound` near x: rounding plus truncation.
inline double richardson_error(double h, double evaluation_error, double fifth_derivative_bound) {
  return 1.5 * evaluation_error / h + std::pow(h, 4) / 30 * fifth_derivative_bound;
}

// The step and the bound for a normalisation layer (LayerNorm, BatchNorm). y depends on x
// through (x - mean) / sigma, sigma = sqrt(var + eps), so sigma is the length over which
// L = sum g y bends. We step h = 2^-12 s, s = min(1, the smallest sigma of any row or
// feature), rounded down to a power of two (x +- h is then exact in double for our
// inputs), and take |f^(5)| <= 1e6 / s^5: in units of s, a fifth derivative a million
// times the O(1) size of g, w and b, which these smooth functions do not approach. The
// term is then h^4/30 * 1e6 / s^5 <= 1.2e-10 / s. (A fixed step fails on a nearly
// constant row or feature, whose sigma is tiny: that is what the scaling is for.)
// The analytic gradient's own f64 rounding, about (n + 10) 2^-53 relative for a reduction
// over n <= 1025 values (< 1.3e-13), is covered by 1e-12 (1 + |gradient|).
struct NormalizationFiniteDifference {
  double scale;  // s above
  double step;   // h above

  explicit NormalizationFiniteDifference(double smallest_sigma)
      : scale(std::min(1.0, smallest_sigma)),
        step(std::exp2(std::floor(std::log2(0x1p-12 * scale)))) {}

  double derivative(const std::function<double()>& f, double& x) const {
    return richardson_derivative(f, x, step);
  }

  double tolerance(double evaluation_error, double analytic) const {
    return richardson_error(step, evaluation_error, 1e6 / std::pow(scale, 5)) +
           1e-12 * (1 + std::abs(analytic));
  }

  /// Checks analytic[k] against the derivative of `loss` by inputs[k], for every k.
  void expect_gradient(const std::string& name, const std::vector<double>& analytic,
                       std::vector<double>& inputs, const std::function<double()>& loss,
                       double evaluation_error) const {
    ASSERT_EQ(analytic.size(), inputs.size()) << name;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      EXPECT_NEAR(analytic[k], derivative(loss, inputs[k]),
                  tolerance(evaluation_error, analytic[k]))
          << name << " " << k;
    }
  }
};

}  // namespace bigbatch::testing

// running_error.hpp: float64 oracle values that carry a bound on a kernel's rounding error.
//
// An oracle evaluates, in double, the exact value of what a kernel computes, operation by
// operation in the kernel's order; Bounded carries beside each value v a bound e on
// |computed - v| for a kernel that rounds every operation once to the unit roundoff u of
// its compute type. These are the rules of running error analysis (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., section 3.3), with the operands' own errors
// carried along, so the bound holds for any values, not only to first order:
//   a + b:  e_a + e_b + u (|a + b| + e_a + e_b)
//   a * b:  |a| e_b + |b| e_a + e_a e_b, plus u times the largest computed |a b|
//   a / b:  (|a| e_b + |b| e_a) / (|b| (|b| - e_b)), plus u times the largest computed |a / b|
//   exp(a): exp(a) expm1(e_a) + phi exp(a + e_a) + the flush to zero below 2^-126
//           (phi: the exponential's own relative error)
//   max:    the largest of the operands' errors (a max is exact)
//   store:  rounding to a storage dtype of unit roundoff s adds s (|v| + e)
// The oracle's own double arithmetic errs by the same rules with u = 2^-53; checks add that.
#pragma once

#include <algorithm>
#include <cmath>

namespace bigbatch::testing {

/// An exact value and a bound on the computed value's distance from it.
struct Bounded {
  double v = 0;  ///< the exact value
  double e = 0;  ///< |computed - v| <= e
};

/// The arithmetic of a kernel: its unit roundoff, its exponential's relative error, and
/// what its exponential may flush to zero.
struct RoundingModel {
  double u;              ///< unit roundoff of the compute type (2^-24 for float)
  double exp_error;      ///< relative error of one exp
  double exp_flush = 0;  ///< absolute: results below this may come out as 0

  Bounded add(Bounded a, Bounded b) const {
    const double e = a.e + b.e;
    return {a.v + b.v, e + u * (std::abs(a.v + b.v) + e)};
  }
  Bounded sub(Bounded a, Bounded b) const { return add(a, {-b.v, b.e}); }
  Bounded mul(Bounded a, Bounded b) const {
    const double e = std::abs(a.v) * b.e + std::abs(b.v) * a.e + a.e * b.e;
    return {a.v * b.v, e + u * (std::abs(a.v * b.v) + e)};
  }
  /// Requires |b| > e_b (the computed divisor cannot be 0).
  Bounded div(Bounded a, Bounded b) const {
    const double e =
        (std::abs(a.v) * b.e + std::abs(b.v) * a.e) / (std::abs(b.v) * (std::abs(b.v) - b.e));
    return {a.v / b.v, e + u * (std::abs(a.v / b.v) + e)};
  }
  Bounded exp(Bounded a) const {
    const double value = std::exp(a.v);
    return {value, value * std::expm1(a.e) + exp_error * std::exp(a.v + a.e) + exp_flush};
  }
  static Bounded max(Bounded a, Bounded b) { return {std::max(a.v, b.v), std::max(a.e, b.e)}; }
  /// Rounding to a storage dtype of unit roundoff `s` (0: stored exactly).
  static Bounded store(Bounded a, double s) { return {a.v, a.e + s * (std::abs(a.v) + a.e)}; }
};

/// The tolerance for a kernel's result against oracle value `b` computed under `model`: the
/// kernel's bound plus the oracle's own double rounding, which obeys the same bound scaled to
/// u = 2^-53 (the bound is proportional to u), and the last rounding of the oracle's value.
inline double tolerance(const Bounded& b, const RoundingModel& model) {
  return b.e * (1 + 0x1p-53 / model.u) + 2 * 0x1p-53 * std::abs(b.v);
}

}  // namespace bigbatch::testing

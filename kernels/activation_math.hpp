// activation_math.hpp: the scalar activation formulas, written once for both backends.
//
// The CPU loops (activation.cpp) and the CUDA kernels (activation.cu) call the same
// functions, so both compute the same bits: every operation below rounds exactly once
// (the *_rn helpers stop nvcc from fusing a*b+c into an fma, which the CPU build never
// does either), and the exponential is our own polynomial rather than each platform's
// libm. The functions are templates on the element type: float is the production path;
// double (CPU only) evaluates the same formulas with std::exp, which gives the tests a
// float64 version of the kernel to take finite differences of.
//
// GELU, tanh approximation (PyTorch nn.GELU(approximate='tanh')):
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3).
// We evaluate it through the identity 1 + tanh(u) = 2 / (1 + e^(-2u)):
//   gelu(x) = x * sigmoid(z),        z = 2u = sqrt(8/pi) (x + 0.044715 x^3),
// the same function, without the cancellation of the literal form: for x = -5, tanh(u)
// is within 1e-7 of -1, so 1 + tanh(u) in float keeps no correct digit, while sigmoid(z)
// keeps nearly all of them. (In float, sqrt(8/pi) rounds to exactly twice the rounded
// sqrt(2/pi) PyTorch uses, so our z is exactly twice PyTorch's u.)
//   gelu'(x) = sigmoid(z) + x z'(x) sigmoid(z) sigmoid(-z),
//   z'(x) = sqrt(8/pi) (1 + 3 * 0.044715 x^2).
// Both sigmoids come from e = exp(-|z|), which lies in [0, 1] and so never overflows.
//
// ReLU: relu(x) = max(x, 0) with NaN passed through, relu'(x) = [x > 0] (relu'(0) = 0),
// as PyTorch.
//
// This header must compile under nvcc: no half.hpp here.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch::activation_math {

// Arithmetic with one rounding per operation on both backends, and the bits of a float.
using scalar_math::add_rn;
using scalar_math::div_rn;
using scalar_math::float_bits;
using scalar_math::float_from_bits;
using scalar_math::mul_rn;

// ---- branch-free selection (scalar_math.hpp says why) ----------------------------------

/// condition ? if_true : if_false, on the bits (a NaN operand is returned unchanged).
BIGBATCH_HD inline float select(bool condition, float if_true, float if_false) {
  return float_from_bits(scalar_math::select_bits(condition, float_bits(if_true),
                                                  float_bits(if_false)));
}
/// condition ? if_true : if_false, for the double (CPU-only) path.
inline double select(bool condition, double if_true, double if_false) {
  return condition ? if_true : if_false;
}

/// -|x| (NaN stays NaN).
BIGBATCH_HD inline float negative_abs(float x) {
  return float_from_bits(float_bits(x) | 0x80000000u);
}
/// -|x|, for the double path.
inline double negative_abs(double x) { return -std::fabs(x); }

// ---- exp on (-inf, 0] ----------------------------------------------------------------

/// e^y for y <= 0 (also exact at y = +0), branch-free so that GCC vectorises the loops
/// that call it. Results below 2^-126 (y < -87.3) may be flushed to zero; -inf gives 0,
/// NaN gives NaN.
///
/// Range reduction y = n ln2 + r with n = round(y / ln2), |r| <= ln2/2, then
/// e^y = 2^n e^r with e^r from its Taylor polynomial of degree 7 (truncation error at
/// most (ln2/2)^8 / 8! = 5.2e-9, under 0.1 ulp). ln2 is split in two (Cody and Waite)
/// so that n * kLn2High is exact for |n| <= 127 and the reduction adds almost no error.
/// Measured over every float y in [-87.3, 0] (1.1e9 of them): at most 1.2122 ulp from
/// the exact e^y, at y = -71.0456161; test_activation.cpp holds it to 1.25 ulp.
BIGBATCH_HD inline float exp_nonpositive(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693145751953125f;  // 15 significant bits
  constexpr float kLn2Low = 1.42860682e-6f;       // ln2 - kLn2High
  // Adding 1.5 * 2^23 rounds to an integer (to nearest even) and leaves that integer
  // in the low mantissa bits: n without a float-to-int conversion or a branch.
  constexpr float kRoundingShift = 12582912.0f;
  // Below -88 the result would be under 2^-127: the clamp makes n = -127, whose 2^n
  // below is exactly 0. (A NaN fails the comparison and stays NaN.)
  const float clamped = select(y < -88.0f, -88.0f, y);
  const float shifted = add_rn(mul_rn(clamped, kLog2e), kRoundingShift);
  const float n = add_rn(shifted, -kRoundingShift);
  const float r = add_rn(add_rn(clamped, -mul_rn(n, kLn2High)), -mul_rn(n, kLn2Low));
  // Horner: 1 + r (1 + r (1/2 + r (1/6 + r (1/24 + r (1/120 + r (1/720 + r/5040))))))
  float poly = 1.0f / 5040.0f;
  poly = add_rn(mul_rn(poly, r), 1.0f / 720.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f / 120.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f / 24.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f / 6.0f);
  poly = add_rn(mul_rn(poly, r), 0.5f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  // 2^n: the biased exponent n + 127 (in [0, 127]) placed in the exponent field.
  const std::uint32_t biased = float_bits(shifted) - float_bits(kRoundingShift) + 127u;
  return mul_rn(poly, float_from_bits(biased << 23));
}

/// e^y by std::exp, for the double path (any y).
inline double exp_nonpositive(double y) { return std::exp(y); }

// ---- GELU ------------------------------------------------------------------------

/// sqrt(8/pi), the factor of z = gelu_z(x).
inline constexpr double kSqrt8OverPi = 1.5957691216057307;  // 2 sqrt(2/pi)
/// The coefficient of x^3 in the tanh approximation.
inline constexpr double kGeluCubic = 0.044715;

/// z = sqrt(8/pi) (x + 0.044715 x^3): twice the argument of tanh in the tanh form.
template <class T>
BIGBATCH_HD T gelu_z(T x) {
  const T cube = mul_rn(mul_rn(x, x), x);
  return mul_rn(T(kSqrt8OverPi), add_rn(x, mul_rn(T(kGeluCubic), cube)));
}

/// sigmoid(|z|) and sigmoid(-|z|), from e = exp(-|z|) in [0, 1].
template <class T>
struct SigmoidPair {
  /// The larger sigmoid, of |z|.
  T of_abs;      // sigmoid(|z|) = 1 / (1 + e), in [1/2, 1]
  /// The smaller sigmoid, of -|z|.
  T of_neg_abs;  // sigmoid(-|z|) = e / (1 + e), in [0, 1/2]
};

/// sigmoid(|z|) and sigmoid(-|z|) from one exponential, e = exp(-|z|).
template <class T>
BIGBATCH_HD SigmoidPair<T> sigmoid_pair(T z) {
  const T e = exp_nonpositive(negative_abs(z));
  const T of_abs = div_rn(T(1), add_rn(T(1), e));
  return {of_abs, mul_rn(e, of_abs)};
}

/// sigmoid(z) from the pair (NaN when z is NaN).
template <class T>
BIGBATCH_HD T sigmoid_of(T z, const SigmoidPair<T>& pair) {
  return select(z >= T(0), pair.of_abs, pair.of_neg_abs);
}

/// gelu(x) from z = gelu_z(x) and sigmoid_pair(z).
template <class T>
BIGBATCH_HD T gelu_from(T x, T z, const SigmoidPair<T>& pair) {
  return mul_rn(x, sigmoid_of(z, pair));
}

/// gelu'(x) from z and the pair. For |x| >= 64, sigmoid(z) sigmoid(-z) is exactly 0 in
/// float and double; the second term then uses x clamped to +-64 so that x z'(x), which
/// overflows, cannot turn 0 into NaN (gelu'(+-inf) is then its limit, 1 or 0).
template <class T>
BIGBATCH_HD T gelu_derivative_from(T x, T z, const SigmoidPair<T>& pair) {
  const T x_limited = select(x > T(64), T(64), select(x < T(-64), T(-64), x));
  const T dz_dx = mul_rn(T(kSqrt8OverPi),
                         add_rn(T(1), mul_rn(T(3 * kGeluCubic), mul_rn(x_limited, x_limited))));
  const T slope_term = mul_rn(mul_rn(x_limited, dz_dx), mul_rn(pair.of_abs, pair.of_neg_abs));
  return add_rn(sigmoid_of(z, pair), slope_term);
}

/// gelu(x) = x * sigmoid(z), z = gelu_z(x): PyTorch's tanh approximation, in T.
template <class T>
BIGBATCH_HD T gelu(T x) {
  const T z = gelu_z(x);
  return gelu_from(x, z, sigmoid_pair(z));
}

/// gelu'(x), in T (see gelu_derivative_from for the large |x|).
template <class T>
BIGBATCH_HD T gelu_derivative(T x) {
  const T z = gelu_z(x);
  return gelu_derivative_from(x, z, sigmoid_pair(z));
}

/// gelu(x) and gelu'(x) from one exponential: the same operations as gelu and
/// gelu_derivative, so the same bits (the fused kernel of kernels/dropout.hpp).
template <class T>
struct GeluAndDerivative {
  /// \var value
  /// gelu(x), the bits of gelu(x).
  /// \var derivative
  /// gelu'(x), the bits of gelu_derivative(x).
  T value, derivative;
};

/// gelu(x) and gelu'(x) for one x, sharing gelu_z and sigmoid_pair.
template <class T>
BIGBATCH_HD GeluAndDerivative<T> gelu_and_derivative(T x) {
  const T z = gelu_z(x);
  const SigmoidPair<T> pair = sigmoid_pair(z);
  return {gelu_from(x, z, pair), gelu_derivative_from(x, z, pair)};
}

// ---- ReLU ------------------------------------------------------------------------

/// max(x, 0); a NaN x is returned unchanged.
template <class T>
BIGBATCH_HD T relu(T x) {
  return select(x <= T(0), T(0), x);  // NaN <= 0 is false: NaN passes through
}

/// dy where x > 0, else 0 (relu'(0) = 0; a NaN x passes dy through, as PyTorch's
/// threshold_backward does).
template <class T>
BIGBATCH_HD T relu_backward_of(T x, T dy) {
  return select(x <= T(0), T(0), dy);
}

}  // namespace bigbatch::activation_math

// bf16_costs.hpp: chapter 04's last part, bf16 against fp16, as measurements with their
// predictions. bf16 keeps fp32's 8 exponent bits but 8 significant bits to fp16's 11, and
// that is what it costs:
//
//   Accumulation            gradients of N micro-batches summed in a 16-bit buffer against
//                           the f32 sum: the share of the update that is wrong, measured
//                           and predicted from the f32 partial sums
//   lost_update_share       weights kept only in bf16 (no f32 master): the share of the
//                           nonzero updates that round away; predicted for weights uniform
//                           in (-b, b) by predicted_lost_share
//
// Both predictions take the root-mean-square relative error of a rounding to p significant
// bits to be kRmsRelativeRounding times the unit roundoff u = 2^-p.
// Why and how: docs/internals.md#chapters04_dynamic_loss_scalingbf16_costshpp
#pragma once

#include <cstdint>
#include <vector>

#include "common/tensor.hpp"

namespace bigbatch::bf16_costs {

/// sqrt(1 / (8 ln 2)) = 0.4247: the RMS relative error of one rounding, in units of u.
inline constexpr double kRmsRelativeRounding = 0.42466090014400953;

/// The unit roundoff of a 16-bit type: 2^-11 for f16, 2^-8 for bf16.
double unit_roundoff(DType dtype);

/// Micro-batch gradients summed two ways, term by term: in f32, and in a 16-bit buffer
/// (each term rounded to `dtype`, added in float and rounded again, as kernels' axpy into a
/// 16-bit tensor does). error() is ||S16 - S32|| / ||S32|| over every element of every
/// tensor: the share of the update the 16-bit buffer gets wrong.
class Accumulation {
 public:
  /// An empty sum in f32 and in `dtype` (f16 or bf16).
  explicit Accumulation(DType dtype);
  /// Adds one term: f32 tensors (a micro-batch's gradients), the same shapes every time.
  void add(const std::vector<Tensor>& term);
  /// The terms added so far.
  std::int64_t terms() const { return terms_; }
  /// ||S16 - S32|| / ||S32|| now.
  double error() const;
  /// The first-order prediction of error(): every rounding (each term's, each partial
  /// sum's) errs independently by kRmsRelativeRounding u of its value and the errors add,
  /// so the RMS error is kRmsRelativeRounding u sqrt(sum_n (||S_n||^2 + ||g_n||^2)), S_n
  /// the f32 partial sums and g_n the terms, divided by ||S_N||. For N similar terms this
  /// grows as kRmsRelativeRounding u sqrt(N / 3).
  double predicted() const;

 private:
  DType dtype_;
  std::vector<Tensor> sum32_, sum16_;
  double rounded_squares_ = 0;  // sum_n (||S_n||^2 + ||g_n||^2)
  std::int64_t terms_ = 0;
};

/// Of the elements whose f32 value moved from `before` to `after` (a step of the f32
/// masters, from weights that are bf16 values), the share for which the bf16 rounding of
/// `after` is `before` again: the update a model without f32 masters would not make.
double lost_update_share(const Tensor& before, const Tensor& after);

/// The share of weights uniform in (-bound, bound) whose bf16 neighbours lie more than
/// `step` away on both sides, so that an update of size `step` rounds back to them: those
/// with half an ulp above `step`, |w| >= 2^(floor(log2 step) + 9) (2^k's bf16 ulp is
/// 2^(k-7)).
double predicted_lost_share(double bound, double step);

}  // namespace bigbatch::bf16_costs

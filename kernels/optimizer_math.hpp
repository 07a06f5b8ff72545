// optimizer_math.hpp: the per-element SGD and AdamW updates, written once for the CPU
// reference (optimizer.cpp) and the CUDA kernels (optimizer.cu).
//
// Goal: PyTorch's fp32 results bit for bit. Each PyTorch op in torch.optim's
// single-tensor path rounds its result to float, and receives its Python scalar
// rounded to float; we perform the same roundings in the same order. Which products
// are fused was measured on PyTorch's CPU kernels (Debian's torch 1.13.1 on an AVX2
// machine, op by op, on 64-element float32 tensors, which take its vector loop, and
// 7-element ones, which take its scalar loop) and matches their source:
//
//   a.add(b, alpha=s)          fma(b, s, a)            vec::fmadd in the add kernel
//   a.addcmul(b, c, value=s)   fma(s*b, c, a)          a + s*b*c, contracted by GCC
//   a.lerp(b, w), |w| < 0.5    fma(w, b-a, a)          lerp_vec: fmadd(coeff, b-a, base)
//   a.lerp(b, w), otherwise    fma(w-1, b-a, b)
//   a.addcdiv(b, c, value=s)   a + (s*b)/c             no fusion possible
//   a.mul(s), a / s            a*s, a/s                one rounding each (true division)
//
// PyTorch uses these fused kernels on every x86 CPU with AVX2 (its default dispatch).
// Its DEFAULT (pre-AVX2) CPU kernels round each product separately, and its CUDA
// kernels differ in other details (a division by a scalar becomes a multiplication by
// its reciprocal), so there the results differ from ours by an ulp now and then.
//
// Every operation is one of scalar_math.hpp's explicitly rounded ones (fma_rn where
// PyTorch fuses), which nvcc never fuses or approximates and the CPU build never
// contracts: both backends give identical bits.
//
// Nothing here includes half.hpp: nvcc compiles this header.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch::optimizer_math {

using scalar_math::add_rn;
using scalar_math::div_rn;
using scalar_math::fma_rn;
using scalar_math::mul_rn;
using scalar_math::sqrt_rn;
using scalar_math::sub_rn;

/// at::lerp(self, end, weight) as PyTorch's CPU kernel computes it: from `self` for a
/// small weight, from `end` otherwise, so that weight 0 gives self and 1 gives end.
BIGBATCH_HD inline float lerp(float self, float end, float weight) {
  const float difference = sub_rn(end, self);
  const bool weight_is_small = weight < 0.5f && weight > -0.5f;
  return weight_is_small ? fma_rn(weight, difference, self)
                         : fma_rn(sub_rn(weight, 1.0f), difference, end);
}

// ---- SGD ---------------------------------------------------------------------------

/// The step's scalars, each rounded to float as PyTorch hands it to its fp32 kernels.
struct SgdScalars {
  /// float(weight_decay).
  float weight_decay;         // d.add(param, alpha=weight_decay)
  /// float(momentum).
  float momentum;             // buf.mul_(momentum); d.add(buf, alpha=momentum)
  /// float(1 - dampening), computed in double.
  float one_minus_dampening;  // buf.add_(d, alpha=1 - dampening)
  /// float(-lr).
  float negative_lr;          // param.add_(d, alpha=-lr)
  /// Whether the weight-decay term is added.
  bool apply_weight_decay;    // weight_decay != 0 (PyTorch skips the add otherwise)
  /// Whether the momentum buffer is used and updated.
  bool use_momentum;          // momentum != 0
  /// Nesterov momentum: step along d + momentum * buf instead of buf.
  bool nesterov;
  /// True at step 1, where the buffer is set, not updated.
  bool first_step;  // step == 1: the buffer starts as a copy of d
};

/// Computed in double, as Python computes them (defined in optimizer.cpp, which is
/// compiled with -ffp-contract=off, so that no host compiler fuses these either).
SgdScalars sgd_scalars(const SgdOptions& options, std::int64_t step);

/// One element after an SGD step.
struct SgdElement {
  /// The updated parameter.
  float param;
  /// The updated momentum buffer.
  float momentum_buffer;  // meaningful only when use_momentum
};

/// One element of torch.optim.SGD's step. `momentum_buffer` is not read at the first
/// step or without momentum.
BIGBATCH_HD inline SgdElement sgd_update(float param, float grad, float momentum_buffer,
                                         const SgdScalars& s) {
  float direction = grad;
  if (s.apply_weight_decay) direction = fma_rn(param, s.weight_decay, direction);
  float buffer = momentum_buffer;
  if (s.use_momentum) {
    buffer = s.first_step ? direction
                          : fma_rn(direction, s.one_minus_dampening, mul_rn(buffer, s.momentum));
    direction = s.nesterov ? fma_rn(buffer, s.momentum, direction) : buffer;
  }
  return {fma_rn(direction, s.negative_lr, param), buffer};
}

// ---- AdamW -------------------------------------------------------------------------

/// The scalars of one AdamW step, each rounded to float as PyTorch hands it to its fp32
/// kernels.
struct AdamWScalars {
  /// float(1 - lr * weight_decay), computed in double.
  float decay_factor;           // param.mul_(1 - lr*weight_decay)
  /// float(1 - beta1), computed in double.
  float lerp_weight;            // exp_avg.lerp_(grad, 1 - beta1)
  /// float(beta2).
  float beta2;                  // exp_avg_sq.mul_(beta2)
  /// float(1 - beta2), computed in double.
  float one_minus_beta2;        // exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
  /// float(sqrt(1 - beta2**step)), computed in double.
  float bias_correction2_sqrt;  // sqrt(1 - beta2**step)
  /// float(eps), added to the denominator.
  float eps;
  /// float(-(lr / (1 - beta1**step))), computed in double.
  float negative_step_size;  // -lr / (1 - beta1**step)
  /// Whether the parameter is multiplied by decay_factor.
  bool apply_weight_decay;   // weight_decay != 0
};

/// Computed in double, as Python computes them (defined in optimizer.cpp).
AdamWScalars adamw_scalars(const AdamWOptions& options, std::int64_t step);

/// One element after an AdamW step.
struct AdamWElement {
  /// The updated parameter.
  float param;
  /// The updated first moment.
  float exp_avg;
  /// The updated second moment.
  float exp_avg_sq;
};

/// One element of torch.optim.AdamW's step.
BIGBATCH_HD inline AdamWElement adamw_update(float param, float grad, float exp_avg,
                                             float exp_avg_sq, const AdamWScalars& s) {
  if (s.apply_weight_decay) param = mul_rn(param, s.decay_factor);
  exp_avg = lerp(exp_avg, grad, s.lerp_weight);
  exp_avg_sq = fma_rn(mul_rn(s.one_minus_beta2, grad), grad, mul_rn(exp_avg_sq, s.beta2));
  const float denominator = add_rn(div_rn(sqrt_rn(exp_avg_sq), s.bias_correction2_sqrt), s.eps);
  param = add_rn(param, div_rn(mul_rn(s.negative_step_size, exp_avg), denominator));
  return {param, exp_avg, exp_avg_sq};
}

}  // namespace bigbatch::optimizer_math

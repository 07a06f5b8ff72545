// optimizer.hpp: one optimizer step on one parameter tensor, with PyTorch's update rules.
//
//   sgd_step(param, grad, momentum_buffer, options, step, half_copy)
//   adamw_step(param, grad, exp_avg, exp_avg_sq, options, step, half_copy)
//
//   param            f32, any shape     updated in place (read, then written)
//   grad             f32, param's shape read only
//   momentum_buffer  f32, param's shape SGD state: at step 1 overwritten (=) with the
//                                       first direction (PyTorch initialises the buffer
//                                       to the gradient, not to zero: its contents are
//                                       not read); at later steps updated in place.
//                                       Neither read nor written when momentum == 0,
//                                       and may then be an undefined Tensor.
//   exp_avg          f32, param's shape AdamW first moment, updated in place at every
//   exp_avg_sq       f32, param's shape step: zero them before step 1 (as PyTorch's
//                                       zeros_like does).
//   half_copy        f16 or bf16,       optional (Tensor{} for none): overwritten (=)
//                    param's shape      with the updated param rounded to its dtype (to
//                                       nearest even), in the same pass; the 16-bit
//                                       working copy of mixed precision.
//   step             the 1-based count of optimizer steps taken, this one included.
//
// The semantics are those of torch.optim.SGD and torch.optim.AdamW (PyTorch 2.x,
// foreach=False, maximize=False, amsgrad=False), op for op, on fp32 tensors (torch
// 1.x's AdamW updated exp_avg as mul_(beta1).add_(grad, alpha=1-beta1) instead of the
// lerp_, which differs from it by an ulp now and then):
//
//   SGD    d = grad;  if weight_decay != 0: d = d.add(param, alpha=weight_decay)
//          if momentum != 0:
//            step 1: buf = d.clone()    later: buf.mul_(momentum).add_(d, alpha=1-dampening)
//            d = nesterov ? d.add(buf, alpha=momentum) : buf
//          param.add_(d, alpha=-lr)
//   AdamW  if weight_decay != 0: param.mul_(1 - lr*weight_decay)
//          exp_avg.lerp_(grad, 1-beta1)
//          exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2)
//          step_size = lr / (1 - beta1**step);  bc2_sqrt = sqrt(1 - beta2**step)
//          denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
//          param.addcdiv_(exp_avg, denom, value=-step_size)
//
// The hyperparameters are doubles because PyTorch's are Python floats (binary64): the
// scalars above (1-beta2, lr/(1-beta1**step), ...) are computed in double and each is
// rounded to float once where an fp32 kernel receives it, as PyTorch does. With the
// same hyperparameters (e.g. lr=1e-3, betas=(0.9, 0.999)) the updates therefore equal
// PyTorch's CPU results bit for bit; kernels/optimizer_math.hpp says which products
// are fused (as PyTorch's vectorised AVX2 CPU kernels fuse them) and why.
//
// Elementwise: every element's result is the same on every backend and at every
// thread count (the CUDA kernels use explicitly rounded intrinsics, so nvcc cannot
// contract them differently from the CPU code).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/settings.hpp"
#include "common/tensor.hpp"

namespace bigbatch {

/// torch.optim.SGD's hyperparameters, with its defaults except lr (torch 1.x has no
/// default lr, recent versions 1e-3).
struct SgdOptions {
  /// Learning rate, >= 0.
  double lr = 0.01;
  /// Momentum factor, >= 0; 0 disables the momentum buffer.
  double momentum = 0;
  /// Dampening: d enters the momentum buffer with weight 1 - dampening; finite.
  double dampening = 0;
  /// L2 penalty added to the gradient (weight_decay * param), >= 0.
  double weight_decay = 0;
  /// Nesterov momentum; needs momentum > 0 and dampening == 0.
  bool nesterov = false;
};

/// torch.optim.AdamW's hyperparameters (betas=(beta1, beta2)), with its defaults.
struct AdamWOptions {
  /// Learning rate, >= 0.
  double lr = 1e-3;
  /// Decay rate of the first moment, in [0, 1).
  double beta1 = 0.9;
  /// Decay rate of the second moment, in [0, 1).
  double beta2 = 0.999;
  /// Added to the denominator, sqrt(exp_avg_sq) / sqrt(1 - beta2**step); >= 0.
  double eps = 1e-8;
  /// Decoupled weight decay: param is multiplied by 1 - lr * weight_decay, >= 0.
  double weight_decay = 1e-2;
};

/// SGD's settings (common/settings.hpp): every one shapes the trajectory.
template <SettingsOf<SgdOptions> Self, class Visit>
constexpr void visit_settings(Self& o, Visit&& visit) {
  visit("lr", o.lr, SettingRole::trajectory);
  visit("momentum", o.momentum, SettingRole::trajectory);
  visit("dampening", o.dampening, SettingRole::trajectory);
  visit("weight-decay", o.weight_decay, SettingRole::trajectory);
  visit("nesterov", o.nesterov, SettingRole::trajectory);
}
static_assert(every_field_visited<SgdOptions>(), "classify SgdOptions' new field above");

/// AdamW's settings (common/settings.hpp): every one shapes the trajectory.
template <SettingsOf<AdamWOptions> Self, class Visit>
constexpr void visit_settings(Self& o, Visit&& visit) {
  visit("lr", o.lr, SettingRole::trajectory);
  visit("beta1", o.beta1, SettingRole::trajectory);
  visit("beta2", o.beta2, SettingRole::trajectory);
  visit("eps", o.eps, SettingRole::trajectory);
  visit("weight-decay", o.weight_decay, SettingRole::trajectory);
}
static_assert(every_field_visited<AdamWOptions>(), "classify AdamWOptions' new field above");

/// One SGD step. Throws std::invalid_argument for mismatched tensors or options that
/// PyTorch rejects (lr < 0, momentum < 0, weight_decay < 0, nesterov without momentum
/// or with dampening), for step < 1, and for a missing buffer when momentum != 0.
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdOptions& options, std::int64_t step, const Tensor& half_copy = {});

/// One AdamW step. Throws std::invalid_argument for mismatched tensors, options that
/// PyTorch rejects (lr < 0, eps < 0, a beta outside [0, 1), weight_decay < 0), step < 1.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWOptions& options, std::int64_t step,
                const Tensor& half_copy = {});

// The backends assume arguments already checked by the functions above.
namespace cpu {
/// The CPU reference of bigbatch::sgd_step, on the path optimizer_path() names.
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdOptions& options, std::int64_t step, const Tensor& half_copy = {});
/// The CPU reference of bigbatch::adamw_step, on the path optimizer_path() names.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWOptions& options, std::int64_t step,
                const Tensor& half_copy = {});

/// The CPU loops' instruction-set paths: the same source compiled for plain x86-64
/// (std::fma and the f16 rounding become library calls) and for AVX2+FMA+F16C
/// (inlined and vectorised, about 3x (AdamW) to 10x (SGD) faster). Both round
/// exactly the same way, so their results are bitwise identical; the tests check that.
enum class OptimizerPath { portable, avx2 };
std::string_view optimizer_path_name(OptimizerPath path);  ///< "portable", "avx2"
/// The paths this CPU can run, portable first, fastest last.
std::vector<OptimizerPath> optimizer_paths_supported();
/// The path the CPU steps use now on the calling thread: the fastest supported one
/// unless a ScopedOptimizerPath says otherwise.
OptimizerPath optimizer_path();
/// Forces the CPU steps called from this thread onto `path` while the guard lives (for
/// tests and benchmarks). Throws std::invalid_argument if this CPU cannot run it.
class ScopedOptimizerPath {
 public:
  /// Forces `path` until destruction, which restores the thread's previous choice.
  explicit ScopedOptimizerPath(OptimizerPath path);
  ~ScopedOptimizerPath();
  ScopedOptimizerPath(const ScopedOptimizerPath&) = delete;
  ScopedOptimizerPath& operator=(const ScopedOptimizerPath&) = delete;

 private:
  int previous_;  // the thread's previous override, -1 for none
};
}  // namespace cpu
namespace cuda {
/// The CUDA implementation of bigbatch::sgd_step.
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdOptions& options, std::int64_t step, const Tensor& half_copy = {});
/// The CUDA implementation of bigbatch::adamw_step.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWOptions& options, std::int64_t step,
                const Tensor& half_copy = {});
}  // namespace cuda

}  // namespace bigbatch

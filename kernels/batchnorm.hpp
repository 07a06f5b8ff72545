// batchnorm.hpp: batch normalisation of features, as torch.nn.BatchNorm1d(N) with
// momentum 0.1, eps 1e-5, affine = True and track_running_stats = True.
//
// Statistics are per feature (column), over the M samples (rows) of the batch.
//
//   batchnorm_forward_train(x, weight, bias, y, mean, rstd, running_mean, running_var,
//                           momentum, eps)
//     x:            [M, N] f32/f16/bf16 (f64: CPU)  M samples of N features, M >= 2
//     weight, bias: [N]    f32 (f64 when x is f64)      gamma, beta
//     y:            [M, N] same dtype as x             (x - mean) * rstd * weight + bias  (=)
//     mean:         [N]    f32 (f64 when x is f64)      batch mean, saved for backward     (=)
//     rstd:         [N]    f32 (f64 when x is f64)      1 / sqrt(var + eps), var BIASED    (=)
//     running_mean: [N]    f32 (f64 when x is f64)      updated in place (see below)
//     running_var:  [N]    f32 (f64 when x is f64)      updated in place (see below)
//
//   batchnorm_forward_eval(x, weight, bias, running_mean, running_var, y, eps)
//     y = (x - running_mean) / sqrt(running_var + eps) * weight + bias                  (=)
//
//   batchnorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias)
//     the backward of the TRAINING forward (batch statistics; mean and rstd as saved):
//     dy:      [M, N] same dtype as x           gradient of the loss with respect to y
//     dx:      [M, N] same dtype as x           (weight * rstd) * ((dy - mean(dy))
//                                                 - xhat * mean(dy * xhat)), means over rows (=)
//     dweight: [N]    f32 (f64 when x is f64)   += sum over rows of dy * xhat          (+=)
//     dbias:   [N]    f32 (f64 when x is f64)   += sum over rows of dy                 (+=)
//     Memory sharing as in layernorm.hpp: dx may be dy or x itself; other sharing is refused.
//
// Running statistics, as PyTorch (with var_sum the sum of squared deviations from the
// batch mean):
//     running_mean = momentum * mean + (1 - momentum) * running_mean
//     running_var  = momentum * var_sum / (M - 1) + (1 - momentum) * running_var
// The running variance uses the UNBIASED estimate (divided by M - 1) while the batch is
// normalised with the BIASED one (divided by M): that is PyTorch's behaviour, and why a
// batch of one sample is rejected in training (its unbiased variance is 0/0).
//
// Arithmetic, as in layernorm.hpp: statistics in f32 (f64 for f64), two-pass variance,
// rstd = 1 / sqrt(var + eps) correctly rounded. On the CPU every reduction over the batch
// (the statistics, and dweight/dbias) walks the rows in order 0..M-1 with one float
// addition per row; dweight and dbias start from the buffer's value:
//     dweight[j] = dweight[j] + dy[i][j] * ((x[i][j] - mean[j]) * rstd[j])
//     dbias[j]   = dbias[j]   + dy[i][j]
// The CUDA backend adds the same terms in reduction_order.hpp's order 1 (tiles of 32 rows
// summed in parallel, then the tiles in order; the sums that start from 0, the statistics
// and the means dx needs, from the first tile): deterministic, and within rounding of the
// CPU's order.
//
// The pitfall this op exists to show: the statistics belong to the batch that was passed.
// Micro-batches of 64 normalise each sample with the micro-batch's mean and variance, so
// y, dx and the parameter gradients differ from one batch of the same samples (not just in
// rounding: in value), and the running statistics see a different sequence of updates.
// Gradient accumulation is therefore NOT equivalent to a big batch for a BatchNorm model.
// (The test BatchNorm.MicroBatchesAreNotTheBigBatch measures the difference.)
#pragma once

#include "common/host_device.hpp"
#include "common/tensor.hpp"
#include "kernels/layernorm.hpp"  // detail::inverse_std, detail::normalize

namespace bigbatch {

/// Normalises x with its own batch statistics: y, mean and rstd are overwritten (=),
/// running_mean and running_var updated in place; shapes and dtypes above.
void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             const Tensor& running_mean, const Tensor& running_var,
                             float momentum = 0.1f, float eps = 1e-5f);
/// y = (x - running_mean) / sqrt(running_var + eps) * weight + bias (=); the running
/// statistics are only read.
void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps = 1e-5f);
/// The backward of batchnorm_forward_train: dx overwritten (=), dweight and dbias
/// accumulated (+=).
void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);

namespace cpu {
/// The CPU reference of bigbatch::batchnorm_forward_train.
void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             const Tensor& running_mean, const Tensor& running_var,
                             float momentum, float eps);
/// The CPU reference of bigbatch::batchnorm_forward_eval.
void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps);
/// The CPU reference of bigbatch::batchnorm_backward.
void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::batchnorm_forward_train.
void batchnorm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd,
                             const Tensor& running_mean, const Tensor& running_var,
                             float momentum, float eps);
/// The CUDA implementation of bigbatch::batchnorm_forward_eval.
void batchnorm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& y, float eps);
/// The CUDA implementation of bigbatch::batchnorm_backward.
void batchnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);
}  // namespace cuda

// ---- scalar math shared by both backends ---------------------------------------------
namespace detail {

/// One exponential-moving-average step of a running statistic, in PyTorch's order:
/// momentum * batch_statistic + (1 - momentum) * running.
template <class A>
BIGBATCH_HD inline A running_average(A running, A batch_statistic, A momentum) {
  return momentum * batch_statistic + (A(1) - momentum) * running;
}

}  // namespace detail
}  // namespace bigbatch

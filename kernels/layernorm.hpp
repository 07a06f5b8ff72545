// layernorm.hpp: layer normalisation over the last dimension, as torch.nn.LayerNorm(N)
// with elementwise affine (weight and bias of shape [N]) and eps = 1e-5 by default.
//
//   layernorm_forward(x, weight, bias, y, mean, rstd, eps)
//     x:      [M, N]  f32/f16/bf16 (f64 on the CPU)     input, one sample per row
//     weight: [N]     f32 (f64 when x is f64)           gamma
//     bias:   [N]     f32 (f64 when x is f64)           beta
//     y:      [M, N]  same dtype as x                   y = (x - mean) * rstd * weight + bias   (=)
//     mean:   [M]     f32 (f64 when x is f64)           row means, saved for backward          (=)
//     rstd:   [M]     f32 (f64 when x is f64)           1 / sqrt(biased variance + eps)         (=)
//
//   layernorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias)
//     x, weight, mean, rstd as above (mean and rstd from the forward on the same x)
//     dy:      [M, N] same dtype as x                   gradient of the loss with respect to y
//     dx:      [M, N] same dtype as x                   gradient with respect to x           (=)
//     dweight: [N]    f32 (f64 when x is f64)           += sum over rows of dy * xhat         (+=)
//     dbias:   [N]    f32 (f64 when x is f64)           += sum over rows of dy                (+=)
//
// Arithmetic. All statistics are computed in f32 (f64 for f64 tensors); f16 and bf16
// elements are widened on load and rounded to nearest even on store. The variance is
// two-pass: first the mean, then the mean of the squared deviations (x - mean)^2. The
// one-pass formula E[x^2] - E[x]^2 cancels catastrophically when |mean| >> std (it can even
// go negative); the two-pass form has a relative error of about N*u whatever the mean. The
// variance is the biased one (divided by N), as PyTorch normalises; rstd = 1 / sqrt(var +
// eps), each step correctly rounded on both backends (no approximate rsqrt).
//
// The accumulation contract (why dweight and dbias are +=). The parameter gradients are
// reductions over the batch. The CPU computes them as
//     for each row i in order 0, 1, ..., M-1:
//         dweight[j] = dweight[j] + dy[i][j] * ((x[i][j] - mean[i]) * rstd[i])
//         dbias[j]   = dbias[j]   + dy[i][j]
// one rounded float multiply and one rounded float addition per row, starting from the
// buffer's current value (no fused multiply-add, no tree, no per-thread partial sums).
// So running backward on micro-batches of rows 0..63, 64..127, ... into the same buffers
// performs exactly the additions of one backward on all rows: gradient accumulation gives
// the big batch's parameter gradients bit for bit, whatever the micro-batch sizes. (This
// holds for LayerNorm because its statistics are per row; BatchNorm cannot offer it.)
// The CUDA backend adds the same terms (same rounded products) in reduction_order.hpp's
// order 1 (tiles of 32 rows summed in parallel, then the tiles in order onto the buffer):
// deterministic, bit for bit the same for micro-batches whose rows are multiples of 32, and
// within rounding of the CPU's order.
// dx is per row and is overwritten.
//
// Memory sharing in the backward (checked by the dispatcher, the same rules for BatchNorm).
// dx may be dy itself or x itself (the same memory, as for an in-place backward that saves
// an [M, N] buffer): both backends compute dweight and dbias first, from the unmodified x
// and dy, and then write each dx element after the last read of that element's dy and x
// (on the GPU by the same thread, after the row's reductions have synchronised the block).
// Any other sharing is refused with an error naming the op and the two tensors: dx
// overlapping x or dy only partly (another row's values would be overwritten before they
// are read), dx overlapping weight, mean, rstd, dweight or dbias, and dweight or dbias
// overlapping each other or any input. The inputs may share memory among themselves.
#pragma once

#include <cmath>

#include "common/host_device.hpp"
#include "common/tensor.hpp"

namespace bigbatch {

/// y = (x - mean) * rstd * weight + bias per row, with the row's statistics; y, mean and
/// rstd are overwritten (=); shapes and dtypes above.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps = 1e-5f);
/// The backward of layernorm_forward: dx overwritten (=), dweight and dbias accumulated
/// (+=) in the order stated above (CPU: row by row; CUDA: tile by tile).
void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);

namespace cpu {
/// The CPU reference of bigbatch::layernorm_forward.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps);
/// The CPU reference of bigbatch::layernorm_backward.
void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::layernorm_forward.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps);
/// The CUDA implementation of bigbatch::layernorm_backward.
void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias);
}  // namespace cuda

// ---- shared by both backends (and by BatchNorm) -----------------------------------------
namespace detail {

/// The memory-sharing rules of a normalisation backward (LayerNorm and BatchNorm, see
/// above): throws std::invalid_argument naming `op` and the two tensors that share memory.
/// The tensors must already be on one device.
void check_normalization_backward_aliasing(const char* op, const Tensor& x, const Tensor& weight,
                                           const Tensor& mean, const Tensor& rstd,
                                           const Tensor& dy, const Tensor& dx,
                                           const Tensor& dweight, const Tensor& dbias);

/// 1 / sqrt(variance + eps): three correctly rounded operations in A (float or double).
template <class A>
BIGBATCH_HD inline A inverse_std(A variance, A eps) {
  using std::sqrt;
  return A(1) / sqrt(variance + eps);
}

/// The normalised value xhat = (x - mean) * rstd, the same two roundings in the forward
/// pass and in both backward passes.
template <class A>
BIGBATCH_HD inline A normalize(A x, A mean, A rstd) {
  return (x - mean) * rstd;
}

}  // namespace detail
}  // namespace bigbatch

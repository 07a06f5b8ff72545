// cross_entropy.hpp: softmax cross-entropy over classes, as torch.nn.functional.cross_entropy
// with class-index targets, no weights, no label smoothing, and a mean over the GLOBAL batch.
//
//   cross_entropy_forward(logits, labels, loss, global_count, scale)
//     logits: [M, C] f32/f16/bf16 (f64: CPU)       one row of class scores per sample
//     labels: [M]    i32, each in [0, C), or kIgnoredLabel (-100): the class of each sample,
//                    or none (the row is padding: no loss, no gradient)
//     loss:   [1]    f32 (f64 for f64 logits)      loss += scale * sum_i loss_i / global_count (+=)
//   with loss_i = -log softmax(logits_i)[label_i] = logsumexp(logits_i) - logits_i[label_i].
//
//   cross_entropy_backward(logits, labels, dlogits, global_count, scale)
//     dlogits: [M, C] f32 (f64 for f64 logits)
//       dlogits[i][c] = (softmax(logits_i)[c] - [c == label_i]) * (scale / global_count)  (=)
//
//   count_correct(logits, labels) -> the number of rows whose argmax is the label, on the host
//     (a row with the ignored label is never correct).
//     Argmax as torch.argmax: the lowest index among equal maxima; a NaN counts as the maximum
//     (so a row with a NaN is correct only if its first NaN sits at the label).
//
// Why a global count and a scale. With gradient accumulation, a batch of B samples is split
// into micro-batches (possibly uneven: 64, 64, ..., 40). Passing global_count = B to every
// micro-batch makes each one contribute exactly its share of the batch mean, so the
// accumulated loss and gradients are those of the whole batch with no rescaling pass and no
// special case for the last micro-batch (dividing by the micro-batch size would weight the
// 40 samples of the last one more than the others). The scale is the loss scale S of mixed
// precision: the gradients come out multiplied by S in the same pass, with no extra kernel.
//
// Arithmetic (the same steps on both backends, which differ by rounding only: their exp and
// log, and the order of the sum over classes):
//   - every internal value is f32 (f64 for f64 logits), whatever the logits' dtype;
//   - per row: m = max_c logits[c]; s = sum_c exp(logits[c] - m) added in class order on
//     the CPU (a fixed tree on the GPU); loss_i = (m - logits[label]) + log(s). Subtracting
//     the max first keeps exp from overflowing (logits of 1e4 are fine), and forming
//     m - logits[label] before adding log(s) keeps the small log(s) from being rounded away
//     against a large m;
//   - factor = scale / global_count, one rounded division;
//   - total = 0; for i in 0..M-1 in order: total = total + loss_i (a float accumulator) on
//     the CPU; on CUDA the deterministic parallel order 2 of reduction_order.hpp (chunks of
//     4096 rows over 256 lanes and a fixed tree, then the chunks the same way);
//   - loss[0] = loss[0] + total * factor.
//   - dlogits[i][c] = (exp(logits[c] - m) / s - [c == label_i]) * factor, with the same
//     factor, so the gradient is exactly the derivative of what the forward accumulates.
//   A NaN or +inf logit makes its row's loss and gradient NaN (as in PyTorch), so the overflow
//   check of dynamic loss scaling sees it; the other rows are unaffected.
//   Because each dlogits row depends only on its own row and the factor, the gradients of
//   micro-batches are bit-identical to those rows of the big batch's gradient. The loss is
//   a sum of per-micro-batch totals and so matches the big batch's to rounding only.
//
// Ignored rows. A row labelled kIgnoredLabel (PyTorch's default ignore_index; defined in
// common/data/dataset.hpp) contributes 0 to the loss and writes a row of zeros into dlogits,
// whatever its logits (a NaN there does not show). global_count is then the number of rows
// that do have a label, counted over the whole optimizer step: a GPT's padded sequences pass
// the step's count of real target tokens to every micro-batch, so the loss is the mean over
// tokens of the batch, not a mean of per-micro-batch means (chapter 08).
//
// Labels. An out-of-range label (other than kIgnoredLabel) is an error, never a silent wrong
// read. On the CPU the dispatcher checks every label before anything is written
// (check_labels, in common/data/dataset.hpp). CUDA labels are checked once, where they are placed on the
// device (gather_rows, or the caller's own check_labels): checking them here would copy them
// back and wait for the device in every step. The CUDA kernels still never read outside a
// row: a label outside [0, C), other than kIgnoredLabel, makes that row's loss and gradient NaN (which the overflow
// check of dynamic loss scaling then sees), and count_correct counts the row as wrong.
#pragma once

#include <cstdint>

#include "common/data/dataset.hpp"
#include "common/host_device.hpp"
#include "common/tensor.hpp"

namespace bigbatch {

/// loss += scale * sum_i loss_i / global_count (accumulates); logits: [M, C], labels:
/// i32 [M] (kIgnoredLabel: no loss), loss: [1]. Throws for a label outside [0, C) that is not
/// kIgnoredLabel on the CPU (NaN on CUDA).
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                           float global_count, float scale = 1.0f);
/// dlogits = (softmax(logits) - one_hot(labels)) * (scale / global_count) (=);
/// dlogits: [M, C] f32 (f64 for f64 logits).
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale = 1.0f);
/// The number of rows whose argmax (the first maximum; NaN counts as the maximum) is
/// the label.
std::int64_t count_correct(const Tensor& logits, const Tensor& labels);

namespace cpu {
/// The CPU reference of bigbatch::cross_entropy_forward.
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                           float global_count, float scale);
/// The CPU reference of bigbatch::cross_entropy_backward.
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale);
/// The CPU reference of bigbatch::count_correct.
std::int64_t count_correct(const Tensor& logits, const Tensor& labels);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::cross_entropy_forward.
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                           float global_count, float scale);
/// The CUDA implementation of bigbatch::cross_entropy_backward.
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                            float global_count, float scale);
/// The CUDA implementation of bigbatch::count_correct.
std::int64_t count_correct(const Tensor& logits, const Tensor& labels);
}  // namespace cuda

// ---- scalar math shared by both backends ---------------------------------------------
namespace detail {

/// The multiplier of every per-sample term: scale / global_count, one rounding.
template <class A>
BIGBATCH_HD inline A cross_entropy_factor(float global_count, float scale) {
  return static_cast<A>(scale) / static_cast<A>(global_count);
}

/// -log softmax(z)[label] from the row's max m, z[label] and log(sum_c exp(z_c - m)).
template <class A>
BIGBATCH_HD inline A cross_entropy_row_loss(A max, A label_logit, A log_sum_exp_shifted) {
  return (max - label_logit) + log_sum_exp_shifted;
}

/// One element of the gradient: (softmax - one_hot) * factor.
template <class A>
BIGBATCH_HD inline A cross_entropy_gradient(A exp_shifted, A sum_exp_shifted, bool is_label,
                                            A factor) {
  return (exp_shifted / sum_exp_shifted - (is_label ? A(1) : A(0))) * factor;
}

/// True when `candidate` must replace the running argmax `best` found at a lower index:
/// strictly greater (ties keep the lower index), or a NaN when best is not one.
template <class A>
BIGBATCH_HD inline bool argmax_replaces(A candidate, A best) {
  const bool candidate_is_nan = candidate != candidate;
  const bool best_is_nan = best != best;
  return !best_is_nan && (candidate_is_nan || candidate > best);
}

}  // namespace detail
}  // namespace bigbatch

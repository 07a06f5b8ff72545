// training.hpp: one training step's pieces on top of any model (nn::Network): the gradient
// of a batch accumulated over micro-batches, and the optimizer over every parameter.
//
//   model.zero_grad();
//   const float loss = accumulate_gradients(model, x, labels, micro_batch, context);
//   optimizer.step();
//
// accumulate_gradients runs the micro-batches of samples [0, m), [m, 2m), ... of the batch
// in order (the last one may be shorter: 1000 = 15 x 64 + 40), each a forward, the
// cross-entropy with the batch's global count of targets (so every micro-batch contributes
// exactly its share of the batch mean, with no rescaling) and a backward that ADDS into the
// parameter gradients. It does not zero them: that is the caller's (once per batch). It
// runs any model (nn::Network: the MLP, the GPT), a sample being a row or a sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "nn/network.hpp"
#include "kernels/optimizer.hpp"

namespace bigbatch::nn {

/// The labels of a micro-batch as one target per logits row: labels [b] as they are, a token
/// batch's targets [b, T] as the view [b*T] (position-major, as the GPT's logits rows are).
Tensor targets_of(const Tensor& labels);

/// Accumulates (+=) into the model's gradients the gradient of the mean cross-entropy over
/// `global_count` targets (default, <= 0: the targets of these labels that are not
/// kIgnoredLabel; for classification, the rows of x), of which these are the samples of x
/// ([B, D] f32 rows, or [B, T] i32 token sequences) with labels [B] (or [B, T]) i32, in
/// micro-batches of `micro_batch` samples; then Network::complete_gradients().
/// context.first_row is the global index of x's sample 0; micro-batch k starts at
/// context.first_row + k * micro_batch. Returns these samples' share of the mean loss
/// (the whole batch's mean loss when global_count counts this batch's targets).
/// loss_scale S multiplies dlogits (and so every gradient) and not the returned loss: the
/// loss scale of mixed precision enters here, once (1 leaves the gradients as they are).
/// Dividing each target's loss by the count of the whole step, not of its micro-batch, is
/// what makes micro-batches of uneven target counts (padded sequences) add up to the batch.
float accumulate_gradients(Network& model, const Tensor& x, const Tensor& labels,
                           std::int64_t micro_batch, const ForwardContext& context,
                           std::int64_t global_count = 0, float loss_scale = 1.0f);

/// Where accumulate_gradients finds micro-batch samples [begin, end) of a batch: x and labels
/// of end - begin samples on the model's device, valid until the next call
/// (nn::MicroBatchBuffer copies them in from the host, one micro-batch at a time).
using BatchRows = std::function<std::pair<Tensor, Tensor>(std::int64_t begin, std::int64_t end)>;

/// Which backwards of a batch tell accumulate_gradients' `on_final`.
enum class TellGradients {
  last_micro_batch,   ///< the last one's: the gradients are final for the batch
  every_micro_batch,  ///< every one's: each group is final for its micro-batch, and the
                      ///< listener takes it away (ZeRO stage 2 sums it over ranks and
                      ///< releases it, so the next micro-batch starts it from zero)
};

/// The same accumulation over a batch of `rows` samples that is not on the device: each
/// micro-batch is fetched from `rows_of` just before its forward pass. global_count <= 0
/// counts the rows, which only classification labels allow (the targets of token
/// sequences are not known before they are fetched: pass their count).
/// `on_final`, when given, is told during the last micro-batch's backward as each group of
/// gradients becomes final for the batch (Network::set_gradients_ready; chapter 07 starts
/// their sum over ranks there); the earlier micro-batches' backwards tell nobody, unless
/// `tell` says every one. A model that does not tell group by group
/// (Network::releases_state() false) refuses a listener.
float accumulate_gradients(Network& model, std::int64_t rows, const BatchRows& rows_of,
                           std::int64_t micro_batch, const ForwardContext& context,
                           std::int64_t global_count = 0, float loss_scale = 1.0f,
                           const GradientsReady& on_final = {},
                           TellGradients tell = TellGradients::last_micro_batch);

/// SGD (with momentum) or AdamW over all of a model's parameters, with PyTorch's rules
/// (kernels/optimizer.hpp). Its state tensors (momentum buffers, Adam moments) are
/// allocated once, on the parameters' device, in MemoryCategory::optimizer_state. It
/// updates each parameter's f32 value and, in the same pass, writes its 16-bit working copy
/// when it has one (mixed precision).
class Optimizer {
 public:
  /// The optimizer and its hyperparameters.
  using Options = std::variant<SgdOptions, AdamWOptions>;

  /// Takes over `parameters` (their tensors are shared, not copied) and allocates the
  /// state: zeroed moments for AdamW, a momentum buffer for SGD when momentum != 0.
  Optimizer(std::vector<NamedParameter> parameters, Options options);

  /// One update of every parameter from its gradient (the gradients are not changed).
  void step();
  /// The learning rate of the next step() (a schedule sets it before every step).
  double learning_rate() const;
  /// Sets the learning rate of the following steps; everything else is kept (the step
  /// count, the momentum buffers, Adam's moments and bias corrections).
  void set_learning_rate(double lr);
  /// Optimizer steps taken so far.
  std::int64_t steps_taken() const { return steps_; }
  /// Continues as if `steps` steps had been taken (resuming from a snapshot, whose
  /// state() tensors are copied back too): AdamW's bias corrections count from here.
  void set_steps_taken(std::int64_t steps);
  /// The optimizer and hyperparameters, the learning rate as last set.
  const Options& options() const { return options_; }
  /// The state tensors, named "<parameter>.momentum_buffer", ".exp_avg", ".exp_avg_sq".
  std::vector<std::pair<std::string, Tensor>> state() const;

 private:
  struct ParameterState {
    NamedParameter parameter;
    Tensor first;   // SGD: momentum buffer (undefined without momentum); AdamW: exp_avg
    Tensor second;  // AdamW: exp_avg_sq
  };
  std::vector<ParameterState> states_;
  Options options_;
  std::int64_t steps_ = 0;
};

}  // namespace bigbatch::nn

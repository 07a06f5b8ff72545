// gradient_sync.hpp: how the trainer's one step (trainer.hpp) gets the gradient of its batch
// from the parts this process computes. One process computes the batch as one part and has
// nothing to sum (OneProcess); chapter 07's ranks (data_parallel::RankGroup) compute their
// shares and sum them, as PyTorch's DDP lets a communication hook do: the step calls these
// members at fixed points and knows nothing of ranks.
//
//   sync.start_step(model, samples, micro_batch)
//   for part in sync.parts(samples):
//     losses += accumulate_gradients(model, part's rows, ..., sync.gradients_ready(model),
//                                    sync.tell())
//     sync.part_done(part, model)
//   loss = sync.reduce(model, losses)
//   the boundary: unscale sync.boundary_pieces(model), step sync.stepped_parameters(model)
//   sync.after_step(model)                     (when the optimizer stepped)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "chapters/03_fp16_static_loss_scaling/loss_scaling.hpp"
#include "chapters/04_dynamic_loss_scaling/optimizer_boundary.hpp"
#include "common/check.hpp"
#include "nn/network.hpp"
#include "nn/training.hpp"

namespace bigbatch::train {

/// Rows [begin, begin + size) of a step's batch, accumulated from zero gradients as one
/// piece; `rank` names whose they are.
struct BatchPart {
  int rank = 0;             ///< the rank that computes them (0 in one process)
  std::int64_t begin = 0;   ///< the first row, within the batch
  std::int64_t size = 0;    ///< rows
};

/// The points of a step where the parts of its batch meet (above).
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  /// Throws std::invalid_argument when this model, or a run whose smallest batch has
  /// `smallest_batch` samples, cannot be computed this way; the trainer asks once.
  virtual void check_run(const nn::Network& model, std::int64_t smallest_batch) const = 0;
  /// The parts of a batch of `samples` that this process computes, in order.
  virtual std::vector<BatchPart> parts(std::int64_t samples) const = 0;
  /// Before a step over a batch of `samples` in micro-batches of `micro_batch`, before its
  /// memory is measured and its gradients zeroed.
  virtual void start_step(nn::Network& /*model*/, std::int64_t /*samples*/,
                          std::int64_t /*micro_batch*/) {}
  /// Whom accumulate_gradients tells during a part's backwards, and which backwards
  /// (nn::TellGradients): nobody, by default.
  virtual nn::GradientsReady gradients_ready(nn::Network& /*model*/) { return {}; }
  virtual nn::TellGradients tell() const { return nn::TellGradients::last_micro_batch; }
  /// After `part` has been accumulated into the model's gradients.
  virtual void part_done(const BatchPart& /*part*/, nn::Network& /*model*/) {}
  /// Leaves the batch's gradient in the model's buffers (or where stepped_parameters
  /// finds it) and returns the batch's mean loss, given the parts' shares of it in
  /// parts()' order.
  virtual float reduce(nn::Network& model, std::span<const float> losses) = 0;
  /// The seconds the step spent summing inside its backward since the last call.
  virtual double take_seconds_in_backward() { return 0; }
  /// After reduce(): the gradients the optimizer boundary measures, and how their parts'
  /// measurements become one.
  virtual loss_scaling::GradientPieces boundary_pieces(const nn::Network& model) = 0;
  /// The parameters the optimizer steps, whose gradients clipping scales.
  virtual std::vector<nn::NamedParameter> stepped_parameters(const nn::Network& model) const = 0;
  /// After an optimizer step (not a skipped one).
  virtual void after_step(nn::Network& /*model*/) {}
};

/// One process over the whole batch: one part, nothing to sum, every gradient measured as
/// one piece and stepped.
class OneProcess final : public GradientSync {
 public:
  void check_run(const nn::Network&, std::int64_t) const override {}
  std::vector<BatchPart> parts(std::int64_t samples) const override { return {{0, 0, samples}}; }
  float reduce(nn::Network&, std::span<const float> losses) override {
    BIGBATCH_CHECK(losses.size() == 1, "OneProcess: one part's loss, got ", losses.size());
    return losses[0];
  }
  loss_scaling::GradientPieces boundary_pieces(const nn::Network& model) override {
    // The one part's measurement is the whole's.
    return {{loss_scaling::gradient_tensors(model)},
            [](std::span<const loss_scaling::GradientStats> parts) { return parts[0]; }};
  }
  std::vector<nn::NamedParameter> stepped_parameters(const nn::Network& model) const override {
    return model.parameters();
  }
};

}  // namespace bigbatch::train

// trainer.hpp: the training loop over a Dataset, and evaluation.
//
// The sample stream. Training reads an endless stream of samples: epoch e is positions
// [e N, (e + 1) N) of the stream, and step k takes positions [k B, k B + B), so a batch
// may straddle two epochs. Position p is sample p mod N when shuffle is off (consecutive
// batches that wrap around), and sample epoch_permutation(N, seed, p / N)[p mod N] when
// it is on: a fresh permutation per epoch, a pure function of (seed, epoch) through the
// counter-based RNG, so a run is the same on every machine and the data order is a pure
// function of (seed, step).
//
// One step k:
//   gather the batch's samples into the device tensors x [B, D], labels [B]
//                                                       (MemoryCategory::data, reused)
//   model.zero_grad()
//   loss = accumulate_gradients(model, x, labels, micro_batch,
//                               {training, dropout_seed, first_row = k B})
//   optimizer.step()
// first_row = k B is the batch's position in the stream, so every sample of the run
// draws its own dropout mask, and the same one whatever the micro-batch size.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/memory.hpp"
#include "common/nn/model.hpp"
#include "common/nn/training.hpp"

namespace bigbatch::nn {

struct TrainConfig {
  std::int64_t batch = 256;        ///< B, samples per optimizer step
  std::int64_t micro_batch = 0;    ///< rows per forward/backward; 0 = batch
  std::int64_t steps = 0;          ///< steps to run; when 0, `epochs` decides
  std::int64_t epochs = 0;         ///< ceil(epochs N / B) steps (when steps is 0)
  bool shuffle = true;             ///< a fresh permutation per epoch, else data order
  std::uint64_t seed = 0;          ///< the permutations' and the dropout masks' seed
};

/// What one step reports.
struct StepRecord {
  std::int64_t step = 0;           ///< 1 for the first step
  float loss = 0;                  ///< the batch's mean loss
  std::int64_t samples = 0;        ///< samples seen so far, this step's included
  MemoryStats::PerCategory peak_bytes{};  ///< the device allocator's peaks by category
};

/// A permutation of 0..n-1 (Fisher-Yates), a pure function of (seed, epoch).
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                            std::int64_t epoch);

class Trainer {
 public:
  /// Checks the configuration (batch > 0, 0 <= micro_batch <= batch, steps or epochs
  /// positive, a non-empty data set whose features fit the model) and allocates the
  /// batch tensors on the model's device.
  Trainer(Model& model, Optimizer& optimizer, const Dataset& data, TrainConfig config);

  std::int64_t total_steps() const { return total_steps_; }
  std::int64_t steps_done() const { return steps_done_; }

  /// The sample indices of step k (0-based), in batch order.
  std::vector<std::int64_t> batch_indices(std::int64_t step) const;

  /// Runs the next step.
  StepRecord step();
  /// Runs the remaining steps, calling on_step after each.
  void run(const std::function<void(const StepRecord&)>& on_step = {});

 private:
  const std::vector<std::int64_t>& permutation(std::int64_t epoch) const;

  Model& model_;
  Optimizer& optimizer_;
  const Dataset& data_;
  TrainConfig config_;
  std::int64_t total_steps_ = 0;
  std::int64_t steps_done_ = 0;
  std::uint64_t dropout_seed_ = 0;
  Tensor batch_features_, batch_labels_;  // [B, D], [B] on the device
  // The last two epochs' permutations: a batch straddles at most two epochs when it is no
  // larger than the data set (otherwise permutations are recomputed as needed).
  mutable std::int64_t cached_epochs_[2] = {-1, -1};
  mutable std::vector<std::int64_t> cached_permutations_[2];
};

struct EvaluationResult {
  double loss = 0;               ///< mean cross-entropy over the data set
  double accuracy = 0;           ///< correct / samples
  std::int64_t correct = 0;      ///< samples whose argmax is the label
  std::int64_t samples = 0;
};

/// The model's mean loss and accuracy on `data`, in inference mode (no dropout,
/// BatchNorm with running statistics), in consecutive batches of `batch` samples.
EvaluationResult evaluate(Model& model, const Dataset& data, std::int64_t batch);

}  // namespace bigbatch::nn

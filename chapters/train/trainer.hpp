// trainer.hpp: the training loop that composes the chapters' techniques, used by the
// `bigbatch` program. It sits above every chapter: it may use any chapter's component,
// and no chapter uses it (chapter 01 writes its loop out by hand, to show it).
//
// One step k:
//   gather the batch's samples into the device tensors x [B, D], labels [B]
//                             (nn::SampleStream; MemoryCategory::data, reused)
//   model.zero_grad()
//   loss = nn::accumulate_gradients(model, x, labels, micro_batch,
//                                   {training, dropout_seed, first_row = k B})
//   optimizer.step()
// first_row = k B is the batch's position in the stream, so every sample of the run
// draws its own dropout mask, and the same one whatever the micro-batch size.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/memory.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bigbatch::train {

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

class Trainer {
 public:
  /// Checks the configuration (batch > 0, 0 <= micro_batch <= batch, steps or epochs
  /// positive, a non-empty data set whose features fit the model) and allocates the
  /// batch tensors on the model's device.
  Trainer(nn::Model& model, nn::Optimizer& optimizer, const Dataset& data, TrainConfig config);

  std::int64_t total_steps() const { return total_steps_; }
  std::int64_t steps_done() const { return steps_done_; }

  /// The sample indices of step k (0-based), in batch order.
  std::vector<std::int64_t> batch_indices(std::int64_t step) const {
    return stream_.batch_indices(step);
  }

  /// Runs the next step.
  StepRecord step();
  /// Runs the remaining steps, calling on_step after each.
  void run(const std::function<void(const StepRecord&)>& on_step = {});

 private:
  nn::Model& model_;
  nn::Optimizer& optimizer_;
  TrainConfig config_;
  nn::SampleStream stream_;
  std::int64_t total_steps_ = 0;
  std::int64_t steps_done_ = 0;
  std::uint64_t dropout_seed_ = 0;
  Tensor batch_features_, batch_labels_;  // [B, D], [B] on the device
};

}  // namespace bigbatch::train

// baseline.hpp: chapter 01's component, the setting every later chapter continues from:
// the model, the optimizer and the data of the baseline, the small device, and the
// training loop written out by hand.
//
//   model   residual MLP, D 784, H 256, expansion 4, depth 2, GELU, LayerNorm (seed 1)
//   data    Fashion-MNIST (or, without the Debian package, synthetic data of its shape)
//   device  48 MiB: room for the model, its gradients, AdamW's state and a batch of
//           256, not for the batch of 4096 we want
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/data/dataset.hpp"
#include "kernels/optimizer.hpp"
#include "nn/model.hpp"
#include "nn/sample_stream.hpp"
#include "nn/training.hpp"

namespace bigbatch::baseline {

inline constexpr std::int64_t kBatchThatFits = 256;
inline constexpr std::int64_t kWantedBatch = 4096;
/// The "device": a scaled-down GPU (a cap on the tracking allocator).
inline constexpr std::size_t kDeviceBytes = std::size_t{48} << 20;

nn::ModelConfig model_config();
AdamWOptions adamw_options();  ///< lr 1e-3, PyTorch's other defaults

struct Data {
  Dataset train, test;
  bool fashion_mnist = false;  ///< else synthetic data of the same shape
};

/// Fashion-MNIST when the files are installed, else synthetic data of the same shape
/// (saying so on stdout). `quick` keeps the first 4096 training and 1000 test samples.
Data load_data(bool quick);

/// The training loop, written out: every step takes the next batch of the run's sample
/// stream (B samples; an epoch's last batch is short, as with PyTorch's DataLoader),
/// computes its mean loss's gradient in micro-batches of `micro_batch` rows (B for one
/// piece), each copied to the device just before its forward pass, and updates. The
/// device holds one micro-batch of samples (MemoryCategory::data), not the batch. chapters/train/trainer.hpp runs the same loop with every technique
/// of the later chapters; this one shows it bare.
class BaselineLoop {
 public:
  BaselineLoop(nn::Model& model, nn::Optimizer& optimizer, const Dataset& data,
               std::int64_t batch, std::int64_t micro_batch, std::uint64_t seed);

  /// Optimizer step k (0-based); returns the batch's mean loss.
  float step(std::int64_t k) {
    return step(k, 1.0f, [] { return true; });
  }
  /// The same step with a loss scale S (chapter 03) and a hook at the optimizer boundary,
  /// after the last micro-batch's backward: the optimizer steps only if it returns true
  /// (a loss scaler unscales and checks the gradients there).
  float step(std::int64_t k, float loss_scale, const std::function<bool()>& at_boundary);
  /// Optimizer steps per pass over the data: ceil(N / B).
  std::int64_t steps_per_epoch() const { return stream_.batches_per_epoch(); }

 private:
  nn::Model& model_;
  nn::Optimizer& optimizer_;
  nn::SampleStream stream_;
  std::int64_t micro_batch_;
  std::uint64_t dropout_seed_;
  nn::MicroBatchBuffer staging_;  // one micro-batch on the device, MemoryCategory::data
};

}  // namespace bigbatch::baseline

// sample_stream.hpp: which samples a training step sees, as a pure function of
// (seed, step), and evaluation over a data set.
//
// Training reads an endless stream of samples: epoch e is positions [e N, (e + 1) N) of
// the stream, and step k takes positions [k B, k B + B), so a batch may straddle two
// epochs. Position p is sample p mod N when shuffle is off (consecutive batches that wrap
// around), and sample epoch_permutation(N, seed, p / N)[p mod N] when it is on: a fresh
// permutation per epoch, a pure function of (seed, epoch) through the counter-based RNG,
// so a run's data order is the same on every machine and can be resumed at any step.
#pragma once

#include <cstdint>
#include <vector>

#include "common/data/dataset.hpp"
#include "nn/model.hpp"

namespace bigbatch::nn {

/// A permutation of 0..n-1 (Fisher-Yates), a pure function of (seed, epoch).
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                            std::int64_t epoch);

/// The dropout seed of a run with this seed (drawn from an RNG stream that the
/// permutations never use).
std::uint64_t dropout_seed_for_run(std::uint64_t seed);

/// The batches of B samples a run takes from a data set, step after step.
class SampleStream {
 public:
  /// Checks batch > 0 and a non-empty data set.
  SampleStream(const Dataset& data, std::int64_t batch, bool shuffle, std::uint64_t seed);

  std::int64_t batch() const { return batch_; }
  const Dataset& data() const { return data_; }

  /// The sample indices of step k (0-based), in batch order.
  std::vector<std::int64_t> batch_indices(std::int64_t step) const;
  /// Copies step k's samples into x [B, D] f32 and labels [B] i32 (on any device).
  void gather(std::int64_t step, const Tensor& x, const Tensor& labels) const;

 private:
  const std::vector<std::int64_t>& permutation(std::int64_t epoch) const;

  const Dataset& data_;
  std::int64_t batch_;
  bool shuffle_;
  std::uint64_t seed_;
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

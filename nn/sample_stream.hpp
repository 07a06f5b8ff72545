// sample_stream.hpp: which samples a training step sees, as a pure function of
// (seed, step), and evaluation over a data set.
//
// Training runs in epochs, as a PyTorch DataLoader does: epoch e is one pass over the N
// samples in the order order_e, cut into consecutive batches of B. An epoch has ceil(N / B)
// batches, the last one short (N mod B samples, when B does not divide N), or floor(N / B)
// batches when the short one is dropped (drop_last); a batch never straddles two epochs.
// Step k is batch j = k mod batches_per_epoch of epoch e = k / batches_per_epoch: it takes
// positions [j B, min(j B + B, N)) of order_e. order_e is 0, 1, ..., N-1 when shuffle is
// off and epoch_permutation(N, seed, e) when it is on: a fresh permutation per epoch, a
// pure function of (seed, epoch) through the counter-based RNG, so a run's data order is
// the same on every machine and can be resumed at any step.
#pragma once

#include <cstdint>
#include <vector>

#include "common/data/dataset.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch::nn {

/// A permutation of 0..n-1 (Fisher-Yates), a pure function of (seed, epoch).
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                            std::int64_t epoch);

/// The dropout seed of a run with this seed (drawn from an RNG stream that the
/// permutations never use).
std::uint64_t dropout_seed_for_run(std::uint64_t seed);

/// Where a step's batch lies in the run.
struct BatchPosition {
  std::int64_t epoch = 0;      ///< e, 0-based
  std::int64_t index = 0;      ///< j, the batch's place in its epoch, 0-based
  std::int64_t size = 0;       ///< samples in the batch: B, or N mod B for a short last one
  std::int64_t first_row = 0;  ///< e N + j B: the run's index of the batch's first sample
                               ///< (unique for every sample of the run; keys dropout)
};

/// Whether an epoch's last batch of N mod B samples is trained or dropped.
enum class LastBatch { keep_short, drop };

/// The batches of up to B samples a run takes from a data set, epoch after epoch.
class SampleStream {
 public:
  /// Checks batch > 0, a non-empty data set and, with LastBatch::drop, batch <= N.
  SampleStream(const Dataset& data, std::int64_t batch, bool shuffle, std::uint64_t seed,
               LastBatch last_batch);

  /// B, the samples of a full batch.
  std::int64_t batch() const { return batch_; }
  /// The data set the batches are taken from (referenced, not copied).
  const Dataset& data() const { return data_; }
  /// ceil(N / B), or floor(N / B) with LastBatch::drop.
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }

  /// The epoch, place, size and first row of step k's batch (k >= 0).
  BatchPosition position(std::int64_t step) const;
  /// The sample indices of step k (0-based), in batch order: position(k).size of them.
  std::vector<std::int64_t> batch_indices(std::int64_t step) const;
  /// Copies step k's samples into x [b, D] f32 and labels [b] i32 (on any device), where
  /// b = position(k).size: pass x.rows(0, b) of a B-row tensor for a short batch.
  void gather(std::int64_t step, const Tensor& x, const Tensor& labels) const;
  /// Copies rows [begin, end) of step k's batch (0 <= begin < end <= position(k).size)
  /// into x [end - begin, D] and labels [end - begin]: one micro-batch of it.
  void gather(std::int64_t step, std::int64_t begin, std::int64_t end, const Tensor& x,
              const Tensor& labels) const;

 private:
  const std::vector<std::int64_t>& permutation(std::int64_t epoch) const;

  const Dataset& data_;
  std::int64_t batch_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t batches_per_epoch_ = 0;
  // The permutation of the epoch last asked for: steps move forward through the epochs.
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> cached_permutation_;
};

/// The device buffers a training loop copies each micro-batch into before its forward pass
/// (x f32 [rows, D] and labels i32 [rows], MemoryCategory::data, allocated once and reused):
/// the device holds one micro-batch of the batch, never the whole batch, as a DataLoader
/// that hands out micro-batches does. One buffer, no prefetch: the next micro-batch is
/// copied after the previous one's backward, so a step's data bytes are one micro-batch's.
class MicroBatchBuffer {
 public:
  /// Room for `rows` samples of `features` each on `device`.
  MicroBatchBuffer(std::int64_t rows, std::int64_t features, Device device);
  /// Room for `rows` samples of the kind `like` holds (f32 rows and a label each, or token
  /// sequences and their targets) on `device`.
  MicroBatchBuffer(std::int64_t rows, const Dataset& like, Device device);
  /// The rows it holds at most.
  std::int64_t rows() const { return x_.dim(0); }
  /// Whether samples of `data` fit its rows (the same features, or sequences of the same
  /// length, of the same dtype).
  bool holds(const Dataset& data) const;
  /// Micro-batch rows [begin, end) of step k's batch in `stream`, copied in; returns
  /// accumulate_gradients' source of micro-batches (nn/training.hpp's BatchRows), which
  /// refers to this buffer and to `stream`: use it while both live.
  BatchRows rows_of(const SampleStream& stream, std::int64_t step);
  /// The same for a batch held elsewhere (the host): rows [begin, end) of x [B, D] f32 and
  /// labels [B] i32 copied in (the source shares x and labels, and refers to this buffer).
  BatchRows rows_of(const Tensor& x, const Tensor& labels);
  /// The samples of `data` at `indices` copied into the buffer's first indices.size() rows
  /// (gather_rows), returned as views of them.
  std::pair<Tensor, Tensor> gather(const Dataset& data, const std::vector<std::int64_t>& indices);

 private:
  /// The buffers' first `rows` rows, checked against the capacity.
  std::pair<Tensor, Tensor> first(std::int64_t rows) const;
  Tensor x_, labels_;
};

/// What evaluate() measured over a data set.
struct EvaluationResult {
  double loss = 0;               ///< mean cross-entropy over the data set's targets
  double accuracy = 0;           ///< correct / targets
  std::int64_t correct = 0;      ///< targets whose argmax is the label
  /// N, the samples evaluated.
  std::int64_t samples = 0;
  /// The targets the means are over: N for classification, the tokens' that are not
  /// ignored (padding) for token sequences.
  std::int64_t targets = 0;
};

/// The model's mean loss and accuracy over the targets of `data` (Network::check_data
/// first), in inference mode (no dropout, BatchNorm with running statistics), in
/// consecutive batches of `batch` samples.
EvaluationResult evaluate(Network& model, const Dataset& data, std::int64_t batch);
/// The same in batches of `buffer`'s rows, gathered into it: a run evaluates in its
/// trainer's staging buffer (train::Trainer::staging), so that an evaluation needs no
/// data bytes beside the step's, and its forward in inference mode no more than a training
/// step's forward holds. std::invalid_argument unless buffer.holds(data).
EvaluationResult evaluate(Network& model, const Dataset& data, MicroBatchBuffer& buffer);

}  // namespace bigbatch::nn

// bucketed_sum.hpp: a sum over ranks in buckets, each started as soon as its buffers are
// final, so that the engine moves it while the caller goes on computing (DDP's buckets).
//
//   BucketedSum sum(communicator, Reduction::deterministic, BucketedSum::Result::every_rank);
//   ... backward of the head:    sum.start({head's gradients});    sum.progress();
//   ... backward of block n - 1: sum.start({its gradients});       sum.progress();
//   ...
//   sum.finish();  // waits for what is left; every buffer now holds the sum over ranks
//
// Each buffer is summed in its own memory, sharded as Communicator's one-call sums shard
// it; under Reduction::deterministic the bits are theirs whatever the bucket size. The
// engine moves a sum only inside MPI calls: start() and progress() are those calls.
//
// Why and how: docs/internals.md#collectivesbucketed_sumhpp
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "collectives/communicator.hpp"

namespace bigbatch::collectives {

/// Sums over ranks started bucket by bucket and finished together (see above).
class BucketedSum {
 public:
  /// What each bucket's sum leaves in its buffers on this rank.
  enum class Result {
    every_rank,  ///< every buffer holds the whole sum (an all-reduce: ZeRO stage 0)
    own_shards,  ///< rank r's shard of each buffer holds the sum of that shard, the rest is
                 ///< left unspecified (a reduce-scatter: ZeRO stage 1)
  };

  /// A collective (it duplicates the run's communicator twice): every rank makes it at
  /// the same point of the run.
  BucketedSum(Communicator& communicator, Reduction reduction, Result result);
  /// Waits for any bucket still in flight; frees the communicators unless MPI has ended.
  ~BucketedSum();
  BucketedSum(const BucketedSum&) = delete;             ///< owns the engine's requests
  BucketedSum& operator=(const BucketedSum&) = delete;  ///< owns the engine's requests

  /// Starts the sums of the next bucket's buffers. A collective: every rank starts the
  /// same buffers in the same order, with the same lengths. The buffers must stay alive,
  /// and untouched by the caller, until finish().
  void start(std::span<const std::span<float>> buffers);
  /// Lets the engine move the started sums on, without waiting for any; a deterministic
  /// sum whose pieces have arrived adds them and starts its all-gather.
  void progress();
  /// Waits for every sum started since the last finish(); afterwards each buffer holds its
  /// sum (Result says which part of it). The next start() begins the next round; the
  /// buffers for the pieces the ranks send (host memory, about one copy of the summed
  /// buffers under the deterministic sum, not counted by the tracking allocator, like the
  /// engine's own) are kept between rounds.
  void finish();

  /// Buffers whose sums started since the last finish().
  std::size_t started() const { return started_; }

 private:
  struct Sum;
  struct Engine;
  /// Starts one buffer's sum.
  void start_sum(std::span<float> buffer);
  /// Moves `sum` on as far as it goes now; true when it is complete.
  bool advance(Sum& sum);

  Communicator& communicator_;
  Reduction reduction_;
  Result result_;
  std::unique_ptr<Engine> engine_;          // MPI's communicators (absent without MPI)
  std::vector<std::unique_ptr<Sum>> sums_;  // one per buffer, reused round after round
  std::size_t started_ = 0;
};

}  // namespace bigbatch::collectives

// bucketed_sum.hpp: a sum over ranks in buckets, each started as soon as its buffers are
// final, so that the engine moves it while the caller goes on computing (DDP's gradient
// buckets; chapter 07 starts them during the last micro-batch's backward).
//
//   BucketedSum sum(communicator, Reduction::deterministic, BucketedSum::Result::every_rank);
//   ... backward of the head:    sum.start({head's gradients});    sum.progress();
//   ... backward of block n - 1: sum.start({its gradients});       sum.progress();
//   ...
//   sum.finish();  // waits for what is left; every buffer now holds the sum over ranks
//
// A bucket is the buffers whose sums start together. Each buffer is summed in its own
// memory by one nonblocking collective, sharded as Communicator::all_reduce_sum and
// reduce_scatter_sum shard it alone (rank s sums shard s, share_of(buffer.size(), R, s)).
// DDP copies a bucket into one flat message to pay one latency per bucket; here the copy
// in and out costs what the sum itself does (this CPU's cores move the bytes either way),
// so a bucket only says when its sums start. Summing an element is the same arithmetic
// whenever it starts: under Reduction::deterministic every element is the rank-order sum
// ((g_0 + g_1) + g_2) + ..., the bits of the one-call collectives and of the one-process
// simulation, whatever the bucket size. Under Reduction::engine the library picks its
// algorithm per call (blocking or not, by size), so the bits may change when R > 2 (with
// two ranks every order is the one addition).
//
// The engine (Open MPI here) moves a nonblocking collective only inside MPI calls: start()
// and progress() are those calls, made between the caller's pieces of work. The
// deterministic sum's two phases (an all-to-all of the pieces, the rank-order additions,
// an all-gather of the sums) run on two duplicates of the run's communicator, each started
// in the same buffer order on every rank, so that no rank's collectives interleave
// differently from another's.
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

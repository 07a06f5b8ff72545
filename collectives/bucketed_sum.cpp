// bucketed_sum.cpp: the buckets' sums on MPI's nonblocking collectives, one per buffer.
#include "collectives/bucketed_sum.hpp"

#include <algorithm>
#include <limits>

#include "common/check.hpp"

#if BIGBATCH_HAVE_MPI
#include <mpi.h>
#endif

namespace bigbatch::collectives {

#if BIGBATCH_HAVE_MPI

namespace {

int mpi_count(std::size_t n) {
  BIGBATCH_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                 "BucketedSum: ", n, " elements do not fit one MPI count");
  return static_cast<int>(n);
}

/// Copies n floats; nothing when n is 0 (an empty vector's data() may be null, which
/// memmove must not see).
void copy_floats(const float* from, std::int64_t n, float* to) {
  if (n > 0) std::copy_n(from, n, to);
}

}  // namespace

struct BucketedSum::Engine {
  MPI_Comm scatter = MPI_COMM_NULL;  // the all-to-all, all-reduce or reduce-scatter
  MPI_Comm gather = MPI_COMM_NULL;   // the deterministic sum's all-gather
};

/// One buffer's sum: where it lives, the engine's request and the pieces it receives.
struct BucketedSum::Sum {
  enum class Phase { scattering, gathering, done };
  std::span<float> buffer;
  Phase phase = Phase::done;
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<float> pieces;  // this rank's shard as each rank sent it, rank after rank
  // Each rank's shard of the buffer (counts, offsets), and the all-to-all's receiving side
  // (`counts[rank]` from each rank, rank after rank): a nonblocking collective reads its
  // count arrays until it completes, so they live here.
  std::vector<int> counts, offsets, receive_counts, receive_offsets;
};

BucketedSum::BucketedSum(Communicator& communicator, Reduction reduction, Result result)
    : communicator_(communicator), reduction_(reduction), result_(result),
      engine_(std::make_unique<Engine>()) {
  MPI_Comm_dup(MPI_COMM_WORLD, &engine_->scatter);
  MPI_Comm_dup(MPI_COMM_WORLD, &engine_->gather);
}

BucketedSum::~BucketedSum() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& sum : sums_) MPI_Wait(&sum->request, MPI_STATUS_IGNORE);
  MPI_Comm_free(&engine_->scatter);
  MPI_Comm_free(&engine_->gather);
}

void BucketedSum::start(std::span<const std::span<float>> buffers) {
  for (const std::span<float> buffer : buffers) start_sum(buffer);
}

void BucketedSum::start_sum(std::span<float> buffer) {
  const int ranks = communicator_.size(), rank = communicator_.rank();
  if (started_ == sums_.size()) sums_.push_back(std::make_unique<Sum>());
  Sum& sum = *sums_[started_++];
  sum.buffer = buffer;
  sum.counts.resize(ranks);
  sum.offsets.resize(ranks);
  for (int s = 0; s < ranks; ++s) {
    const Share shard = share_of(static_cast<std::int64_t>(buffer.size()), ranks, s);
    sum.counts[s] = mpi_count(static_cast<std::size_t>(shard.size));
    sum.offsets[s] = mpi_count(static_cast<std::size_t>(shard.begin));
  }
  const int mine = sum.counts[rank];
  const int n = mpi_count(buffer.size());
  sum.phase = Sum::Phase::scattering;
  if (reduction_ == Reduction::engine && result_ == Result::every_rank) {
    MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), n, MPI_FLOAT, MPI_SUM, engine_->scatter,
                   &sum.request);
  } else if (reduction_ == Reduction::engine) {  // own shard: the sum arrives in `pieces`
    if (sum.pieces.size() < static_cast<std::size_t>(mine)) sum.pieces.resize(mine);
    MPI_Ireduce_scatter(buffer.data(), sum.pieces.data(), sum.counts.data(), MPI_FLOAT, MPI_SUM,
                        engine_->scatter, &sum.request);
  } else {  // deterministic: shard s of every rank's buffer to rank s
    const auto needed = static_cast<std::size_t>(ranks) * static_cast<std::size_t>(mine);
    if (sum.pieces.size() < needed) sum.pieces.resize(needed);
    sum.receive_counts.assign(ranks, mine);
    sum.receive_offsets.resize(ranks);
    for (int r = 0; r < ranks; ++r) sum.receive_offsets[r] = r * mine;
    MPI_Ialltoallv(buffer.data(), sum.counts.data(), sum.offsets.data(), MPI_FLOAT,
                   sum.pieces.data(), sum.receive_counts.data(), sum.receive_offsets.data(),
                   MPI_FLOAT, engine_->scatter, &sum.request);
  }
}

void BucketedSum::progress() {
  // In the order started, stopping at the first that waits: a buffer's all-gather is
  // started only after every earlier buffer's, the same order on every rank.
  for (std::size_t i = 0; i < started_; ++i) {
    if (!advance(*sums_[i])) return;
  }
}

bool BucketedSum::advance(Sum& sum) {
  const int rank = communicator_.rank();
  while (sum.phase != Sum::Phase::done) {
    int complete = 0;
    MPI_Test(&sum.request, &complete, MPI_STATUS_IGNORE);
    if (!complete) return false;
    const std::span<float> total(sum.buffer.data() + sum.offsets[rank],
                                 static_cast<std::size_t>(sum.counts[rank]));
    if (sum.phase == Sum::Phase::gathering || reduction_ == Reduction::engine) {
      if (reduction_ == Reduction::engine && result_ == Result::own_shards) {
        copy_floats(sum.pieces.data(), sum.counts[rank], total.data());
      }
      sum.phase = Sum::Phase::done;
      break;
    }
    // Deterministic, the pieces arrived: their rank-order sum into this rank's shard.
    copy_floats(sum.pieces.data(), static_cast<std::int64_t>(total.size()), total.data());
    for (int r = 1; r < communicator_.size(); ++r) {
      add_next_rank(total, std::span<const float>(sum.pieces.data() + r * total.size(),
                                                  total.size()));
    }
    if (result_ == Result::own_shards) {
      sum.phase = Sum::Phase::done;
      break;
    }
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sum.buffer.data(), sum.counts.data(),
                    sum.offsets.data(), MPI_FLOAT, engine_->gather, &sum.request);
    sum.phase = Sum::Phase::gathering;
  }
  return true;
}

void BucketedSum::finish() {
  for (std::size_t i = 0; i < started_; ++i) {
    Sum& sum = *sums_[i];
    while (!advance(sum)) MPI_Wait(&sum.request, MPI_STATUS_IGNORE);
    sum.buffer = {};
  }
  started_ = 0;
}

#else  // built without MPI: one rank (Communicator::world()), whose sum is its own buffers

struct BucketedSum::Engine {};
struct BucketedSum::Sum {};

BucketedSum::BucketedSum(Communicator& communicator, Reduction reduction, Result result)
    : communicator_(communicator), reduction_(reduction), result_(result) {}
BucketedSum::~BucketedSum() = default;
void BucketedSum::start(std::span<const std::span<float>>) {}
void BucketedSum::progress() {}
void BucketedSum::start_sum(std::span<float>) {}
bool BucketedSum::advance(Sum&) { return true; }
void BucketedSum::finish() {}

#endif

}  // namespace bigbatch::collectives

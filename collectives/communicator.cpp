// communicator.cpp: the collectives on MPI, and the rank-order sum they share with the
// one-process simulation of the ranks.
#include "collectives/communicator.hpp"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/check.hpp"

#if BIGBATCH_HAVE_MPI
#include <mpi.h>
#endif

namespace bigbatch::collectives {

std::string_view reduction_name(Reduction reduction) {
  return reduction == Reduction::deterministic ? "deterministic" : "engine";
}

void add_next_rank(std::span<float> total, std::span<const float> next) {
  BIGBATCH_CHECK(total.size() == next.size(), "add_next_rank: ", total.size(), " and ",
                 next.size(), " elements");
  for (std::size_t i = 0; i < total.size(); ++i) total[i] = total[i] + next[i];
}

Share share_of(std::int64_t count, int ranks, int rank) {
  BIGBATCH_CHECK(count >= 0 && ranks >= 1 && rank >= 0 && rank < ranks,
                 "share_of: count ", count, " over ", ranks, " ranks, rank ", rank);
  const std::int64_t base = count / ranks, extra = count % ranks;
  return {rank * base + std::min<std::int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

bool launched_by_mpi() {
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(variable) != nullptr) return true;
  }
  return false;
}

std::uint32_t fingerprint(std::span<const std::byte> bytes, std::uint32_t crc) {
  return static_cast<std::uint32_t>(
      ::crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

#if BIGBATCH_HAVE_MPI

namespace {

int count_of(std::int64_t n) {
  BIGBATCH_CHECK(n >= 0 && n <= std::numeric_limits<int>::max(),
                 "collectives: ", n, " elements do not fit one MPI count");
  return static_cast<int>(n);
}

/// MPI_Finalize at exit, after every collective of the run.
struct MpiSession {
  MpiSession() {
    int provided = 0;
    // Only the main thread calls MPI (the CPU kernels' OpenMP threads never do).
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

/// MPI's counts and offsets of the R shards of a buffer of n elements (share_of).
struct ShardLayout {
  std::vector<int> counts, offsets;
  ShardLayout(std::int64_t n, int ranks) : counts(ranks), offsets(ranks) {
    for (int r = 0; r < ranks; ++r) {
      const Share shard = share_of(n, ranks, r);
      counts[r] = count_of(shard.size);
      offsets[r] = count_of(shard.begin);
    }
  }
};

/// The rank-order sum of this rank's shard: shard s of every rank's buffer goes to rank s
/// (all-to-all), which adds its R pieces in rank order with add_next_rank and leaves the
/// sum in its shard of `values`. `scratch` receives the pieces: kept by the caller between
/// calls, since a fresh buffer every call pays its page faults every step (with one, the
/// all-reduce took 116 ms per step of scripts/data-parallel-bench.sh's run on 2 ranks here;
/// with the kept one, 7.3 ms).
void reduce_scatter_in_rank_order(std::span<float> values, int rank, int ranks,
                                  std::vector<float>& scratch) {
  const auto n = static_cast<std::int64_t>(values.size());
  const Share mine = share_of(n, ranks, rank);
  const ShardLayout send(n, ranks);
  std::vector<int> receive_counts(ranks), receive_offsets(ranks);
  for (int r = 0; r < ranks; ++r) {
    receive_counts[r] = count_of(mine.size);
    receive_offsets[r] = count_of(r * mine.size);
  }
  const auto needed = static_cast<std::size_t>(ranks * mine.size);
  if (scratch.size() < needed) scratch.resize(needed);
  float* const pieces_data = scratch.data();
  MPI_Alltoallv(values.data(), send.counts.data(), send.offsets.data(), MPI_FLOAT,
                pieces_data, receive_counts.data(), receive_offsets.data(), MPI_FLOAT,
                MPI_COMM_WORLD);
  const auto shard = static_cast<std::size_t>(mine.size);
  const std::span<float> total(values.data() + mine.begin, shard);
  std::copy_n(pieces_data, shard, total.data());
  for (int r = 1; r < ranks; ++r) {
    add_next_rank(total, std::span<const float>(pieces_data + r * shard, shard));
  }
}

/// Every rank's shard of `values` to every rank, in place.
void all_gather_in_place(void* values, std::int64_t n, MPI_Datatype type, int ranks) {
  const ShardLayout layout(n, ranks);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values, layout.counts.data(),
                 layout.offsets.data(), type, MPI_COMM_WORLD);
}

}  // namespace

namespace {
Communicator* g_world = nullptr;  // set by the first world()
}  // namespace

bool Communicator::available() { return true; }

Communicator& Communicator::world() {
  static MpiSession session;
  static Communicator communicator = [] {
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node = MPI_COMM_NULL;  // this machine's ranks, in world rank order
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    return Communicator(rank, size, local_rank, local_size);
  }();
  g_world = &communicator;
  return communicator;
}

Communicator* Communicator::joined() { return g_world && g_world->size() > 1 ? g_world : nullptr; }

void Communicator::all_reduce_sum(std::span<float> values, Reduction reduction) {
  if (reduction == Reduction::engine) {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), count_of(static_cast<std::int64_t>(values.size())),
                  MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    reduce_scatter_in_rank_order(values, rank(), size(), scratch_);
    all_gather_shares(values);
  }
}

void Communicator::reduce_scatter_sum(std::span<float> values, Reduction reduction) {
  if (reduction == Reduction::deterministic) {
    reduce_scatter_in_rank_order(values, rank(), size(), scratch_);
    return;
  }
  // MPI_Reduce_scatter in place leaves this rank's sum at the front of the buffer.
  const auto n = static_cast<std::int64_t>(values.size());
  const ShardLayout layout(n, size());
  MPI_Reduce_scatter(MPI_IN_PLACE, values.data(), layout.counts.data(), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD);
  const Share mine = share_of(n, size(), rank());
  if (mine.size == 0) return;  // nothing of it here (and an empty buffer may be null)
  std::memmove(values.data() + mine.begin, values.data(),
               static_cast<std::size_t>(mine.size) * sizeof(float));
}

void Communicator::all_gather_shares(std::span<float> values) {
  all_gather_in_place(values.data(), static_cast<std::int64_t>(values.size()), MPI_FLOAT, size());
}

void Communicator::all_gather_shares(std::span<std::uint16_t> values) {
  all_gather_in_place(values.data(), static_cast<std::int64_t>(values.size()), MPI_UINT16_T,
                      size());
}

std::vector<float> Communicator::all_gather(float value) {
  std::vector<float> values(static_cast<std::size_t>(size()));
  MPI_Allgather(&value, 1, MPI_FLOAT, values.data(), 1, MPI_FLOAT, MPI_COMM_WORLD);
  return values;
}

std::vector<std::uint64_t> Communicator::all_gather(std::uint64_t value) {
  std::vector<std::uint64_t> values(static_cast<std::size_t>(size()));
  MPI_Allgather(&value, 1, MPI_UINT64_T, values.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return values;
}

std::vector<double> Communicator::all_gather(double value) {
  std::vector<double> values(static_cast<std::size_t>(size()));
  MPI_Allgather(&value, 1, MPI_DOUBLE, values.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return values;
}

namespace {

/// Waits for `request`, testing it every millisecond instead of spinning in MPI_Wait.
void wait_quietly(MPI_Request& request) {
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

std::string Communicator::broadcast(const std::string& text) {
  std::uint64_t length = rank() == 0 ? text.size() : 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibcast(&length, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &request);
  wait_quietly(request);
  std::string received = rank() == 0 ? text : std::string(length, '\0');
  MPI_Ibcast(received.data(), count_of(static_cast<std::int64_t>(length)), MPI_CHAR, 0,
             MPI_COMM_WORLD, &request);
  wait_quietly(request);
  return received;
}

void Communicator::barrier() { MPI_Barrier(MPI_COMM_WORLD); }

void Communicator::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] true
}

#else  // built without MPI: a world of one rank, whose collectives have nothing to move

bool Communicator::available() { return false; }
Communicator* Communicator::joined() { return nullptr; }

Communicator& Communicator::world() {
  if (launched_by_mpi()) {  // this process is one of several, which it cannot reach
    throw std::runtime_error(
        "an MPI launcher started this bigbatch, which was built without MPI: install Open "
        "MPI (Debian: openmpi-bin libopenmpi-dev) and build again for runs of several ranks");
  }
  static Communicator alone(0, 1, 0, 1);
  return alone;
}

void Communicator::all_reduce_sum(std::span<float>, Reduction) {}
void Communicator::reduce_scatter_sum(std::span<float>, Reduction) {}
void Communicator::all_gather_shares(std::span<float>) {}
void Communicator::all_gather_shares(std::span<std::uint16_t>) {}
std::vector<double> Communicator::all_gather(double value) { return {value}; }
std::vector<float> Communicator::all_gather(float value) { return {value}; }
std::vector<std::uint64_t> Communicator::all_gather(std::uint64_t value) { return {value}; }
std::string Communicator::broadcast(const std::string& text) { return text; }
void Communicator::barrier() {}
void Communicator::abort(int exit_code) { std::exit(exit_code); }

#endif

}  // namespace bigbatch::collectives

// communicator.hpp: the collectives a data-parallel run needs, on an existing engine.
//
// The ranks' sums are formed by MPI (Open MPI, on host tensors); this file adds no transport
// of its own, only the order of a sum (Reduction):
//   engine         MPI_Allreduce: the engine chooses the order of the additions, so the bits
//                  of a float sum may change with R, the message size or the library version
//   deterministic  every element summed in rank order, ((g_0 + g_1) + g_2) + ... + g_{R-1}:
//                  the same bits on every run with the same R, and the bits a one-process
//                  simulation of the R ranks gets by adding its R buffers with add_next_rank
// For ZeRO stage 1, reduce_scatter_sum leaves each rank only its shard's sum (share_of of
// the buffer), and all_gather_shares sends every rank's updated shard to every rank.
//
// Why and how: docs/internals.md#collectivescommunicatorhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bigbatch::collectives {

/// How a sum over ranks is formed (see above).
enum class Reduction {
  deterministic,  ///< rank order, ((g_0 + g_1) + g_2) + ...: reproducible for a given R
  engine,         ///< MPI_Allreduce: the engine's order
};

/// "deterministic" or "engine".
std::string_view reduction_name(Reduction reduction);

/// total[i] = total[i] + next[i]: one rank's step of the rank-order sum. The deterministic
/// reduction and the one-process simulation of the ranks both add with this.
void add_next_rank(std::span<float> total, std::span<const float> next);

/// A rank's contiguous part of `count` items split over `ranks`.
struct Share {
  std::int64_t begin = 0;  ///< the first item
  std::int64_t size = 0;   ///< how many (0 when count < ranks leaves none)
};

/// Items [begin, begin + size) of `count` for `rank` of `ranks`: the first count mod R
/// ranks take floor(count / R) + 1 items, the others floor(count / R), in rank order
/// (rank r begins at r floor(count / R) + min(r, count mod R)). Throws
/// std::invalid_argument for count < 0, ranks < 1 or a rank outside [0, ranks).
Share share_of(std::int64_t count, int ranks, int rank);

/// The sums and gathers of a run's ranks over buffers in one kind of memory:
/// Communicator's over host memory (MPI), DeviceCommunicator's over CUDA memory (NCCL,
/// collectives/device_communicator.hpp). Every call is collective: every rank makes it, in the
/// same order, with buffers of the same length.
class Collectives {
 public:
  virtual ~Collectives() = default;

  /// This process's rank, 0 to size() - 1.
  int rank() const { return rank_; }
  /// R, the run's processes.
  int size() const { return size_; }

  /// Every rank's `values` summed element by element; the sum replaces `values` on every
  /// rank. The buffers must have the same length everywhere. The deterministic reduction
  /// keeps a buffer of the pieces of the largest `values` it has summed, between calls.
  virtual void all_reduce_sum(std::span<float> values, Reduction reduction) = 0;
  /// The first half of all_reduce_sum: afterwards this rank's shard of `values`
  /// (share_of(values.size(), size(), rank())) holds the sum over ranks of that shard, with
  /// all_reduce_sum's bits for the same reduction; the rest of `values` is left unspecified.
  virtual void reduce_scatter_sum(std::span<float> values, Reduction reduction) = 0;
  /// The second half: every rank's shard of `values` (share_of, as above) copied to every
  /// other rank, in place; afterwards every rank holds the same buffer.
  virtual void all_gather_shares(std::span<float> values) = 0;
  /// The same for 16-bit elements (the f16 or bf16 working copies of the parameters).
  virtual void all_gather_shares(std::span<std::uint16_t> values) = 0;

 protected:
  /// Rank `rank` of `size`.
  Collectives(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_ = 0;
  int size_ = 1;
};

/// The processes of one run (MPI_COMM_WORLD) and the collectives among them, on host
/// memory. An error in the engine aborts the whole job (MPI's default handler), so no rank
/// waits for one that has stopped.
class Communicator final : public Collectives {
 public:
  /// The run's processes, MPI initialised on the first call and finalised at exit. Built
  /// without MPI: one rank alone, whose collectives leave every buffer as it is (a sum over
  /// one rank); throws std::runtime_error when an MPI launcher started the process then.
  static Communicator& world();
  /// Whether this build has MPI (runs of more than one rank need it).
  static bool available();
  /// world() when this process has joined a run of more than one rank, else null: a
  /// program that fails on one rank ends them all with abort() (the others may be
  /// waiting for it in a collective).
  static Communicator* joined();
  /// This rank's place among the ranks on its machine (MPI_COMM_TYPE_SHARED: those that
  /// can share memory), 0 to local_size() - 1: which of the machine's GPUs it takes.
  int local_rank() const { return local_rank_; }
  /// The ranks on this rank's machine.
  int local_size() const { return local_size_; }

  /// MPI_Allreduce (engine), or MPI_Alltoallv, rank-order adds and MPI_Allgatherv.
  void all_reduce_sum(std::span<float> values, Reduction reduction) override;
  /// MPI_Reduce_scatter (engine), or the deterministic all-reduce's first two steps.
  void reduce_scatter_sum(std::span<float> values, Reduction reduction) override;
  /// MPI_Allgatherv in place.
  void all_gather_shares(std::span<float> values) override;
  /// MPI_Allgatherv in place, of 16-bit words.
  void all_gather_shares(std::span<std::uint16_t> values) override;
  /// Every rank's one value, in rank order, on every rank.
  std::vector<float> all_gather(float value);
  /// The same for a 64-bit word (a fingerprint, a flag).
  std::vector<std::uint64_t> all_gather(std::uint64_t value);
  /// The same for a double (a shard's squared gradient norm).
  std::vector<double> all_gather(double value);
  /// Rank 0's `text` on every rank (the others' `text` is ignored). The other ranks wait
  /// without spinning (they test for it every millisecond), so that their cores stay free
  /// for rank 0's work in the meantime (the cost model it may be measuring).
  std::string broadcast(const std::string& text);
  /// Waits until every rank has called it.
  void barrier();
  /// Ends every rank of the run with this exit code (MPI_Abort): for a rank that cannot go
  /// on while the others wait in a collective.
  [[noreturn]] void abort(int exit_code);

  Communicator(const Communicator&) = delete;             ///< one per process
  Communicator& operator=(const Communicator&) = delete;  ///< one per process

 private:
  Communicator(int rank, int size, int local_rank, int local_size)
      : Collectives(rank, size), local_rank_(local_rank), local_size_(local_size) {}
  int local_rank_ = 0;
  int local_size_ = 1;
  // The deterministic reduction's pieces: as large as the largest buffer summed so far,
  // kept between calls (host memory the tracking allocator does not count, like the
  // engine's own buffers).
  std::vector<float> scratch_;
};

/// Whether an MPI launcher (mpirun, mpiexec, srun) started this process: one of the
/// variables Open MPI (OMPI_COMM_WORLD_SIZE), PMI (PMI_SIZE: MPICH, Slurm) or PMIx
/// (PMIX_RANK) sets is present. A program that can run alone too asks before world().
bool launched_by_mpi();

/// The CRC-32 (zlib's) of `bytes`, continuing from `crc`: a fingerprint for comparing what
/// the ranks hold (their settings, their initial parameters) without sending it.
std::uint32_t fingerprint(std::span<const std::byte> bytes, std::uint32_t crc = 0);
/// The fingerprint of a text's bytes.
inline std::uint32_t fingerprint(std::string_view text, std::uint32_t crc = 0) {
  return fingerprint(std::as_bytes(std::span(text.data(), text.size())), crc);
}

}  // namespace bigbatch::collectives

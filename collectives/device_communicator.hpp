// device_communicator.hpp: the ranks' sums of CUDA tensors, on NCCL.
//
// The same collectives as Communicator, with the same meaning and the same two reductions
// (deterministic: the bits of the host sum), for buffers in GPU memory. One rank per GPU.
// MPI still starts the run and carries the small host values; NCCL's unique id, made by
// rank 0, reaches the other ranks with Communicator::broadcast. The calls are queued on the
// default stream, in order with the kernels that made the gradients and before those that
// read the sums; none waits for the GPU. start_beside queues a bucket's sums on a stream of
// the communicator's own, behind an event recorded on the default stream; join_beside makes
// the default stream wait for every sum started. Either stream gives the same bits. NCCL's
// buffers and the deterministic sum's pieces are device memory outside the tracking
// allocator.
// Why and how: docs/internals.md#collectivesdevice_communicatorhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "collectives/communicator.hpp"

namespace bigbatch::collectives {

/// The collectives of `host`'s ranks on CUDA buffers (device pointers in the spans),
/// with Collectives' contract: the forms above, queued on the default stream.
class DeviceCommunicator final : public Collectives {
 public:
  /// Whether this build has NCCL (the CUDA backend, and nccl.h and libnccl found).
  static bool compiled();

  /// The ranks of `host`, each on its current CUDA device (ncclCommInitRank): rank 0 makes
  /// NCCL's unique id and host.broadcast sends it. A collective: every rank makes one, at
  /// the same point of the run. Throws std::runtime_error in a build without NCCL, or
  /// with NCCL's own message when it cannot start.
  explicit DeviceCommunicator(Communicator& host);
  ~DeviceCommunicator() override;
  DeviceCommunicator(const DeviceCommunicator&) = delete;             ///< one per run
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;  ///< one per run

  void all_reduce_sum(std::span<float> values, Reduction reduction) override;
  void reduce_scatter_sum(std::span<float> values, Reduction reduction) override;
  void all_gather_shares(std::span<float> values) override;
  void all_gather_shares(std::span<std::uint16_t> values) override;

  /// Queues the sums of `buffers` (an all-reduce of each, or with own_shards a
  /// reduce-scatter) on the side stream, after the work the default stream holds now.
  /// The buffers must not be touched until join_beside.
  void start_beside(std::span<const std::span<float>> buffers, Reduction reduction,
                    bool own_shards);
  /// The default stream's next work waits for every sum start_beside queued.
  void join_beside();

 private:
  struct Engine;  // NCCL's communicator and the pieces' buffer (device_communicator.cu)
  std::unique_ptr<Engine> engine_;
};

/// The deterministic sum's additions on the GPU: total[i] = ((p_0[i] + p_1[i]) + p_2[i]) +
/// ..., where p_r = pieces[r n, (r + 1) n) and n = total.size(), R = pieces.size() / n; the
/// additions of add_next_rank, so the bits of the host's sum. Both spans are device memory;
/// queued on the default stream. Throws std::runtime_error in a build without NCCL.
void add_in_rank_order_on_device(std::span<float> total, std::span<const float> pieces);

}  // namespace bigbatch::collectives

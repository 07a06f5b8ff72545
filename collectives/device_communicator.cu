// device_communicator.cu: the collectives on CUDA tensors, on NCCL (built with NCCL only).
#include "collectives/device_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/check.hpp"

namespace bigbatch::collectives {
namespace {

// Every kernel of the CUDA backend is queued on the default stream; the collectives join
// that queue, so they follow the backward that made the gradients and precede the step.
// The overlapped sums run on a stream of their own (Engine::side), ordered by events.
const cudaStream_t kStream = nullptr;

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) {
    throw std::runtime_error(std::string("NCCL: ") + what + " failed: " +
                             ncclGetErrorString(result));
  }
}

void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA: ") + what + " failed: " +
                             cudaGetErrorString(result));
  }
}

/// ncclGroupStart ... ncclGroupEnd around `calls`: NCCL starts them together (an
/// all-to-all of sends and receives, a broadcast per shard), so no rank waits on another's
/// order of them.
template <class Calls>
void grouped(const char* what, Calls&& calls) {
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  calls();
  check_nccl(ncclGroupEnd(), what);
}

/// One thread per element, each adding the R pieces of its element in rank order with
/// round-to-nearest additions (__fadd_rn: never contracted), as add_next_rank does.
__global__ void add_in_rank_order_kernel(float* total, const float* pieces, int ranks,
                                         std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    float sum = pieces[i];
    for (int r = 1; r < ranks; ++r) sum = __fadd_rn(sum, pieces[r * n + i]);
    total[i] = sum;
  }
}

/// Every rank's shard of `values` (n elements of `element_bytes` bytes) to every rank, in
/// place: one ncclBroadcast per shard, rooted at its rank.
void gather_shares(ncclComm_t comm, void* values, std::int64_t n, std::size_t element_bytes,
                   int ranks, cudaStream_t stream) {
  auto* const bytes = static_cast<char*>(values);
  grouped("the shards' ncclBroadcast", [&] {
    for (int r = 0; r < ranks; ++r) {
      const Share shard = share_of(n, ranks, r);
      if (shard.size == 0) continue;  // the same on every rank: no call is left unmatched
      char* const at = bytes + shard.begin * element_bytes;
      check_nccl(ncclBroadcast(at, at, static_cast<std::size_t>(shard.size) * element_bytes,
                               ncclInt8, r, comm, stream),
                 "ncclBroadcast");
    }
  });
}

/// add_in_rank_order_on_device's kernel, queued on `stream`.
void add_in_rank_order(std::span<float> total, std::span<const float> pieces,
                       cudaStream_t stream) {
  const auto n = static_cast<std::int64_t>(total.size());
  BIGBATCH_CHECK(n > 0 && pieces.size() % total.size() == 0 && !pieces.empty(),
                 "add_in_rank_order_on_device: ", pieces.size(), " piece elements for a total of ",
                 total.size());
  const auto ranks = static_cast<int>(pieces.size() / total.size());
  constexpr int kThreads = 256;
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535 * 8);
  add_in_rank_order_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      total.data(), pieces.data(), ranks, n);
  check_cuda(cudaGetLastError(), "add_in_rank_order_kernel's launch");
}

}  // namespace

struct DeviceCommunicator::Engine {
  ncclComm_t comm = nullptr;
  float* pieces = nullptr;   // the deterministic sum's R pieces of this rank's shard
  std::size_t capacity = 0;  // elements of `pieces`
  // Overlap: the side stream the started sums run on, made with the first; `ready` marks
  // the default stream's work before a bucket, `done` the side stream's before a join.
  cudaStream_t side = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;

  ~Engine() {
    if (side != nullptr) cudaStreamSynchronize(side);  // nothing of ours is still in flight
    if (ready != nullptr) cudaEventDestroy(ready);
    if (done != nullptr) cudaEventDestroy(done);
    if (side != nullptr) cudaStreamDestroy(side);
    if (pieces != nullptr) cudaFree(pieces);
    if (comm != nullptr) ncclCommDestroy(comm);
  }

  /// The side stream, made on the first call: non-blocking, so that it runs beside the
  /// legacy default stream instead of serialising with it; events without timing.
  cudaStream_t side_stream() {
    if (side == nullptr) {
      check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
      check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    }
    return side;
  }

  /// `pieces` with room for n elements, kept between calls (the host sum keeps its scratch
  /// for the same reason: a fresh buffer every step costs its allocation every step).
  float* pieces_for(std::size_t n) {
    if (n > capacity) {
      if (pieces != nullptr) check_cuda(cudaFree(pieces), "cudaFree");  // waits for its users
      pieces = nullptr;
      capacity = 0;
      check_cuda(cudaMalloc(&pieces, n * sizeof(float)), "cudaMalloc of the sum's pieces");
      capacity = n;
    }
    return pieces;
  }

  /// The rank-order sum of this rank's shard, left in the shard of `values`, queued on
  /// `stream`.
  void sum_shard_in_rank_order(std::span<float> values, int rank, int ranks,
                               cudaStream_t stream) {
    const auto n = static_cast<std::int64_t>(values.size());
    const Share mine = share_of(n, ranks, rank);
    float* const received = pieces_for(static_cast<std::size_t>(ranks * mine.size));
    const auto shard_bytes = static_cast<std::size_t>(mine.size) * sizeof(float);
    if (mine.size > 0) {
      check_cuda(cudaMemcpyAsync(received + rank * mine.size, values.data() + mine.begin,
                                 shard_bytes, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync of this rank's piece");
    }
    grouped("the pieces' ncclSend and ncclRecv", [&] {
      for (int r = 0; r < ranks; ++r) {
        if (r == rank) continue;
        const Share theirs = share_of(n, ranks, r);
        if (theirs.size > 0) {
          check_nccl(ncclSend(values.data() + theirs.begin, static_cast<std::size_t>(theirs.size),
                              ncclFloat, r, comm, stream),
                     "ncclSend");
        }
        if (mine.size > 0) {
          check_nccl(ncclRecv(received + r * mine.size, static_cast<std::size_t>(mine.size),
                              ncclFloat, r, comm, stream),
                     "ncclRecv");
        }
      }
    });
    if (mine.size > 0) {
      add_in_rank_order(
          values.subspan(static_cast<std::size_t>(mine.begin), static_cast<std::size_t>(mine.size)),
          std::span<const float>(received, static_cast<std::size_t>(ranks * mine.size)), stream);
    }
  }

  /// Every rank's sum of `values` (an all-reduce), queued on `stream`.
  void all_reduce(std::span<float> values, Reduction reduction, int rank, int ranks,
                  cudaStream_t stream) {
    if (values.empty()) return;
    if (reduction == Reduction::engine) {
      check_nccl(ncclAllReduce(values.data(), values.data(), values.size(), ncclFloat, ncclSum,
                               comm, stream),
                 "ncclAllReduce");
    } else {
      sum_shard_in_rank_order(values, rank, ranks, stream);
      gather_shares(comm, values.data(), static_cast<std::int64_t>(values.size()),
                    sizeof(float), ranks, stream);
    }
  }

  /// Each rank's shard of the sum of `values` (a reduce-scatter), queued on `stream`.
  void reduce_scatter(std::span<float> values, Reduction reduction, int rank, int ranks,
                      cudaStream_t stream) {
    if (values.empty()) return;
    if (reduction == Reduction::deterministic) {
      sum_shard_in_rank_order(values, rank, ranks, stream);
      return;
    }
    const auto n = static_cast<std::int64_t>(values.size());
    grouped("the shards' ncclReduce", [&] {
      for (int r = 0; r < ranks; ++r) {
        const Share shard = share_of(n, ranks, r);
        if (shard.size == 0) continue;
        float* const at = values.data() + shard.begin;
        check_nccl(ncclReduce(at, at, static_cast<std::size_t>(shard.size), ncclFloat, ncclSum,
                              r, comm, stream),
                   "ncclReduce");
      }
    });
  }
};

DeviceCommunicator::DeviceCommunicator(Communicator& host)
    : Collectives(host.rank(), host.size()), engine_(std::make_unique<Engine>()) {
  ncclUniqueId id{};
  if (rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const std::string sent =
      host.broadcast(std::string(reinterpret_cast<const char*>(&id), sizeof id));
  BIGBATCH_CHECK(sent.size() == sizeof id, "DeviceCommunicator: NCCL's id arrived as ",
                 sent.size(), " bytes, not ", sizeof id);
  std::memcpy(&id, sent.data(), sizeof id);
  check_nccl(ncclCommInitRank(&engine_->comm, size(), id, rank()), "ncclCommInitRank");
}

DeviceCommunicator::~DeviceCommunicator() = default;

void DeviceCommunicator::all_reduce_sum(std::span<float> values, Reduction reduction) {
  engine_->all_reduce(values, reduction, rank(), size(), kStream);
}

void DeviceCommunicator::reduce_scatter_sum(std::span<float> values, Reduction reduction) {
  engine_->reduce_scatter(values, reduction, rank(), size(), kStream);
}

void DeviceCommunicator::start_beside(std::span<const std::span<float>> buffers,
                                      Reduction reduction, bool own_shards) {
  const cudaStream_t side = engine_->side_stream();
  // The side stream waits for what the default stream has queued so far: the backward
  // that made these gradients. Work queued after this runs beside the sums.
  check_cuda(cudaEventRecord(engine_->ready, kStream), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(side, engine_->ready, 0), "cudaStreamWaitEvent");
  for (const std::span<float> buffer : buffers) {
    if (own_shards) {
      engine_->reduce_scatter(buffer, reduction, rank(), size(), side);
    } else {
      engine_->all_reduce(buffer, reduction, rank(), size(), side);
    }
  }
}

void DeviceCommunicator::join_beside() {
  if (engine_->side == nullptr) return;  // nothing was ever started beside
  check_cuda(cudaEventRecord(engine_->done, engine_->side), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(kStream, engine_->done, 0), "cudaStreamWaitEvent");
}

void DeviceCommunicator::all_gather_shares(std::span<float> values) {
  if (values.empty()) return;
  gather_shares(engine_->comm, values.data(), static_cast<std::int64_t>(values.size()),
                sizeof(float), size(), kStream);
}

void DeviceCommunicator::all_gather_shares(std::span<std::uint16_t> values) {
  if (values.empty()) return;
  gather_shares(engine_->comm, values.data(), static_cast<std::int64_t>(values.size()),
                sizeof(std::uint16_t), size(), kStream);
}

void add_in_rank_order_on_device(std::span<float> total, std::span<const float> pieces) {
  add_in_rank_order(total, pieces, kStream);
}

}  // namespace bigbatch::collectives

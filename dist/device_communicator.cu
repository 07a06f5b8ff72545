// device_communicator.cu: the collectives on CUDA tensors, on NCCL (built with NCCL only).
#include "dist/device_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/check.hpp"

namespace bigbatch::dist {
namespace {

// Every kernel of the CUDA backend is queued on the default stream; the collectives join
// that queue, so they follow the backward that made the gradients and precede the step.
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
                   int ranks) {
  auto* const bytes = static_cast<char*>(values);
  grouped("the shards' ncclBroadcast", [&] {
    for (int r = 0; r < ranks; ++r) {
      const Share shard = share_of(n, ranks, r);
      if (shard.size == 0) continue;  // the same on every rank: no call is left unmatched
      char* const at = bytes + shard.begin * element_bytes;
      check_nccl(ncclBroadcast(at, at, static_cast<std::size_t>(shard.size) * element_bytes,
                               ncclInt8, r, comm, kStream),
                 "ncclBroadcast");
    }
  });
}

}  // namespace

struct DeviceCommunicator::Engine {
  ncclComm_t comm = nullptr;
  float* pieces = nullptr;   // the deterministic sum's R pieces of this rank's shard
  std::size_t capacity = 0;  // elements of `pieces`

  ~Engine() {
    if (pieces != nullptr) cudaFree(pieces);
    if (comm != nullptr) ncclCommDestroy(comm);
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

  /// The rank-order sum of this rank's shard, left in the shard of `values`.
  void sum_shard_in_rank_order(std::span<float> values, int rank, int ranks) {
    const auto n = static_cast<std::int64_t>(values.size());
    const Share mine = share_of(n, ranks, rank);
    float* const received = pieces_for(static_cast<std::size_t>(ranks * mine.size));
    const auto shard_bytes = static_cast<std::size_t>(mine.size) * sizeof(float);
    if (mine.size > 0) {
      check_cuda(cudaMemcpyAsync(received + rank * mine.size, values.data() + mine.begin,
                                 shard_bytes, cudaMemcpyDeviceToDevice, kStream),
                 "cudaMemcpyAsync of this rank's piece");
    }
    grouped("the pieces' ncclSend and ncclRecv", [&] {
      for (int r = 0; r < ranks; ++r) {
        if (r == rank) continue;
        const Share theirs = share_of(n, ranks, r);
        if (theirs.size > 0) {
          check_nccl(ncclSend(values.data() + theirs.begin, static_cast<std::size_t>(theirs.size),
                              ncclFloat, r, comm, kStream),
                     "ncclSend");
        }
        if (mine.size > 0) {
          check_nccl(ncclRecv(received + r * mine.size, static_cast<std::size_t>(mine.size),
                              ncclFloat, r, comm, kStream),
                     "ncclRecv");
        }
      }
    });
    if (mine.size > 0) {
      add_in_rank_order_on_device(
          values.subspan(static_cast<std::size_t>(mine.begin), static_cast<std::size_t>(mine.size)),
          std::span<const float>(received, static_cast<std::size_t>(ranks * mine.size)));
    }
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
  if (values.empty()) return;
  if (reduction == Reduction::engine) {
    check_nccl(ncclAllReduce(values.data(), values.data(), values.size(), ncclFloat, ncclSum,
                             engine_->comm, kStream),
               "ncclAllReduce");
  } else {
    engine_->sum_shard_in_rank_order(values, rank(), size());
    all_gather_shares(values);
  }
}

void DeviceCommunicator::reduce_scatter_sum(std::span<float> values, Reduction reduction) {
  if (values.empty()) return;
  if (reduction == Reduction::deterministic) {
    engine_->sum_shard_in_rank_order(values, rank(), size());
    return;
  }
  const auto n = static_cast<std::int64_t>(values.size());
  grouped("the shards' ncclReduce", [&] {
    for (int r = 0; r < size(); ++r) {
      const Share shard = share_of(n, size(), r);
      if (shard.size == 0) continue;
      float* const at = values.data() + shard.begin;
      check_nccl(ncclReduce(at, at, static_cast<std::size_t>(shard.size), ncclFloat, ncclSum, r,
                            engine_->comm, kStream),
                 "ncclReduce");
    }
  });
}

void DeviceCommunicator::all_gather_shares(std::span<float> values) {
  if (values.empty()) return;
  gather_shares(engine_->comm, values.data(), static_cast<std::int64_t>(values.size()),
                sizeof(float), size());
}

void DeviceCommunicator::all_gather_shares(std::span<std::uint16_t> values) {
  if (values.empty()) return;
  gather_shares(engine_->comm, values.data(), static_cast<std::int64_t>(values.size()),
                sizeof(std::uint16_t), size());
}

void add_in_rank_order_on_device(std::span<float> total, std::span<const float> pieces) {
  const auto n = static_cast<std::int64_t>(total.size());
  BIGBATCH_CHECK(n > 0 && pieces.size() % total.size() == 0 && !pieces.empty(),
                 "add_in_rank_order_on_device: ", pieces.size(), " piece elements for a total of ",
                 total.size());
  const auto ranks = static_cast<int>(pieces.size() / total.size());
  constexpr int kThreads = 256;
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535 * 8);
  add_in_rank_order_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, kStream>>>(
      total.data(), pieces.data(), ranks, n);
  check_cuda(cudaGetLastError(), "add_in_rank_order_kernel's launch");
}

}  // namespace bigbatch::dist

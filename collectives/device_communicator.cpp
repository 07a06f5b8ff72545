// device_communicator.cpp: a build without NCCL keeps DeviceCommunicator's API and refuses
// to make one; with NCCL, device_communicator.cu holds the collectives.
#include "collectives/device_communicator.hpp"

#include <stdexcept>

namespace bigbatch::collectives {

bool DeviceCommunicator::compiled() { return BIGBATCH_HAVE_NCCL != 0; }

#if !BIGBATCH_HAVE_NCCL

namespace {
[[noreturn]] void refuse() {
  throw std::runtime_error(
      "this bigbatch was built without NCCL, which data-parallel runs on CUDA tensors need: "
      "build with the CUDA toolkit's nccl.h and libnccl (found beside cuBLAS)");
}
}  // namespace

struct DeviceCommunicator::Engine {};

DeviceCommunicator::DeviceCommunicator(Communicator& host)
    : Collectives(host.rank(), host.size()) {
  refuse();
}
DeviceCommunicator::~DeviceCommunicator() = default;
void DeviceCommunicator::all_reduce_sum(std::span<float>, Reduction) { refuse(); }
void DeviceCommunicator::reduce_scatter_sum(std::span<float>, Reduction) { refuse(); }
void DeviceCommunicator::all_gather_shares(std::span<float>) { refuse(); }
void DeviceCommunicator::all_gather_shares(std::span<std::uint16_t>) { refuse(); }
void DeviceCommunicator::start_beside(std::span<const std::span<float>>, Reduction, bool) {
  refuse();
}
void DeviceCommunicator::join_beside() { refuse(); }
void add_in_rank_order_on_device(std::span<float>, std::span<const float>) { refuse(); }

#endif

}  // namespace bigbatch::collectives

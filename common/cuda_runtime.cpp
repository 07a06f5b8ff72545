#include "common/cuda_runtime.hpp"

#include <stdexcept>
#include <string>

#if BIGBATCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace bigbatch::cuda_rt {

#if BIGBATCH_HAVE_CUDA

namespace {

void throw_on_error(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " +
                             cudaGetErrorString(status));
  }
}

}  // namespace

bool compiled() { return true; }

/// cudaGetDeviceCount's answer, asked once per process (a thread-safe static): the answer
/// does not change while the process runs, and every tensor constructor asks.
struct DeviceCount {
  cudaError_t status = cudaSuccess;
  int count = 0;
};

const DeviceCount& device_count() {
  static const DeviceCount answer = [] {
    DeviceCount result;
    result.status = cudaGetDeviceCount(&result.count);
    if (result.status != cudaSuccess) cudaGetLastError();  // clear the sticky error
    return result;
  }();
  return answer;
}

bool available(std::string* why_not) {
  const cudaError_t status = device_count().status;
  const int count = device_count().count;
  if (status != cudaSuccess || count == 0) {
    if (why_not != nullptr) {
      *why_not = status != cudaSuccess
                     ? std::string("no usable CUDA device (") + cudaGetErrorName(status) + ": " +
                           cudaGetErrorString(status) +
                           "); is there a GPU with an NVIDIA driver on this machine?"
                     : std::string("no CUDA device present");
    }
    return false;
  }
  return true;
}

int devices() { return available() ? device_count().count : 0; }

void use_device(int index) {
  if (index < 0 || index >= devices()) {
    throw std::runtime_error("CUDA device " + std::to_string(index) + " does not exist: this "
                             "process sees " + std::to_string(devices()));
  }
  throw_on_error(cudaSetDevice(index), "cudaSetDevice");
}

void* device_malloc(std::size_t bytes) {
  void* pointer = nullptr;
  if (cudaMalloc(&pointer, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return pointer;
}

void device_free(void* pointer) noexcept { cudaFree(pointer); }

void memcpy(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device:
      // Queued on the default stream: from pageable memory (every host buffer here) the call
      // returns once the source is staged, so the caller may reuse it. cudaMemcpy syncs the
      // stream first; the async form does not have to (CUDA's "API synchronization
      // behavior" still allows the driver to wait when it stages pageable memory: only a
      // pinned staging buffer would rule that out).
      throw_on_error(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0),
                     "cudaMemcpyAsync (host to device)");
      return;
    case CopyKind::device_to_host:
      throw_on_error(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      return;
    case CopyKind::device_to_device:
      throw_on_error(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
      return;
  }
}

void memset_zero(void* dst, std::size_t bytes) {
  throw_on_error(cudaMemset(dst, 0, bytes), "cudaMemset");
}

void synchronize() { throw_on_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

MemInfo mem_info() {
  MemInfo info;
  throw_on_error(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

std::string device_name() {
  int device = 0;
  throw_on_error(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties{};
  throw_on_error(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

void check_last_launch(const char* what) {
  // A bad launch (configuration, missing kernel image) is reported by the launch itself.
  throw_on_error(cudaGetLastError(), what);
#if BIGBATCH_SYNC_AFTER_LAUNCH
  // A fault while the kernel runs (an illegal address, a trap) is asynchronous: without this
  // wait it surfaces at the next synchronising call (often a copy), named after that call.
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error while ") + what +
                             " ran (found by the synchronisation after its launch): " +
                             cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
  }
#endif
}

#else  // built without CUDA

namespace {
[[noreturn]] void not_built() {
  throw std::runtime_error("this build of bigbatch has no CUDA backend (configure with nvcc "
                           "on PATH and BIGBATCH_CUDA=ON)");
}
}  // namespace

bool compiled() { return false; }
bool available(std::string* why_not) {
  if (why_not != nullptr) *why_not = "bigbatch was built without the CUDA backend";
  return false;
}
int devices() { return 0; }
void use_device(int) { not_built(); }
void* device_malloc(std::size_t) { not_built(); }
void device_free(void*) noexcept {}
void memcpy(void*, const void*, std::size_t, CopyKind) { not_built(); }
void memset_zero(void*, std::size_t) { not_built(); }
void synchronize() { not_built(); }
MemInfo mem_info() { not_built(); }
std::string device_name() { not_built(); }
void check_last_launch(const char*) { not_built(); }

#endif

}  // namespace bigbatch::cuda_rt

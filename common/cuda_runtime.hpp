// cuda_runtime.hpp: the few CUDA runtime calls common/ needs, behind a plain C++ API.
//
// The project builds with or without the CUDA toolkit. Without it (or without a GPU)
// cuda_available() is false and says why; the other functions then throw.
#pragma once

#include <cstddef>
#include <string>

namespace bigbatch::cuda_rt {

/// True when the build includes the CUDA backend.
bool compiled();
/// True when the CUDA backend is compiled in and at least one device answers.
/// Otherwise false, with the reason in *why_not (if given). The device count is asked
/// once per process (cudaGetDeviceCount) and remembered.
bool available(std::string* why_not = nullptr);

/// The CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 when available()
/// is false.
int devices();
/// Makes device `index` the current one (cudaSetDevice): the device every later
/// allocation, copy and kernel of this thread uses. Throws std::runtime_error for an index
/// outside [0, devices()).
void use_device(int index);

/// The direction of a memcpy().
enum class CopyKind { host_to_device, device_to_host, device_to_device };

void* device_malloc(std::size_t bytes);  ///< nullptr when the device is full
/// Frees memory from device_malloc(); errors are ignored.
void device_free(void* pointer) noexcept;
/// Copies `bytes` bytes from `src` to `dst` in the direction `kind`, in order with the
/// kernels on the default stream. Host to device is queued (cudaMemcpyAsync; the pageable
/// source may be reused on return) and need not wait for the device; device to host waits
/// for the copy (and so for the work queued before it).
void memcpy(void* dst, const void* src, std::size_t bytes, CopyKind kind);
/// Sets `bytes` bytes of device memory at `dst` to zero.
void memset_zero(void* dst, std::size_t bytes);
/// Waits for all work on the current device (cudaDeviceSynchronize).
void synchronize();

/// The current device's memory as cudaMemGetInfo reports it, in bytes.
struct MemInfo {
  /// Bytes the device has free now.
  std::size_t free_bytes = 0;
  /// The device's total memory.
  std::size_t total_bytes = 0;
};
/// Free and total memory of the current device.
MemInfo mem_info();
/// The current device's name, as cudaGetDeviceProperties reports it.
std::string device_name();

/// Throws std::runtime_error naming `what` (the kernel) when the last launch failed. Built
/// with BIGBATCH_SYNC_AFTER_LAUNCH (Debug builds, the `debug` preset) it then waits for the
/// kernel to finish (cudaDeviceSynchronize), so that a fault while it runs is reported here,
/// with the kernel's name, instead of at the next synchronising call; Release builds skip
/// the wait and keep launches asynchronous.
void check_last_launch(const char* what);

}  // namespace bigbatch::cuda_rt

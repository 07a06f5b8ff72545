// memory.hpp: the tracking allocator. Memory is counted, not guessed.
//
// Every byte a tensor owns comes from the TrackingAllocator of its device and is tagged
// with a MemoryCategory. Per category and in total, the allocator keeps the bytes live now
// and the peak, plus the category breakdown at the total's peak. Counts are the bytes
// requested (no rounding, no allocator overhead); what the device's CachingAllocator holds
// from the driver is reported apart, as reserved bytes. A cap limits the bytes requested: a
// request that would take the live total past it throws OutOfMemoryError, naming the
// request, the cap and the live bytes by category; a real cudaMalloc failure throws the
// same error. host_data (the data sets a run reads from) is counted in its own row but not
// in the totals, the peaks' breakdown or the cap.
//
// Why and how: docs/internals.md#commonmemoryhpp
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/caching_allocator.hpp"
#include "common/device.hpp"

namespace bigbatch {

/// What an allocation is for; every tracked byte carries one of these tags.
enum class MemoryCategory : std::uint8_t {
  parameters,       ///< weights the forward pass reads (fp32, or the fp16 working copy)
  master_weights,   ///< fp32 copy of the weights under mixed precision
  gradients,        ///< parameter gradients
  optimizer_state,  ///< momentum, Adam moments
  activations,      ///< what the forward pass saves for the backward pass
  checkpoints,      ///< activations kept at checkpoint boundaries (recompute)
  workspace,        ///< temporaries that die within an op or a step
  data,             ///< input batches and labels on the device
  host_data,        ///< data sets in host memory: outside the totals and the cap
};

/// The number of MemoryCategory values, the length of the per-category arrays.
inline constexpr std::size_t kNumMemoryCategories = 9;

/// Why a category may be empty or is set apart, for reports ("" for the others).
constexpr std::string_view category_remark(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::master_weights: return "fp32 weights under fp16 (chapter 03)";
    case MemoryCategory::checkpoints: return "kept block inputs (chapter 05)";
    case MemoryCategory::host_data: return "data sets on the host: not in the total";
    default: return "";
  }
}

/// Whether a category is part of the device's totals and cap (all but host_data).
constexpr bool counts_on_device(MemoryCategory c) { return c != MemoryCategory::host_data; }

/// The category's name as spelled in the enum ("parameters", "host_data", ...).
constexpr std::string_view category_name(MemoryCategory c) {
  constexpr std::array<std::string_view, kNumMemoryCategories> names = {
      "parameters", "master_weights", "gradients", "optimizer_state",
      "activations", "checkpoints", "workspace", "data", "host_data"};
  return names[static_cast<std::size_t>(c)];
}

/// A snapshot of the allocator's books.
struct MemoryStats {
  /// Bytes for each category, indexed by the MemoryCategory's value.
  using PerCategory = std::array<std::size_t, kNumMemoryCategories>;
  PerCategory live{};     ///< bytes allocated and not yet freed, by category
  PerCategory peak{};     ///< the most bytes ever live in each category on its own
  PerCategory at_peak{};  ///< the live bytes by category when the total peaked
  std::size_t live_total = 0;  ///< device bytes live now (every category but host_data)
  std::size_t peak_total = 0;  ///< the most device bytes ever live at once
  std::size_t allocation_count = 0;  ///< allocations made since construction
  /// Bytes held from the driver now: blocks in use at their size class plus cached blocks
  /// (CUDA); live allocations rounded to 64 bytes, host_data included (CPU). At least
  /// live_total.
  std::size_t reserved_total = 0;
  std::size_t reserved_peak = 0;       ///< the most bytes ever reserved at once
  std::size_t driver_allocations = 0;  ///< blocks obtained from the driver (cudaMalloc calls)

  /// live[c]: the bytes of category `c` allocated and not yet freed.
  std::size_t live_of(MemoryCategory c) const { return live[static_cast<std::size_t>(c)]; }
  /// peak[c]: the most bytes of category `c` ever live at once.
  std::size_t peak_of(MemoryCategory c) const { return peak[static_cast<std::size_t>(c)]; }
  /// at_peak[c]: the bytes of category `c` live when the total peaked.
  std::size_t at_peak_of(MemoryCategory c) const { return at_peak[static_cast<std::size_t>(c)]; }
};

/// Thrown when a request would take a device past its cap (or the real device is full).
class OutOfMemoryError : public std::runtime_error {
 public:
  /// `message` is what what() returns; `requested` bytes of `category` were refused.
  OutOfMemoryError(const std::string& message, std::size_t requested, MemoryCategory category)
      : std::runtime_error(message), requested_(requested), category_(category) {}
  /// The size of the refused request, in bytes.
  std::size_t requested() const { return requested_; }
  /// The category of the refused request.
  MemoryCategory category() const { return category_; }

 private:
  std::size_t requested_;
  MemoryCategory category_;
};

/// Hands out a device's memory and keeps its books: live and peak bytes per category and in
/// total, and an optional cap. Thread-safe; not copyable.
class TrackingAllocator {
 public:
  /// An allocator for `device` with nothing live and no cap; a CUDA device's memory comes
  /// from cudaMalloc through a CachingAllocator.
  explicit TrackingAllocator(Device device);
  /// An allocator for `device` whose memory comes from `source` through a CachingAllocator
  /// (tests pass a stand-in for the driver).
  TrackingAllocator(Device device, std::unique_ptr<DeviceMemorySource> source);
  /// Gives the cached blocks back (see allocator_for for the process-wide allocators).
  ~TrackingAllocator();
  TrackingAllocator(const TrackingAllocator&) = delete;
  TrackingAllocator& operator=(const TrackingAllocator&) = delete;

  /// Returns `bytes` bytes (64-byte aligned on the CPU), or nullptr for 0 bytes.
  /// Throws OutOfMemoryError past the cap or when the device itself is full; on the CPU,
  /// "full" is every live byte (host_data included) past host_memory_bytes(), checked
  /// before any is taken: the operating system would hand out such memory on credit and
  /// end the process when it is touched.
  void* allocate(std::size_t bytes, MemoryCategory category);
  /// Returns memory obtained from allocate() with the same size and category.
  void deallocate(void* pointer, std::size_t bytes, MemoryCategory category) noexcept;

  /// A copy of the books as they are now.
  MemoryStats stats() const;
  /// Starts a new peak measurement: peaks become what is live now.
  void reset_peak();
  /// Limits the live total to `cap` bytes; std::nullopt removes the limit.
  void set_cap(std::optional<std::size_t> cap);
  /// The cap in bytes, or std::nullopt when there is none.
  std::optional<std::size_t> cap() const;
  /// Gives every cached, unused block back to the driver (cudaFree); nothing on the CPU.
  /// The next allocations of those sizes call the driver again.
  void empty_cache();
  /// The device whose memory this allocator hands out.
  Device device() const { return device_; }

  /// A table of live and peak bytes by category; on CUDA also what cudaMemGetInfo saw.
  std::string report() const;

 private:
  std::string describe_live_locked() const;
  void* allocate_block_locked(std::size_t bytes);
  void update_reserved_locked();

  Device device_;
  std::unique_ptr<DeviceMemorySource> source_;  // nullptr on the CPU
  std::unique_ptr<CachingAllocator> cache_;     // nullptr on the CPU
  std::size_t cpu_reserved_ = 0;                // CPU: live bytes rounded to 64
  std::size_t cpu_capacity_ = 0;                // CPU: host_memory_bytes()
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::optional<std::size_t> cap_;
};

/// The memory this process may use on this machine: its physical memory, or the limit of
/// its control group (cgroup v2's memory.max) where that is lower. Read once.
std::size_t host_memory_bytes();

/// The process-wide allocator of a device (one per device, created on first use). These are
/// never destroyed: a tensor destroyed late in the program's exit still finds its
/// allocator, and no cudaFree runs from a static destructor after the CUDA runtime has
/// shut down. Cached device memory goes back to the driver with the process (or earlier,
/// through empty_cache()).
TrackingAllocator& allocator_for(Device device);

/// Sets a cap for the lifetime of the object and restores the previous one after.
class ScopedMemoryCap {
 public:
  /// Sets the cap of allocator_for(device) to `cap` (std::nullopt: no cap).
  ScopedMemoryCap(Device device, std::optional<std::size_t> cap);
  ~ScopedMemoryCap();
  ScopedMemoryCap(const ScopedMemoryCap&) = delete;
  ScopedMemoryCap& operator=(const ScopedMemoryCap&) = delete;

 private:
  TrackingAllocator& allocator_;
  std::optional<std::size_t> previous_;
};

}  // namespace bigbatch

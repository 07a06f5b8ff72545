#include "common/memory.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <sstream>

#include "common/format.hpp"

namespace bigbatch {
namespace {

constexpr std::size_t kCpuAlignment = 64;

std::size_t index_of(MemoryCategory c) { return static_cast<std::size_t>(c); }

}  // namespace

std::size_t host_memory_bytes() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    std::size_t total = pages > 0 && page_size > 0
                            ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size)
                            : std::numeric_limits<std::size_t>::max();
    // A container's limit: a number of bytes, or "max" (no limit), which does not parse.
    std::ifstream limit("/sys/fs/cgroup/memory.max");
    std::size_t limit_bytes = 0;
    if (limit >> limit_bytes && limit_bytes > 0 && limit_bytes < total) total = limit_bytes;
    return total;
  }();
  return bytes;
}

TrackingAllocator::TrackingAllocator(Device device)
    : TrackingAllocator(device, device.is_cuda() ? make_cuda_memory_source() : nullptr) {}

TrackingAllocator::TrackingAllocator(Device device, std::unique_ptr<DeviceMemorySource> source)
    : device_(device), source_(std::move(source)) {
  if (source_) {
    cache_ = std::make_unique<CachingAllocator>(*source_);
  } else {
    cpu_capacity_ = host_memory_bytes();
  }
}

TrackingAllocator::~TrackingAllocator() = default;  // cache_ empties itself before source_ goes

void* TrackingAllocator::allocate_block_locked(std::size_t bytes) {
  if (cache_) return cache_->allocate(bytes);
  const std::size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* pointer = rounded < bytes ? nullptr : std::aligned_alloc(kCpuAlignment, rounded);
  if (pointer != nullptr) {
    cpu_reserved_ += rounded;
    stats_.driver_allocations += 1;
  }
  return pointer;
}

void TrackingAllocator::update_reserved_locked() {
  if (cache_) {
    stats_.reserved_total = cache_->reserved_bytes();
    stats_.driver_allocations = cache_->source_allocations();
  } else {
    stats_.reserved_total = cpu_reserved_;
  }
  if (stats_.reserved_total > stats_.reserved_peak) stats_.reserved_peak = stats_.reserved_total;
}

void* TrackingAllocator::allocate(std::size_t bytes, MemoryCategory category) {
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex_);
  const bool on_device = counts_on_device(category);
  if (on_device && cap_ && (bytes > *cap_ || stats_.live_total > *cap_ - bytes)) {
    std::ostringstream message;
    message << "out of memory on " << device_.name() << ": cannot allocate "
            << format_bytes(bytes) << " (" << bytes << " bytes) of "
            << category_name(category) << "; the device is capped at " << format_bytes(*cap_)
            << " and " << format_bytes(stats_.live_total) << " are live ("
            << describe_live_locked() << ")";
    throw OutOfMemoryError(message.str(), bytes, category);
  }
  if (!cache_) {  // the CPU: what is live and asked for must fit in the machine
    const std::size_t host_data = stats_.live[index_of(MemoryCategory::host_data)];
    const std::size_t live = stats_.live_total + host_data;
    if (bytes > cpu_capacity_ || live > cpu_capacity_ - bytes) {
      std::ostringstream message;
      message << "out of memory on " << device_.name() << ": cannot allocate "
              << format_bytes(bytes) << " (" << bytes << " bytes) of "
              << category_name(category) << "; this machine has " << format_bytes(cpu_capacity_)
              << " of memory and " << format_bytes(live) << " are live ("
              << describe_live_locked();
      if (host_data > 0) message << "; and the data sets' " << format_bytes(host_data);
      message << ")";
      throw OutOfMemoryError(message.str(), bytes, category);
    }
  }
  void* pointer = allocate_block_locked(bytes);
  update_reserved_locked();
  if (pointer == nullptr) {
    std::ostringstream message;
    message << "out of memory on " << device_.name() << ": the device refused "
            << format_bytes(bytes) << " (" << bytes << " bytes) of " << category_name(category)
            << " with " << format_bytes(stats_.live_total) << " live ("
            << describe_live_locked() << ")";
    if (cache_) {
      message << "; the allocator's cache was emptied and the request retried";
      if (const std::string remark = cache_->describe_source(); !remark.empty()) {
        message << "; " << remark;
      }
    }
    throw OutOfMemoryError(message.str(), bytes, category);
  }
  const std::size_t c = index_of(category);
  stats_.live[c] += bytes;
  stats_.allocation_count += 1;
  if (stats_.live[c] > stats_.peak[c]) stats_.peak[c] = stats_.live[c];
  if (!on_device) return pointer;
  stats_.live_total += bytes;
  if (stats_.live_total > stats_.peak_total) {
    stats_.peak_total = stats_.live_total;
    stats_.at_peak = stats_.live;
  }
  return pointer;
}

void TrackingAllocator::deallocate(void* pointer, std::size_t bytes,
                                   MemoryCategory category) noexcept {
  if (pointer == nullptr) return;
  std::lock_guard lock(mutex_);
  if (cache_) {
    cache_->deallocate(pointer);
  } else {
    std::free(pointer);
    cpu_reserved_ -= (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  }
  update_reserved_locked();
  stats_.live[index_of(category)] -= bytes;
  if (counts_on_device(category)) stats_.live_total -= bytes;
}

void TrackingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (cache_) cache_->empty_cache();
  update_reserved_locked();
}

MemoryStats TrackingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void TrackingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
  stats_.at_peak = stats_.live;
  stats_.reserved_peak = stats_.reserved_total;
}

void TrackingAllocator::set_cap(std::optional<std::size_t> cap) {
  std::lock_guard lock(mutex_);
  cap_ = cap;
}

std::optional<std::size_t> TrackingAllocator::cap() const {
  std::lock_guard lock(mutex_);
  return cap_;
}

std::string TrackingAllocator::describe_live_locked() const {
  std::ostringstream out;
  bool first = true;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    if (stats_.live[c] == 0 || !counts_on_device(category)) continue;
    out << (first ? "" : ", ") << category_name(category) << " " << format_bytes(stats_.live[c]);
    first = false;
  }
  if (first) out << "nothing";
  return out.str();
}

std::string TrackingAllocator::report() const {
  const MemoryStats s = stats();
  std::ostringstream out;
  out << "memory on " << device_.name();
  if (const auto c = cap()) out << " (capped at " << format_bytes(*c) << ")";
  out << "\n";
  // "at total peak" is the breakdown of one moment and adds up to the total's peak; each
  // category's own peak may come from another moment, so that column does not add up.
  char line[192];
  std::snprintf(line, sizeof line, "  %-16s %12s %14s %16s\n", "category", "live",
                "at total peak", "own peak");
  out << line;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    const bool on_device = counts_on_device(category);
    std::snprintf(line, sizeof line, "  %-16s %12s %14s %16s  %s\n",
                  std::string(category_name(category)).c_str(), format_bytes(s.live[c]).c_str(),
                  on_device ? format_bytes(s.at_peak[c]).c_str() : "-",
                  format_bytes(s.peak[c]).c_str(),
                  std::string(category_remark(category)).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %12s %14s\n", "total",
                format_bytes(s.live_total).c_str(), format_bytes(s.peak_total).c_str());
  out << line;
  std::snprintf(line, sizeof line, "  %-16s %12s %14s  %zu driver allocations\n", "reserved",
                format_bytes(s.reserved_total).c_str(), format_bytes(s.reserved_peak).c_str(),
                s.driver_allocations);
  out << line;
  std::string remark;
  {
    std::lock_guard lock(mutex_);
    if (cache_) remark = cache_->describe_source();
  }
  if (!remark.empty()) out << "  " << remark << "\n";
  return out.str();
}

TrackingAllocator& allocator_for(Device device) {
  static std::mutex mutex;
  // Never destroyed (memory.hpp says why); still reachable, so not a leak to sanitizers.
  static auto& allocators =
      *new std::map<std::pair<int, int>, std::unique_ptr<TrackingAllocator>>();
  std::lock_guard lock(mutex);
  auto& slot = allocators[{static_cast<int>(device.type), device.index}];
  if (!slot) slot = std::make_unique<TrackingAllocator>(device);
  return *slot;
}

ScopedMemoryCap::ScopedMemoryCap(Device device, std::optional<std::size_t> cap)
    : allocator_(allocator_for(device)), previous_(allocator_.cap()) {
  allocator_.set_cap(cap);
}

ScopedMemoryCap::~ScopedMemoryCap() { allocator_.set_cap(previous_); }

}  // namespace bigbatch

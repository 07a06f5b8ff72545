#include "common/caching_allocator.hpp"

#include <limits>

#include "common/cuda_runtime.hpp"
#include "common/format.hpp"
#include "common/integer_math.hpp"

namespace bigbatch {
namespace {

std::size_t round_up_saturating(std::size_t bytes, std::size_t granule) {
  if (bytes > std::numeric_limits<std::size_t>::max() - (granule - 1)) {
    return std::numeric_limits<std::size_t>::max();
  }
  return bigbatch::round_up(bytes, granule);
}

/// cudaMalloc and cudaFree through common/cuda_runtime.hpp.
class CudaMemorySource final : public DeviceMemorySource {
 public:
  void* allocate(std::size_t bytes) override { return cuda_rt::device_malloc(bytes); }
  void release(void* block) noexcept override { cuda_rt::device_free(block); }
  std::string describe() const override {
    const auto info = cuda_rt::mem_info();
    return "cudaMemGetInfo: " + format_bytes(info.free_bytes) + " free of " +
           format_bytes(info.total_bytes);
  }
};

}  // namespace

std::unique_ptr<DeviceMemorySource> make_cuda_memory_source() {
  return std::make_unique<CudaMemorySource>();
}

std::size_t round_to_size_class(std::size_t bytes) {
  return bytes <= kSmallBlockLimit ? round_up_saturating(bytes, kSmallBlockGranule)
                                   : round_up_saturating(bytes, kLargeBlockGranule);
}

CachingAllocator::~CachingAllocator() { empty_cache(); }

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = round_to_size_class(bytes);
  void* block = nullptr;
  if (const auto cached = cached_.find(size); cached != cached_.end()) {
    block = cached->second;
    cached_.erase(cached);
    cached_bytes_ -= size;
  } else {
    block = source_.allocate(size);
    if (block == nullptr && !cached_.empty()) {
      empty_cache();  // the cached blocks of other classes may be what fills the device
      block = source_.allocate(size);
    }
    if (block == nullptr) return nullptr;
    source_allocations_ += 1;
  }
  in_use_.emplace(block, size);
  in_use_bytes_ += size;
  return block;
}

std::size_t CachingAllocator::deallocate(void* block) noexcept {
  const auto found = in_use_.find(block);
  if (found == in_use_.end()) return 0;
  const std::size_t size = found->second;
  in_use_.erase(found);
  in_use_bytes_ -= size;
  cached_.emplace(size, block);
  cached_bytes_ += size;
  return size;
}

void CachingAllocator::empty_cache() noexcept {
  for (const auto& [size, block] : cached_) {
    source_.release(block);
    source_releases_ += 1;
  }
  cached_.clear();
  cached_bytes_ = 0;
}

}  // namespace bigbatch

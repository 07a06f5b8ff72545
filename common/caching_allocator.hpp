// caching_allocator.hpp: device memory kept for reuse, so that a training step after the
// first makes no driver allocation (cudaMalloc) and no driver free (cudaFree).
//
// A request is rounded up to its size class (round_to_size_class: a multiple of 512 bytes
// up to 1 MiB, of 2 MiB above) and served from a block of exactly that class: a cached one
// when there is one, a new one from the source (the driver) otherwise. Blocks are never
// split or merged; empty_cache() gives the cached blocks back. When the source refuses a
// block, every cached block goes back to it and the request is tried once more; a second
// refusal returns nullptr. Reuse is safe without events because every kernel and copy runs
// on one stream (the legacy default stream), in order. The books are of blocks (rounded
// sizes). Not thread-safe: the TrackingAllocator calls it under its lock.
//
// Why and how: docs/internals.md#commoncaching_allocatorhpp
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

namespace bigbatch {

/// Where a CachingAllocator gets its blocks: the CUDA driver, or a stand-in in tests.
class DeviceMemorySource {
 public:
  virtual ~DeviceMemorySource() = default;
  /// A new block of `bytes` bytes, or nullptr when the device refuses it.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Gives back a block from allocate(); never throws.
  virtual void release(void* block) noexcept = 0;
  /// A remark for out-of-memory messages and reports (e.g. what cudaMemGetInfo says);
  /// "" when there is nothing to add.
  virtual std::string describe() const { return ""; }
};

/// The source of the CUDA backend: cudaMalloc and cudaFree on the current device.
std::unique_ptr<DeviceMemorySource> make_cuda_memory_source();

/// 512-byte granule of the small size classes (requests up to kSmallBlockLimit).
inline constexpr std::size_t kSmallBlockGranule = 512;
/// Requests up to this many bytes (1 MiB) are small.
inline constexpr std::size_t kSmallBlockLimit = std::size_t{1} << 20;
/// 2 MiB granule of the large size classes.
inline constexpr std::size_t kLargeBlockGranule = std::size_t{2} << 20;

/// The size of the block that serves a request of `bytes` bytes (> 0): rounded up to a
/// multiple of 512 bytes up to 1 MiB, of 2 MiB above. Saturates at SIZE_MAX (a request
/// no device can meet, which its source then refuses).
std::size_t round_to_size_class(std::size_t bytes);

/// Blocks from a DeviceMemorySource, kept for reuse after they are freed (see the top of
/// this file). Not thread-safe.
class CachingAllocator {
 public:
  /// Takes blocks from `source`, which must outlive the allocator.
  explicit CachingAllocator(DeviceMemorySource& source) : source_(source) {}
  /// Gives every cached block back to the source. Blocks still in use are left alone:
  /// they belong to whoever holds them.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// A block of at least `bytes` (> 0) bytes, from the cache when one of its size class is
  /// there; nullptr when the source refuses it even after the cache was emptied.
  void* allocate(std::size_t bytes);
  /// Puts a block from allocate() back into the cache; returns its size, or 0 (and does
  /// nothing) for a pointer this allocator did not hand out.
  std::size_t deallocate(void* block) noexcept;
  /// Gives every cached block back to the source.
  void empty_cache() noexcept;

  /// Bytes held from the source: blocks in use plus cached blocks.
  std::size_t reserved_bytes() const { return in_use_bytes_ + cached_bytes_; }
  /// Bytes of the blocks in use (requests rounded to their size class).
  std::size_t in_use_bytes() const { return in_use_bytes_; }
  /// Bytes of the cached blocks, free for reuse.
  std::size_t cached_bytes() const { return cached_bytes_; }
  /// How many blocks the source has handed out (each one a cudaMalloc on CUDA).
  std::size_t source_allocations() const { return source_allocations_; }
  /// How many blocks went back to the source (each one a cudaFree on CUDA).
  std::size_t source_releases() const { return source_releases_; }
  /// The source's remark (DeviceMemorySource::describe).
  std::string describe_source() const { return source_.describe(); }

 private:
  DeviceMemorySource& source_;
  std::unordered_map<void*, std::size_t> in_use_;  // block -> its size class
  std::multimap<std::size_t, void*> cached_;       // size class -> free blocks
  std::size_t in_use_bytes_ = 0;
  std::size_t cached_bytes_ = 0;
  std::size_t source_allocations_ = 0;
  std::size_t source_releases_ = 0;
};

}  // namespace bigbatch

// The caching allocator under the tracking allocator: size classes, reuse without a new
// driver allocation, exact requested bytes beside the reserved ones, the cap, a refusing
// driver (cache emptied, one retry, then OutOfMemoryError), empty_cache and a clean
// destruction. A stand-in driver (FakeDriver) runs everything on the CPU; the CUDA test
// checks the real driver's allocator where a GPU is present.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/caching_allocator.hpp"
#include "common/memory.hpp"
#include "common/tensor.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

/// A driver on the host: counts what it hands out and gives back, and refuses a block
/// that would take it past `capacity` bytes.
struct FakeDriverBooks {
  std::size_t capacity = std::size_t{1} << 40;
  std::size_t held = 0;
  std::size_t allocations = 0;
  std::size_t releases = 0;
  std::size_t refusals = 0;
  std::set<void*> blocks;
  std::vector<std::size_t> sizes_asked;
};

class FakeDriver final : public DeviceMemorySource {
 public:
  explicit FakeDriver(FakeDriverBooks& books) : books_(books) {}
  void* allocate(std::size_t bytes) override {
    books_.sizes_asked.push_back(bytes);
    if (bytes > books_.capacity - books_.held) {
      books_.refusals += 1;
      return nullptr;
    }
    void* block = std::malloc(bytes);
    books_.held += bytes;
    books_.allocations += 1;
    books_.blocks.insert(block);
    sizes_[block] = bytes;
    return block;
  }
  void release(void* block) noexcept override {
    books_.held -= sizes_.at(block);
    books_.releases += 1;
    books_.blocks.erase(block);
    sizes_.erase(block);
    std::free(block);
  }
  std::string describe() const override { return "fake driver: " + std::to_string(books_.held) + " held"; }

 private:
  FakeDriverBooks& books_;
  std::map<void*, std::size_t> sizes_;
};

TEST(SizeClasses, RoundUpToTheGranuleOfTheirRange) {
  EXPECT_EQ(round_to_size_class(1), 512u);
  EXPECT_EQ(round_to_size_class(512), 512u);
  EXPECT_EQ(round_to_size_class(513), 1024u);
  EXPECT_EQ(round_to_size_class(kSmallBlockLimit), kSmallBlockLimit);  // the last small class
  EXPECT_EQ(round_to_size_class(kSmallBlockLimit + 1), kLargeBlockGranule);
  EXPECT_EQ(round_to_size_class(kLargeBlockGranule + 1), 2 * kLargeBlockGranule);
  EXPECT_EQ(round_to_size_class(SIZE_MAX - 3), SIZE_MAX) << "saturates instead of wrapping";
  // Every class holds its request and wastes less than one granule.
  for (std::size_t bytes = 1; bytes < (std::size_t{5} << 20); bytes = bytes * 3 + 7) {
    const std::size_t size = round_to_size_class(bytes);
    const std::size_t granule = bytes <= kSmallBlockLimit ? kSmallBlockGranule : kLargeBlockGranule;
    EXPECT_GE(size, bytes);
    EXPECT_LT(size - bytes, granule) << bytes;
    EXPECT_EQ(size % granule, 0u) << bytes;
  }
}

TEST(CachingAllocator, ReusesAFreedBlockOfTheSameClassWithoutTheDriver) {
  FakeDriverBooks books;
  FakeDriver driver(books);
  CachingAllocator cache(driver);
  void* a = cache.allocate(1000);  // class 1024
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(books.allocations, 1u);
  EXPECT_EQ(cache.deallocate(a), 1024u);
  EXPECT_EQ(cache.cached_bytes(), 1024u);
  void* b = cache.allocate(600);  // also class 1024: the cached block
  EXPECT_EQ(b, a);
  EXPECT_EQ(books.allocations, 1u) << "no new driver allocation";
  void* c = cache.allocate(400);  // class 512: another block
  EXPECT_NE(c, a);
  EXPECT_EQ(books.allocations, 2u);
  EXPECT_EQ(cache.in_use_bytes(), 1536u);
  EXPECT_EQ(cache.reserved_bytes(), books.held);
  EXPECT_EQ(cache.deallocate(&books), 0u) << "a pointer it never handed out is ignored";
  cache.deallocate(b);
  cache.deallocate(c);
  EXPECT_EQ(cache.reserved_bytes(), 1536u);
  EXPECT_EQ(books.releases, 0u) << "freeing keeps blocks";
  cache.empty_cache();
  EXPECT_EQ(books.releases, 2u);
  EXPECT_EQ(books.held, 0u);
  EXPECT_EQ(cache.reserved_bytes(), 0u);
}

// A step's allocations repeated: the first step takes blocks from the driver, every later
// one only from the cache (what "no cudaMalloc inside a step after the first" means).
TEST(CachingAllocator, ARepeatedStepAllocatesOnlyInTheFirst) {
  FakeDriverBooks books;
  FakeDriver driver(books);
  CachingAllocator cache(driver);
  const std::vector<std::size_t> step = {4 << 20, 3000, 4 << 20, 17, (4 << 20) + 5, 3000, 64};
  std::size_t after_first = 0;
  for (int repeat = 0; repeat < 4; ++repeat) {
    std::vector<void*> blocks;
    for (const std::size_t bytes : step) blocks.push_back(cache.allocate(bytes));
    for (void* block : blocks) cache.deallocate(block);
    if (repeat == 0) after_first = books.allocations;
  }
  EXPECT_EQ(after_first, step.size());
  EXPECT_EQ(books.allocations, after_first);
}

TEST(CachingAllocator, ARefusalEmptiesTheCacheAndRetriesOnce) {
  FakeDriverBooks books;
  books.capacity = 8 << 20;
  FakeDriver driver(books);
  CachingAllocator cache(driver);
  cache.deallocate(cache.allocate(6 << 20));  // 6 MiB cached
  void* big = cache.allocate(4 << 20);        // needs the cached 6 MiB back first
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(books.refusals, 1u);
  EXPECT_EQ(books.releases, 1u);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_EQ(cache.allocate(6 << 20), nullptr) << "refused twice: reported";
  EXPECT_EQ(books.refusals, 2u) << "no retry without a cache to empty";
  cache.deallocate(big);
}

TEST(CachingAllocator, DestructionReturnsTheCachedBlocksAndLeavesLiveOnes) {
  FakeDriverBooks books;
  FakeDriver driver(books);
  void* kept = nullptr;
  {
    CachingAllocator cache(driver);
    kept = cache.allocate(100);
    cache.deallocate(cache.allocate(5 << 20));
    cache.deallocate(cache.allocate(700));
  }
  EXPECT_EQ(books.releases, 2u);
  EXPECT_EQ(books.blocks, std::set<void*>{kept});
  driver.release(kept);
}

// The tracking allocator over the stand-in driver: the books are exact requested bytes by
// category, reserved covers them, and the driver is called only for new size classes.
TEST(TrackingAllocatorWithCache, CountsRequestedBytesAndReservesBlocks) {
  FakeDriverBooks books;
  TrackingAllocator allocator(Device::cuda(0), std::make_unique<FakeDriver>(books));
  void* w = allocator.allocate(60, MemoryCategory::parameters);
  void* a = allocator.allocate(3 << 20, MemoryCategory::activations);
  MemoryStats s = allocator.stats();
  EXPECT_EQ(s.live_of(MemoryCategory::parameters), 60u);
  EXPECT_EQ(s.live_of(MemoryCategory::activations), std::size_t{3} << 20);
  EXPECT_EQ(s.live_total, 60u + (3 << 20));
  EXPECT_EQ(s.reserved_total, 512u + (4 << 20));
  EXPECT_GE(s.reserved_total, s.live_total);
  EXPECT_EQ(s.driver_allocations, 2u);
  allocator.deallocate(a, 3 << 20, MemoryCategory::activations);
  s = allocator.stats();
  EXPECT_EQ(s.live_total, 60u);
  EXPECT_EQ(s.peak_total, 60u + (3 << 20));
  EXPECT_EQ(s.reserved_total, 512u + (4 << 20)) << "the freed block stays cached";
  // Another category, same size class: the cached block, no driver call.
  void* g = allocator.allocate((3 << 20) + 1, MemoryCategory::gradients);
  s = allocator.stats();
  EXPECT_EQ(s.driver_allocations, 2u);
  EXPECT_EQ(s.live_of(MemoryCategory::gradients), (std::size_t{3} << 20) + 1);
  EXPECT_EQ(s.live_of(MemoryCategory::activations), 0u);
  allocator.deallocate(g, (3 << 20) + 1, MemoryCategory::gradients);
  allocator.empty_cache();
  s = allocator.stats();
  EXPECT_EQ(s.reserved_total, 512u);
  EXPECT_EQ(s.reserved_peak, 512u + (4 << 20));
  EXPECT_EQ(books.held, 512u);
  EXPECT_NE(allocator.report().find("reserved"), std::string::npos);
  allocator.deallocate(w, 60, MemoryCategory::parameters);
}

TEST(TrackingAllocatorWithCache, TheCapCountsRequestedBytesAndThrowsTheSameError) {
  FakeDriverBooks books;
  TrackingAllocator allocator(Device::cuda(0), std::make_unique<FakeDriver>(books));
  allocator.set_cap(1000);
  void* a = allocator.allocate(600, MemoryCategory::activations);  // reserves 1024 > cap: fine
  try {
    allocator.allocate(401, MemoryCategory::workspace);
    ADD_FAILURE() << "the cap let 1001 bytes through";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 401u);
    EXPECT_EQ(e.category(), MemoryCategory::workspace);
    EXPECT_NE(std::string(e.what()).find("capped at"), std::string::npos) << e.what();
  }
  void* b = allocator.allocate(400, MemoryCategory::workspace);  // exactly the cap
  EXPECT_EQ(allocator.stats().live_total, 1000u);
  allocator.deallocate(b, 400, MemoryCategory::workspace);
  allocator.deallocate(a, 600, MemoryCategory::activations);
}

TEST(TrackingAllocatorWithCache, ADriverRefusalIsAnOutOfMemoryErrorAfterEmptyingTheCache) {
  FakeDriverBooks books;
  books.capacity = 8 << 20;
  TrackingAllocator allocator(Device::cuda(0), std::make_unique<FakeDriver>(books));
  void* a = allocator.allocate(5 << 20, MemoryCategory::activations);  // 6 MiB block
  allocator.deallocate(allocator.allocate(100, MemoryCategory::workspace), 100,
                       MemoryCategory::workspace);
  try {
    allocator.allocate(3 << 20, MemoryCategory::checkpoints);
    ADD_FAILURE() << "the fake driver has 2 MiB left, 4 MiB were granted";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.requested(), std::size_t{3} << 20);
    EXPECT_NE(message.find("the device refused"), std::string::npos) << message;
    EXPECT_NE(message.find("cache was emptied"), std::string::npos) << message;
    EXPECT_NE(message.find("fake driver"), std::string::npos) << message;
  }
  EXPECT_EQ(books.refusals, 2u) << "one retry";
  EXPECT_EQ(books.releases, 1u) << "the cached 512-byte block went back before the retry";
  const MemoryStats s = allocator.stats();
  EXPECT_EQ(s.live_total, std::size_t{5} << 20) << "a refused request changes no books";
  EXPECT_EQ(s.reserved_total, std::size_t{6} << 20);
  allocator.deallocate(a, 5 << 20, MemoryCategory::activations);
}

TEST(TrackingAllocatorOnCpu, ReservesTheAlignedSizeAndCountsAllocations) {
  TrackingAllocator allocator(Device::cpu());
  void* a = allocator.allocate(65, MemoryCategory::workspace);
  const MemoryStats s = allocator.stats();
  EXPECT_EQ(s.live_total, 65u);
  EXPECT_EQ(s.reserved_total, 128u);
  EXPECT_EQ(s.driver_allocations, 1u);
  allocator.deallocate(a, 65, MemoryCategory::workspace);
  EXPECT_EQ(allocator.stats().reserved_total, 0u);
}

// The real driver: a second identical round of tensors reuses the cached blocks.
TEST(CachingAllocatorCuda, ASecondRoundOfTensorsMakesNoDriverAllocation) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  TrackingAllocator& allocator = allocator_for(device);
  const auto round = [&] {
    const Tensor a({1000, 1000}, DType::f32, device, MemoryCategory::activations);
    const Tensor b({333}, DType::f16, device, MemoryCategory::workspace);
    const Tensor c({3, 1 << 20}, DType::f16, device, MemoryCategory::gradients);
  };
  round();
  const MemoryStats before = allocator.stats();
  round();
  const MemoryStats after = allocator.stats();
  EXPECT_EQ(after.driver_allocations, before.driver_allocations);
  EXPECT_EQ(after.live_total, before.live_total);
  EXPECT_GE(after.reserved_total, after.live_total);
  allocator.empty_cache();
  EXPECT_LT(allocator.stats().reserved_total, before.reserved_total);
}

}  // namespace
}  // namespace bigbatch

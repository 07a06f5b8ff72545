// The tracking allocator: exact bytes by category, peaks, the cap and its message.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "common/format.hpp"
#include "common/memory.hpp"
#include "common/tensor.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

TEST_P(DeviceTest, AllocatorCountsExactBytesByCategory) {
  TrackingAllocator& allocator = allocator_for(device());
  const MemoryStats before = allocator.stats();
  allocator.reset_peak();
  {
    Tensor weights({3, 5}, DType::f32, device(), MemoryCategory::parameters);     // 60 B
    Tensor grads({3, 5}, DType::f32, device(), MemoryCategory::gradients);        // 60 B
    Tensor half({7}, DType::f16, device(), MemoryCategory::activations);          // 14 B
    const MemoryStats during = allocator.stats();
    EXPECT_EQ(during.live_of(MemoryCategory::parameters) - before.live_of(MemoryCategory::parameters), 60u);
    EXPECT_EQ(during.live_of(MemoryCategory::gradients) - before.live_of(MemoryCategory::gradients), 60u);
    EXPECT_EQ(during.live_of(MemoryCategory::activations) - before.live_of(MemoryCategory::activations), 14u);
    EXPECT_EQ(during.live_total - before.live_total, 134u);
    {
      Tensor scratch({100}, DType::f32, device(), MemoryCategory::workspace);  // 400 B
      EXPECT_EQ(allocator.stats().live_total - before.live_total, 534u);
    }
    const MemoryStats after_scratch = allocator.stats();
    EXPECT_EQ(after_scratch.live_total - before.live_total, 134u);
    EXPECT_EQ(after_scratch.peak_total - before.live_total, 534u);
    EXPECT_EQ(after_scratch.at_peak_of(MemoryCategory::workspace) -
                  before.live_of(MemoryCategory::workspace), 400u);
    EXPECT_EQ(after_scratch.at_peak_of(MemoryCategory::parameters) -
                  before.live_of(MemoryCategory::parameters), 60u);
  }
  EXPECT_EQ(allocator.stats().live_total, before.live_total);
}

TEST(HostData, IsCountedInItsOwnRowOutsideTheTotalsAndTheCap) {
  // A data set held by the host: counted, but neither in the device totals nor the cap
  // (a GPU run keeps it in host memory), so a cap means the device's bytes alone.
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const MemoryStats before = allocator.stats();
  allocator.reset_peak();
  ScopedMemoryCap cap(Device::cpu(), before.live_total + 100);
  Tensor data_set({1000}, DType::f32, Device::cpu(), MemoryCategory::host_data);  // 4000 B
  Tensor batch({25}, DType::f32, Device::cpu(), MemoryCategory::data);            // 100 B fit
  const MemoryStats during = allocator.stats();
  EXPECT_EQ(during.live_of(MemoryCategory::host_data) - before.live_of(MemoryCategory::host_data),
            4000u);
  EXPECT_EQ(during.live_total - before.live_total, 100u);
  EXPECT_EQ(during.peak_total - before.live_total, 100u);
  EXPECT_EQ(during.at_peak_of(MemoryCategory::data) - before.live_of(MemoryCategory::data), 100u);
  EXPECT_THROW(Tensor({1}, DType::f16, Device::cpu(), MemoryCategory::data), OutOfMemoryError)
      << "the cap must hold for device categories";
  const std::string report = allocator.report();
  EXPECT_NE(report.find("host_data"), std::string::npos) << report;
  EXPECT_NE(report.find("not in the total"), std::string::npos) << report;
}

TEST(HostMemory, TheCpuRefusesWhatTheMachineCannotHoldBeforeTakingAnyOfIt) {
  // The machine's memory bounds the CPU as a GPU's own memory bounds the GPU: a request
  // past what is left (host data counted: it is in the same memory) throws OutOfMemoryError
  // naming the machine's size. Refused before a byte is taken, since the kernel lends such
  // memory on credit and kills the process when it is touched. This one would fit if the
  // data set's 4000 bytes did not count.
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const std::size_t machine = host_memory_bytes();
  Tensor data_set({1000}, DType::f32, Device::cpu(), MemoryCategory::host_data);
  const MemoryStats before = allocator.stats();
  ASSERT_GT(machine, before.live_total + 4000);
  const std::size_t asked = machine - before.live_total - 10;
  try {
    allocator.allocate(asked, MemoryCategory::activations);
    FAIL() << "an allocation past the machine's " << format_bytes(machine) << " was granted";
  } catch (const OutOfMemoryError& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.requested(), asked);
    EXPECT_EQ(error.category(), MemoryCategory::activations);
    EXPECT_NE(message.find("this machine has " + format_bytes(machine) + " of memory"),
              std::string::npos) << message;
    EXPECT_NE(message.find("the data sets' " + format_bytes(4000)), std::string::npos)
        << message;
  }
  EXPECT_EQ(allocator.stats().live_total, before.live_total) << "a refusal changed the books";
  EXPECT_THROW(allocator.allocate(std::numeric_limits<std::size_t>::max(),
                                  MemoryCategory::parameters),
               OutOfMemoryError);
  Tensor fits({10}, DType::f32, Device::cpu(), MemoryCategory::activations);
  EXPECT_EQ(allocator.stats().live_total, before.live_total + 40);
}

TEST_P(DeviceTest, ViewsShareStorageAndAllocateNothing) {
  TrackingAllocator& allocator = allocator_for(device());
  Tensor batch = Tensor::zeros({10, 4}, DType::f32, device(), MemoryCategory::data);
  const std::size_t live = allocator.stats().live_total;
  const std::size_t count = allocator.stats().allocation_count;
  Tensor micro = batch.rows(3, 7);
  EXPECT_EQ(micro.shape(), (Shape{4, 4}));
  EXPECT_EQ(allocator.stats().live_total, live);
  EXPECT_EQ(allocator.stats().allocation_count, count);
  fill(micro, 2.0);
  const auto values = batch.to_vector<float>();
  for (int i = 0; i < 40; ++i) EXPECT_EQ(values[i], (i >= 12 && i < 28) ? 2.0f : 0.0f) << i;
  EXPECT_THROW(batch.rows(5, 11), std::invalid_argument);
  EXPECT_THROW(batch.reshaped({3, 13}), std::invalid_argument);
  EXPECT_EQ(batch.reshaped({40}).numel(), 40);
}

TEST_P(DeviceTest, CapThrowsWithAClearMessage) {
  TrackingAllocator& allocator = allocator_for(device());
  const std::size_t live = allocator.stats().live_total;
  ScopedMemoryCap cap(device(), live + 1000);
  Tensor weights({100}, DType::f32, device(), MemoryCategory::parameters);  // 400 B fits
  Tensor grads({150}, DType::f32, device(), MemoryCategory::gradients);     // 600 B: exactly full
  try {
    Tensor one_more({1}, DType::f16, device(), MemoryCategory::activations);
    FAIL() << "allocation past the cap succeeded";
  } catch (const OutOfMemoryError& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.requested(), 2u);
    EXPECT_EQ(error.category(), MemoryCategory::activations);
    EXPECT_NE(message.find("cannot allocate 2 B"), std::string::npos) << message;
    EXPECT_NE(message.find("activations"), std::string::npos) << message;
    EXPECT_NE(message.find("capped at " + format_bytes(live + 1000)), std::string::npos) << message;
    EXPECT_NE(message.find("parameters"), std::string::npos) << message;
    EXPECT_NE(message.find("gradients"), std::string::npos) << message;
  }
  EXPECT_EQ(allocator.stats().live_total, live + 1000) << "a refused request changed the books";
}

TEST_P(DeviceTest, ScopedCapRestoresThePreviousCap) {
  TrackingAllocator& allocator = allocator_for(device());
  EXPECT_FALSE(allocator.cap().has_value());
  {
    ScopedMemoryCap outer(device(), 1u << 30);
    {
      ScopedMemoryCap inner(device(), 1u << 20);
      EXPECT_EQ(allocator.cap(), std::optional<std::size_t>(1u << 20));
    }
    EXPECT_EQ(allocator.cap(), std::optional<std::size_t>(1u << 30));
  }
  EXPECT_FALSE(allocator.cap().has_value());
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

TEST(Format, BytesForPeople) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(std::size_t{2} << 30), "2.00 GiB");
}

TEST(Format, BytesFromPeople) {
  EXPECT_EQ(parse_bytes("1024"), 1024u);
  EXPECT_EQ(parse_bytes("2GiB"), std::size_t{2} << 30);
  EXPECT_EQ(parse_bytes("1.5 KiB"), 1536u);
  EXPECT_EQ(parse_bytes("300MB"), 300000000u);
  EXPECT_EQ(parse_bytes("64kib"), 65536u);
  EXPECT_THROW(parse_bytes("two gigs"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("-1GiB"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("1.3B"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("5 parsecs"), std::invalid_argument);
}

TEST(DeviceName, ParsesAndRejects) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:1"), Device::cuda(1));
  EXPECT_THROW(parse_device("gpu"), std::invalid_argument);
  EXPECT_THROW(parse_device("cuda:"), std::invalid_argument);
}

}  // namespace
}  // namespace bigbatch

namespace bigbatch {
namespace {

TEST(TensorShape, RefusesAShapeWhoseElementCountOverflows) {
  EXPECT_THROW(shape_numel({std::int64_t{1} << 32, std::int64_t{1} << 32}), std::invalid_argument);
  EXPECT_THROW(Tensor({std::int64_t{1} << 40, std::int64_t{1} << 40}, DType::f32),
               std::invalid_argument);
  EXPECT_EQ(shape_numel({0, std::int64_t{1} << 62, 7}), 0);
}

TEST(TensorCopy, OverlappingViewsOfOneStorageCopyAsIfThroughABuffer) {
  const Tensor t = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {6, 1});
  t.rows(1, 6).copy_from(t.rows(0, 5));  // shift down by one row
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace bigbatch

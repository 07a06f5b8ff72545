// fill: every element written, the value rounded to the dtype; on both backends.
#include <gtest/gtest.h>

#include "kernels/fill.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

class Fill : public DeviceTest {};

TEST_P(Fill, WritesEveryElementOfEveryDtype) {
  for (const std::int64_t n : {1, 7, 1025, 300000}) {
    for (const DType dtype : {DType::f32, DType::f16, DType::f64, DType::i32}) {
      if (dtype == DType::f64 && device().is_cuda()) continue;  // f64 is CPU-only
      Tensor t({n}, dtype, device());
      testing::poison(t);
      fill(t, 3.0);
      const auto values = testing::to_doubles(t);
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(values[i], 3.0) << dtype_name(dtype) << " " << i;
    }
  }
}

TEST_P(Fill, RoundsToTheDtype) {
  Tensor h({1}, DType::f16, device());
  fill(h, 1.0 + 0x1p-11);  // halfway between 1 and 1 + 2^-10: ties to even gives 1
  EXPECT_EQ(testing::to_doubles(h)[0], 1.0);
  fill(h, 70000.0);  // past the largest half (65504): overflows to infinity
  EXPECT_TRUE(std::isinf(testing::to_doubles(h)[0]));
  fill(h, 0x1p-24);  // the smallest subnormal half
  EXPECT_EQ(testing::to_doubles(h)[0], 0x1p-24);
}

INSTANTIATE_TEST_SUITE_P(Backends, Fill, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace bigbatch

// test_lr_schedule.cpp: warm-up, cosine decay and the batch-size scaling rules against
// values computed by hand from the formulas of nn/lr_schedule.hpp.
#include <gtest/gtest.h>

#include <stdexcept>

#include "nn/lr_schedule.hpp"

namespace bigbatch {
namespace {

using nn::LrSchedule;
using nn::LrScheduleKind;
using nn::LrScale;

// The irrational values are written to 16 digits; 1e-15 absolute is a few ulps of 0.1.
constexpr double kTolerance = 1e-15;

TEST(LrSchedule, CosineWithWarmUpMatchesHandComputedValues) {
  // lr = 0.1, T = 10 steps, W = 4 warm-up steps.
  // Warm-up, step i < 4: 0.1 (i + 1) / 4 = 0.025, 0.05, 0.075, 0.1.
  // Cosine, i >= 4: T_cur = i - 4, T_max = 10 - 4 = 6, lr (1 + cos(pi T_cur / 6)) / 2:
  //   i = 4: cos 0 = 1                               -> 0.1
  //   i = 5: cos(pi/6) = sqrt(3)/2 = 0.8660254037844386 -> 0.1 x 1.8660254037844386 / 2
  //                                                  =  0.09330127018922193
  //   i = 6: cos(pi/3) = 1/2                         -> 0.075
  //   i = 7: cos(pi/2) = 0                           -> 0.05
  //   i = 8: cos(2pi/3) = -1/2                       -> 0.025
  //   i = 9: cos(5pi/6) = -0.8660254037844386        -> 0.1 x 0.1339745962155614 / 2
  //                                                  =  0.006698729810778070
  const LrSchedule schedule{0.1, 10, 4, LrScheduleKind::cosine};
  const double expected[10] = {0.025, 0.05, 0.075, 0.1, 0.1, 0.09330127018922193,
                               0.075, 0.05, 0.025, 0.006698729810778070};
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(nn::lr_at(schedule, i), expected[i], kTolerance) << "step " << i;
  }
}

TEST(LrSchedule, CosineWithoutWarmUpStartsAtTheBaseRate) {
  // lr = 1, T = 4, W = 0: (1 + cos(pi i / 4)) / 2 with cos(pi/4) = 0.7071067811865476:
  //   1, 1.7071067811865476 / 2 = 0.8535533905932738, 0.5, 0.2928932188134524 / 2 =
  //   0.1464466094067262.
  const LrSchedule schedule{1.0, 4, 0, LrScheduleKind::cosine};
  const double expected[4] = {1.0, 0.8535533905932738, 0.5, 0.1464466094067262};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(nn::lr_at(schedule, i), expected[i], kTolerance) << "step " << i;
  }
}

TEST(LrSchedule, ConstantWithWarmUpRampsLinearlyThenHolds) {
  // lr = 0.2, W = 5: 0.2 (i + 1) / 5 = 0.04, 0.08, 0.12, 0.16, 0.2, then 0.2.
  const LrSchedule schedule{0.2, 8, 5, LrScheduleKind::constant};
  const double expected[8] = {0.04, 0.08, 0.12, 0.16, 0.2, 0.2, 0.2, 0.2};
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(nn::lr_at(schedule, i), expected[i], kTolerance) << "step " << i;
  }
}

TEST(LrSchedule, ConstantWithoutWarmUpIsTheBaseRateItself) {
  // Bit for bit, so that a run without a schedule trains exactly as before.
  const double base = 1e-3;
  const LrSchedule schedule{base, 100, 0, LrScheduleKind::constant};
  for (int i : {0, 1, 50, 99, 1000}) EXPECT_EQ(nn::lr_at(schedule, i), base) << "step " << i;
}

TEST(LrSchedule, RefusesNegativeStepsAndWarmUp) {
  EXPECT_THROW(nn::lr_at({0.1, 10, 0, LrScheduleKind::constant}, -1), std::invalid_argument);
  EXPECT_THROW(nn::lr_at({0.1, 10, -1, LrScheduleKind::constant}, 0), std::invalid_argument);
  EXPECT_THROW(nn::lr_at({0.1, 0, 0, LrScheduleKind::cosine}, 0), std::invalid_argument);
}

TEST(LrScaling, LinearAndSquareRootRulesAgainstAReferenceBatch) {
  // lr 1e-3 tuned at batch 256. Batch 4096 is 16 x 256: linear 16e-3, sqrt 4e-3.
  // Batch 64 is 256 / 4: linear 0.25e-3, sqrt 0.5e-3.
  EXPECT_DOUBLE_EQ(nn::scaled_learning_rate(1e-3, LrScale::none, 4096, 256), 1e-3);
  EXPECT_DOUBLE_EQ(nn::scaled_learning_rate(1e-3, LrScale::linear, 4096, 256), 0.016);
  EXPECT_DOUBLE_EQ(nn::scaled_learning_rate(1e-3, LrScale::sqrt, 4096, 256), 0.004);
  EXPECT_DOUBLE_EQ(nn::scaled_learning_rate(1e-3, LrScale::linear, 64, 256), 0.00025);
  EXPECT_DOUBLE_EQ(nn::scaled_learning_rate(1e-3, LrScale::sqrt, 64, 256), 0.0005);
  EXPECT_THROW(nn::scaled_learning_rate(1e-3, LrScale::linear, 0, 256), std::invalid_argument);
  EXPECT_THROW(nn::scaled_learning_rate(1e-3, LrScale::linear, 64, 0), std::invalid_argument);
}

}  // namespace
}  // namespace bigbatch

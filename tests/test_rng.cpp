// Counter-based RNG: known-answer vectors and the property dropout relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "common/rng.hpp"

namespace bigbatch {
namespace {

// Known-answer vectors for Philox4x32-10 published with the reference implementation
// (Random123, kat_vectors): counter, key -> output.
TEST(Philox, KnownAnswers) {
  const auto zero = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const auto ones = philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                                  0xffffffffu, 0xffffffffu);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  const auto pi = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                                0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Philox, ValueDependsOnlyOnSeedStreamAndIndex) {
  // Drawn in any order, the same (seed, stream, index) gives the same value.
  const float forward = random_uniform(7, 3, 123456789012ull);
  for (std::uint64_t i = 0; i < 1000; ++i) random_uniform(7, 3, i);
  EXPECT_EQ(random_uniform(7, 3, 123456789012ull), forward);
  // Each coordinate matters, the high halves of 64-bit ones included.
  std::set<std::uint32_t> distinct = {random_bits(7, 3, 5), random_bits(8, 3, 5),
                                      random_bits(7, 4, 5), random_bits(7, 3, 6),
                                      random_bits(7, 3, 5 + (1ull << 32)),
                                      random_bits(7 + (1ull << 32), 3, 5),
                                      random_bits(7, 3 + (1ull << 32), 5)};
  EXPECT_EQ(distinct.size(), 7u);
}

TEST(Philox, UniformIsOnTheHalfOpenUnitIntervalWithTheRightMean) {
  constexpr int n = 1 << 20;
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const float u = random_uniform(42, 0, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, std::ldexp(std::floor(std::ldexp(u, 24)), -24)) << "not a multiple of 2^-24";
    sum += u;
  }
  // The mean of n uniforms has standard deviation sqrt(1/12/n) = 2.8e-4; 6 sigma.
  EXPECT_NEAR(sum / n, 0.5, 6 * std::sqrt(1.0 / 12 / n));
}

}  // namespace
}  // namespace bigbatch

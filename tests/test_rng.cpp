// Counter-based RNG: known-answer vectors, the four-words-per-group contract, and the
// properties dropout relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

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

// The contract of rng.hpp, written out with philox4x32_10 itself: index 4q + w takes
// word w of the evaluation on counter (q_lo, q_hi, stream_lo, stream_hi) under key
// (seed_lo, seed_hi). The groups q = 2^32 - 1 and 2^32 are where q's high word steps
// (indices 2^34 - 4 to 2^34 + 3); the high halves of seed and stream matter too.
TEST(Philox, RandomBitsAreTheWordsOfTheirGroup) {
  const auto lo = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };
  const auto hi = [](std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); };
  const std::uint64_t seeds[] = {0, 42, 0x1234567890abcdefULL};
  const std::uint64_t streams[] = {0, 7, 0xfedcba0987654321ULL};
  const std::uint64_t groups[] = {
      0, 1, 12345, (1ull << 32) - 1, 1ull << 32, (1ull << 32) + 1, (1ull << 62) - 1};
  for (const std::uint64_t seed : seeds) {
    for (const std::uint64_t stream : streams) {
      for (const std::uint64_t q : groups) {
        const Philox4x32 want =
            philox4x32_10(lo(q), hi(q), lo(stream), hi(stream), lo(seed), hi(seed));
        const Philox4x32 group = random_group(seed, stream, q);
        for (std::uint64_t w = 0; w < 4; ++w) {
          EXPECT_EQ(random_bits(seed, stream, 4 * q + w), want.v[w])
              << "seed " << seed << " stream " << stream << " group " << q << " word " << w;
          EXPECT_EQ(group.v[w], want.v[w]);
          EXPECT_EQ(random_uniform(seed, stream, 4 * q + w),
                    static_cast<float>(want.v[w] >> 8) * 0x1p-24f);
        }
      }
    }
  }
}

TEST(Philox, ValueDependsOnlyOnSeedStreamAndIndex) {
  // Drawn in any order, the same (seed, stream, index) gives the same value.
  const float forward = random_uniform(7, 3, 123456789012ull);
  for (std::uint64_t i = 0; i < 1000; ++i) random_uniform(7, 3, i);
  EXPECT_EQ(random_uniform(7, 3, 123456789012ull), forward);
  // Walked backwards from mid-group, a run draws what a run from 0 upwards draws.
  std::vector<std::uint32_t> ascending(42);
  for (std::uint64_t i = 0; i < ascending.size(); ++i) ascending[i] = random_bits(7, 3, i);
  for (std::uint64_t i = ascending.size(); i-- > 0;) {
    EXPECT_EQ(random_bits(7, 3, i), ascending[i]) << i;
  }
  // Each coordinate matters, the high halves of 64-bit ones included, and so does the
  // word within a group (indices 5 and 6 share a group).
  std::set<std::uint32_t> distinct = {random_bits(7, 3, 5), random_bits(8, 3, 5),
                                      random_bits(7, 4, 5), random_bits(7, 3, 6),
                                      random_bits(7, 3, 5 + (1ull << 34)),
                                      random_bits(7 + (1ull << 32), 3, 5),
                                      random_bits(7, 3 + (1ull << 32), 5)};
  EXPECT_EQ(distinct.size(), 7u);
}

// Each of the four words of a group is uniform on its own: the mean of n/4 uniforms has
// standard deviation sqrt(1/12/(n/4)); a failure beyond 6 sigma (probability below
// 2e-9 per mean for a true uniform; Philox passes TestU01's BigCrush) is a bug in how
// the words are used, e.g. a word never drawn or drawn twice.
TEST(Philox, UniformIsOnTheHalfOpenUnitIntervalWithTheRightMean) {
  constexpr int n = 1 << 20;
  double sum = 0;
  double word_sum[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    const float u = random_uniform(42, 0, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, std::ldexp(std::floor(std::ldexp(u, 24)), -24)) << "not a multiple of 2^-24";
    sum += u;
    word_sum[i % 4] += u;
  }
  // The mean of n uniforms has standard deviation sqrt(1/12/n) = 2.8e-4; 6 sigma.
  EXPECT_NEAR(sum / n, 0.5, 6 * std::sqrt(1.0 / 12 / n));
  for (int w = 0; w < 4; ++w) {
    EXPECT_NEAR(word_sum[w] / (n / 4), 0.5, 6 * std::sqrt(1.0 / 12 / (n / 4))) << "word " << w;
  }
}

// Neighbouring indices of one group come from one evaluation; they must still look
// independent. For independent uniforms the sample correlation of n/4 pairs has
// standard deviation 1/sqrt(n/4); 6 sigma.
TEST(Philox, WordsOfAGroupAreUncorrelated) {
  constexpr int groups = 1 << 18;
  for (int w = 0; w < 3; ++w) {
    double sum_a = 0, sum_b = 0, sum_ab = 0, sum_aa = 0, sum_bb = 0;
    for (std::uint64_t q = 0; q < groups; ++q) {
      const double a = random_uniform(9, 1, 4 * q + w), b = random_uniform(9, 1, 4 * q + w + 1);
      sum_a += a;
      sum_b += b;
      sum_ab += a * b;
      sum_aa += a * a;
      sum_bb += b * b;
    }
    const double covariance = sum_ab / groups - (sum_a / groups) * (sum_b / groups);
    const double var_a = sum_aa / groups - (sum_a / groups) * (sum_a / groups);
    const double var_b = sum_bb / groups - (sum_b / groups) * (sum_b / groups);
    EXPECT_NEAR(covariance / std::sqrt(var_a * var_b), 0.0, 6 / std::sqrt(double{groups}))
        << "words " << w << " and " << w + 1;
  }
}

}  // namespace
}  // namespace bigbatch

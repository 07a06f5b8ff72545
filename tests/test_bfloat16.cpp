// test_bfloat16.cpp: common/bfloat16.hpp's conversions against references of their own.
//   - bf16 -> float for all 2^16 values, against a decoding of sign, exponent and
//     significand with std::ldexp; and back to the same bits (a NaN to a quiet NaN of
//     the same sign);
//   - float -> bf16 against the IEEE definition, computed in double: the nearer of the two
//     bf16 values around x (2^128 standing for the one past the largest finite), ties to
//     the even one; for the edge cases (ties both ways, the largest finite, subnormals,
//     signed zeros, NaNs whose payload lies only in the dropped half) and 2^20 random bit
//     patterns.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/bfloat16.hpp"
#include "common/rng.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/optimizer.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

bool is_nan_bits(std::uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu) != 0; }

/// The value of a bf16 bit pattern, decoded field by field.
double decoded(std::uint16_t bits) {
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> 7) & 0xff;
  const int significand = bits & 0x7f;
  if (exponent == 0xff) {
    return significand == 0 ? sign * std::numeric_limits<double>::infinity()
                            : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(significand / 128.0, -126);  // subnormal
  return sign * std::ldexp(1.0 + significand / 128.0, exponent - 127);
}

/// IEEE round to nearest even of a finite or infinite float to bf16, in double.
std::uint16_t reference_bits(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  const auto toward_zero = static_cast<std::uint16_t>(u >> 16);  // |value| <= |x|
  if (std::isinf(x) || (u & 0xffffu) == 0) return toward_zero;
  const auto away = static_cast<std::uint16_t>(toward_zero + 1);  // the next magnitude up
  const double below = decoded(toward_zero);
  const double above = (away & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), x)
                                                    : decoded(away);
  const double to_below = std::abs(static_cast<double>(x) - below);
  const double to_above = std::abs(above - static_cast<double>(x));
  if (to_below < to_above) return toward_zero;
  if (to_above < to_below) return away;
  return (toward_zero & 1u) == 0 ? toward_zero : away;  // a tie: the even one
}

float float_of(std::uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(Bfloat16, EveryValueWidensExactlyAndNarrowsBackToItself) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const bf16 value{static_cast<std::uint16_t>(b)};
    const float wide = to_float(value);
    if (is_nan_bits(value.bits)) {
      ASSERT_TRUE(std::isnan(wide)) << std::hex << b;
      const bf16 back = to_bf16(wide);
      ASSERT_TRUE(is_nan_bits(back.bits)) << std::hex << b;
      ASSERT_EQ(back.bits & 0x8000u, b & 0x8000u) << "the sign of NaN " << std::hex << b;
      ASSERT_NE(back.bits & 0x0040u, 0u) << "a quiet NaN";
      continue;
    }
    ASSERT_EQ(static_cast<double>(wide), decoded(value.bits)) << std::hex << b;
    ASSERT_EQ(std::signbit(wide), (b & 0x8000u) != 0) << std::hex << b;  // -0 too
    ASSERT_EQ(to_bf16(wide), value) << std::hex << b;
  }
}

TEST(Bfloat16, NarrowingRoundsToNearestEvenAtTheEdges) {
  const std::vector<std::uint32_t> edges = {
      0x3f808000u,  // 1 + 2^-8, a tie: the lower neighbour's last bit is even, keep it
      0x3f818000u,  // a tie above an odd neighbour: round up to the even one
      0x3f807fffu, 0x3f808001u,  // just below and just above a tie
      0x7f7f7fffu,  // below the half-way point above the largest finite: the largest
      0x7f7f8000u,  // exactly half-way (an odd neighbour): rounds to infinity
      0x7f7fffffu,  // FLT_MAX: infinity
      0x00000001u,  // the smallest subnormal float: +0
      0x00008000u,  // a tie at the bottom of the subnormals: to the even 0
      0x00018000u,  // a tie above the odd subnormal 0x0001: up to 0x0002
      0x007fffffu,  // the largest subnormal float: the smallest normal bf16
      0x80000000u, 0x80008000u,  // -0, and a tie that keeps -0
      0x7f800000u, 0xff800000u,  // the infinities
      0xbf818000u,  // a negative tie above an odd neighbour: away from zero, to even
  };
  for (const std::uint32_t bits : edges) {
    const float x = float_of(bits);
    EXPECT_EQ(to_bf16(x).bits, reference_bits(x)) << std::hex << bits;
  }
  EXPECT_EQ(to_bf16(float_of(0x7f7f8000u)).bits, 0x7f80u);
  EXPECT_EQ(to_bf16(float_of(0x00018000u)).bits, 0x0002u);
}

TEST(Bfloat16, ANanStaysANanWhereRoundingWouldCarryIntoTheExponent) {
  // NaNs whose payload lies only in the half that is dropped: rounding their bits would
  // give 0x7f80, an infinity.
  for (const std::uint32_t bits : {0x7f800001u, 0x7f807fffu, 0xff800001u, 0x7fffffffu,
                                   0x7fc00000u, 0xffc12345u}) {
    const bf16 narrow = to_bf16(float_of(bits));
    EXPECT_TRUE(is_nan_bits(narrow.bits)) << std::hex << bits << " -> " << narrow.bits;
    EXPECT_EQ(narrow.bits & 0x8000u, (bits >> 16) & 0x8000u) << "the sign";
  }
}

TEST(Bfloat16, NarrowingMatchesTheDefinitionOnRandomBitPatterns) {
  int nans = 0;
  for (std::uint64_t i = 0; i < (1u << 20); ++i) {
    const float x = float_of(random_bits(/*seed=*/16, /*stream=*/0, i));
    if (std::isnan(x)) {
      ++nans;
      ASSERT_TRUE(is_nan_bits(to_bf16(x).bits));
      continue;
    }
    ASSERT_EQ(to_bf16(x).bits, reference_bits(x)) << std::hex << std::bit_cast<std::uint32_t>(x);
  }
  EXPECT_GT(nans, 0);  // 1 in 256 of all bit patterns is a NaN
}

/// Floats at every rounding edge above, their neighbours, and random bit patterns (NaNs
/// included): what the kernels' conversions are checked on.
std::vector<float> conversion_probe() {
  std::vector<float> values;
  for (const std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,
                                   0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x00000001u,
                                   0x00008000u, 0x00018000u, 0x007fffffu, 0x80000000u,
                                   0x80008000u, 0x7f800000u, 0xff800000u, 0xbf818000u,
                                   0x7f800001u, 0x7f807fffu, 0xff800001u, 0x7fc00000u}) {
    values.push_back(float_of(bits));
  }
  for (std::uint64_t i = 0; i < 20000; ++i) values.push_back(float_of(random_bits(17, 0, i)));
  return values;
}

/// The bits `narrowed` must hold for `x`: the definition's, and a quiet NaN for a NaN.
::testing::AssertionResult narrowed_as_defined(float x, std::uint16_t narrowed) {
  if (std::isnan(x) ? is_nan_bits(narrowed) : narrowed == reference_bits(x)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << std::hex << std::bit_cast<std::uint32_t>(x)
                                       << " narrowed to " << narrowed;
}

// The kernels round where they store, in their own loops: the cast kernel at every vector
// instruction set and the optimizer's working copy on every path give the definition's
// bits. (The GEMM's store of a bf16 C: test_gemm.cpp, Bf16OutputRoundsOnce...)
TEST(Bfloat16, EveryKernelThatStoresBf16RoundsAsDefined) {
  const std::vector<float> values = conversion_probe();
  const auto n = static_cast<std::int64_t>(values.size());
  const Tensor source = Tensor::from_vector(values, {n});
  testing::expect_every_simd_level_agrees([&] {
    const Tensor narrow({n}, DType::bf16);
    cast(source, narrow);
    const auto bits = narrow.to_vector<bf16>();
    for (std::int64_t i = 0; i < n; ++i) EXPECT_TRUE(narrowed_as_defined(values[i], bits[i].bits));
    return std::vector<Tensor>{narrow};
  });
  for (const cpu::OptimizerPath path : cpu::optimizer_paths_supported()) {
    const cpu::ScopedOptimizerPath scoped(path);
    // lr 0: the master is unchanged, so the copy is the master's values rounded.
    const Tensor param = Tensor::from_vector(values, {n});
    const Tensor grad = Tensor::zeros({n}, DType::f32);
    const Tensor copy({n}, DType::bf16);
    sgd_step(param, grad, Tensor(), SgdOptions{.lr = 0.0}, 1, copy);
    const auto bits = copy.to_vector<bf16>();
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(narrowed_as_defined(values[i], bits[i].bits)) << cpu::optimizer_path_name(path);
    }
  }
}

}  // namespace
}  // namespace bigbatch

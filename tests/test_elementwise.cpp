// elementwise: cast (every fp16 edge case), scale, axpy, unscale_and_check_finite.
//
// These ops do one or two IEEE operations per element, so their results are defined to
// the bit, and the tests demand the bit. The float64 oracle computes each operation
// exactly in double and rounds it once to float: the product or sum of two floats
// rounded to double and then to float equals the float operation rounded directly,
// because double has more than 2*24+2 bits (Figueroa, "When is double rounding
// innocuous?", SIGNUM 1995). Rounding to binary16 has its own oracle (round_to_half,
// nearest-even on the binary16 grid computed in double).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "common/bfloat16.hpp"
#include "common/half.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/elementwise.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<std::int64_t> kOddSizes = {1, 7, 1025, (1 << 20) + 3};

/// x rounded to binary16 (to nearest even, overflow to inf, subnormals kept), in double.
double round_to_half(double x) {
  if (std::isnan(x)) return x;
  const double magnitude = std::fabs(x);
  if (magnitude >= 65520.0) return std::copysign(kInf, x);  // rounds past 65504
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  // binary16 has 10 fraction bits; subnormals share the spacing of [2^-14, 2^-13)
  const double spacing = std::ldexp(1.0, std::max(exponent - 1, -14) - 10);
  return std::copysign(std::nearbyint(magnitude / spacing) * spacing, x);  // ties to even
}

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

using testing::same_bits_or_both_nan;

/// Values across the whole f16 range and beyond: both signs, 2^-30 to 2^18, plus zeros.
std::vector<double> wide_range_values(std::int64_t n, std::uint64_t seed) {
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double mantissa = 1.0 + random_uniform(seed, 1, i);
    const int exponent = -30 + static_cast<int>(random_bits(seed, 2, i) % 49);
    const double sign = (random_bits(seed, 3, i) & 1) ? -1.0 : 1.0;
    values[static_cast<std::size_t>(i)] =
        i % 97 == 0 ? 0.0 : sign * static_cast<float>(std::ldexp(mantissa, exponent));
  }
  return values;
}

// ---- binary16 conversions of the CPU loops ------------------------------------------

// half_bits_to_float / float_to_half_bits must agree with GCC's _Float16, the project's
// definition of fp16 on the CPU: every half exactly, and for float -> half every float
// that is a half, every midpoint between neighbouring halves (the ties) and the floats
// just beside each of them (where the rounding direction flips), NaNs included.
// (Once, offline, all 2^32 floats were compared: no difference.)
TEST(HalfConversions, EveryHalfConvertsToFloatAsFloat16Does) {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float want = static_cast<float>(f16_from_bits(static_cast<std::uint16_t>(bits)));
    const float got = cpu::half_bits_to_float(static_cast<std::uint16_t>(bits));
    ASSERT_EQ(bits_of(got), bits_of(want)) << "half bits " << std::hex << bits;
  }
}

TEST(HalfConversions, FloatsAtAndAroundEveryRoundingBoundaryMatchFloat16) {
  const auto check = [](float x) {
    const std::uint16_t want = f16_bits(static_cast<f16>(x));
    ASSERT_EQ(cpu::float_to_half_bits(x), want) << "float bits " << std::hex << bits_of(x);
  };
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const double value = static_cast<double>(f16_from_bits(h));
    const double next = static_cast<double>(f16_from_bits(static_cast<std::uint16_t>(h + 1)));
    for (const double point : {value, (value + next) / 2}) {  // the half, the tie above it
      if (!std::isfinite(point)) continue;
      const float x = static_cast<float>(point);
      check(x);
      check(std::nextafter(x, -std::numeric_limits<float>::infinity()));
      check(std::nextafter(x, std::numeric_limits<float>::infinity()));
    }
  }
  for (std::uint64_t i = 0; i < (1u << 20); ++i) {  // and arbitrary bit patterns
    check(std::bit_cast<float>(random_bits(7, 0, i)));
  }
  check(std::numeric_limits<float>::infinity());
  check(-std::numeric_limits<float>::infinity());
  check(std::numeric_limits<float>::quiet_NaN());
  check(std::bit_cast<float>(0x7f800001u));  // a signalling NaN
  check(std::bit_cast<float>(0xffc12345u));  // a negative NaN with a payload
}

// ---- cast ----------------------------------------------------------------------------

class Cast : public DeviceTest {};

TEST_P(Cast, Float32ToFloat16EdgeCases) {
  struct Case {
    double in, want;
    const char* why;
  };
  const Case cases[] = {
      {65520.0, kInf, "the tie above 65504 rounds to even: past the largest half, inf"},
      {-65520.0, -kInf, "the same, negative"},
      {65519.0, 65504.0, "just below the tie: the largest half"},
      {65504.0, 65504.0, "the largest half is exact"},
      {1e10, kInf, "far past the range"},
      {0x1p-24, 0x1p-24, "the smallest subnormal is exact"},
      {3 * 0x1p-25, 0x1p-23, "halfway between 2^-24 and 2^-23: ties to even (2 * 2^-24), up"},
      {5 * 0x1p-25, 0x1p-23, "halfway between 2 and 3 * 2^-24: ties to even (2 * 2^-24), down"},
      {0x1p-14 - 0x1p-24, 0x1p-14 - 0x1p-24, "the largest subnormal is exact"},
      {0x1p-25, 0.0, "halfway between 0 and 2^-24: ties to even, zero"},
      {0x1p-26, 0.0, "below half the smallest subnormal: underflows to zero"},
      {-0x1p-26, -0.0, "underflow keeps the sign"},
      {1 + 0x1p-11, 1.0, "halfway between 1 and 1 + 2^-10: ties to even, 1"},
      {1 + 3 * 0x1p-11, 1 + 0x1p-9, "halfway between 1 + 2^-10 and 1 + 2^-9: ties to even"},
      {1 + 0x1p-11 + 0x1p-20, 1 + 0x1p-10, "just above the tie rounds up"},
      {-0.0, -0.0, "-0 stays -0"},
      {kInf, kInf, "inf stays inf"},
      {-kInf, -kInf, "-inf stays -inf"},
  };
  std::vector<double> inputs;
  for (const Case& c : cases) inputs.push_back(c.in);
  inputs.push_back(std::nan(""));
  const Tensor src = testing::make_tensor(inputs, {static_cast<std::int64_t>(inputs.size())},
                                          DType::f32, device());
  Tensor dst(src.shape(), DType::f16, device());
  testing::poison(dst);
  cast(src, dst);
  const auto got = testing::to_doubles(dst);
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    EXPECT_EQ(got[i], cases[i].want) << cases[i].in << ": " << cases[i].why;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(cases[i].want))
        << cases[i].in << ": " << cases[i].why;
  }
  EXPECT_TRUE(std::isnan(got.back())) << "NaN stays NaN";
}

TEST_P(Cast, Float32ToFloat16MatchesTheRoundingOracle) {
  for (const std::int64_t n : kOddSizes) {
    const auto values = wide_range_values(n, 11);
    const Tensor src = testing::make_tensor(values, {n}, DType::f32, device());
    Tensor dst({n}, DType::f16, device());
    testing::poison(dst);
    cast(src, dst);
    std::vector<double> want(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) want[i] = round_to_half(values[i]);
    ASSERT_TRUE(same_bits_or_both_nan(testing::to_doubles(dst), want)) << "n = " << n;
  }
}

TEST_P(Cast, Float16ToFloat32IsExact) {
  // every half, twice over so the size is odd-shaped: [2, 65536] plus one
  std::vector<f16> halves;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    halves.push_back(f16_from_bits(static_cast<std::uint16_t>(bits)));
  }
  halves.push_back(f16_from_bits(0x3c00));  // 1.0
  const auto n = static_cast<std::int64_t>(halves.size());
  const Tensor src = Tensor::from_vector(halves, {n}, device());
  Tensor dst({n}, DType::f32, device());
  testing::poison(dst);
  cast(src, dst);
  ASSERT_TRUE(same_bits_or_both_nan(testing::to_doubles(dst), testing::to_doubles(src)));
}

// Between the two 16-bit types a cast goes through float: exact from either, then one
// rounding to nearest even into the other (f16 -> bf16 drops 3 significand bits; bf16 ->
// f16 overflows past 65504 and goes subnormal below 2^-14). Every bit pattern of each, the
// rounding done here by the host conversions (common/half.hpp, common/bfloat16.hpp).
TEST_P(Cast, BetweenFloat16AndBfloat16GoesThroughFloat) {
  std::vector<f16> halves;
  std::vector<bf16> brains;
  std::vector<double> halves_as_bf16, brains_as_f16;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    halves.push_back(f16_from_bits(static_cast<std::uint16_t>(bits)));
    halves_as_bf16.push_back(to_float(to_bf16(static_cast<float>(halves.back()))));
    brains.push_back(bf16{static_cast<std::uint16_t>(bits)});
    brains_as_f16.push_back(static_cast<float>(static_cast<f16>(to_float(brains.back()))));
  }
  const auto n = static_cast<std::int64_t>(halves.size());
  const Tensor from_f16 = Tensor::from_vector(halves, {n}, device());
  Tensor to_bf16_tensor({n}, DType::bf16, device());
  testing::poison(to_bf16_tensor);
  cast(from_f16, to_bf16_tensor);
  EXPECT_TRUE(same_bits_or_both_nan(testing::to_doubles(to_bf16_tensor), halves_as_bf16));
  const Tensor from_bf16 = Tensor::from_vector(brains, {n}, device());
  Tensor to_f16_tensor({n}, DType::f16, device());
  testing::poison(to_f16_tensor);
  cast(from_bf16, to_f16_tensor);
  EXPECT_TRUE(same_bits_or_both_nan(testing::to_doubles(to_f16_tensor), brains_as_f16));
}

TEST_P(Cast, SameDtypeCopiesTheBits) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const std::int64_t n : kOddSizes) {
      const Tensor src = testing::make_tensor(wide_range_values(n, 5), {n}, dtype, device());
      Tensor dst({n}, dtype, device());
      testing::poison(dst);
      cast(src, dst);
      ASSERT_TRUE(testing::bitwise_equal(dst, src)) << dtype_name(dtype) << " n = " << n;
      cast(src, src);  // onto itself: nothing changes
      ASSERT_TRUE(testing::bitwise_equal(dst, src));
    }
  }
}

TEST(CastCuda, MatchesTheCpuBitForBit) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const std::int64_t n = (1 << 20) + 3;
  const Tensor src = testing::make_tensor(wide_range_values(n, 3), {n}, DType::f32, device);
  Tensor on_device({n}, DType::f16, device), on_cpu({n}, DType::f16);
  cast(src, on_device);
  cast(src.to(Device::cpu()), on_cpu);
  EXPECT_TRUE(testing::bitwise_equal(on_device, on_cpu));  // no NaN among these inputs
  Tensor back_device({n}, DType::f32, device), back_cpu({n}, DType::f32);
  cast(on_device, back_device);
  cast(on_cpu, back_cpu);
  EXPECT_TRUE(testing::bitwise_equal(back_device, back_cpu));
}

TEST_P(Cast, RejectsBadArguments) {
  const Tensor f32({4, 3}, DType::f32, device());
  EXPECT_THROW(cast(f32, Tensor({3, 4}, DType::f16, device())), std::invalid_argument);
  EXPECT_THROW(cast(f32, Tensor({4, 3}, DType::i32, device())), std::invalid_argument);
  EXPECT_THROW(cast(Tensor({4, 3}, DType::i32, device()), f32), std::invalid_argument);
  // a dst that overlaps src without being it
  const Tensor both({8}, DType::f32, device());
  EXPECT_THROW(cast(both.rows(0, 4), both.rows(2, 6).reshaped({4})), std::invalid_argument);
  if (device().is_cuda()) {
    EXPECT_THROW(cast(f32, Tensor({4, 3}, DType::f16)), std::invalid_argument);
  }
}

// ---- scale and axpy --------------------------------------------------------------------

class Scale : public DeviceTest {};

TEST_P(Scale, IsOneRoundedProduct) {
  const float s = 0.3f;  // not a power of two: every product rounds
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const std::int64_t n : kOddSizes) {
      const auto values = wide_range_values(n, 17);
      const Tensor x = testing::make_tensor(values, {n}, dtype, device());
      const auto before = testing::to_doubles(x);
      scale(x, s);
      std::vector<double> want(before.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        const double product = static_cast<float>(before[i] * s);  // computed in float
        want[i] = dtype == DType::f16 ? round_to_half(product) : product;
      }
      ASSERT_TRUE(same_bits_or_both_nan(testing::to_doubles(x), want))
          << dtype_name(dtype) << " n = " << n;
    }
  }
}

TEST_P(Scale, RejectsOtherDtypes) {
  EXPECT_THROW(scale(Tensor({3}, DType::i32, device()), 2.0f), std::invalid_argument);
}

class Axpy : public DeviceTest {};

TEST_P(Axpy, IsARoundedProductThenARoundedSum) {
  for (const float alpha : {0.3f, 1.0f, -2.5f}) {
    for (const DType x_dtype : {DType::f32, DType::f16}) {
      for (const std::int64_t n : kOddSizes) {
        const auto x_values = wide_range_values(n, 23);
        const Tensor x = testing::make_tensor(x_values, {n}, x_dtype, device());
        const Tensor y = testing::random_tensor({n}, DType::f32, device(), 29, -4.0, 4.0);
        const auto x_exact = testing::to_doubles(x), y_before = testing::to_doubles(y);
        axpy(alpha, x, y);
        std::vector<double> want(y_before.size());
        for (std::size_t i = 0; i < want.size(); ++i) {
          const float product = static_cast<float>(alpha * x_exact[i]);
          // with alpha == 1 the product is x itself, so this is exactly y + x
          want[i] = static_cast<float>(y_before[i] + product);
        }
        ASSERT_TRUE(same_bits_or_both_nan(testing::to_doubles(y), want))
            << "alpha " << alpha << " x " << dtype_name(x_dtype) << " n = " << n;
      }
    }
  }
}

// The residual stream under mixed precision: y f16 += x f16, the float result of the
// f32 path rounded once more, to nearest even, on store.
TEST_P(Axpy, IntoHalfIsTheFloatResultRoundedOnceMore) {
  for (const float alpha : {1.0f, -0.3f}) {
    for (const std::int64_t n : kOddSizes) {
      const Tensor x = testing::make_tensor(wide_range_values(n, 31), {n}, DType::f16, device());
      const Tensor y = testing::random_tensor({n}, DType::f16, device(), 37, -4.0, 4.0);
      const auto x_exact = testing::to_doubles(x), y_before = testing::to_doubles(y);
      axpy(alpha, x, y);
      std::vector<double> want(y_before.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        const float product = static_cast<float>(alpha * x_exact[i]);
        const float sum = static_cast<float>(y_before[i] + product);
        want[i] = static_cast<double>(static_cast<f16>(sum));
      }
      ASSERT_TRUE(same_bits_or_both_nan(testing::to_doubles(y), want))
          << "alpha " << alpha << " n = " << n;
    }
  }
}

TEST_P(Axpy, RejectsBadArguments) {
  const Tensor x({5}, DType::f32, device());
  EXPECT_THROW(axpy(1.0f, x, Tensor({5}, DType::f16, device())), std::invalid_argument);
  EXPECT_THROW(axpy(1.0f, x, Tensor({6}, DType::f32, device())), std::invalid_argument);
  EXPECT_THROW(axpy(1.0f, Tensor({5}, DType::i32, device()), Tensor({5}, DType::f32, device())),
               std::invalid_argument);
  if (device().is_cuda()) {
    EXPECT_THROW(axpy(1.0f, x, Tensor({5}, DType::f32)), std::invalid_argument);
  }
}

// ---- unscale_and_check_finite ----------------------------------------------------------

class Unscale : public DeviceTest {
 protected:
  /// Tensors of the odd sizes with values in [-8, 8).
  std::vector<Tensor> gradients(std::uint64_t seed) const {
    std::vector<Tensor> tensors;
    for (const std::int64_t n : kOddSizes) {
      tensors.push_back(testing::random_tensor({n}, DType::f32, device(), seed + n, -8.0, 8.0));
    }
    return tensors;
  }
  Tensor flag(float value) const {
    return Tensor::from_vector(std::vector<float>{value}, {1}, device());
  }
  static float read(const Tensor& t) { return t.to_vector<float>()[0]; }
};

TEST_P(Unscale, ScalesEveryElementAndLeavesTheFlagWhenAllAreFinite) {
  const float inv_scale = 1.0f / 3.0f;
  const std::vector<Tensor> tensors = gradients(3);
  std::vector<std::vector<double>> before;
  for (const Tensor& t : tensors) before.push_back(testing::to_doubles(t));
  for (const float initial : {0.0f, 1.0f}) {  // left as it was, whatever it was
    const Tensor found_inf = flag(initial);
    unscale_and_check_finite(tensors, inv_scale, found_inf);
    EXPECT_EQ(read(found_inf), initial);
  }
  for (std::size_t k = 0; k < tensors.size(); ++k) {  // scaled twice by now
    std::vector<double> want(before[k].size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float once = static_cast<float>(before[k][i] * inv_scale);
      want[i] = static_cast<float>(static_cast<double>(once) * inv_scale);
    }
    ASSERT_TRUE(same_bits_or_both_nan(testing::to_doubles(tensors[k]), want)) << "tensor " << k;
  }
}

TEST_P(Unscale, FlagsAnyInfOrNanWherever) {
  const double specials[] = {kInf, -kInf, std::nan("")};
  const std::vector<Tensor> tensors = gradients(5);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const std::int64_t n = tensors[k].numel();
    for (const std::int64_t where : {std::int64_t{0}, n / 2, n - 1}) {  // first, middle, last
      Tensor element = tensors[k].rows(where, where + 1);
      for (const double special : specials) {
        element.copy_from(testing::make_tensor({special}, {1}, DType::f32, device()));
        const Tensor found_inf = flag(0.0f);
        unscale_and_check_finite(tensors, 0.5f, found_inf);
        ASSERT_EQ(read(found_inf), 1.0f) << "tensor " << k << " element " << where;
        const double got = testing::to_doubles(element)[0];
        EXPECT_TRUE(std::isnan(special) ? std::isnan(got) : got == special);
      }
      element.copy_from(testing::make_tensor({1.0}, {1}, DType::f32, device()));
    }
  }
}

TEST_P(Unscale, HandlesManyTensorsAndEmptyOnes) {
  // more tensors than one CUDA launch takes (48), the infinity in the last one
  std::vector<Tensor> tensors;
  for (int k = 0; k < 50; ++k) {
    tensors.push_back(
        testing::random_tensor({k % 5 == 0 ? 0 : 3 + k}, DType::f32, device(), 40 + k));
  }
  const Tensor found_inf = flag(0.0f);
  unscale_and_check_finite(tensors, 2.0f, found_inf);
  EXPECT_EQ(read(found_inf), 0.0f);
  tensors.back().copy_from(testing::make_tensor(std::vector<double>(tensors.back().numel(), kInf),
                                                tensors.back().shape(), DType::f32, device()));
  unscale_and_check_finite(tensors, 2.0f, found_inf);
  EXPECT_EQ(read(found_inf), 1.0f);
}

TEST_P(Unscale, RejectsBadArguments) {
  const std::vector<Tensor> tensors = gradients(1);
  EXPECT_THROW(unscale_and_check_finite(tensors, 1.0f, Tensor({2}, DType::f32, device())),
               std::invalid_argument);
  EXPECT_THROW(unscale_and_check_finite(tensors, 1.0f, Tensor({1}, DType::f16, device())),
               std::invalid_argument);
  EXPECT_THROW(unscale_and_check_finite({Tensor({3}, DType::f16, device())}, 1.0f, flag(0.0f)),
               std::invalid_argument);
  if (device().is_cuda()) {
    EXPECT_THROW(unscale_and_check_finite(tensors, 1.0f, Tensor({1}, DType::f32)),
                 std::invalid_argument);
  }
}

// A tensor listed twice would be unscaled twice on the CPU and raced on by two blocks on
// CUDA; views sharing memory the same; a tensor over found_inf would race with the flag.
TEST_P(Unscale, RefusesTensorsThatShareMemory) {
  std::vector<Tensor> tensors = gradients(5);
  const Tensor found_inf = flag(0.0f);
  const std::vector<double> before = testing::to_doubles(tensors[1]);
  std::vector<Tensor> twice = tensors;
  twice.push_back(tensors[1]);
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] { unscale_and_check_finite(twice, 0.5f, found_inf); }),
      {"unscale_and_check_finite", "tensors[1]", "tensors[" + std::to_string(tensors.size()) + "]",
       "share memory"}));
  // Refused before anything is written.
  EXPECT_EQ(testing::to_doubles(tensors[1]), before);
  // Two views of one buffer that overlap by one element, listed apart from each other.
  const Tensor buffer = testing::random_tensor({9}, DType::f32, device(), 6);
  const std::vector<Tensor> overlapping = {buffer.rows(0, 5), tensors[0], buffer.rows(4, 9)};
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] { unscale_and_check_finite(overlapping, 0.5f, found_inf); }),
      {"tensors[0]", "tensors[2]", "share memory"}));
  // Adjacent views that do not overlap are fine.
  EXPECT_NO_THROW(
      unscale_and_check_finite({buffer.rows(0, 4), buffer.rows(4, 9)}, 1.0f, found_inf));
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] { unscale_and_check_finite({found_inf}, 0.5f, found_inf); }),
      {"tensors[0]", "shares memory with found_inf"}));
}

INSTANTIATE_TEST_SUITE_P(Backends, Cast, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);
INSTANTIATE_TEST_SUITE_P(Backends, Scale, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);
INSTANTIATE_TEST_SUITE_P(Backends, Axpy, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);
INSTANTIATE_TEST_SUITE_P(Backends, Unscale, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- every vector instruction set computes the same bits -------------------------------

using testing::expect_every_simd_level_agrees;

TEST(ElementwiseSimd, EveryLevelGivesTheBaselineBits) {
  std::cout << "SIMD levels compared: baseline up to "
            << cpu::simd_level_name(cpu::simd_level_supported()) << "\n";
  const std::int64_t n = (1 << 16) + 77;  // one chunk, and a remainder for every width
  auto values = wide_range_values(n, 31);
  values[5] = kInf;
  values[6] = std::nan("");
  const Tensor f32 = testing::make_tensor(values, {n}, DType::f32, Device::cpu());
  const Tensor f16 = testing::make_tensor(values, {n}, DType::f16, Device::cpu());
  expect_every_simd_level_agrees([&]() -> std::vector<Tensor> {
    Tensor out({n}, DType::f16);
    cast(f32, out);
    return {out};
  });
  expect_every_simd_level_agrees([&]() -> std::vector<Tensor> {
    Tensor out({n}, DType::f32);
    cast(f16, out);
    return {out};
  });
  for (const Tensor& x : {f32, f16}) {
    expect_every_simd_level_agrees([&]() -> std::vector<Tensor> {
      Tensor out = x.clone();
      scale(out, 0.3f);
      return {out};
    });
    for (const DType y_dtype : {DType::f32, DType::f16}) {
      if (y_dtype == DType::f16 && x.dtype() != DType::f16) continue;
      expect_every_simd_level_agrees([&]() -> std::vector<Tensor> {
        Tensor y = testing::random_tensor({n}, y_dtype, Device::cpu(), 2);
        axpy(0.7f, x, y);
        return {y};
      });
    }
  }
  expect_every_simd_level_agrees([&]() -> std::vector<Tensor> {
    Tensor g = f32.clone();
    Tensor found_inf = Tensor::zeros({1}, DType::f32);
    unscale_and_check_finite({g}, 0.125f, found_inf);
    EXPECT_EQ(found_inf.to_vector<float>()[0], 1.0f);
    return {g};
  });
}

}  // namespace
}  // namespace bigbatch

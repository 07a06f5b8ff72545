// bfloat16.hpp: bfloat16, the upper half of an IEEE binary32, on both backends.
//
//   bf16 -> float   exact: the 16 bits become the float's top half, the rest zeros
//   float -> bf16   round to nearest, ties to even: IEEE rounding for every finite value,
//                   subnormals included, and a value past the largest bf16's half-way
//                   point rounds to infinity. A NaN is not rounded: its top half is kept
//                   and the quiet bit set.
// This is what CUDA's __float2bfloat16_rn does (and PyTorch's round_to_nearest_even, which
// returns one canonical NaN where this keeps the sign and the payload's top bits).
//
// Why and how: docs/internals.md#commonbfloat16hpp
#pragma once

#include <bit>
#include <cstdint>

#include "common/dtype.hpp"

namespace bigbatch {

/// The bits of a bfloat16 value (the element type of DType::bf16 tensors on the host).
struct bf16 {
  std::uint16_t bits = 0;  ///< sign, 8 exponent bits, 7 significand bits
  /// The same bits (so +0 and -0 differ, and a NaN equals itself).
  friend constexpr bool operator==(bf16, bf16) = default;
};

/// bf16 is bf16.
template <>
struct DTypeOf<bf16> {
  /// DType::bf16.
  static constexpr DType value = DType::bf16;
};

/// float -> bf16, rounded to nearest even; a NaN stays a NaN (quiet, its sign kept).
/// Written without a branch (the NaN case is a select), so loops over it vectorise.
constexpr bf16 to_bf16(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t lowest_kept = (u >> 16) & 1u;
  const std::uint32_t rounded = (u + 0x7fffu + lowest_kept) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return {static_cast<std::uint16_t>(nan ? quiet_nan : rounded)};
}

/// bf16 -> float, exactly.
constexpr float to_float(bf16 x) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

}  // namespace bigbatch

// half.hpp: IEEE binary16 on the CPU.
//
// GCC's _Float16 is a real binary16: conversions from float round to nearest even,
// values below 2^-14 become subnormals (down to 2^-24), smaller ones flush to zero,
// and values at or above 65520 overflow to infinity. That is exactly what the GPU's
// __half does, so underflow and overflow happen on the CPU where they would on a GPU.
//
// Only CPU translation units include this header (nvcc's host front end does not
// need to see _Float16).
#pragma once

#include <bit>
#include <cstdint>

#include "common/dtype.hpp"

namespace bigbatch {

/// The CPU's binary16 type, the element type of DType::f16 tensors on the host.
using f16 = _Float16;

/// _Float16 is f16.
template <>
struct DTypeOf<_Float16> {
  /// DType::f16.
  static constexpr DType value = DType::f16;
};

// (The bits of a float, for both backends: kernels/scalar_math.hpp.)

/// The 16 raw bits of a binary16 value.
inline std::uint16_t f16_bits(f16 x) { return std::bit_cast<std::uint16_t>(x); }

/// The binary16 value with the given raw bits.
inline f16 f16_from_bits(std::uint16_t bits) { return std::bit_cast<f16>(bits); }

}  // namespace bigbatch

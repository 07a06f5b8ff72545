// dtype.hpp: the element types a Tensor can hold.
//
//   f32  IEEE binary32: activations, gradients, master weights, losses
//   f16  IEEE binary16: the mixed-precision working copy (_Float16 on the CPU,
//        __half on the GPU; both round to nearest even and keep subnormals)
//   bf16 bfloat16, the top half of a binary32: the other mixed-precision working copy,
//        fp32's range with 8 significant bits (common/bfloat16.hpp's bf16 on the CPU,
//        __nv_bfloat16 on the GPU; both round to nearest even)
//   f64  IEEE binary64: only on the CPU, for oracles in the tests
//   i32  int32: class labels
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace bigbatch {

/// The element type of a Tensor (see the table above).
enum class DType : std::uint8_t { f32, f16, f64, i32, bf16 };

/// Bytes per element: f32 4, f16 2, bf16 2, f64 8, i32 4.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::bf16: return 2;
  }
  return 0;
}

/// The short name used in messages: "f32", "f16", "bf16", "f64" or "i32".
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
  }
  return "?";
}

/// True for f32, f16, bf16 and f64; false for i32.
constexpr bool is_floating(DType t) { return t != DType::i32; }

/// True for the two 16-bit working types of mixed precision, f16 and bf16.
constexpr bool is_half_width(DType t) { return t == DType::f16 || t == DType::bf16; }

/// Maps a C++ element type to its DType. Specialised here for the portable types;
/// common/half.hpp adds _Float16 and common/bfloat16.hpp bf16 (CPU), and
/// kernels/cuda_common.cuh adds __half and __nv_bfloat16 (GPU).
template <class T>
struct DTypeOf;
/// float is f32.
template <>
struct DTypeOf<float> {
  /// DType::f32.
  static constexpr DType value = DType::f32;
};
/// double is f64.
template <>
struct DTypeOf<double> {
  /// DType::f64.
  static constexpr DType value = DType::f64;
};
/// std::int32_t is i32.
template <>
struct DTypeOf<std::int32_t> {
  /// DType::i32.
  static constexpr DType value = DType::i32;
};

}  // namespace bigbatch

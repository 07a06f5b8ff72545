// scalar_math.hpp: the scalar building blocks that the CPU loops and the CUDA kernels
// share (activation_math.hpp, optimizer_math.hpp, cpu_vector.hpp): float operations
// rounded exactly once, the bits of a float, branch-free selection, and the type an
// element is computed in.
//
// Why explicit roundings: the CPU code is compiled with -ffp-contract=off, so the
// compiler never fuses a*b+c on its own, and fma_rn says where we want one fused
// rounding (std::fma is exactly rounded with or without FMA hardware). nvcc contracts
// a*b+c by default (--fmad=true), so on the device every operation is an intrinsic with
// explicit round-to-nearest (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn,
// __fmaf_rn) that nvcc never fuses or approximates: both backends give identical bits.
//
// This header must compile under nvcc: no half.hpp here.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/host_device.hpp"

namespace bigbatch::scalar_math {

// ---- float operations rounded once, never contracted ----------------------------------

/// a * b, rounded once to nearest.
BIGBATCH_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a + b, rounded once to nearest.
BIGBATCH_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// a - b, rounded once to nearest.
BIGBATCH_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// a / b, correctly rounded to nearest.
BIGBATCH_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// sqrt(a), correctly rounded to nearest.
BIGBATCH_HD inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

/// a*b + c with one rounding.
BIGBATCH_HD inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The float64 path runs on the CPU only, where nothing is ever contracted.
/// a * b in double.
inline double mul_rn(double a, double b) { return a * b; }
/// a + b in double.
inline double add_rn(double a, double b) { return a + b; }
/// a / b in double.
inline double div_rn(double a, double b) { return a / b; }

// ---- bits ---------------------------------------------------------------------------

/// The 32 raw bits of x.
BIGBATCH_HD inline std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint32_t>(__float_as_uint(x));
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}

/// The float with the given raw bits.
BIGBATCH_HD inline float float_from_bits(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

// ---- branch-free selection ------------------------------------------------------------
//
// GCC will not if-convert `c ? a : b` when a or b is computed by a float operation it
// could sink into the branch (that operation might trap), and a loop with a branch
// does not vectorise. Selecting the bits instead keeps the loops straight-line.

/// condition ? if_true : if_false, on the bits.
BIGBATCH_HD inline std::uint32_t select_bits(bool condition, std::uint32_t if_true,
                                             std::uint32_t if_false) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

// ---- the type an element is computed in -----------------------------------------------

/// Elements are computed in float (in double for f64 data) and rounded once on store.
template <class T>
using ComputeType = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace bigbatch::scalar_math

// elementwise.hpp: casts and the simple in-place updates of mixed-precision training.
//
//   cast(src, dst)          src, dst: same shape; f32->f16, f16->f32,
//                           f32->f32 or f16->f16                          dst = src
//   scale(x, s)             x: any shape, f32 or f16                      x = x * s
//   axpy(alpha, x, y)       y: f32; x: same shape, f32 or f16             y += alpha * x
//   unscale_and_check_finite(tensors, inv_scale, found_inf)
//                           tensors: f32, any shapes, one device          g = g * inv_scale
//                           found_inf: f32 [1], the same device           found_inf = 1 if any g
//                                                                         was inf or NaN, else
//                                                                         left as it was
//
// Arithmetic, identical on both backends:
// - cast f32->f16 rounds to nearest even; values at or above 65520 in magnitude become
//   inf, subnormal halves are kept, magnitudes at or below 2^-25 become (signed) zero;
//   f16->f32 is exact. NaN stays NaN (the payload is not specified across backends).
// - scale computes x * s in float and rounds once to x's dtype.
// - axpy computes y + (alpha * x) with two roundings in float: the product, then the
//   sum (never a fused multiply-add). With alpha == 1 the product is exact, so the
//   result is exactly the float sum y + x. An f16 x is first converted to float (exact).
// - unscale_and_check_finite is PyTorch's _amp_foreach_non_finite_check_and_unscale_
//   with a float scale: every element becomes g * inv_scale (one rounding), and found_inf
//   becomes exactly 1.0f if any element was inf or NaN before scaling; otherwise it is
//   left as it was (the caller zeroes it), so one found_inf can collect several calls.
//   One pass over each tensor (on CUDA: one launch for up to 48 tensors).
//
// The bottom of this header holds the CPU building blocks that the elementwise families
// (activation, bias, dropout and this one) share: float <-> binary16 conversions that
// vectorise, and run_vectorized, which compiles a loop for AVX-512, AVX2 and the x86-64
// baseline and runs the best one the CPU has.
#pragma once

#include <cstdint>
#include <vector>

#include "common/tensor.hpp"

namespace bigbatch {

void cast(const Tensor& src, const Tensor& dst);
void scale(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf);

namespace cpu {
void cast(const Tensor& src, const Tensor& dst);
void scale(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf);
}  // namespace cpu

namespace cuda {
void cast(const Tensor& src, const Tensor& dst);
void scale(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf);
}  // namespace cuda

namespace detail {
/// An op may write an output over an input that is the very same memory (in place), but
/// not over one that overlaps it only partly: element i would read what element j wrote.
void check_same_or_disjoint(const char* op, const char* output_name, const Tensor& output,
                            const char* input_name, const Tensor& input);
}  // namespace detail

}  // namespace bigbatch

// ---- CPU building blocks of the elementwise families ------------------------------
#if !defined(__CUDACC__)

#include <cstring>
#include <string_view>
#include <type_traits>

#include "common/half.hpp"

namespace bigbatch::cpu {

// -- binary16 <-> float, bit for bit as GCC's _Float16 conversions --------------------
//
// GCC converts _Float16 through a libgcc call per element (even with F16C), which no
// loop survives. These do the same rounding with integer and float operations that
// vectorise; the tests check them against _Float16 over every half and over every
// float near a rounding boundary.

namespace half_detail {
inline std::uint32_t bits_of(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}
inline float float_of(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
/// condition ? a : b without a branch (see activation_math.hpp, select).
inline std::uint32_t pick(bool condition, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}
}  // namespace half_detail

/// The float value of the binary16 with these bits (exact). A signalling NaN comes back
/// quiet, its payload kept.
inline float half_bits_to_float(std::uint16_t bits) {
  using namespace half_detail;
  const std::uint32_t sign = (std::uint32_t{bits} & 0x8000u) << 16;
  const std::uint32_t magnitude = std::uint32_t{bits} & 0x7fffu;
  // Normal: move exponent and mantissa into place and rebias the exponent (15 -> 127).
  const std::uint32_t normal = (magnitude << 13) + ((127u - 15u) << 23);
  // Subnormal or zero: m * 2^-24, exact in float (m < 2^10), with no float subnormal.
  const std::uint32_t subnormal =
      bits_of(static_cast<float>(static_cast<std::int32_t>(magnitude)) * 0x1p-24f);
  const std::uint32_t quiet_bit = pick(magnitude > 0x7c00u, 0x00400000u, 0u);
  const std::uint32_t inf_or_nan = 0x7f800000u | (magnitude << 13) | quiet_bit;
  return float_of(
      sign | pick(magnitude >= 0x7c00u, inf_or_nan, pick(magnitude >= 0x0400u, normal, subnormal)));
}

/// The bits of x rounded to binary16: to nearest even, overflow to inf, subnormals kept.
inline std::uint16_t float_to_half_bits(float x) {
  using namespace half_detail;
  const std::uint32_t bits = bits_of(x);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  // Normal half (|x| >= 2^-14): rebias, then round the 13 dropped bits to nearest even
  // (adding 0xfff plus the kept lowest bit carries exactly when rounding goes up; a
  // carry out of the mantissa correctly bumps the exponent).
  const std::uint32_t normal =
      (magnitude - ((127u - 15u) << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
  // Subnormal half (|x| < 2^-14): in [0.5, 1) the float spacing is 2^-24, the spacing of
  // subnormal halves, so the float addition does the rounding to nearest even for us.
  const std::uint32_t subnormal = bits_of(float_of(magnitude) + 0.5f) - bits_of(0.5f);
  const std::uint32_t quiet_nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  std::uint32_t half = pick(magnitude < 0x38800000u, subnormal, normal);  // 2^-14
  half = pick(magnitude >= 0x477ff000u, 0x7c00u, half);                   // 65520: inf
  half = pick(magnitude > 0x7f800000u, quiet_nan, half);                  // NaN
  return static_cast<std::uint16_t>(sign | half);
}

/// Elements are computed in float (double for f64) and rounded once on store.
template <class T>
using ComputeType = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Loads and stores of the element types, computing in ComputeType<T>. GCC vectorises an
// f16 load only as a copy of its 16 bits, and an f16 store only as a typed _Float16
// store (a copied store may alias anything, the loop's bounds included, which stops
// the vectorizer); hence the two different forms.

inline float load(const float* p) { return *p; }
inline double load(const double* p) { return *p; }
inline float load(const f16* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return half_bits_to_float(bits);
}

/// *p = value, rounded once to the element type.
inline void store(float* p, float value) { *p = value; }
inline void store(double* p, double value) { *p = value; }
inline void store(f16* p, float value) { *p = f16_from_bits(float_to_half_bits(value)); }

// -- vector instruction sets -------------------------------------------------------
//
// The build targets the x86-64 baseline (SSE2). run_vectorized(loop) compiles `loop`
// three times, for AVX-512, AVX2 and the baseline (GCC inlines the loop into a function
// with that target and vectorises it there), and runs the best copy the CPU supports.
// Every copy computes the same bits: the loops use only IEEE additions, multiplications,
// divisions, comparisons and integer operations, each rounded once, and the build never
// contracts a*b+c into an fma (-ffp-contract=off); a wider vector only does more lanes
// at a time. (Only a NaN's sign and payload may differ: the compiler may swap the
// operands of a + b, and x86 returns the first of two NaNs.) The tests cap the level
// to run and compare every copy on one machine.

enum class SimdLevel : std::uint8_t { baseline, avx2, avx512 };

std::string_view simd_level_name(SimdLevel level);
/// The best level this CPU (and OS) supports.
SimdLevel simd_level_supported();
/// The level the loops use now: the supported one, unless capped lower.
SimdLevel simd_level();
/// Caps the level the loops use (for tests and benchmarks); returns the previous cap.
SimdLevel set_simd_level_cap(SimdLevel cap);

namespace simd_detail {
template <class Loop>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void run_avx512(
    const Loop& loop) {
  loop();
}
template <class Loop>
__attribute__((target("avx2"), flatten)) void run_avx2(const Loop& loop) {
  loop();
}
template <class Loop>
__attribute__((flatten)) void run_baseline(const Loop& loop) {
  loop();
}
}  // namespace simd_detail

/// Runs loop() compiled for the best vector instruction set available (see above).
template <class Loop>
void run_vectorized(const Loop& loop) {
  switch (simd_level()) {
    case SimdLevel::avx512: return simd_detail::run_avx512(loop);
    case SimdLevel::avx2: return simd_detail::run_avx2(loop);
    case SimdLevel::baseline: return simd_detail::run_baseline(loop);
  }
}

/// Elements per parallel chunk: big enough that a fork/join (a few microseconds) is
/// small next to the chunk's work (64 Ki floats take about 10 us to stream), small
/// enough that a 1 MiB buffer already splits across four threads.
inline constexpr std::int64_t kElementwiseGrain = 1 << 16;

}  // namespace bigbatch::cpu

#endif  // !defined(__CUDACC__)

// cpu_vector.hpp: the CPU building blocks that the elementwise op families (activation,
// bias, dropout, elementwise) share, so that each writes its loops once and gets them
// vectorised for the best instruction set the CPU has:
// - run_vectorized(loop): the loop compiled for AVX-512, AVX2 and the x86-64 baseline,
//   the best supported copy run (with a cap, so that tests compare every copy);
// - float <-> binary16 conversions that vectorise, and the loads and stores of the
//   element types built on them (bfloat16's are common/bfloat16.hpp's, which vectorise too);
// - the parallel chunk size of these loops;
// - with_float_type, the dispatch from a tensor's dtype to its C++ element type;
// - check_same_or_disjoint, the argument check of an op that may work in place.
//
// For the kernels' .cpp files, the tests and the benchmarks; not part of any op's API.
// CPU-only: it includes half.hpp, which nvcc does not see. The functions declared here without a body
// are defined in elementwise.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/bfloat16.hpp"
#include "common/check.hpp"
#include "common/half.hpp"
#include "common/tensor.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {

namespace detail {
/// An op may write an output over an input that is the very same memory (in place), but
/// not over one that overlaps it only partly: element i would read what element j wrote.
void check_same_or_disjoint(const char* op, const char* output_name, const Tensor& output,
                            const char* input_name, const Tensor& input);
}  // namespace detail

namespace cpu {

// -- binary16 <-> float, bit for bit as GCC's _Float16 conversions --------------------
//
// GCC converts _Float16 through a libgcc call per element (even with F16C), which no
// loop survives. These do the same rounding with integer and float operations that
// vectorise; the tests check them against _Float16 over every half and over every
// float near a rounding boundary.

/// The float value of the binary16 with these bits (exact). A signalling NaN comes back
/// quiet, its payload kept.
inline float half_bits_to_float(std::uint16_t bits) {
  using scalar_math::float_bits, scalar_math::float_from_bits, scalar_math::select_bits;
  const std::uint32_t sign = (std::uint32_t{bits} & 0x8000u) << 16;
  const std::uint32_t magnitude = std::uint32_t{bits} & 0x7fffu;
  // Normal: move exponent and mantissa into place and rebias the exponent (15 -> 127).
  const std::uint32_t normal = (magnitude << 13) + ((127u - 15u) << 23);
  // Subnormal or zero: m * 2^-24, exact in float (m < 2^10), with no float subnormal.
  const std::uint32_t subnormal =
      float_bits(static_cast<float>(static_cast<std::int32_t>(magnitude)) * 0x1p-24f);
  const std::uint32_t quiet_bit = select_bits(magnitude > 0x7c00u, 0x00400000u, 0u);
  const std::uint32_t inf_or_nan = 0x7f800000u | (magnitude << 13) | quiet_bit;
  return float_from_bits(
      sign | select_bits(magnitude >= 0x7c00u, inf_or_nan,
                         select_bits(magnitude >= 0x0400u, normal, subnormal)));
}

/// The bits of x rounded to binary16: to nearest even, overflow to inf, subnormals kept.
inline std::uint16_t float_to_half_bits(float x) {
  using scalar_math::float_bits, scalar_math::float_from_bits, scalar_math::select_bits;
  const std::uint32_t bits = float_bits(x);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  // Normal half (|x| >= 2^-14): rebias, then round the 13 dropped bits to nearest even
  // (adding 0xfff plus the kept lowest bit carries exactly when rounding goes up; a
  // carry out of the mantissa correctly bumps the exponent).
  const std::uint32_t normal =
      (magnitude - ((127u - 15u) << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
  // Subnormal half (|x| < 2^-14): in [0.5, 1) the float spacing is 2^-24, the spacing of
  // subnormal halves, so the float addition does the rounding to nearest even for us.
  const std::uint32_t subnormal = float_bits(float_from_bits(magnitude) + 0.5f) - float_bits(0.5f);
  const std::uint32_t quiet_nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  std::uint32_t half = select_bits(magnitude < 0x38800000u, subnormal, normal);  // 2^-14
  half = select_bits(magnitude >= 0x477ff000u, 0x7c00u, half);                   // 65520: inf
  half = select_bits(magnitude > 0x7f800000u, quiet_nan, half);                  // NaN
  return static_cast<std::uint16_t>(sign | half);
}

/// Elements are computed in float (double for f64) and rounded once on store.
using scalar_math::ComputeType;

// Loads and stores of the element types, computing in ComputeType<T>. GCC vectorises an
// f16 load only as a copy of its 16 bits, and an f16 store only as a typed _Float16
// store (a copied store may alias anything, the loop's bounds included, which stops
// the vectorizer); hence the two different forms.

/// *p.
inline float load(const float* p) { return *p; }
/// *p.
inline double load(const double* p) { return *p; }
/// *p as float (exact), read as its 16 bits.
inline float load(const f16* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return half_bits_to_float(bits);
}

/// *p = value, rounded once to the element type.
inline void store(float* p, float value) { *p = value; }
/// *p as float (exact).
inline float load(const bf16* p) { return to_float(*p); }

/// *p = value.
inline void store(double* p, double value) { *p = value; }
/// *p = value rounded to binary16 (to nearest even), stored as a typed _Float16.
inline void store(f16* p, float value) { *p = f16_from_bits(float_to_half_bits(value)); }
/// *p = value rounded to bfloat16 (to nearest even; a NaN stays a NaN).
inline void store(bf16* p, float value) { *p = to_bf16(value); }

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

/// The instruction sets run_vectorized compiles a loop for, weakest first.
enum class SimdLevel : std::uint8_t { baseline, avx2, avx512 };

/// "x86-64 baseline (SSE2)", "AVX2" or "AVX-512", for reports.
std::string_view simd_level_name(SimdLevel level);
/// The best level this CPU (and OS) supports.
SimdLevel simd_level_supported();
/// The level the loops use now: the supported one, unless capped lower.
SimdLevel simd_level();
/// Caps the level the loops use (for tests and benchmarks); returns the previous cap.
SimdLevel set_simd_level_cap(SimdLevel cap);

namespace simd_detail {
/// Runs loop() compiled for AVX-512 (F, BW, DQ, VL): flatten inlines the loop's body here.
template <class Loop>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void run_avx512(
    const Loop& loop) {
  loop();
}
/// Runs loop() compiled for AVX2.
template <class Loop>
__attribute__((target("avx2"), flatten)) void run_avx2(const Loop& loop) {
  loop();
}
/// Runs loop() compiled for the x86-64 baseline (SSE2).
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

/// Calls body(T{}) with T the C++ element type of `dtype` (float, f16, bf16 or double); an
/// integer dtype is refused naming `op` (the ops' argument checks refuse it first).
template <class Body>
void with_float_type(const char* op, DType dtype, const Body& body) {
  switch (dtype) {
    case DType::f32: return body(float{});
    case DType::f16: return body(f16{});
    case DType::bf16: return body(bf16{});
    case DType::f64: return body(double{});
    case DType::i32: break;
  }
  BIGBATCH_CHECK(false, op, ": unsupported dtype ", dtype_name(dtype));
}

}  // namespace cpu
}  // namespace bigbatch

// harness.hpp: what every op test needs.
//
// - Backends: op tests are parameterised over Device; the CUDA instance skips, with the
//   reason, when no GPU is present (BIGBATCH_SKIP_WITHOUT_DEVICE).
// - Poison: outputs are filled with NaN (i32: a sentinel) before every op, so an
//   element the op forgot to write fails the comparison.
// - Tolerances come from the dtype's unit roundoff u and the number n of roundings on a
//   computation's path: gamma(n) = n*u / (1 - n*u) bounds the error of an n-term sum
//   computed in any order relative to the sum of the terms' magnitudes (Higham, "Accuracy
//   and Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and section 4.2). Where a
//   test computes those magnitudes (the op tests), its tolerance is a proof for that
//   computation. Where it cannot, a tolerance rests on something not derived: a stand-in
//   for the magnitude, an assumed derivative bound, a growth factor or an accuracy
//   measured rather than proven. The comment at each such tolerance says which part is
//   derived and which is not, and gives the measured margin.
// - Oracles run in double on the CPU; finite differences are central differences
//   (Richardson-extrapolated ones, with their error bound: finite_difference.hpp).
// - The CPU loops are compiled for several vector instruction sets: every one must give
//   the baseline's results (expect_every_simd_level_agrees).
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda_runtime.hpp"
#include "common/half.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/fill.hpp"

namespace bigbatch {
/// How GoogleTest prints a Device parameter: "cpu" or "cuda:0", not its bytes.
inline void PrintTo(const Device& device, std::ostream* out) { *out << device.name(); }
}  // namespace bigbatch

namespace bigbatch::testing {

/// The backends every op test runs on.
inline std::vector<Device> all_devices() { return {Device::cpu(), Device::cuda()}; }

inline std::string device_test_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda";
}

/// Skips the current test, saying why, when `device` is CUDA and no GPU can be used.
#define BIGBATCH_SKIP_WITHOUT_DEVICE(device)                                           \
  do {                                                                                 \
    std::string bigbatch_why_not_;                                                     \
    if ((device).is_cuda() && !::bigbatch::cuda_rt::available(&bigbatch_why_not_)) {   \
      GTEST_SKIP() << "CUDA test skipped: " << bigbatch_why_not_;                      \
    }                                                                                  \
  } while (false)

/// A fixture parameterised by backend that skips the CUDA instance without a GPU.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { BIGBATCH_SKIP_WITHOUT_DEVICE(GetParam()); }
  Device device() const { return GetParam(); }
};

/// Unit roundoff: half the distance from 1 to the next number (bf16 2^-8, f16 2^-11,
/// f32 2^-24).
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 0x1p-8;
    case DType::f16: return 0x1p-11;
    case DType::f32: return 0x1p-24;
    case DType::f64: return 0x1p-53;
    case DType::i32: return 0;
  }
  return 0;
}

/// gamma(n): bound on the relative error of n rounded operations in `dtype`.
inline double gamma(std::int64_t n, DType dtype) {
  const double nu = static_cast<double>(n) * unit_roundoff(dtype);
  return nu / (1.0 - nu);
}

/// Fills a tensor with NaN (floating dtypes) or INT32_MIN (i32).
inline void poison(const Tensor& t) {
  fill(t, t.dtype() == DType::i32 ? -2147483648.0 : std::nan(""));
}

/// Deterministic values uniform in [lo, hi), rounded to the dtype.
inline std::vector<double> random_values(std::int64_t n, std::uint64_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = lo + (hi - lo) * random_uniform(seed, 0, i);
  }
  return values;
}

/// A tensor of the given dtype holding `values` (rounded to float, then to the dtype).
inline Tensor make_tensor(const std::vector<double>& values, Shape shape, DType dtype,
                          Device device, MemoryCategory category = MemoryCategory::workspace) {
  switch (dtype) {
    case DType::f64: return Tensor::from_vector(values, std::move(shape), device, category);
    case DType::f32: {
      std::vector<float> v(values.begin(), values.end());
      return Tensor::from_vector(v, std::move(shape), device, category);
    }
    case DType::f16: {
      std::vector<f16> v(values.size());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<f16>(static_cast<float>(values[i]));
      return Tensor::from_vector(v, std::move(shape), device, category);
    }
    case DType::bf16: {
      std::vector<bf16> v(values.size());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_bf16(static_cast<float>(values[i]));
      return Tensor::from_vector(v, std::move(shape), device, category);
    }
    case DType::i32: {
      std::vector<std::int32_t> v(values.begin(), values.end());
      return Tensor::from_vector(v, std::move(shape), device, category);
    }
  }
  return {};
}

/// A random tensor: make_tensor(random_values(...)).
inline Tensor random_tensor(Shape shape, DType dtype, Device device, std::uint64_t seed,
                            double lo = -1.0, double hi = 1.0) {
  const auto values = random_values(shape_numel(shape), seed, lo, hi);
  return make_tensor(values, std::move(shape), dtype, device);
}

/// The elements of any tensor as doubles, on the host (exact: every dtype fits).
inline std::vector<double> to_doubles(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f64: return t.to_vector<double>();
    case DType::f32: {
      const auto v = t.to_vector<float>();
      return {v.begin(), v.end()};
    }
    case DType::f16: {
      const auto v = t.to_vector<f16>();
      std::vector<double> out(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(v[i]);
      return out;
    }
    case DType::bf16: {
      const auto v = t.to_vector<bf16>();
      std::vector<double> out(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
      return out;
    }
    case DType::i32: {
      const auto v = t.to_vector<std::int32_t>();
      return {v.begin(), v.end()};
    }
  }
  return {};
}

/// Checks |got[i] - want[i]| <= tolerance(i) for every i, NaN and inf first. Reports
/// the count of failures and the first few, with their index and tolerance.
inline ::testing::AssertionResult all_close(const std::vector<double>& got,
                                            const std::vector<double>& want,
                                            const std::function<double(std::size_t)>& tolerance) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: got " << got.size() << ", want " << want.size();
  }
  std::size_t failures = 0;
  std::ostringstream details;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same_special = (std::isnan(got[i]) && std::isnan(want[i])) ||
                              (std::isinf(got[i]) && got[i] == want[i]);
    if (same_special) continue;
    const double tol = tolerance(i);
    const bool ok = std::isfinite(got[i]) && std::isfinite(want[i]) &&
                    std::abs(got[i] - want[i]) <= tol;
    if (!ok) {
      if (failures < 8) {
        details << "\n  [" << i << "] got " << got[i] << ", want " << want[i] << ", |diff| "
                << std::abs(got[i] - want[i]) << " > tolerance " << tol;
      }
      ++failures;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures << " of " << got.size()
                                       << " elements differ" << details.str();
}

/// Checks got == want bit for bit (NaN payloads included) for tensors of one dtype.
inline ::testing::AssertionResult bitwise_equal(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << got.describe() << " vs " << want.describe();
  }
  const Tensor a = got.to(Device::cpu()), b = want.to(Device::cpu());
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  const std::size_t element = dtype_size(a.dtype());
  std::size_t failures = 0, first = 0;
  for (std::size_t i = 0; i < a.nbytes(); i += element) {
    if (std::memcmp(pa + i, pb + i, element) != 0) {
      if (failures++ == 0) first = i / element;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  const auto va = to_doubles(a), vb = to_doubles(b);
  return ::testing::AssertionFailure()
         << failures << " of " << a.numel() << " elements differ in their bits; first at ["
         << first << "]: " << va[first] << " vs " << vb[first];
}

/// Checks got == want bit for bit, except that any NaN equals any NaN: a NaN's sign and
/// payload are not specified (a compiler may swap the operands of a + b, and x86 returns
/// the first of two NaNs).
inline ::testing::AssertionResult same_bits_or_both_nan(const std::vector<double>& got,
                                                        const std::vector<double>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  std::size_t failures = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) ||
                      std::bit_cast<std::uint64_t>(got[i]) == std::bit_cast<std::uint64_t>(want[i]);
    if (!same && failures++ == 0) first = i;
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << got.size() << " differ; first [" << first << "]: got "
         << got[first] << ", want " << want[first];
}

/// The same for tensors of one dtype and shape (their values, exact as doubles).
inline ::testing::AssertionResult same_bits_or_both_nan(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << got.describe() << " vs " << want.describe();
  }
  return same_bits_or_both_nan(to_doubles(got), to_doubles(want));
}

/// Runs `outputs_of` (CPU ops, returning their outputs) with the vector instruction set
/// capped at the x86-64 baseline, then at every higher level this CPU supports, and
/// checks with `same` that each level gives the baseline's outputs (cpu_vector.hpp: every
/// copy of a loop computes the same bits).
inline void expect_every_simd_level_agrees(
    const std::function<std::vector<Tensor>()>& outputs_of,
    const std::function<::testing::AssertionResult(const Tensor&, const Tensor&)>& same =
        bitwise_equal) {
  const cpu::SimdLevel previous = cpu::set_simd_level_cap(cpu::SimdLevel::baseline);
  const std::vector<Tensor> baseline = outputs_of();
  for (const cpu::SimdLevel level : {cpu::SimdLevel::avx2, cpu::SimdLevel::avx512}) {
    if (level > cpu::simd_level_supported()) continue;
    cpu::set_simd_level_cap(level);
    const std::vector<Tensor> outputs = outputs_of();
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      EXPECT_TRUE(same(outputs[k], baseline[k])) << cpu::simd_level_name(level) << ", output " << k;
    }
  }
  cpu::set_simd_level_cap(previous);
}

/// The message of the exception `action` throws, or "" when it throws none.
template <class Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

/// Passes when `message` is an error message containing every one of `parts`.
inline ::testing::AssertionResult mentions(const std::string& message,
                                           std::initializer_list<std::string> parts) {
  if (message.empty()) return ::testing::AssertionFailure() << "no exception was thrown";
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "\"" << part << "\" not in: " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Central difference (f(x+h) - f(x-h)) / 2h of f at x, where f reads `x` by reference.
inline double central_difference(const std::function<double()>& f, double& x, double h) {
  const double saved = x;
  x = saved + h;
  const double plus = f();
  x = saved - h;
  const double minus = f();
  x = saved;
  return (plus - minus) / (2 * h);
}

}  // namespace bigbatch::testing

#include "kernels/elementwise.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {
namespace {

bool is_f32_or_f16(DType dtype) { return dtype == DType::f32 || dtype == DType::f16; }

/// unscale_and_check_finite reads, checks and rewrites every element once. A tensor listed
/// twice, or two tensors sharing memory, would be unscaled twice on the CPU and written by
/// two blocks at once on CUDA (a data race); a tensor sharing found_inf's memory would race
/// with the flag's store. Refuse them all, naming the positions in the list.
void check_unscale_tensors_apart(const char* op, const std::vector<Tensor>& tensors,
                                 const Tensor& found_inf) {
  struct Range {
    const char* begin;
    const char* end;
    std::size_t index;
  };
  std::vector<Range> ranges;
  const auto* flag = static_cast<const char*>(found_inf.raw_data());
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    if (t.nbytes() == 0) continue;  // an empty tensor has no memory to share
    const auto* begin = static_cast<const char*>(t.raw_data());
    const Range range{begin, begin + t.nbytes(), k};
    BIGBATCH_CHECK(!(std::less<>()(range.begin, flag + found_inf.nbytes()) &&
                     std::less<>()(flag, range.end)),
                   op, ": tensors[", k, "] ", t.describe(), " shares memory with found_inf");
    ranges.push_back(range);
  }
  // Sorted by first byte, a range overlaps an earlier one exactly when it starts before the
  // furthest end seen so far.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return std::less<>()(a.begin, b.begin); });
  for (std::size_t r = 1, furthest = 0; r < ranges.size(); ++r) {
    const Range& earlier = ranges[furthest];
    const Range& range = ranges[r];
    const std::size_t first = std::min(earlier.index, range.index);
    const std::size_t second = std::max(earlier.index, range.index);
    BIGBATCH_CHECK(!std::less<>()(range.begin, earlier.end), op, ": tensors[", first, "] ",
                   tensors[first].describe(), " and tensors[", second, "] ",
                   tensors[second].describe(),
                   " share memory (each tensor must be listed once, apart from the others)");
    if (std::less<>()(earlier.end, range.end)) furthest = r;
  }
}

}  // namespace

void detail::check_same_or_disjoint(const char* op, const char* output_name, const Tensor& output,
                                    const char* input_name, const Tensor& input) {
  const auto* out_begin = static_cast<const char*>(output.raw_data());
  const auto* in_begin = static_cast<const char*>(input.raw_data());
  const bool same = out_begin == in_begin && output.nbytes() == input.nbytes();
  const bool disjoint = std::less_equal<>()(out_begin + output.nbytes(), in_begin) ||
                        std::less_equal<>()(in_begin + input.nbytes(), out_begin);
  BIGBATCH_CHECK(same || disjoint || output.numel() == 0 || input.numel() == 0, op, ": ",
                 output_name, " ", output.describe(), " partly overlaps ", input_name, " ",
                 input.describe(), " (an output may be its input, or apart from it)");
}

void cast(const Tensor& src, const Tensor& dst) {
  const Device device = detail::common_device("cast", {&src, &dst});
  BIGBATCH_CHECK(is_f32_or_f16(src.dtype()) && is_f32_or_f16(dst.dtype()),
                 "cast: supports f32 and f16, got ", src.describe(), " -> ", dst.describe());
  detail::check_shape("cast", "dst", dst, src.shape());
  detail::check_same_or_disjoint("cast", "dst", dst, "src", src);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("cast", cuda::cast(src, dst));
  cpu::cast(src, dst);
}

void scale(const Tensor& x, float s) {
  BIGBATCH_CHECK(is_f32_or_f16(x.dtype()), "scale: x must be f32 or f16, got ", x.describe());
  if (x.device().is_cuda()) BIGBATCH_RUN_CUDA("scale", cuda::scale(x, s));
  cpu::scale(x, s);
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  const Device device = detail::common_device("axpy", {&x, &y});
  BIGBATCH_CHECK(is_f32_or_f16(x.dtype()), "axpy: x must be f32 or f16, got ", x.describe());
  BIGBATCH_CHECK(y.dtype() == DType::f32 || (y.dtype() == DType::f16 && x.dtype() == DType::f16),
                 "axpy: y must be f32, or f16 with an f16 x; got y ", y.describe(), " and x ",
                 x.describe());
  detail::check_shape("axpy", "y", y, x.shape());
  detail::check_same_or_disjoint("axpy", "y", y, "x", x);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("axpy", cuda::axpy(alpha, x, y));
  cpu::axpy(alpha, x, y);
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf) {
  const char* op = "unscale_and_check_finite";
  detail::check_dtype(op, "found_inf", found_inf, DType::f32);
  detail::check_shape(op, "found_inf", found_inf, {1});
  for (const Tensor& t : tensors) {
    detail::check_dtype(op, "every tensor", t, DType::f32);
    detail::common_device(op, {&found_inf, &t});
  }
  check_unscale_tensors_apart(op, tensors, found_inf);
  if (found_inf.device().is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::unscale_and_check_finite(tensors, inv_scale, found_inf));
  }
  cpu::unscale_and_check_finite(tensors, inv_scale, found_inf);
}

namespace cpu {

// ---- vector instruction sets --------------------------------------------------------

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::baseline: return "x86-64 baseline (SSE2)";
    case SimdLevel::avx2: return "AVX2";
    case SimdLevel::avx512: return "AVX-512";
  }
  return "?";
}

SimdLevel simd_level_supported() {
  static const SimdLevel supported = [] {
    __builtin_cpu_init();  // we may run before libgcc's own constructor
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
      return SimdLevel::avx512;
    }
    return __builtin_cpu_supports("avx2") ? SimdLevel::avx2 : SimdLevel::baseline;
  }();
  return supported;
}

namespace {
std::atomic<SimdLevel> simd_level_cap{SimdLevel::avx512};
}

SimdLevel simd_level() { return std::min(simd_level_supported(), simd_level_cap.load()); }

SimdLevel set_simd_level_cap(SimdLevel cap) { return simd_level_cap.exchange(cap); }

// ---- the ops ----------------------------------------------------------------------

namespace {

template <class Src, class Dst>
void convert(const Tensor& src, const Tensor& dst) {
  const Src* in = src.data<Src>();
  Dst* out = dst.data<Dst>();
  parallel_for(src.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) store(out + i, load(in + i));
    });
  });
}

void copy_bytes(const Tensor& src, const Tensor& dst) {
  if (src.raw_data() == dst.raw_data()) return;
  const auto* in = static_cast<const char*>(src.raw_data());
  auto* out = static_cast<char*>(dst.raw_data());
  const auto element = static_cast<std::int64_t>(dtype_size(src.dtype()));
  parallel_for(src.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    std::memcpy(out + begin * element, in + begin * element,
                static_cast<std::size_t>((end - begin) * element));
  });
}

template <class T>
void scale_typed(const Tensor& x, float s) {
  T* data = x.data<T>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) store(data + i, load(data + i) * s);
    });
  });
}

template <class X, class Y = float>
void axpy_typed(float alpha, const Tensor& x, const Tensor& y) {
  const X* in = x.data<X>();
  Y* out = y.data<Y>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) {
        const float product = alpha * load(in + i);
        store(out + i, load(out + i) + product);  // an f16 y: rounded once more, on store
      }
    });
  });
}

/// g = g * inv_scale over one tensor; true if any g was inf or NaN before.
bool unscale_one(const Tensor& t, float inv_scale) {
  float* data = t.data<float>();
  std::atomic<bool> any_non_finite{false};
  parallel_for(t.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    std::uint32_t non_finite = 0;
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) {
        // inf or NaN: the exponent field is all ones (an integer test that vectorises)
        const std::uint32_t exponent = scalar_math::float_bits(data[i]) & 0x7f800000u;
        non_finite |= static_cast<std::uint32_t>(exponent == 0x7f800000u);
        data[i] = data[i] * inv_scale;
      }
    });
    if (non_finite != 0) any_non_finite.store(true, std::memory_order_relaxed);
  });
  return any_non_finite.load();
}

}  // namespace

void cast(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) return copy_bytes(src, dst);
  if (src.dtype() == DType::f32) return convert<float, f16>(src, dst);
  convert<f16, float>(src, dst);
}

void scale(const Tensor& x, float s) {
  if (x.dtype() == DType::f16) return scale_typed<f16>(x, s);
  scale_typed<float>(x, s);
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  if (y.dtype() == DType::f16) return axpy_typed<f16, f16>(alpha, x, y);
  if (x.dtype() == DType::f16) return axpy_typed<f16>(alpha, x, y);
  axpy_typed<float>(alpha, x, y);
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf) {
  bool any_non_finite = false;
  for (const Tensor& t : tensors) any_non_finite |= unscale_one(t, inv_scale);
  if (any_non_finite) found_inf.data<float>()[0] = 1.0f;
}

}  // namespace cpu
}  // namespace bigbatch

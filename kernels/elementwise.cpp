#include "kernels/elementwise.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "common/cpu_features.hpp"
#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {
namespace {

/// The dtypes of these ops: f32 and the two 16-bit types of mixed precision.
bool is_f32_or_half(DType dtype) { return dtype == DType::f32 || is_half_width(dtype); }

/// unscale_and_check_finite reads, checks and rewrites every element once. A tensor listed
/// twice, or two tensors sharing memory, would be unscaled twice on the CPU and written by
/// two blocks at once on CUDA (a data race); a tensor sharing found_inf's memory would race
/// with the flag's store. Refuse them all, naming the positions in the list.
void check_unscale_tensors_apart(const char* op, const std::vector<Tensor>& tensors,
                                 const Tensor& found_inf, const char* output_name = "found_inf") {
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
                   op, ": tensors[", k, "] ", t.describe(), " shares memory with ", output_name);
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
  BIGBATCH_CHECK(is_f32_or_half(src.dtype()) && is_f32_or_half(dst.dtype()),
                 "cast: supports f32, f16 and bf16, got ", src.describe(), " -> ", dst.describe());
  detail::check_shape("cast", "dst", dst, src.shape());
  detail::check_same_or_disjoint("cast", "dst", dst, "src", src);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("cast", cuda::cast(src, dst));
  cpu::cast(src, dst);
}

void scale(const Tensor& x, float s) {
  BIGBATCH_CHECK(is_f32_or_half(x.dtype()), "scale: x must be f32, f16 or bf16, got ",
                 x.describe());
  if (x.device().is_cuda()) BIGBATCH_RUN_CUDA("scale", cuda::scale(x, s));
  cpu::scale(x, s);
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  const Device device = detail::common_device("axpy", {&x, &y});
  const bool f64 = x.dtype() == DType::f64 && y.dtype() == DType::f64 && device.is_cpu();
  BIGBATCH_CHECK(is_f32_or_half(x.dtype()) || f64, "axpy: x must be f32, f16 or bf16, got ",
                 x.describe());
  BIGBATCH_CHECK(f64 || y.dtype() == DType::f32 ||
                     (is_half_width(y.dtype()) && x.dtype() == y.dtype()),
                 "axpy: y must be f32, or f16 or bf16 with an x of its dtype (or both f64 on "
                 "the CPU); got y ",
                 y.describe(), " and x ", x.describe());
  detail::check_shape("axpy", "y", y, x.shape());
  detail::check_same_or_disjoint("axpy", "y", y, "x", x);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("axpy", cuda::axpy(alpha, x, y));
  cpu::axpy(alpha, x, y);
}

namespace {

/// The checks both forms of unscale_and_check_finite make on the tensors and found_inf.
void check_unscale_arguments(const char* op, const std::vector<Tensor>& tensors,
                             const Tensor& found_inf) {
  detail::check_dtype(op, "found_inf", found_inf, DType::f32);
  detail::check_shape(op, "found_inf", found_inf, {1});
  for (const Tensor& t : tensors) {
    detail::check_dtype(op, "every tensor", t, DType::f32);
    detail::common_device(op, {&found_inf, &t});
  }
  check_unscale_tensors_apart(op, tensors, found_inf);
}

}  // namespace

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf) {
  const char* op = "unscale_and_check_finite";
  check_unscale_arguments(op, tensors, found_inf);
  if (found_inf.device().is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::unscale_and_check_finite(tensors, inv_scale, found_inf));
  }
  cpu::unscale_and_check_finite(tensors, inv_scale, found_inf);
}

std::int64_t squared_norm_chunks(const std::vector<Tensor>& tensors) {
  std::int64_t chunks = 0;
  for (const Tensor& t : tensors) chunks += (t.numel() + kNormChunk - 1) / kNormChunk;
  return chunks;
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf, const Tensor& squared_norm) {
  const char* op = "unscale_and_check_finite";
  check_unscale_arguments(op, tensors, found_inf);
  detail::check_dtype(op, "squared_norm", squared_norm, DType::f64);
  detail::check_shape(op, "squared_norm", squared_norm, {1});
  detail::common_device(op, {&found_inf, &squared_norm});
  check_unscale_tensors_apart(op, tensors, squared_norm, "squared_norm");
  detail::check_same_or_disjoint(op, "squared_norm", squared_norm, "found_inf", found_inf);
  const Tensor chunk_sums({std::max<std::int64_t>(squared_norm_chunks(tensors), 1)}, DType::f64,
                          found_inf.device(), MemoryCategory::workspace);
  if (found_inf.device().is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::unscale_and_check_finite(tensors, inv_scale, found_inf,
                                                          squared_norm, chunk_sums));
  }
  cpu::unscale_and_check_finite(tensors, inv_scale, found_inf, squared_norm, chunk_sums);
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
    if (cpu_supports(CpuFeature::avx512f) && cpu_supports(CpuFeature::avx512bw) &&
        cpu_supports(CpuFeature::avx512dq) && cpu_supports(CpuFeature::avx512vl)) {
      return SimdLevel::avx512;
    }
    return cpu_supports(CpuFeature::avx2) ? SimdLevel::avx2 : SimdLevel::baseline;
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
        const auto product = static_cast<scalar_math::ComputeType<X>>(alpha) * load(in + i);
        store(out + i, load(out + i) + product);  // a 16-bit y: rounded once more, on store
      }
    });
  });
}

/// 1 when x is inf or NaN, else 0: its exponent field is all ones (an integer test that
/// vectorises, unlike std::isfinite).
inline std::uint32_t non_finite_bit(float x) {
  return static_cast<std::uint32_t>((scalar_math::float_bits(x) & 0x7f800000u) == 0x7f800000u);
}

/// g = g * inv_scale over one tensor; true if any g was inf or NaN before.
bool unscale_one(const Tensor& t, float inv_scale) {
  float* data = t.data<float>();
  std::atomic<bool> any_non_finite{false};
  parallel_for(t.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    std::uint32_t non_finite = 0;
    run_vectorized([&] {
      for (std::int64_t i = begin; i < end; ++i) {
        non_finite |= non_finite_bit(data[i]);
        data[i] = data[i] * inv_scale;
      }
    });
    if (non_finite != 0) any_non_finite.store(true, std::memory_order_relaxed);
  });
  return any_non_finite.load();
}

/// The 32-lane tree of a CUDA warp's shuffle-down sum: for d = 16, 8, 4, 2, 1 lane i < d
/// adds lane i + d; lane 0 ends with the sum. Its order is the one every backend uses.
double warp_tree_sum(double* lanes) {
  for (int d = 16; d > 0; d /= 2) {
    for (int i = 0; i < d; ++i) lanes[i] += lanes[i + d];
  }
  return lanes[0];
}

/// The kNormLanes lane sums combined: the warp tree in each group of 32 lanes, then over the
/// 8 group sums padded to 32. `lanes` is overwritten.
double combine_lanes(double* lanes) {
  double groups[32] = {};
  for (int w = 0; w < kNormLanes / 32; ++w) groups[w] = warp_tree_sum(lanes + 32 * w);
  return warp_tree_sum(groups);
}

/// One chunk of at most kNormChunk elements: g = g * inv_scale, non_finite |= any g was inf
/// or NaN, and the sum of the new g^2 in the order elementwise.hpp states.
double unscale_chunk(float* data, std::int64_t n, float inv_scale, std::uint32_t& non_finite) {
  double lanes[kNormLanes] = {};
  const std::int64_t rows = (n + kNormLanes - 1) / kNormLanes;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = data + r * kNormLanes;
    const int width = static_cast<int>(std::min<std::int64_t>(kNormLanes, n - r * kNormLanes));
    run_vectorized([&] {
      for (int l = 0; l < width; ++l) {
        non_finite |= non_finite_bit(row[l]);
        const float g = row[l] * inv_scale;
        row[l] = g;
        lanes[l] += static_cast<double>(g) * static_cast<double>(g);  // exact square
      }
    });
  }
  return combine_lanes(lanes);
}

}  // namespace

void cast(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) return copy_bytes(src, dst);
  // Through float: exact from either 16-bit type, rounded once into either.
  with_float_type("cast", src.dtype(), [&]<class Src>(Src) {
    with_float_type("cast", dst.dtype(), [&]<class Dst>(Dst) { convert<Src, Dst>(src, dst); });
  });
}

void scale(const Tensor& x, float s) {
  with_float_type("scale", x.dtype(), [&]<class T>(T) { scale_typed<T>(x, s); });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  with_float_type("axpy", x.dtype(), [&]<class X>(X) {
    if (y.dtype() == DType::f32) return axpy_typed<X, float>(alpha, x, y);
    axpy_typed<X, X>(alpha, x, y);  // y has x's 16-bit type, or both are f64 (checked)
  });
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf) {
  bool any_non_finite = false;
  for (const Tensor& t : tensors) any_non_finite |= unscale_one(t, inv_scale);
  if (any_non_finite) found_inf.data<float>()[0] = 1.0f;
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf, const Tensor& squared_norm,
                              const Tensor& chunk_sums) {
  double* sums = chunk_sums.data<double>();
  std::atomic<bool> any_non_finite{false};
  std::int64_t first_chunk = 0;
  for (const Tensor& t : tensors) {
    float* data = t.data<float>();
    const std::int64_t n = t.numel();
    const std::int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    // Whole chunks per thread: a chunk's sum never depends on the thread count.
    parallel_for(chunks, kElementwiseGrain / kNormChunk, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t c = begin; c < end; ++c) {
        std::uint32_t non_finite = 0;
        sums[first_chunk + c] =
            unscale_chunk(data + c * kNormChunk, std::min(kNormChunk, n - c * kNormChunk),
                          inv_scale, non_finite);
        if (non_finite != 0) any_non_finite.store(true, std::memory_order_relaxed);
      }
    });
    first_chunk += chunks;
  }
  // The chunks' sums as a chunk's elements: lane c % 256 adds chunk sum c, in order.
  double lanes[kNormLanes] = {};
  for (std::int64_t c = 0; c < first_chunk; ++c) lanes[c % kNormLanes] += sums[c];
  squared_norm.data<double>()[0] = combine_lanes(lanes);
  if (any_non_finite.load()) found_inf.data<float>()[0] = 1.0f;
}

}  // namespace cpu
}  // namespace bigbatch

#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.hpp"

namespace bigbatch::cuda {
namespace {

template <class Src, class Dst>
__global__ void convert_kernel(const Src* in, Dst* out, std::int64_t n) {
  for (const std::int64_t i : grid_stride(n)) {
    out[i] = from_float<Dst>(to_float(in[i]));
  }
}

template <class T>
__global__ void scale_kernel(T* data, std::int64_t n, float s) {
  for (const std::int64_t i : grid_stride(n)) {
    data[i] = from_float<T>(__fmul_rn(to_float(data[i]), s));
  }
}

template <class X, class Y>
__global__ void axpy_kernel(float alpha, const X* x, Y* y, std::int64_t n) {
  for (const std::int64_t i : grid_stride(n)) {
    // two roundings, as on the CPU: nvcc would otherwise fuse this into an fma (and a
    // third, to y's type, when y is f16 or bf16)
    y[i] = from_float<Y>(__fadd_rn(to_float(y[i]), __fmul_rn(alpha, to_float(x[i]))));
  }
}

// Up to kTensorsPerLaunch tensors per launch, passed by value in the kernel's parameters;
// blockIdx.y picks the tensor, a grid-stride loop over x covers it.
constexpr int kTensorsPerLaunch = 48;
struct TensorList {
  float* data[kTensorsPerLaunch];
  std::int64_t numel[kTensorsPerLaunch];
};

__global__ void unscale_kernel(TensorList list, float inv_scale, float* found_inf) {
  float* data = list.data[blockIdx.y];
  const std::int64_t n = list.numel[blockIdx.y];
  bool non_finite = false;
  for (const std::int64_t i : grid_stride(n)) {
    const float g = data[i];
    non_finite |= !isfinite(g);
    data[i] = __fmul_rn(g, inv_scale);
  }
  // Every writer stores the same 1.0f, so the unordered stores need no atomic.
  if (non_finite) *found_inf = 1.0f;
}

// One block of kNormLanes threads per chunk of kNormChunk elements (blockIdx.x: the chunk,
// blockIdx.y: the tensor): unscale, check, and the chunk's sum of squares in the order
// elementwise.hpp states (the CPU computes the same sums, term for term).
struct ChunkOffsets {
  std::int64_t first[kTensorsPerLaunch];  // the tensor's first chunk in chunk_sums
};

__device__ inline double warp_tree_sum(double value) {
  for (int d = 16; d > 0; d /= 2) value = __dadd_rn(value, __shfl_down_sync(0xffffffffu, value, d));
  return value;
}

/// The lane sums of a block of kNormLanes threads combined: the warp tree in each group of
/// 32, then over the 8 group sums padded to 32. Lane 0 gets the result; every thread of the
/// block must call it (it synchronises the block).
__device__ inline double combine_lanes(double sum) {
  __shared__ double group_sums[kNormLanes / 32];
  const int lane = static_cast<int>(threadIdx.x);
  sum = warp_tree_sum(sum);
  if (lane % 32 == 0) group_sums[lane / 32] = sum;
  __syncthreads();
  if (lane < 32) sum = warp_tree_sum(lane < kNormLanes / 32 ? group_sums[lane] : 0.0);
  return sum;
}

__global__ void unscale_norm_kernel(TensorList list, ChunkOffsets offsets, float inv_scale,
                                    float* found_inf, double* chunk_sums) {
  float* data = list.data[blockIdx.y];
  const std::int64_t n = list.numel[blockIdx.y];
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * kNormChunk;
  if (begin >= n) return;  // the grid covers the largest tensor; the whole block leaves
  const int lane = static_cast<int>(threadIdx.x);
  bool non_finite = false;
  double sum = 0.0;
  for (std::int64_t i = begin + lane; i < begin + kNormChunk && i < n; i += kNormLanes) {
    const float g = data[i];
    non_finite |= !isfinite(g);
    const float unscaled = __fmul_rn(g, inv_scale);
    data[i] = unscaled;
    sum = __dadd_rn(sum, __dmul_rn(unscaled, unscaled));  // the square is exact
  }
  sum = combine_lanes(sum);
  if (lane == 0) chunk_sums[offsets.first[blockIdx.y] + blockIdx.x] = sum;
  if (non_finite) *found_inf = 1.0f;
}

// The chunks' sums combined as a chunk's elements (elementwise.hpp), by one block: lane l adds
// chunk sums l, l + 256, ... in order, then the lanes meet in the same trees.
__global__ void sum_chunks_kernel(const double* chunk_sums, std::int64_t n, double* total) {
  double sum = 0.0;
  for (std::int64_t c = threadIdx.x; c < n; c += kNormLanes) sum = __dadd_rn(sum, chunk_sums[c]);
  sum = combine_lanes(sum);
  if (threadIdx.x == 0) *total = sum;
}

template <class Src, class Dst>
void launch_convert(const Tensor& src, const Tensor& dst) {
  convert_kernel<<<grid_for(src.numel()), kThreadsPerBlock>>>(src.data<Src>(), dst.data<Dst>(),
                                                              src.numel());
  BIGBATCH_CHECK_LAUNCH("convert_kernel");
}

template <class T>
void launch_scale(const Tensor& x, float s) {
  scale_kernel<<<grid_for(x.numel()), kThreadsPerBlock>>>(x.data<T>(), x.numel(), s);
  BIGBATCH_CHECK_LAUNCH("scale_kernel");
}

template <class X, class Y>
void launch_axpy(float alpha, const Tensor& x, const Tensor& y) {
  axpy_kernel<<<grid_for(x.numel()), kThreadsPerBlock>>>(alpha, x.data<X>(), y.data<Y>(),
                                                         x.numel());
  BIGBATCH_CHECK_LAUNCH("axpy_kernel");
}

}  // namespace

void cast(const Tensor& src, const Tensor& dst) {
  if (src.numel() == 0) return;
  if (src.dtype() == dst.dtype()) {
    if (src.raw_data() != dst.raw_data()) {
      cuda_rt::memcpy(dst.raw_data(), src.raw_data(), src.nbytes(),
                      cuda_rt::CopyKind::device_to_device);
    }
    return;
  }
  // Through float: exact from either 16-bit type, rounded once into either.
  dispatch_floating("cast", src.dtype(), [&]<class Src>(ElementType<Src>) {
    dispatch_floating("cast", dst.dtype(), [&]<class Dst>(ElementType<Dst>) {
      launch_convert<Src, Dst>(src, dst);
    });
  });
}

void scale(const Tensor& x, float s) {
  if (x.numel() == 0) return;
  dispatch_floating("scale", x.dtype(), [&]<class T>(ElementType<T>) { launch_scale<T>(x, s); });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  if (x.numel() == 0) return;
  dispatch_floating("axpy", x.dtype(), [&]<class X>(ElementType<X>) {
    if (y.dtype() == DType::f32) return launch_axpy<X, float>(alpha, x, y);
    launch_axpy<X, X>(alpha, x, y);  // y has x's 16-bit type (checked)
  });
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf) {
  for (std::size_t first = 0; first < tensors.size(); first += kTensorsPerLaunch) {
    const std::size_t count = std::min<std::size_t>(kTensorsPerLaunch, tensors.size() - first);
    TensorList list{};
    std::int64_t largest = 0;
    for (std::size_t k = 0; k < count; ++k) {
      list.data[k] = tensors[first + k].data<float>();
      list.numel[k] = tensors[first + k].numel();
      largest = std::max(largest, list.numel[k]);
    }
    if (largest == 0) continue;
    const dim3 grid(grid_for(largest), static_cast<unsigned>(count));
    unscale_kernel<<<grid, kThreadsPerBlock>>>(list, inv_scale, found_inf.data<float>());
    BIGBATCH_CHECK_LAUNCH("unscale_kernel");
  }
}

void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf, const Tensor& squared_norm,
                              const Tensor& chunk_sums) {
  std::int64_t first_chunk = 0;
  for (std::size_t first = 0; first < tensors.size(); first += kTensorsPerLaunch) {
    const std::size_t count = std::min<std::size_t>(kTensorsPerLaunch, tensors.size() - first);
    TensorList list{};
    ChunkOffsets offsets{};
    std::int64_t most_chunks = 0;
    for (std::size_t k = 0; k < count; ++k) {
      const std::int64_t n = tensors[first + k].numel();
      list.data[k] = tensors[first + k].data<float>();
      list.numel[k] = n;
      offsets.first[k] = first_chunk;
      first_chunk += (n + kNormChunk - 1) / kNormChunk;
      most_chunks = std::max(most_chunks, (n + kNormChunk - 1) / kNormChunk);
    }
    if (most_chunks == 0) continue;
    const dim3 grid(static_cast<unsigned>(most_chunks), static_cast<unsigned>(count));
    unscale_norm_kernel<<<grid, kNormLanes>>>(list, offsets, inv_scale, found_inf.data<float>(),
                                              chunk_sums.data<double>());
    BIGBATCH_CHECK_LAUNCH("unscale_norm_kernel");
  }
  sum_chunks_kernel<<<1, kNormLanes>>>(chunk_sums.data<double>(), first_chunk,
                                       squared_norm.data<double>());
  BIGBATCH_CHECK_LAUNCH("sum_chunks_kernel");
}

}  // namespace bigbatch::cuda

// layernorm.cu: LayerNorm on the GPU (the contract is in layernorm.hpp).
//
// Forward and dx: one block per row; the row's sums are block reductions with a fixed tree,
// so a row's result does not depend on the grid or on the other rows (and differs from the
// CPU's sequential sums by rounding only). dweight and dbias: reduction_order.hpp's order 1
// (tiles of 32 rows summed by many blocks, then the tiles in order), with unfused float
// operations (__fmul_rn, __fadd_rn): deterministic, and bit for bit the same for
// micro-batches whose rows are multiples of 32; it differs from the CPU's row order by
// rounding.
// Elsewhere nvcc may contract a*b+c into a fused multiply-add: rounding differences only.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_row_sums.cuh"
#include "kernels/layernorm.hpp"

namespace bigbatch::cuda {
namespace {

template <class T>
__global__ void forward_kernel(const T* x, const float* weight, const float* bias, T* y,
                               float* mean, float* rstd, std::int64_t M, std::int64_t N,
                               float eps) {
  for (std::int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const T* row = x + i * N;
    float sum = 0.0f;
    for (std::int64_t j = threadIdx.x; j < N; j += blockDim.x) sum += to_float(row[j]);
    const float mu = block_sum(sum) / static_cast<float>(N);
    float squared_deviations = 0.0f;
    for (std::int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const float deviation = to_float(row[j]) - mu;
      squared_deviations += deviation * deviation;
    }
    const float r =
        detail::inverse_std(block_sum(squared_deviations) / static_cast<float>(N), eps);
    T* out = y + i * N;
    for (std::int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const float xhat = detail::normalize(to_float(row[j]), mu, r);
      out[j] = from_float<T>(xhat * weight[j] + bias[j]);
    }
    if (threadIdx.x == 0) {
      mean[i] = mu;
      rstd[i] = r;
    }
  }
}

/// dx = rstd * ((g - mean(g)) - xhat * mean(g * xhat)), g = dy * weight, one block per row.
template <class T>
__global__ void input_gradient_kernel(const T* x, const float* weight, const float* mean,
                                      const float* rstd, const T* dy, T* dx, std::int64_t M,
                                      std::int64_t N) {
  for (std::int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const T* x_row = x + i * N;
    const T* dy_row = dy + i * N;
    const float mu = mean[i], r = rstd[i];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (std::int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const float g = to_float(dy_row[j]) * weight[j];
      sum_g += g;
      sum_g_xhat += g * detail::normalize(to_float(x_row[j]), mu, r);
    }
    const float mean_g = block_sum(sum_g) / static_cast<float>(N);
    const float mean_g_xhat = block_sum(sum_g_xhat) / static_cast<float>(N);
    T* dx_row = dx + i * N;
    for (std::int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const float g = to_float(dy_row[j]) * weight[j];
      const float xhat = detail::normalize(to_float(x_row[j]), mu, r);
      dx_row[j] = from_float<T>(r * ((g - mean_g) - xhat * mean_g_xhat));
    }
  }
}

/// The parameter gradients' terms for reduction_order.hpp's order 1: k = 0 is dy * xhat
/// (dweight), k = 1 is dy (dbias).
template <class T>
struct ParameterGradientTerms {
  const T* x;
  const float* mean;
  const float* rstd;
  const T* dy;
  std::int64_t N;
  __device__ float operator()(int k, std::int64_t i, std::int64_t j) const {
    const float g = to_float(dy[i * N + j]);
    if (k == 1) return g;
    return __fmul_rn(g, detail::normalize(to_float(x[i * N + j]), mean[i], rstd[i]));
  }
};

/// dweight[j] += the dy * xhat tiles, dbias[j] += the dy tiles, each in tile order.
__global__ void parameter_gradient_fold_kernel(const float* partials, float* dweight,
                                               float* dbias, std::int64_t tiles,
                                               std::int64_t N) {
  for (const std::int64_t j : grid_stride(N)) {
    dweight[j] = fold_column_tiles(dweight[j], partials, tiles, N, j);
    dbias[j] = fold_column_tiles(dbias[j], partials + tiles * N, tiles, N, j);
  }
}

template <class T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd, float eps) {
  const std::int64_t M = x.dim(0), N = x.dim(1);
  if (M == 0) return;
  forward_kernel<T><<<row_blocks(M), kThreadsPerBlock>>>(
      x.data<T>(), weight.data<float>(), bias.data<float>(), y.data<T>(), mean.data<float>(),
      rstd.data<float>(), M, N, eps);
  BIGBATCH_CHECK_LAUNCH("layernorm forward_kernel");
}

template <class T>
void backward_typed(const Tensor& x, const Tensor& weight, const Tensor& mean,
                    const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                    const Tensor& dweight, const Tensor& dbias) {
  const std::int64_t M = x.dim(0), N = x.dim(1);
  if (M == 0) return;
  // The parameter gradients first, so that dx may be dy or x itself: the stream runs the
  // launches in order, and input_gradient_kernel writes each dx element after the last
  // read of it, by the same thread (layernorm.hpp: memory sharing).
  const std::int64_t tiles = reduction_order::tile_count(M);
  const Tensor partials({2, tiles, N}, DType::f32, x.device(), MemoryCategory::workspace);
  launch_column_tile_sums<2>(
      "layernorm column_tile_sums_kernel",
      ParameterGradientTerms<T>{x.data<T>(), mean.data<float>(), rstd.data<float>(),
                                dy.data<T>(), N},
      partials.data<float>(), M, N);
  parameter_gradient_fold_kernel<<<grid_for(N), kThreadsPerBlock>>>(
      partials.data<float>(), dweight.data<float>(), dbias.data<float>(), tiles, N);
  BIGBATCH_CHECK_LAUNCH("layernorm parameter_gradient_fold_kernel");
  input_gradient_kernel<T><<<row_blocks(M), kThreadsPerBlock>>>(
      x.data<T>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<T>(),
      dx.data<T>(), M, N);
  BIGBATCH_CHECK_LAUNCH("layernorm input_gradient_kernel");
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps) {
  dispatch_floating("layernorm_forward", x.dtype(), [&]<class T>(ElementType<T>) {
    forward_typed<T>(x, weight, bias, y, mean, rstd, eps);
  });
}

void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                        const Tensor& dweight, const Tensor& dbias) {
  dispatch_floating("layernorm_backward", x.dtype(), [&]<class T>(ElementType<T>) {
    backward_typed<T>(x, weight, mean, rstd, dy, dx, dweight, dbias);
  });
}

}  // namespace bigbatch::cuda

#include "common/rng.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/dropout.hpp"

namespace bigbatch::cuda {
namespace {

__device__ inline float load(float x) { return x; }
__device__ inline float load(__half x) { return __half2float(x); }
__device__ inline void store(float* out, float value) { *out = value; }
__device__ inline void store(__half* out, float value) { *out = __float2half_rn(value); }

// out[e] = in[e] * (kept ? scale : 0), element e having global index first_index + e:
// the same mask and the same product as the CPU (dropout.hpp).
template <class T>
__global__ void dropout_kernel(const T* in, T* out, std::int64_t n, std::uint64_t first_index,
                               std::uint64_t seed, std::uint64_t stream, float p, float scale) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float u = random_uniform(seed, stream, first_index + static_cast<std::uint64_t>(i));
    store(out + i, __fmul_rn(load(in[i]), u >= p ? scale : 0.0f));
  }
}

void launch_dropout(const Tensor& in, const Tensor& out, const DropoutSpec& spec) {
  const std::int64_t n = in.numel();
  if (n == 0) return;
  const std::uint64_t first_index = detail::dropout_first_index(in, spec);
  const float scale = detail::dropout_keep_scale(spec.p);
  if (in.dtype() == DType::f16) {
    dropout_kernel<<<grid_for(n), kThreadsPerBlock>>>(in.data<__half>(), out.data<__half>(), n,
                                                      first_index, spec.seed, spec.stream, spec.p,
                                                      scale);
  } else {
    dropout_kernel<<<grid_for(n), kThreadsPerBlock>>>(
        in.data<float>(), out.data<float>(), n, first_index, spec.seed, spec.stream, spec.p, scale);
  }
  BIGBATCH_CHECK_LAUNCH("dropout_kernel");
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  launch_dropout(x, y, spec);
}

void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec) {
  launch_dropout(dy, dx, spec);
}

}  // namespace bigbatch::cuda

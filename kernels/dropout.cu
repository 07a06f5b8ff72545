#include "common/rng.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/dropout.hpp"

namespace bigbatch::cuda {
namespace {

// out[e] = in[e] * (kept ? scale : 0), element e having global index first_index + e:
// the same mask and the same product as the CPU (dropout.hpp). One thread per group of
// four consecutive global indices, whose four random words one Philox evaluation gives
// (common/rng.hpp); the first and last groups may lie partly outside the tensor.
template <class T>
__global__ void dropout_kernel(const T* in, T* out, std::int64_t n, std::uint64_t first_index,
                               std::int64_t groups, std::uint64_t seed, std::uint64_t stream,
                               float p, float scale) {
  const std::uint64_t first_group = first_index / 4;
  for (const std::int64_t g : grid_stride(groups)) {
    const std::uint64_t group = first_group + static_cast<std::uint64_t>(g);
    const Philox4x32 words = random_group(seed, stream, group);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // e is in [-3, n + 3): negative before the tensor, n and up after it
      const auto e =
          static_cast<std::int64_t>(4 * group + static_cast<std::uint64_t>(w) - first_index);
      if (e < 0 || e >= n) continue;
      out[e] = from_float<T>(
          __fmul_rn(to_float(in[e]), uniform_from_bits(words.v[w]) >= p ? scale : 0.0f));
    }
  }
}

void launch_dropout(const char* op, const Tensor& in, const Tensor& out,
                    const DropoutSpec& spec) {
  const std::int64_t n = in.numel();
  if (n == 0) return;
  const std::uint64_t first_index = detail::dropout_first_index(in, spec);
  // the groups holding global indices first_index .. first_index + n - 1
  const auto groups = static_cast<std::int64_t>(
      (first_index + static_cast<std::uint64_t>(n) - 1) / 4 - first_index / 4 + 1);
  const float scale = detail::dropout_keep_scale(spec.p);
  dispatch_f16_f32(op, in.dtype(), [&]<class T>(ElementType<T>) {
    dropout_kernel<<<grid_for(groups), kThreadsPerBlock>>>(in.data<T>(), out.data<T>(), n,
                                                           first_index, groups, spec.seed,
                                                           spec.stream, spec.p, scale);
  });
  BIGBATCH_CHECK_LAUNCH("dropout_kernel");
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  launch_dropout("dropout_forward", x, y, spec);
}

void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec) {
  launch_dropout("dropout_backward", dy, dx, spec);
}

}  // namespace bigbatch::cuda

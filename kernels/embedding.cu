// embedding.cu: token and position embeddings on the GPU (the contract is in embedding.hpp).
//
// Forward: one thread per output element. Backward: the scatter-add in the CPU's order, so
// both backends compute the same bits: one thread per (token-table row, channel) walks all
// positions in order and adds those whose token is its row; one thread per (position,
// channel) adds the sequences in order. No atomics, so nothing depends on timing.
#include "kernels/cuda_common.cuh"
#include "kernels/embedding.hpp"

namespace bigbatch::cuda {
namespace {

/// Positions whose tokens a block stages in shared memory at a time.
constexpr int kTokenTile = 1024;

template <class T>
__global__ void forward_kernel(const std::int32_t* tokens, const T* wte, const T* wpe, T* out,
                               std::int64_t positions, std::int64_t T_, std::int64_t C,
                               std::int64_t V) {
  for (const std::int64_t k : grid_stride(positions * C)) {
    const std::int64_t bt = k / C, c = k % C;
    const std::int32_t token = tokens[bt];
    // A token outside [0, V) (not checked on the device) gives NaN, never a wild read.
    const float w =
        (token >= 0 && token < V) ? to_float(wte[token * C + c]) : __int_as_float(0x7fc00000);
    out[k] = from_float<T>(__fadd_rn(w, to_float(wpe[(bt % T_) * C + c])));
  }
}

/// dwte[v][c] += dout[bt][c] for every position bt whose token is v, in position order.
/// Thread (blockIdx.y = v, channel c); the block stages tokens kTokenTile at a time.
template <class T>
__global__ void token_gradient_kernel(const std::int32_t* tokens, const T* dout, float* dwte,
                                      std::int64_t positions, std::int64_t C, std::int64_t V) {
  __shared__ std::int32_t tile[kTokenTile];
  const std::int64_t c = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  for (std::int64_t v = blockIdx.y; v < V; v += gridDim.y) {
    float acc = c < C ? dwte[v * C + c] : 0.0f;
    for (std::int64_t first = 0; first < positions; first += kTokenTile) {
      const std::int64_t count = positions - first < kTokenTile ? positions - first : kTokenTile;
      __syncthreads();  // the previous tile is no longer read
      for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) tile[k] = tokens[first + k];
      __syncthreads();
      if (c < C) {
        for (std::int64_t k = 0; k < count; ++k) {
          if (tile[k] == v) acc = __fadd_rn(acc, to_float(dout[(first + k) * C + c]));
        }
      }
    }
    if (c < C) dwte[v * C + c] = acc;
  }
}

/// dwpe[t][c] += dout[b][t][c] for b = 0, 1, ..., B - 1 in order; one thread per (t, c).
template <class T>
__global__ void position_gradient_kernel(const T* dout, float* dwpe, std::int64_t B,
                                         std::int64_t T_, std::int64_t C) {
  for (const std::int64_t k : grid_stride(T_ * C)) {
    float acc = dwpe[k];
    for (std::int64_t b = 0; b < B; ++b) acc = __fadd_rn(acc, to_float(dout[b * T_ * C + k]));
    dwpe[k] = acc;
  }
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out) {
  const std::int64_t positions = tokens.numel(), C = wte.dim(1);
  if (positions * C == 0) return;
  dispatch_floating("embedding_forward", out.dtype(), [&]<class T>(ElementType<T>) {
    forward_kernel<T><<<grid_for(positions * C), kThreadsPerBlock>>>(
        tokens.data<std::int32_t>(), wte.data<T>(), wpe.data<T>(), out.data<T>(), positions,
        tokens.dim(1), C, wte.dim(0));
    BIGBATCH_CHECK_LAUNCH("embedding forward_kernel");
  });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe) {
  const std::int64_t B = tokens.dim(0), T_ = tokens.dim(1), C = dwte.dim(1), V = dwte.dim(0);
  if (B * T_ * C == 0) return;
  dispatch_floating("embedding_backward", dout.dtype(), [&]<class T>(ElementType<T>) {
    const dim3 grid(static_cast<unsigned>((C + kThreadsPerBlock - 1) / kThreadsPerBlock),
                    static_cast<unsigned>(V < 65535 ? V : 65535));
    token_gradient_kernel<T><<<grid, kThreadsPerBlock>>>(
        tokens.data<std::int32_t>(), dout.data<T>(), dwte.data<float>(), B * T_, C, V);
    BIGBATCH_CHECK_LAUNCH("embedding token_gradient_kernel");
    position_gradient_kernel<T>
        <<<grid_for(T_ * C), kThreadsPerBlock>>>(dout.data<T>(), dwpe.data<float>(), B, T_, C);
    BIGBATCH_CHECK_LAUNCH("embedding position_gradient_kernel");
  });
}

}  // namespace bigbatch::cuda

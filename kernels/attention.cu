// attention.cu: causal multi-head self-attention on the GPU (the contract is in
// attention.hpp).
//
// The reference kernels: they run the header's chains in the header's order, so they
// compute the CPU's bits, one block per query row (forward, dq) or key row (dk, dv), a
// thread per key, query or channel, with the row's scores in shared memory. Every sum is
// sequential in its documented order; the row's max (exact in any order) is a block
// reduction. Every product and sum is an explicit round-to-nearest intrinsic (nvcc would
// otherwise contract a*b+c into an fma and change the bits).
// The production alternatives are cuBLAS's strided-batched GEMMs for q k^T and P v (what
// nanoGPT's manual path and llm.c run) and cuDNN's fused attention; both reorder the sums
// and so give up the bit-for-bit agreement these kernels are tested for.
#include "kernels/attention.hpp"
#include "kernels/cuda_common.cuh"

namespace bigbatch::cuda {
namespace {

using detail::AttentionMask;

/// Where the query, key and value of head h at position t of sequence b start in qkv.
struct HeadLayout {
  std::int64_t T, C, D;
  __device__ std::int64_t q(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * T + t) * 3 * C + h * D;
  }
  __device__ std::int64_t k(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return q(b, t, h) + C;
  }
  __device__ std::int64_t v(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return q(b, t, h) + 2 * C;
  }
};

/// a . b over D channels: a chain from 0 in channel order, each step rounded twice.
template <class T>
__device__ float dot(const T* a, const T* b, std::int64_t D) {
  float acc = 0.0f;
  for (std::int64_t d = 0; d < D; ++d)
    acc = __fadd_rn(acc, __fmul_rn(to_float(a[d]), to_float(b[d])));
  return acc;
}

/// out[d] = sum over j < keys of weights[j] * rows[j * stride + d] for the D channels, one
/// thread per channel, each a chain from 0 in key order, rounded once to T at the end.
template <class T>
__device__ void store_weighted_sum(const float* weights, std::int64_t keys, const T* rows,
                                   std::int64_t stride, std::int64_t D, T* out) {
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t j = 0; j < keys; ++j) {
      acc = __fadd_rn(acc, __fmul_rn(weights[j], to_float(rows[j * stride + d])));
    }
    out[d] = from_float<T>(acc);
  }
}

/// One block per (query i, head h, sequence b): P[b][h][i][:] and y[b][i][h*D:(h+1)*D].
template <class T>
__global__ void forward_kernel(const T* qkv, T* y, T* probabilities, HeadLayout layout, float scale,
                               AttentionMask mask) {
  extern __shared__ float row[];  // [T]: scores, then exponentials, then m_ij P_ij
  __shared__ float total;
  const std::int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t T_ = layout.T, D = layout.D, keys = i + 1;
  const T* q = qkv + layout.q(b, i, h);
  float max = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    row[j] = __fmul_rn(dot(q, qkv + layout.k(b, j, h), D), scale);
    max = fmaxf(max, row[j]);
  }
  max = block_max(max);
  for (std::int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    row[j] = activation_math::exp_nonpositive(__fsub_rn(row[j], max));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (std::int64_t j = 0; j < keys; ++j) sum = __fadd_rn(sum, row[j]);
    total = sum;
  }
  __syncthreads();
  T* p_row = probabilities + ((b * gridDim.y + h) * T_ + i) * T_;
  for (std::int64_t j = threadIdx.x; j < T_; j += blockDim.x) {
    if (j < keys) {
      const T p = from_float<T>(__fdiv_rn(row[j], total));
      p_row[j] = p;
      row[j] = __fmul_rn(to_float(p), mask.factor(b, h, i, j));  // as stored, then dropped
    } else {
      p_row[j] = from_float<T>(0.0f);
    }
  }
  if (y == nullptr) return;  // P alone (the same for every thread of the block)
  __syncthreads();
  store_weighted_sum(row, keys, qkv + layout.v(b, 0, h), 3 * layout.C, D,
                     y + (b * T_ + i) * layout.C + h * D);
}

/// One block per (query i, head h, sequence b): r_i and dq_i.
template <class T>
__global__ void query_gradient_kernel(const T* qkv, const T* probabilities, const T* dy, T* dqkv,
                                      float* row_sums, HeadLayout layout, float scale,
                                      AttentionMask mask) {
  extern __shared__ float g[];  // [T]: dP_ij, then g_ij
  __shared__ float r;
  const std::int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t T_ = layout.T, D = layout.D, keys = i + 1;
  const T* dy_i = dy + (b * T_ + i) * layout.C + h * D;
  const T* p_row = probabilities + ((b * gridDim.y + h) * T_ + i) * T_;
  for (std::int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    g[j] = __fmul_rn(dot(dy_i, qkv + layout.v(b, j, h), D), mask.factor(b, h, i, j));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (std::int64_t j = 0; j < keys; ++j)
      sum = __fadd_rn(sum, __fmul_rn(to_float(p_row[j]), g[j]));
    r = sum;
    row_sums[(b * gridDim.y + h) * T_ + i] = sum;
  }
  __syncthreads();
  for (std::int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    g[j] = detail::attention_score_gradient(to_float(p_row[j]), g[j], r, scale);
  }
  __syncthreads();
  store_weighted_sum(g, keys, qkv + layout.k(b, 0, h), 3 * layout.C, D, dqkv + layout.q(b, i, h));
}

/// One block per (key j, head h, sequence b): dk_j and dv_j, over the queries i >= j in
/// order, with g_ij recomputed from the stored P and the row sums r_i.
template <class T>
__global__ void key_value_gradient_kernel(const T* qkv, const T* probabilities, const T* dy,
                                          T* dqkv, const float* row_sums, HeadLayout layout,
                                          float scale, AttentionMask mask) {
  extern __shared__ float column[];  // [2T]: g_ij, then m_ij P_ij, for the queries i >= j
  const std::int64_t j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t T_ = layout.T, D = layout.D;
  float* g = column;
  float* dropped = column + T_;
  const std::int64_t bh = b * gridDim.y + h;
  for (std::int64_t i = j + threadIdx.x; i < T_; i += blockDim.x) {
    const float factor = mask.factor(b, h, i, j);
    const float d_probability =
        __fmul_rn(dot(dy + (b * T_ + i) * layout.C + h * D, qkv + layout.v(b, j, h), D), factor);
    const float p = to_float(probabilities[(bh * T_ + i) * T_ + j]);
    g[i] = detail::attention_score_gradient(p, d_probability, row_sums[bh * T_ + i], scale);
    dropped[i] = __fmul_rn(p, factor);
  }
  __syncthreads();
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float dk = 0.0f, dv = 0.0f;
    for (std::int64_t i = j; i < T_; ++i) {
      dk = __fadd_rn(dk, __fmul_rn(g[i], to_float(qkv[layout.q(b, i, h) + d])));
      dv = __fadd_rn(dv, __fmul_rn(dropped[i], to_float(dy[(b * T_ + i) * layout.C + h * D + d])));
    }
    dqkv[layout.k(b, j, h) + d] = from_float<T>(dk);
    dqkv[layout.v(b, j, h) + d] = from_float<T>(dv);
  }
}

/// The grid of one block per (row, head, sequence), refused with a clear error past the
/// hardware's limits or past the shared memory a block may hold.
dim3 row_grid(const char* op, std::int64_t B, std::int64_t heads, std::int64_t T_,
              std::size_t shared_bytes) {
  BIGBATCH_CHECK(B <= 65535 && heads <= 65535 && T_ <= 2147483647, op,
                 ": the reference kernels take at most 65535 sequences and heads, got B = ", B,
                 ", heads = ", heads);
  BIGBATCH_CHECK(shared_bytes <= 48 * 1024, op, ": T = ", T_,
                 " needs more shared memory per block than the reference kernels use (48 KiB)");
  return dim3(static_cast<unsigned>(T_), static_cast<unsigned>(heads), static_cast<unsigned>(B));
}

}  // namespace

void causal_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                              std::int64_t heads, const DropoutSpec& dropout) {
  constexpr const char* op = "causal_attention_forward";
  const std::int64_t B = qkv.dim(0), T_ = qkv.dim(1), C = qkv.dim(2) / 3;
  if (B * T_ == 0) return;
  const HeadLayout layout{T_, C, C / heads};
  const AttentionMask mask = detail::attention_mask(dropout, heads, T_);
  const std::size_t shared = static_cast<std::size_t>(T_) * sizeof(float);
  const dim3 grid = row_grid(op, B, heads, T_, shared);
  dispatch_floating(op, qkv.dtype(), [&]<class T>(ElementType<T>) {
    forward_kernel<T><<<grid, kThreadsPerBlock, shared>>>(qkv.data<T>(),
                                                          y.defined() ? y.data<T>() : nullptr,
                                                          probabilities.data<T>(), layout,
                                                          attention_scale(layout.D), mask);
    BIGBATCH_CHECK_LAUNCH("attention forward_kernel");
  });
}

void causal_attention_backward(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                               const Tensor& dqkv, std::int64_t heads, const DropoutSpec& dropout,
                               const Tensor& row_sums) {
  constexpr const char* op = "causal_attention_backward";
  const std::int64_t B = qkv.dim(0), T_ = qkv.dim(1), C = qkv.dim(2) / 3;
  if (B * T_ == 0) return;
  const HeadLayout layout{T_, C, C / heads};
  const AttentionMask mask = detail::attention_mask(dropout, heads, T_);
  const float scale = attention_scale(layout.D);
  const std::size_t shared = 2 * static_cast<std::size_t>(T_) * sizeof(float);
  const dim3 grid = row_grid(op, B, heads, T_, shared);
  dispatch_floating(op, qkv.dtype(), [&]<class T>(ElementType<T>) {
    query_gradient_kernel<T><<<grid, kThreadsPerBlock, shared / 2>>>(
        qkv.data<T>(), probabilities.data<T>(), dy.data<T>(), dqkv.data<T>(),
        row_sums.data<float>(), layout, scale, mask);
    BIGBATCH_CHECK_LAUNCH("attention query_gradient_kernel");
    key_value_gradient_kernel<T><<<grid, kThreadsPerBlock, shared>>>(
        qkv.data<T>(), probabilities.data<T>(), dy.data<T>(), dqkv.data<T>(),
        row_sums.data<float>(), layout, scale, mask);
    BIGBATCH_CHECK_LAUNCH("attention key_value_gradient_kernel");
  });
}

}  // namespace bigbatch::cuda

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

// ---- memory-efficient attention: tiles of kKeyTile keys (or queries) in shared memory ----

/// One block per (query i, head h, sequence b): y[b][i][h] and the row's (m, l), the keys
/// visited in tiles with the running max, sum and output (the header's order).
template <class T>
__global__ void efficient_forward_kernel(const T* qkv, T* y, float* row_stats, HeadLayout layout,
                                         float scale, AttentionMask mask) {
  extern __shared__ float shared[];
  float* e = shared;                   // [kKeyTile]: the tile's exponentials
  float* weight = shared + kKeyTile;   // [kKeyTile]: the same times the mask factors
  float* acc = shared + 2 * kKeyTile;  // [D]: the running output
  __shared__ float run_max, run_sum;
  const std::int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t D = layout.D, keys = i + 1;
  const T* q = qkv + layout.q(b, i, h);
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) acc[d] = 0.0f;
  if (threadIdx.x == 0) {
    run_max = -INFINITY;
    run_sum = 0.0f;
  }
  __syncthreads();
  for (std::int64_t t0 = 0; t0 < keys; t0 += kKeyTile) {
    const std::int64_t n = (keys - t0 < kKeyTile ? keys - t0 : kKeyTile);
    float local_max = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      e[j] = __fmul_rn(dot(q, qkv + layout.k(b, t0 + j, h), D), scale);
      local_max = fmaxf(local_max, e[j]);
    }
    const float new_max = fmaxf(run_max, block_max(local_max));  // block_max synchronises
    const float rescale = activation_math::exp_nonpositive(__fsub_rn(run_max, new_max));
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      e[j] = activation_math::exp_nonpositive(__fsub_rn(e[j], new_max));
      weight[j] = __fmul_rn(e[j], mask.factor(b, h, i, t0 + j));
    }
    __syncthreads();  // every thread has read run_max; the tile is complete
    if (threadIdx.x == 0) {
      float sum = __fmul_rn(run_sum, rescale);
      for (std::int64_t j = 0; j < n; ++j) sum = __fadd_rn(sum, e[j]);
      run_sum = sum;
      run_max = new_max;
    }
    const T* v = qkv + layout.v(b, t0, h);
    for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float a = __fmul_rn(acc[d], rescale);
      for (std::int64_t j = 0; j < n; ++j) {
        a = __fadd_rn(a, __fmul_rn(weight[j], to_float(v[j * 3 * layout.C + d])));
      }
      acc[d] = a;
    }
    __syncthreads();  // the next tile overwrites e and weight
  }
  T* out = y + (b * layout.T + i) * layout.C + h * D;
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    out[d] = from_float<T>(__fdiv_rn(acc[d], run_sum));
  }
  if (threadIdx.x == 0) {
    float* stats = row_stats + ((b * gridDim.y + h) * layout.T + i) * 2;
    stats[0] = run_max;
    stats[1] = run_sum;
  }
}

/// One thread per (sequence, head, row): D_i = dy_i . y_i, a chain in channel order.
template <class T>
__global__ void efficient_row_dot_kernel(const T* y, const T* dy, float* d_row, HeadLayout layout,
                                         std::int64_t heads, std::int64_t rows) {
  for (const std::int64_t n : grid_stride(rows)) {
    const std::int64_t i = n % layout.T, bh = n / layout.T, h = bh % heads, b = bh / heads;
    const std::int64_t at = (b * layout.T + i) * layout.C + h * layout.D;
    d_row[n] = dot(dy + at, y + at, layout.D);
  }
}

/// P_ij, and g_ij and m_ij P_ij for the backward, from the row's statistics and D_i.
struct ScoreGradient {
  float g, dropped;
};
template <class T>
__device__ ScoreGradient efficient_score_gradient(const T* qkv, const T* dy, const float* row_stats,
                                                  const float* d_row, HeadLayout layout,
                                                  float scale, AttentionMask mask, std::int64_t b,
                                                  std::int64_t h, std::int64_t heads,
                                                  std::int64_t i, std::int64_t j) {
  const std::int64_t row = (b * heads + h) * layout.T + i;
  const float s = __fmul_rn(dot(qkv + layout.q(b, i, h), qkv + layout.k(b, j, h), layout.D), scale);
  const float p = __fdiv_rn(activation_math::exp_nonpositive(__fsub_rn(s, row_stats[2 * row])),
                            row_stats[2 * row + 1]);
  const float factor = mask.factor(b, h, i, j);
  const float d_probability = __fmul_rn(
      dot(dy + (b * layout.T + i) * layout.C + h * layout.D, qkv + layout.v(b, j, h), layout.D),
      factor);
  return {detail::attention_score_gradient(p, d_probability, d_row[row], scale),
          __fmul_rn(p, factor)};
}

/// One block per (query i, head h, sequence b): dq_i over the keys j <= i, in tiles.
template <class T>
__global__ void efficient_query_gradient_kernel(const T* qkv, const T* dy, const float* row_stats,
                                                const float* d_row, T* dqkv, HeadLayout layout,
                                                float scale, AttentionMask mask) {
  extern __shared__ float shared[];
  float* g = shared;             // [kKeyTile]
  float* acc = shared + kKeyTile;  // [D]
  const std::int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t D = layout.D, keys = i + 1;
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) acc[d] = 0.0f;
  for (std::int64_t t0 = 0; t0 < keys; t0 += kKeyTile) {
    const std::int64_t n = (keys - t0 < kKeyTile ? keys - t0 : kKeyTile);
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      g[j] = efficient_score_gradient(qkv, dy, row_stats, d_row, layout, scale, mask, b, h,
                                      gridDim.y, i, t0 + j).g;
    }
    __syncthreads();
    for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float a = acc[d];
      for (std::int64_t j = 0; j < n; ++j) {
        a = __fadd_rn(a, __fmul_rn(g[j], to_float(qkv[layout.k(b, t0 + j, h) + d])));
      }
      acc[d] = a;
    }
    __syncthreads();  // the next tile overwrites g
  }
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    dqkv[layout.q(b, i, h) + d] = from_float<T>(acc[d]);
  }
}

/// One block per (key j, head h, sequence b): dk_j and dv_j over the queries i >= j, in
/// tiles of kKeyTile queries.
template <class T>
__global__ void efficient_key_value_gradient_kernel(const T* qkv, const T* dy,
                                                    const float* row_stats, const float* d_row,
                                                    T* dqkv, HeadLayout layout, float scale,
                                                    AttentionMask mask) {
  extern __shared__ float shared[];
  float* g = shared;                   // [kKeyTile]
  float* dropped = shared + kKeyTile;  // [kKeyTile]
  float* dk = shared + 2 * kKeyTile;   // [D]
  float* dv = dk + layout.D;           // [D]
  const std::int64_t j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t T_ = layout.T, D = layout.D;
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) dk[d] = dv[d] = 0.0f;
  for (std::int64_t t0 = j; t0 < T_; t0 += kKeyTile) {
    const std::int64_t n = (T_ - t0 < kKeyTile ? T_ - t0 : kKeyTile);
    for (std::int64_t x = threadIdx.x; x < n; x += blockDim.x) {
      const ScoreGradient sg = efficient_score_gradient(qkv, dy, row_stats, d_row, layout, scale,
                                                        mask, b, h, gridDim.y, t0 + x, j);
      g[x] = sg.g;
      dropped[x] = sg.dropped;
    }
    __syncthreads();
    for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float k_acc = dk[d], v_acc = dv[d];
      for (std::int64_t x = 0; x < n; ++x) {
        const std::int64_t i = t0 + x;
        k_acc = __fadd_rn(k_acc, __fmul_rn(g[x], to_float(qkv[layout.q(b, i, h) + d])));
        v_acc = __fadd_rn(v_acc, __fmul_rn(dropped[x], to_float(dy[(b * T_ + i) * layout.C + h * D + d])));
      }
      dk[d] = k_acc;
      dv[d] = v_acc;
    }
    __syncthreads();  // the next tile overwrites g and dropped
  }
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    dqkv[layout.k(b, j, h) + d] = from_float<T>(dk[d]);
    dqkv[layout.v(b, j, h) + d] = from_float<T>(dv[d]);
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

void efficient_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                 std::int64_t heads, const DropoutSpec& dropout) {
  constexpr const char* op = "efficient_attention_forward";
  const std::int64_t B = qkv.dim(0), T_ = qkv.dim(1), C = qkv.dim(2) / 3;
  if (B * T_ == 0) return;
  const HeadLayout layout{T_, C, C / heads};
  const AttentionMask mask = detail::attention_mask(dropout, heads, T_);
  const std::size_t shared = static_cast<std::size_t>(2 * kKeyTile + layout.D) * sizeof(float);
  const dim3 grid = row_grid(op, B, heads, T_, shared);
  dispatch_floating(op, qkv.dtype(), [&]<class T>(ElementType<T>) {
    efficient_forward_kernel<T><<<grid, kThreadsPerBlock, shared>>>(
        qkv.data<T>(), y.data<T>(), row_stats.data<float>(), layout, attention_scale(layout.D),
        mask);
    BIGBATCH_CHECK_LAUNCH("attention efficient_forward_kernel");
  });
}

void efficient_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                  const Tensor& dy, const Tensor& dqkv, std::int64_t heads,
                                  const DropoutSpec& dropout, const Tensor& d_row) {
  constexpr const char* op = "efficient_attention_backward";
  const std::int64_t B = qkv.dim(0), T_ = qkv.dim(1), C = qkv.dim(2) / 3;
  if (B * T_ == 0) return;
  const HeadLayout layout{T_, C, C / heads};
  const AttentionMask mask = detail::attention_mask(dropout, heads, T_);
  const float scale = attention_scale(layout.D);
  const std::size_t query_shared = static_cast<std::size_t>(kKeyTile + layout.D) * sizeof(float);
  const std::size_t key_shared =
      static_cast<std::size_t>(2 * kKeyTile + 2 * layout.D) * sizeof(float);
  const dim3 grid = row_grid(op, B, heads, T_, key_shared);
  const std::int64_t rows = B * heads * T_;
  dispatch_floating(op, qkv.dtype(), [&]<class T>(ElementType<T>) {
    efficient_row_dot_kernel<T><<<grid_for(rows), kThreadsPerBlock>>>(
        y.data<T>(), dy.data<T>(), d_row.data<float>(), layout, heads, rows);
    BIGBATCH_CHECK_LAUNCH("attention efficient_row_dot_kernel");
    efficient_query_gradient_kernel<T><<<grid, kThreadsPerBlock, query_shared>>>(
        qkv.data<T>(), dy.data<T>(), row_stats.data<float>(), d_row.data<float>(),
        dqkv.data<T>(), layout, scale, mask);
    BIGBATCH_CHECK_LAUNCH("attention efficient_query_gradient_kernel");
    efficient_key_value_gradient_kernel<T><<<grid, kThreadsPerBlock, key_shared>>>(
        qkv.data<T>(), dy.data<T>(), row_stats.data<float>(), d_row.data<float>(),
        dqkv.data<T>(), layout, scale, mask);
    BIGBATCH_CHECK_LAUNCH("attention efficient_key_value_gradient_kernel");
  });
}

}  // namespace bigbatch::cuda

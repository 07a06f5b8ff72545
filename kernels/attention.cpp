#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/half.hpp"
#include "kernels/attention_cpu.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch {

namespace cpu::attention_rows {

AttentionShape check_qkv(const char* op, const Tensor& qkv, std::int64_t heads) {
  detail::check_rank(op, "qkv", qkv, 3);
  detail::check_floating(op, "qkv", qkv);
  BIGBATCH_CHECK(heads >= 1, op, ": heads must be >= 1, got ", heads);
  const std::int64_t width = qkv.dim(2);
  BIGBATCH_CHECK(width >= 3 * heads && width % (3 * heads) == 0, op,
                 ": qkv's last dimension must be 3C with C a positive multiple of heads (", heads,
                 "), got ", qkv.describe());
  const std::int64_t C = width / 3;
  return {qkv.dim(0), qkv.dim(1), C, heads, C / heads};
}

}  // namespace cpu::attention_rows

namespace {

using cpu::attention_rows::AttentionShape;
using cpu::attention_rows::check_qkv;

/// The row statistics' dtype: the compute type, f32 (f64 for f64 data).
DType stats_dtype(const Tensor& qkv) { return qkv.dtype() == DType::f64 ? DType::f64 : DType::f32; }

/// row_stats: [B, heads, T, 2] of stats_dtype(qkv).
void check_row_stats(const char* op, const Tensor& row_stats, const Tensor& qkv,
                     const AttentionShape& s) {
  detail::check_dtype(op, "row_stats", row_stats, stats_dtype(qkv));
  detail::check_shape(op, "row_stats", row_stats, {s.B, s.heads, s.T, 2});
}

void check_like(const char* op, const char* name, const Tensor& t, const Tensor& qkv,
                const Shape& shape) {
  detail::check_dtype(op, name, t, qkv.dtype());
  detail::check_shape(op, name, t, shape);
}

/// p in [0, 1], first_row >= 0, and every mask index (header) below 2^63.
void check_dropout(const char* op, const DropoutSpec& dropout, const AttentionShape& s) {
  BIGBATCH_CHECK(dropout.p >= 0.0f && dropout.p <= 1.0f, op, ": dropout p must be in [0, 1], got ",
                 dropout.p);
  BIGBATCH_CHECK(dropout.first_row >= 0, op, ": dropout first_row must be >= 0, got ",
                 dropout.first_row);
  const std::int64_t per_sequence = s.heads * s.T * s.T;
  BIGBATCH_CHECK(
      per_sequence == 0 ||
          dropout.first_row <= std::numeric_limits<std::int64_t>::max() / per_sequence - s.B,
      op, ": dropout first_row ", dropout.first_row, " puts the mask's global indices past 2^63");
}

/// No output shares memory with an input or with the other output.
void refuse_sharing(const char* op, std::initializer_list<detail::NamedTensor> outputs,
                    std::initializer_list<detail::NamedTensor> inputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (const detail::NamedTensor& in : inputs) {
      detail::refuse_overlap(op, *out, in, "they must be apart");
    }
    for (auto other = out + 1; other != outputs.end(); ++other) {
      detail::refuse_overlap(op, *out, *other, "they must be apart");
    }
  }
}

}  // namespace

float attention_scale(std::int64_t head_channels) {
  return 1.0f / std::sqrt(static_cast<float>(head_channels));
}

detail::AttentionMask detail::attention_mask(const DropoutSpec& dropout, std::int64_t heads,
                                             std::int64_t length) {
  return {dropout.p,
          dropout_keep_scale(dropout.p),
          dropout.seed,
          dropout.stream,
          dropout.first_row,
          heads,
          length};
}

void causal_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                              std::int64_t heads, const DropoutSpec& dropout) {
  constexpr const char* op = "causal_attention_forward";
  const AttentionShape s = check_qkv(op, qkv, heads);
  check_like(op, "y", y, qkv, {s.B, s.T, s.C});
  check_like(op, "probabilities", probabilities, qkv, {s.B, s.heads, s.T, s.T});
  check_dropout(op, dropout, s);
  const Device device = detail::common_device(op, {&qkv, &y, &probabilities});
  refuse_sharing(op, {{"y", &y}, {"probabilities", &probabilities}}, {{"qkv", &qkv}});
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::causal_attention_forward(qkv, y, probabilities, heads, dropout));
  }
  cpu::causal_attention_forward(qkv, y, probabilities, heads, dropout);
}

void efficient_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                 std::int64_t heads, const DropoutSpec& dropout) {
  constexpr const char* op = "efficient_attention_forward";
  const AttentionShape s = check_qkv(op, qkv, heads);
  check_like(op, "y", y, qkv, {s.B, s.T, s.C});
  check_row_stats(op, row_stats, qkv, s);
  check_dropout(op, dropout, s);
  const Device device = detail::common_device(op, {&qkv, &y, &row_stats});
  refuse_sharing(op, {{"y", &y}, {"row_stats", &row_stats}}, {{"qkv", &qkv}});
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::efficient_attention_forward(qkv, y, row_stats, heads, dropout));
  }
  cpu::efficient_attention_forward(qkv, y, row_stats, heads, dropout);
}

void efficient_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                  const Tensor& dy, const Tensor& dqkv, std::int64_t heads,
                                  const DropoutSpec& dropout) {
  constexpr const char* op = "efficient_attention_backward";
  const AttentionShape s = check_qkv(op, qkv, heads);
  check_like(op, "y", y, qkv, {s.B, s.T, s.C});
  check_row_stats(op, row_stats, qkv, s);
  check_like(op, "dy", dy, qkv, {s.B, s.T, s.C});
  check_like(op, "dqkv", dqkv, qkv, qkv.shape());
  check_dropout(op, dropout, s);
  const Device device = detail::common_device(op, {&qkv, &y, &row_stats, &dy, &dqkv});
  refuse_sharing(op, {{"dqkv", &dqkv}},
                 {{"qkv", &qkv}, {"y", &y}, {"row_stats", &row_stats}, {"dy", &dy}});
  const Tensor d_row({s.B, s.heads, s.T}, DType::f32, device, MemoryCategory::workspace);
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::efficient_attention_backward(qkv, y, row_stats, dy, dqkv, heads,
                                                             dropout, d_row));
  }
  cpu::efficient_attention_backward(qkv, y, row_stats, dy, dqkv, heads, dropout, d_row);
}

void causal_attention_probabilities(const Tensor& qkv, const Tensor& probabilities,
                                    std::int64_t heads) {
  constexpr const char* op = "causal_attention_probabilities";
  const AttentionShape s = check_qkv(op, qkv, heads);
  check_like(op, "probabilities", probabilities, qkv, {s.B, s.heads, s.T, s.T});
  const Device device = detail::common_device(op, {&qkv, &probabilities});
  refuse_sharing(op, {{"probabilities", &probabilities}}, {{"qkv", &qkv}});
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::causal_attention_forward(qkv, Tensor(), probabilities, heads, {}));
  }
  cpu::causal_attention_forward(qkv, Tensor(), probabilities, heads, {});
}

void causal_attention_backward(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                               const Tensor& dqkv, std::int64_t heads, const DropoutSpec& dropout) {
  constexpr const char* op = "causal_attention_backward";
  const AttentionShape s = check_qkv(op, qkv, heads);
  check_like(op, "probabilities", probabilities, qkv, {s.B, s.heads, s.T, s.T});
  check_like(op, "dy", dy, qkv, {s.B, s.T, s.C});
  check_like(op, "dqkv", dqkv, qkv, qkv.shape());
  check_dropout(op, dropout, s);
  const Device device = detail::common_device(op, {&qkv, &probabilities, &dy, &dqkv});
  refuse_sharing(op, {{"dqkv", &dqkv}},
                 {{"qkv", &qkv}, {"probabilities", &probabilities}, {"dy", &dy}});
  const Tensor row_sums({s.B, s.heads, s.T}, DType::f32, device, MemoryCategory::workspace);
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::causal_attention_backward(qkv, probabilities, dy, dqkv, heads,
                                                          dropout, row_sums));
  }
  cpu::causal_attention_backward(qkv, probabilities, dy, dqkv, heads, dropout, row_sums);
}

namespace cpu {
namespace {

using namespace attention_rows;

template <class T>
void forward_typed(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                   const AttentionShape& s, const detail::AttentionMask& mask) {
  using A = ComputeType<T>;
  const A scale = attention_scale(s.D);
  const T* in = qkv.data<T>();     // [B, T, 3C]
  T* out = y.defined() ? y.data<T>() : nullptr;  // [B, T, C]; null: P alone
  T* P = probabilities.data<T>();  // [B, heads, T, T]
  const std::int64_t T_ = s.T, D = s.D;
  parallel_for(s.B * s.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    HeadScratch<A> scratch;
    run_vectorized([&] {
      for (std::int64_t bh = begin; bh < end; ++bh) {
        const std::int64_t b = bh / s.heads, h = bh % s.heads;
        scratch.load_head(in, s, b, h);
        A* row = scratch.row.data();
        for (std::int64_t i = 0; i < T_; ++i) {
          const std::int64_t keys = i + 1;  // the causal mask: keys 0 .. i
          weighted_row_sum(scratch.q.data() + i * D, scratch.k_t.data(), D, T_, keys, row);
          A max = -std::numeric_limits<A>::infinity();
          for (std::int64_t j = 0; j < keys; ++j) {
            row[j] = row[j] * scale;
            max = std::max(max, row[j]);
          }
          A sum = 0;
          for (std::int64_t j = 0; j < keys; ++j) {
            row[j] = activation_math::exp_nonpositive(row[j] - max);
          }
          for (std::int64_t j = 0; j < keys; ++j) sum = sum + row[j];
          T* p_row = P + (bh * T_ + i) * T_;
          for (std::int64_t j = 0; j < keys; ++j) store(p_row + j, row[j] / sum);
          for (std::int64_t j = keys; j < T_; ++j) store(p_row + j, A(0));
          if (out == nullptr) continue;
          // y_i = sum_j m_ij P_ij v_j, with P_ij read back as stored.
          mask_factors(mask, b, h, i, scratch.factors.data());
          for (std::int64_t j = 0; j < keys; ++j) row[j] = load(p_row + j) * scratch.factors[j];
          weighted_row_sum(row, scratch.v.data(), keys, D, D, scratch.out.data());
          T* y_row = out + (b * T_ + i) * s.C + h * D;
          for (std::int64_t d = 0; d < D; ++d) store(y_row + d, scratch.out[d]);
        }
      }
    });
  });
}

template <class T>
void backward_typed(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                    const Tensor& dqkv, const AttentionShape& s, const detail::AttentionMask& mask,
                    const Tensor& row_sums) {
  using A = ComputeType<T>;
  const A scale = attention_scale(s.D);
  const T* in = qkv.data<T>();           // [B, T, 3C]
  const T* P = probabilities.data<T>();  // [B, heads, T, T]
  const T* d_out = dy.data<T>();         // [B, T, C]
  T* d_in = dqkv.data<T>();              // [B, T, 3C]
  float* r = row_sums.data<float>();     // [B, heads, T]
  const std::int64_t T_ = s.T, D = s.D;
  parallel_for(s.B * s.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    HeadScratch<A> scratch;
    std::vector<A> dy_row(D), dropped(T_);
    run_vectorized([&] {
      for (std::int64_t bh = begin; bh < end; ++bh) {
        const std::int64_t b = bh / s.heads, h = bh % s.heads;
        scratch.load_head(in, s, b, h);
        scratch.dk.assign(T_ * D, A(0));
        scratch.dv.assign(T_ * D, A(0));
        A* g = scratch.row.data();
        A* factors = scratch.factors.data();
        for (std::int64_t i = 0; i < T_; ++i) {
          const std::int64_t keys = i + 1;
          const T* p_row = P + (bh * T_ + i) * T_;
          const T* dy_at = d_out + (b * T_ + i) * s.C + h * D;
          for (std::int64_t d = 0; d < D; ++d) dy_row[d] = load(dy_at + d);
          mask_factors(mask, b, h, i, factors);
          // dP_ij = m_ij (dy_i . v_j); the dropped probabilities m_ij P_ij again.
          weighted_row_sum(dy_row.data(), scratch.v_t.data(), D, T_, keys, g);
          for (std::int64_t j = 0; j < keys; ++j) {
            g[j] = g[j] * factors[j];
            dropped[j] = load(p_row + j) * factors[j];
          }
          A row_sum = 0;
          for (std::int64_t j = 0; j < keys; ++j) row_sum = row_sum + load(p_row + j) * g[j];
          r[bh * T_ + i] = static_cast<float>(row_sum);
          for (std::int64_t j = 0; j < keys; ++j) {
            g[j] = detail::attention_score_gradient(static_cast<A>(load(p_row + j)), g[j], row_sum,
                                                    scale);
          }
          // dq_i = sum_j g_ij k_j; dk_j += g_ij q_i and dv_j += m_ij P_ij dy_i, i ascending.
          add_row_gradients(scratch, g, dropped.data(), dy_row.data(), i, D,
                            d_in + (b * T_ + i) * 3 * s.C + h * D);
        }
        store_key_value_gradients(scratch, s, b, h, d_in);
      }
    });
  });
}

}  // namespace

void causal_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                              std::int64_t heads, const DropoutSpec& dropout) {
  const AttentionShape s = check_qkv("causal_attention_forward", qkv, heads);
  const detail::AttentionMask mask = detail::attention_mask(dropout, heads, s.T);
  with_float_type("causal_attention_forward", qkv.dtype(),
                  [&]<class T>(T) { forward_typed<T>(qkv, y, probabilities, s, mask); });
}

void causal_attention_backward(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                               const Tensor& dqkv, std::int64_t heads, const DropoutSpec& dropout,
                               const Tensor& row_sums) {
  const AttentionShape s = check_qkv("causal_attention_backward", qkv, heads);
  const detail::AttentionMask mask = detail::attention_mask(dropout, heads, s.T);
  with_float_type("causal_attention_backward", qkv.dtype(), [&]<class T>(T) {
    backward_typed<T>(qkv, probabilities, dy, dqkv, s, mask, row_sums);
  });
}

}  // namespace cpu
}  // namespace bigbatch

// attention_efficient.cpp: the memory-efficient attention on the CPU (attention.hpp).
#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/half.hpp"
#include "kernels/attention_cpu.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch::cpu {
namespace {

using namespace attention_rows;

/// The memory-efficient forward (the header's tiles): per query row, the running max, sum
/// and output over tiles of kKeyTile keys.
template <class T>
void efficient_forward_typed(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                             const AttentionShape& s, const detail::AttentionMask& mask) {
  using A = ComputeType<T>;
  const A scale = attention_scale(s.D);
  const T* in = qkv.data<T>();             // [B, T, 3C]
  T* out = y.data<T>();                    // [B, T, C]
  A* stats = row_stats.data<A>();  // [B, heads, T, 2]
  const std::int64_t T_ = s.T, D = s.D;
  parallel_for(s.B * s.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    HeadScratch<A> scratch;
    std::vector<A> weights(kKeyTile);
    run_vectorized([&] {
      for (std::int64_t bh = begin; bh < end; ++bh) {
        const std::int64_t b = bh / s.heads, h = bh % s.heads;
        scratch.load_head(in, s, b, h);
        A* score = scratch.row.data();
        A* acc = scratch.out.data();
        for (std::int64_t i = 0; i < T_; ++i) {
          const std::int64_t keys = i + 1;  // causal: the keys up to the query's own
          A m = -std::numeric_limits<A>::infinity(), l = 0;
          for (std::int64_t d = 0; d < D; ++d) acc[d] = 0;
          mask_factors(mask, b, h, i, scratch.factors.data());
          for (std::int64_t t0 = 0; t0 < keys; t0 += kKeyTile) {
            const std::int64_t t1 = std::min(keys, t0 + kKeyTile), n = t1 - t0;
            // The tile's scores s_j = (q_i . k_j) * scale, and their max.
            weighted_row_sum(scratch.q.data() + i * D, scratch.k_t.data() + t0, D, T_, n, score);
            A tile_max = -std::numeric_limits<A>::infinity();
            for (std::int64_t j = 0; j < n; ++j) {
              score[j] = score[j] * scale;
              tile_max = std::max(tile_max, score[j]);
            }
            const A m_new = std::max(m, tile_max);
            const A rescale = activation_math::exp_nonpositive(m - m_new);  // 0 at the first
            for (std::int64_t j = 0; j < n; ++j) {
              score[j] = activation_math::exp_nonpositive(score[j] - m_new);
            }
            l = l * rescale;
            for (std::int64_t j = 0; j < n; ++j) l = l + score[j];
            for (std::int64_t d = 0; d < D; ++d) acc[d] = acc[d] * rescale;
            for (std::int64_t j = 0; j < n; ++j) weights[j] = score[j] * scratch.factors[t0 + j];
            add_weighted_rows(weights.data(), scratch.v.data() + t0 * D, n, D, D, acc);
            m = m_new;
          }
          T* y_row = out + (b * T_ + i) * s.C + h * D;
          for (std::int64_t d = 0; d < D; ++d) store(y_row + d, acc[d] / l);
          stats[(bh * T_ + i) * 2] = m;
          stats[(bh * T_ + i) * 2 + 1] = l;
        }
      }
    });
  });
}

/// The memory-efficient backward: D_i = dy_i . y_i for every row, then each row's
/// probabilities and score gradients rebuilt from the row's statistics, one row at a time.
template <class T>
void efficient_backward_typed(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                              const Tensor& dy, const Tensor& dqkv, const AttentionShape& s,
                              const detail::AttentionMask& mask, const Tensor& d_row) {
  using A = ComputeType<T>;
  const A scale = attention_scale(s.D);
  const T* in = qkv.data<T>();                   // [B, T, 3C]
  const T* out = y.data<T>();                    // [B, T, C]
  const A* stats = row_stats.data<A>();          // [B, heads, T, 2]
  const T* d_out = dy.data<T>();                 // [B, T, C]
  T* d_in = dqkv.data<T>();                      // [B, T, 3C]
  float* D_row = d_row.data<float>();            // [B, heads, T]
  const std::int64_t T_ = s.T, D = s.D;
  parallel_for(s.B * s.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    HeadScratch<A> scratch;
    std::vector<A> dy_row(D), P(T_), dropped(T_);
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
          const T* dy_at = d_out + (b * T_ + i) * s.C + h * D;
          const T* y_at = out + (b * T_ + i) * s.C + h * D;
          A d_i = 0;  // dy_i . y_i, y as stored
          for (std::int64_t d = 0; d < D; ++d) {
            dy_row[d] = load(dy_at + d);
            d_i = d_i + dy_row[d] * static_cast<A>(load(y_at + d));
          }
          D_row[bh * T_ + i] = static_cast<float>(d_i);
          const A m = stats[(bh * T_ + i) * 2], l = stats[(bh * T_ + i) * 2 + 1];
          // P_ij = exp(s_ij - m_i) / l_i from the scores again.
          weighted_row_sum(scratch.q.data() + i * D, scratch.k_t.data(), D, T_, keys, P.data());
          for (std::int64_t j = 0; j < keys; ++j) {
            P[j] = activation_math::exp_nonpositive(P[j] * scale - m) / l;
          }
          mask_factors(mask, b, h, i, scratch.factors.data());  // factors: m_ij, j <= i
          // dP_ij = m_ij (dy_i . v_j), g_ij = (P_ij (dP_ij - D_i)) scale.
          weighted_row_sum(dy_row.data(), scratch.v_t.data(), D, T_, keys, g);
          for (std::int64_t j = 0; j < keys; ++j) {
            g[j] = detail::attention_score_gradient(P[j], g[j] * factors[j], d_i, scale);
            dropped[j] = P[j] * factors[j];
          }
          add_row_gradients(scratch, g, dropped.data(), dy_row.data(), i, D,
                            d_in + (b * T_ + i) * 3 * s.C + h * D);
        }
        store_key_value_gradients(scratch, s, b, h, d_in);
      }
    });
  });
}

}  // namespace

void efficient_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                 std::int64_t heads, const DropoutSpec& dropout) {
  const AttentionShape s = check_qkv("efficient_attention_forward", qkv, heads);
  const detail::AttentionMask mask = detail::attention_mask(dropout, heads, s.T);
  with_float_type("efficient_attention_forward", qkv.dtype(), [&]<class T>(T) {
    efficient_forward_typed<T>(qkv, y, row_stats, s, mask);
  });
}

void efficient_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                  const Tensor& dy, const Tensor& dqkv, std::int64_t heads,
                                  const DropoutSpec& dropout, const Tensor& d_row) {
  const AttentionShape s = check_qkv("efficient_attention_backward", qkv, heads);
  const detail::AttentionMask mask = detail::attention_mask(dropout, heads, s.T);
  with_float_type("efficient_attention_backward", qkv.dtype(), [&]<class T>(T) {
    efficient_backward_typed<T>(qkv, y, row_stats, dy, dqkv, s, mask, d_row);
  });
}

}  // namespace bigbatch::cpu

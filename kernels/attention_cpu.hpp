// attention_cpu.hpp: what the CPU attention kernels share, internal to kernels/:
// attention.cpp (the checks, the plain kernel) and attention_efficient.cpp (the memory-
// efficient kernel). Two files so that a change to one kernel recompiles only its own
// instantiations.
#pragma once

#include <cstdint>
#include <vector>

#include "common/tensor.hpp"
#include "kernels/attention.hpp"
#include "kernels/cpu_vector.hpp"

namespace bigbatch::cpu::attention_rows {

/// The sizes of one call: B sequences of T positions, C channels split into `heads` heads
/// of D channels.
struct AttentionShape {
  std::int64_t B;      ///< sequences
  std::int64_t T;      ///< positions of each
  std::int64_t C;      ///< channels
  std::int64_t heads;  ///< heads
  std::int64_t D;      ///< channels of a head: C / heads
};

/// qkv: [B, T, 3C] floating (f64 on the CPU only), C a positive multiple of heads.
AttentionShape check_qkv(const char* op, const Tensor& qkv, std::int64_t heads);

using scalar_math::ComputeType;

/// One head of one sequence, widened to the compute type A: the rows of q, k and v (each
/// [T, D]) and their transposes where a loop runs across positions. Reused per thread.
template <class A>
struct HeadScratch {
  std::vector<A> q;        ///< [T, D]
  std::vector<A> k;        ///< [T, D]
  std::vector<A> v;        ///< [T, D]
  std::vector<A> k_t;      ///< [D, T]: k transposed
  std::vector<A> v_t;      ///< [D, T]: v transposed
  std::vector<A> row;      ///< [T]: the scores or score gradients of one query row
  std::vector<A> factors;  ///< [T]: that row's mask factors
  std::vector<A> out;      ///< [D]: one output row
  std::vector<A> dk;       ///< [T, D]: the backward's accumulator of dk
  std::vector<A> dv;       ///< [T, D]: the backward's accumulator of dv

  /// Copies head h of sequence b out of qkv ([B, T, 3C]).
  template <class T>
  void load_head(const T* qkv, const AttentionShape& s, std::int64_t b, std::int64_t h) {
    const std::int64_t T_ = s.T, D = s.D;
    for (auto* buffer : {&q, &k, &v, &k_t, &v_t}) buffer->resize(T_ * D);
    row.resize(T_);
    factors.resize(T_);
    out.resize(D);
    for (std::int64_t t = 0; t < T_; ++t) {
      const T* position = qkv + (b * T_ + t) * 3 * s.C + h * D;
      for (std::int64_t d = 0; d < D; ++d) {
        q[t * D + d] = load(position + d);
        k[t * D + d] = k_t[d * T_ + t] = load(position + s.C + d);
        v[t * D + d] = v_t[d * T_ + t] = load(position + 2 * s.C + d);
      }
    }
  }
};

/// acc[x] = acc[x] + weights[r] * rows[r * stride + x] for r < count in order, for x < width:
/// one chain per x, run across x (so it vectorises without reordering a sum).
/// Both of the header's sums are this: a dot product q_i . k_j for every key j is the
/// weights q_i over the rows of k^T ([D, T], stride T); y_i is the weights m_ij P_ij over
/// the rows of v ([T, D], stride D).
template <class A>
void add_weighted_rows(const A* weights, const A* rows, std::int64_t count, std::int64_t stride,
                       std::int64_t width, A* acc) {
  for (std::int64_t r = 0; r < count; ++r) {
    const A w = weights[r];
    const A* row = rows + r * stride;
    for (std::int64_t x = 0; x < width; ++x) acc[x] = acc[x] + w * row[x];
  }
}

/// The same sum from acc = 0.
template <class A>
void weighted_row_sum(const A* weights, const A* rows, std::int64_t count, std::int64_t stride,
                      std::int64_t width, A* acc) {
  for (std::int64_t x = 0; x < width; ++x) acc[x] = 0;
  add_weighted_rows(weights, rows, count, stride, width, acc);
}

/// Row i's share of the backward, given its score gradients g_ij and dropped probabilities
/// m_ij P_ij for j <= i: dq_i = sum_j g_ij k_j (key order) stored at dq, and dk_j += g_ij q_i,
/// dv_j += m_ij P_ij dy_i into the head's accumulators (called for i ascending).
template <class T, class A>
void add_row_gradients(HeadScratch<A>& scratch, const A* g, const A* dropped, const A* dy_row,
                       std::int64_t i, std::int64_t D, T* dq) {
  const std::int64_t keys = i + 1;
  weighted_row_sum(g, scratch.k.data(), keys, D, D, scratch.out.data());
  for (std::int64_t d = 0; d < D; ++d) store(dq + d, scratch.out[d]);
  const A* q_i = scratch.q.data() + i * D;
  for (std::int64_t j = 0; j < keys; ++j) {
    A* dk = scratch.dk.data() + j * D;
    A* dv = scratch.dv.data() + j * D;
    const A gj = g[j], pj = dropped[j];
    for (std::int64_t d = 0; d < D; ++d) {
      dk[d] = dk[d] + gj * q_i[d];
      dv[d] = dv[d] + pj * dy_row[d];
    }
  }
}

/// The head's accumulated dk and dv into dqkv ([B, T, 3C]) of sequence b, head h.
template <class T, class A>
void store_key_value_gradients(const HeadScratch<A>& scratch, const AttentionShape& s,
                               std::int64_t b, std::int64_t h, T* d_in) {
  const std::int64_t D = s.D;
  for (std::int64_t t = 0; t < s.T; ++t) {
    T* position = d_in + (b * s.T + t) * 3 * s.C + h * D;
    for (std::int64_t d = 0; d < D; ++d) {
      store(position + s.C + d, scratch.dk[t * D + d]);
      store(position + 2 * s.C + d, scratch.dv[t * D + d]);
    }
  }
}

/// The mask factors m_ij of query row i for j <= i (1 when p = 0).
template <class A>
void mask_factors(const detail::AttentionMask& mask, std::int64_t b, std::int64_t h, std::int64_t i,
                  A* factors) {
  for (std::int64_t j = 0; j <= i; ++j) factors[j] = mask.factor(b, h, i, j);
}

}  // namespace bigbatch::cpu::attention_rows

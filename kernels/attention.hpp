// attention.hpp: causal multi-head self-attention, the core of a GPT block (nanoGPT's
// CausalSelfAttention between c_attn and c_proj; PyTorch's
// scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)).
//
//   causal_attention_forward(qkv, y, probabilities, heads, dropout)
//     qkv:           [B, T, 3C]  f32/f16/bf16 (f64 on the CPU)   c_attn's output: per position,
//                                q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C]; head h
//                                owns channels h*D .. h*D + D - 1 of each, D = C / heads
//     y:             [B, T, C]   the dtype of qkv                 the heads side by side     (=)
//     probabilities: [B, heads, T, T]  the dtype of qkv           P, saved for the backward  (=)
//
//   causal_attention_probabilities(qkv, probabilities, heads)
//     P alone (=), the bits the forward stores: selective attention recomputation keeps qkv
//     and y, drops P after the forward and rebuilds it here for the backward
//
//   causal_attention_backward(qkv, probabilities, dy, dqkv, heads, dropout)
//     qkv, probabilities as the forward left them; dy: [B, T, C] the dtype of qkv
//     dqkv:          [B, T, 3C]  the dtype of qkv                 dq, dk, dv side by side    (=)
//
// What it computes, per sequence b, head h and query position i (keys j <= i only: the
// causal mask; P[b][h][i][j] = 0 for j > i):
//   s_j = scale * (q_i . k_j)                 scale = 1 / sqrt(D), rounded to float
//   P_ij = exp(s_j - max_j s_j) / sum_j exp(s_j - max_j s_j)
//   y_i = sum_j m_ij P_ij v_j                 m_ij = keep_ij / (1 - p): dropout on P
// and the backward of that, with g_ij = dL/ds_ij:
//   dv_j = sum_{i >= j} m_ij P_ij dy_i        dP_ij = m_ij (dy_i . v_j)
//   r_i = sum_j P_ij dP_ij                    g_ij = scale * (P_ij (dP_ij - r_i))
//   dq_i = sum_{j <= i} g_ij k_j              dk_j = sum_{i >= j} g_ij q_i
//
// What is stored, and what is not. The forward saves P only (in the activations' dtype):
// the scores s are transient, and the dropout mask is not stored at all, because the
// counter-based RNG draws it again in the backward from its global index
//   ((dropout.first_row + b) * heads + h) * T * T + i * T + j
// (element kept iff random_uniform(seed, stream, index) >= p, as dropout.hpp), so a sequence
// draws the same mask in a batch and in a micro-batch, and again when recomputed. Nor is the
// dropped P (m_ij P_ij): it is recomputed from P and the mask. That is 2 bytes per score in
// 16 bits where Korthikanti et al. (2022) count 5 (scores, probabilities, mask, dropped
// probabilities); chapter 08 compares the two counts.
//
// Arithmetic, exactly (both backends; every operation rounded once in float, or double for
// f64, never fused; 16-bit elements widened exactly on load and rounded to nearest even on
// store):
//   - a dot product over the D channels (q_i . k_j, dy_i . v_j) is a chain from 0 in channel
//     order: acc = acc + a_d * b_d;
//   - s_j = (q_i . k_j) * scale: the scale applied to the float dot product, so no 16-bit
//     intermediate exists that could overflow (a 16-bit GEMM that stores q k^T before scaling
//     overflows fp16 near |q . k| = 65504);
//   - the max is exact; e_j = exp(s_j - max) by activation_math.hpp's exp_nonpositive (the
//     same polynomial on both backends; std::exp for f64); sum = e_0 + e_1 + ... in key order;
//   - P_ij = e_j / sum, stored rounded to the dtype, and read back from that stored value for
//     everything after it, in the forward and the backward alike;
//   - m_ij P_ij is P_ij times the kept scale 1/(1 - p) or 0, as dropout.hpp (p = 0: times 1);
//   - y_i, dq_i: sums over the keys j = 0 .. i in order; dk_j, dv_j: sums over the queries
//     i = j .. T - 1 in order; r_i: over j = 0 .. i in order;
//   - g_ij = (P_ij * (dP_ij - r_i)) * scale.
// So the two backends compute the same bits, and everything per sequence depends on that
// sequence alone: micro-batches of sequences give the big batch's bits (batch invariance).
// The CPU vectorises across keys or channels, never along a sum; CUDA runs the same chains
// one thread per output element. The sums are sequential, O(T) long: the reference is
// written to be checked, not to be the fastest attention (the memory-efficient kernels below,
// tiled over keys, keep no P at all).
//
// Memory. The backward takes one workspace tensor, r: [B, heads, T] f32, on the device of
// qkv (counted under workspace). The CPU keeps O(T * D) floats of host scratch per thread
// (the head's q, k, v and the accumulators), uncounted like GEMM's packing buffers.
// No output may share memory with an input.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/dropout.hpp"
#include "kernels/scalar_math.hpp"

namespace bigbatch {

// ---- memory-efficient attention ---------------------------------------------------------
//
//   efficient_attention_forward(qkv, y, row_stats, heads, dropout)
//     y:          [B, T, C]        the dtype of qkv                                         (=)
//     row_stats:  [B, heads, T, 2] f32 (f64 for f64 data): per query row its running max m
//                                  and sum l at the end (FlashAttention's first version's
//                                  two statistics; its second keeps m + ln l, one float, but a
//                                  logarithm both backends would have to round alike)    (=)
//   efficient_attention_backward(qkv, y, row_stats, dy, dqkv, heads, dropout)
//     qkv, y, row_stats as the forward left them; dy [B, T, C]; dqkv [B, T, 3C]           (=)
//
// The same function as causal_attention_forward/backward, computed without P: nothing of
// size T x T exists, only O(T) per row (Dao et al. 2022). The forward visits a query row's
// keys 0..i in tiles of kKeyTile keys, keeping the running max m, the running sum l of
// exponentials and the running output acc (D floats); per tile [t0, t1):
//   s_j = (q_i . k_j) * scale                  as the plain kernel's
//   m' = max(m, max_j s_j)                     (m = -inf before the first tile)
//   a = exp(m - m')                            the rescaling of what came before (0 at first)
//   e_j = exp(s_j - m')
//   l = l * a, then l = l + e_j in key order
//   acc_d = acc_d * a, then acc_d = acc_d + (e_j * m_ij) * v_jd in key order
//   m = m'
// and at the end y_id = acc_d / l, stored rounded to the dtype, and (m, l) to row_stats.
// m is then the row's exact max, so exp(s_j - m) is the plain kernel's e_j; l and y differ
// from the plain kernel's by the rescalings' roundings (a bound the tests derive).
// The backward recomputes the scores row by row, never storing them:
//   D_i = dy_i . y_i                           (= sum_j P_ij dP_ij, FlashAttention-2's
//                                               identity; y read back as stored)
//   P_ij = exp(s_ij - m_i) / l_i               (float, not rounded to the dtype)
//   dP_ij = m_ij (dy_i . v_j);  g_ij = (P_ij (dP_ij - D_i)) * scale
//   dq_i = sum_{j <= i} g_ij k_j (key order); dk_j = sum_{i >= j} g_ij q_i and
//   dv_j = sum_{i >= j} (m_ij P_ij) dy_i (query order)
// with every operation rounded once in float (double for f64), as the plain kernels, so the
// CPU and CUDA give the same bits and micro-batches of sequences the batch's. The backward
// takes one workspace tensor, D: [B, heads, T] f32 (MemoryCategory::workspace). The
// attention's memory is y and row_stats: O(T) per head, against the plain kernel's T^2.

/// Keys per tile of the memory-efficient forward: the tiles set where the running max is
/// rescaled, and so the bits.
inline constexpr std::int64_t kKeyTile = 64;

/// y and row_stats (=) from qkv, as above.
void efficient_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                 std::int64_t heads, const DropoutSpec& dropout = {});
/// dqkv (=) from dy and what the forward read and left, with the same dropout spec.
void efficient_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                  const Tensor& dy, const Tensor& dqkv, std::int64_t heads,
                                  const DropoutSpec& dropout = {});

/// y and probabilities (=) from qkv, `heads` heads, dropout on the probabilities as `dropout`
/// says (p = 0: none); shapes and dtypes above.
void causal_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                              std::int64_t heads, const DropoutSpec& dropout = {});
/// probabilities (=) from qkv alone: the P causal_attention_forward stores, bit for bit (P
/// does not depend on the dropout, which acts after it), without computing y.
void causal_attention_probabilities(const Tensor& qkv, const Tensor& probabilities,
                                    std::int64_t heads);
/// dqkv (=) from dy, the forward's qkv and probabilities, and the same dropout spec.
void causal_attention_backward(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                               const Tensor& dqkv, std::int64_t heads,
                               const DropoutSpec& dropout = {});

/// The attention's scale 1 / sqrt(D) for heads of D channels, rounded to float.
float attention_scale(std::int64_t head_channels);

namespace cpu {
/// The CPU reference of bigbatch::efficient_attention_forward.
void efficient_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                 std::int64_t heads, const DropoutSpec& dropout);
/// The CPU reference of bigbatch::efficient_attention_backward; d_row: D, [B, heads, T] f32.
void efficient_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                  const Tensor& dy, const Tensor& dqkv, std::int64_t heads,
                                  const DropoutSpec& dropout, const Tensor& d_row);
/// The CPU reference of bigbatch::causal_attention_forward; an undefined y computes P alone.
void causal_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                              std::int64_t heads, const DropoutSpec& dropout);
/// The CPU reference of bigbatch::causal_attention_backward; row_sums: r, [B, heads, T] f32.
void causal_attention_backward(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                               const Tensor& dqkv, std::int64_t heads, const DropoutSpec& dropout,
                               const Tensor& row_sums);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::efficient_attention_forward.
void efficient_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                 std::int64_t heads, const DropoutSpec& dropout);
/// The CUDA implementation of bigbatch::efficient_attention_backward; d_row: D, [B, heads, T].
void efficient_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& row_stats,
                                  const Tensor& dy, const Tensor& dqkv, std::int64_t heads,
                                  const DropoutSpec& dropout, const Tensor& d_row);
/// The CUDA implementation of bigbatch::causal_attention_forward; an undefined y computes P
/// alone.
void causal_attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& probabilities,
                              std::int64_t heads, const DropoutSpec& dropout);
/// The CUDA implementation of bigbatch::causal_attention_backward (row_sums as the CPU's).
void causal_attention_backward(const Tensor& qkv, const Tensor& probabilities, const Tensor& dy,
                               const Tensor& dqkv, std::int64_t heads, const DropoutSpec& dropout,
                               const Tensor& row_sums);
}  // namespace cuda

// ---- scalar math shared by both backends ---------------------------------------------
namespace detail {

/// Where a sequence's mask lives in the dropout stream: what the header's index formula
/// needs, with the kept scale, computed once on the host.
struct AttentionMask {
  float p = 0.0f;              ///< drop probability; 0: no dropout (every factor is 1)
  float keep_scale = 1.0f;     ///< 1 / (1 - p) in float (dropout_keep_scale)
  std::uint64_t seed = 0;      ///< the RNG's seed
  std::uint64_t stream = 0;    ///< the RNG's stream
  std::int64_t first_row = 0;  ///< the global index of sequence 0 of this call
  std::int64_t heads = 1;      ///< heads per sequence
  std::int64_t length = 1;     ///< T

  /// m_ij for sequence b, head h, query i, key j: keep_scale if kept, else 0 (1 when p = 0).
  BIGBATCH_HD float factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (p == 0.0f) return 1.0f;
    const std::uint64_t index =
        static_cast<std::uint64_t>((((first_row + b) * heads + h) * length + i) * length + j);
    return random_uniform(seed, stream, index) >= p ? keep_scale : 0.0f;
  }
};

/// The mask of a call on B sequences of length T with `heads` heads.
AttentionMask attention_mask(const DropoutSpec& dropout, std::int64_t heads, std::int64_t length);

/// g = (P * (dP - r)) * scale: the gradient of one score, three roundings.
template <class A>
BIGBATCH_HD inline A attention_score_gradient(A probability, A d_probability, A row_sum, A scale) {
  using scalar_math::add_rn;
  using scalar_math::mul_rn;
  return mul_rn(mul_rn(probability, add_rn(d_probability, -row_sum)), scale);
}

}  // namespace detail
}  // namespace bigbatch

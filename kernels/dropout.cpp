#include "kernels/dropout.hpp"

#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "common/half.hpp"
#include "common/rng.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cpu_vector.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch {
namespace {

Device check_dropout(const char* op, const char* in_name, const Tensor& in, const char* out_name,
                     const Tensor& out, const DropoutSpec& spec) {
  const Device device = detail::common_device(op, {&in, &out});
  const DType dtype = in.dtype();
  detail::check_floating(op, in_name, in);
  detail::check_dtype(op, out_name, out, dtype);
  detail::check_shape(op, out_name, out, in.shape());
  detail::check_same_or_disjoint(op, out_name, out, in_name, in);
  BIGBATCH_CHECK(in.rank() >= 1, op, ": ", in_name, " needs a first (row) dimension, got ",
                 in.describe());
  BIGBATCH_CHECK(spec.p >= 0.0f && spec.p <= 1.0f, op, ": p must be in [0, 1], got ", spec.p);
  BIGBATCH_CHECK(spec.first_row >= 0, op, ": first_row must be >= 0, got ", spec.first_row);
  // The global indices (first_row + i) * N + j must fit in 64 bits.
  const std::int64_t rows = in.dim(0);
  const std::int64_t row_length = rows == 0 ? 0 : in.numel() / rows;
  BIGBATCH_CHECK(row_length == 0 ||
                     spec.first_row <= std::numeric_limits<std::int64_t>::max() / row_length - rows,
                 op, ": first_row ", spec.first_row, " puts the global element indices of ",
                 in.describe(), " past 2^63");
  return device;
}

}  // namespace

std::uint64_t detail::dropout_first_index(const Tensor& t, const DropoutSpec& spec) {
  const std::int64_t rows = t.dim(0);
  const std::int64_t row_length = rows == 0 ? 0 : t.numel() / rows;
  return static_cast<std::uint64_t>(spec.first_row) * static_cast<std::uint64_t>(row_length);
}

void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  if (check_dropout("dropout_forward", "x", x, "y", y, spec).is_cuda()) {
    BIGBATCH_RUN_CUDA("dropout_forward", cuda::dropout_forward(x, y, spec));
  }
  cpu::dropout_forward(x, y, spec);
}

void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec) {
  if (check_dropout("dropout_backward", "dy", dy, "dx", dx, spec).is_cuda()) {
    BIGBATCH_RUN_CUDA("dropout_backward", cuda::dropout_backward(dy, dx, spec));
  }
  cpu::dropout_backward(dy, dx, spec);
}

void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec, const Tensor& y) {
  const char* op = "activation_dropout_backward";
  const Device device = check_dropout(op, "dy", dy, "dx", dx, spec);
  detail::check_dtype(op, "x", x, dy.dtype());
  detail::check_shape(op, "x", x, dy.shape());
  detail::common_device(op, {&x, &dy});
  // Element k is read (x, dy) before it is written (dx, y): an output may be an input,
  // but two outputs may not be one.
  detail::check_same_or_disjoint(op, "dx", dx, "x", x);
  if (y.defined()) {
    detail::check_dtype(op, "y", y, dy.dtype());
    detail::check_shape(op, "y", y, dy.shape());
    detail::common_device(op, {&y, &dy});
    detail::check_same_or_disjoint(op, "y", y, "x", x);
    detail::check_same_or_disjoint(op, "y", y, "dy", dy);
    detail::check_same_or_disjoint(op, "y", y, "dx", dx);
    BIGBATCH_CHECK(y.numel() == 0 || y.raw_data() != dx.raw_data(), op,
                   ": y and dx are both outputs and may not be the same tensor");
  }
  if (device.is_cuda()) {
    BIGBATCH_RUN_CUDA(op, cuda::activation_dropout_backward(act, x, dy, dx, spec, y));
  }
  cpu::activation_dropout_backward(act, x, dy, dx, spec, y);
}

namespace cpu {
namespace {

// The mask is computed a block at a time into `factors` (scale where kept, 0 where
// dropped), then applied in a second loop over the block, still in L1. Even at one
// Philox 4x32-10 per four elements, drawing the mask is not free next to moving the
// data (AVX-512, measured: about 0.55 ns per element and core for the mask, against
// about 1.4 ns to stream an element in and out on 2 threads), so the memory of the
// block after next is prefetched while this block's numbers are drawn (2 threads,
// 64 MiB, median of 6: 0.64 of memcpy, against 0.57 prefetching the next block).
// Blocks end where the global index is a multiple of kBlock, so every block but the
// first and last of a thread's chunk is whole, aligned groups of four indices
// (common/rng.hpp), which the AVX-512 path draws 128 at a time.
constexpr std::int64_t kBlock = 256;

struct MaskParams {
  std::uint64_t seed, stream;
  float p, scale;
};

/// The factor of one element from its 32 random bits: scale if kept, 0 if dropped.
inline float keep_factor(const MaskParams& mask, std::uint32_t bits) {
  return uniform_from_bits(bits) >= mask.p ? mask.scale : 0.0f;
}

/// factors[k] = keep(first + k) ? scale : 0, for k < count; any instruction set. Each
/// group of four indices is drawn once, the partial groups at both ends included.
void keep_factors_portable(const MaskParams& mask, std::uint64_t first, std::int64_t count,
                           float* factors) {
  // The first group may have begun before `first`: take its remaining words.
  std::int64_t k = 0;
  if (count > 0 && first % 4 != 0) {
    const Philox4x32 words = random_group(mask.seed, mask.stream, first / 4);
    for (std::uint64_t w = first % 4; w < 4 && k < count; ++w, ++k) {
      factors[k] = keep_factor(mask, words.v[w]);
    }
  }
  // Whole groups: element k + 4g + w is word w of group (first + k) / 4 + g.
  const std::uint64_t first_group = (first + static_cast<std::uint64_t>(k)) / 4;
  const std::int64_t whole_groups = (count - k) / 4;
  float* whole = factors + k;
  run_vectorized([&] {
    for (std::int64_t g = 0; g < whole_groups; ++g) {
      const Philox4x32 words =
          random_group(mask.seed, mask.stream, first_group + static_cast<std::uint64_t>(g));
      for (int w = 0; w < 4; ++w) whole[4 * g + w] = keep_factor(mask, words.v[w]);
    }
  });
  k += 4 * whole_groups;
  // The last group may end after the run: take its first words.
  if (k < count) {
    const Philox4x32 words = random_group(mask.seed, mask.stream,
                                          first_group + static_cast<std::uint64_t>(whole_groups));
    for (int w = 0; k < count; ++w, ++k) factors[k] = keep_factor(mask, words.v[w]);
  }
}

// GCC 12 warns, falsely, that the unmasked AVX-512 intrinsics read an uninitialised
// register (the placeholder operand of their masked builtins).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Philox 4x32-10 exactly as common/rng.hpp computes it (the tests compare the two bit
// for bit), for 8 groups at a time in the eight 64-bit lanes of an AVX-512 register.
// Each lane keeps its 32-bit word in its low half: vpmuludq multiplies exactly those
// low halves into the full 64-bit product, so the high halves may hold leftovers that
// nothing reads. Two multiplications of the plain form are skipped: in round 1 only
// counter word 0 differs between the lanes (the counters are (q_lo + lane, q_hi,
// stream)), so the product of word 2 and everything made from it is one scalar; in
// round 2 the same holds for word 0's product. Four registers (32 groups, 128 words) go
// through the rounds side by side, which keeps the multipliers busy while each chain
// waits.
constexpr std::uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;
constexpr int kPhiloxRegisters = 4;
constexpr std::int64_t kPhiloxGroups = 8 * kPhiloxRegisters;
constexpr std::int64_t kPhiloxWords = 4 * kPhiloxGroups;
static_assert(kBlock % kPhiloxWords == 0, "whole blocks are whole calls");
static_assert((std::uint64_t{1} << 34) % kBlock == 0, "a block never holds two high words");

struct PhiloxKeys {
  std::uint32_t key0[10], key1[10];  // the key of each round
  std::uint32_t stream0, stream1;    // the counter's words 2 and 3

  PhiloxKeys(std::uint64_t seed, std::uint64_t stream)
      : stream0(static_cast<std::uint32_t>(stream)),
        stream1(static_cast<std::uint32_t>(stream >> 32)) {
    key0[0] = static_cast<std::uint32_t>(seed);
    key1[0] = static_cast<std::uint32_t>(seed >> 32);
    for (int round = 1; round < 10; ++round) {
      key0[round] = key0[round - 1] + kPhiloxWeyl0;
      key1[round] = key1[round - 1] + kPhiloxWeyl1;
    }
  }
};

#define BIGBATCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

/// A 32-bit word in the low half of every 64-bit lane.
BIGBATCH_AVX512 inline __m512i broadcast(std::uint32_t word) { return _mm512_set1_epi64(word); }

/// The words of groups (lo + g, hi), g < 32, in index order: word w of group g is
/// 32-bit element (4 g + w) % 16 of out[(4 g + w) / 16]. lo + 31 must not wrap.
BIGBATCH_AVX512 inline void philox_groups_avx512(std::uint32_t lo, std::uint32_t hi,
                                                 const PhiloxKeys& keys,
                                                 __m512i (&out)[2 * kPhiloxRegisters]) {
  constexpr int R = kPhiloxRegisters;
  const __m512i mul0 = broadcast(kPhiloxMul0), mul1 = broadcast(kPhiloxMul1);
  // The scalar (shared) parts of rounds 1 and 2.
  const std::uint64_t shared_p1 = std::uint64_t{kPhiloxMul1} * keys.stream0;
  const auto shared_c0 = static_cast<std::uint32_t>(shared_p1 >> 32) ^ hi ^ keys.key0[0];
  const auto shared_c1 = static_cast<std::uint32_t>(shared_p1);
  const std::uint64_t shared_q0 = std::uint64_t{kPhiloxMul0} * shared_c0;
  __m512i c0[R], c1[R], c2[R], c3[R];
  for (int r = 0; r < R; ++r) {
    // Round 1: word 0 is per lane, words 1 to 3 are shared.
    const __m512i word0 =
        _mm512_add_epi64(broadcast(lo + 8 * r), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
    const __m512i p0 = _mm512_mul_epu32(word0, mul0);
    const __m512i round1_c2 =
        _mm512_xor_si512(_mm512_srli_epi64(p0, 32), broadcast(keys.stream1 ^ keys.key1[0]));
    // Round 2: word 0 (shared_c0) is shared, so is its product shared_q0.
    const __m512i q1 = _mm512_mul_epu32(round1_c2, mul1);
    c0[r] = _mm512_xor_si512(_mm512_srli_epi64(q1, 32), broadcast(shared_c1 ^ keys.key0[1]));
    c1[r] = q1;
    c2[r] =
        _mm512_xor_si512(p0, broadcast(static_cast<std::uint32_t>(shared_q0 >> 32) ^ keys.key1[1]));
    c3[r] = broadcast(static_cast<std::uint32_t>(shared_q0));
  }
  // Rounds 3 to 10: every word is per lane.
  for (int round = 2; round < 10; ++round) {
    const __m512i key0 = broadcast(keys.key0[round]), key1 = broadcast(keys.key1[round]);
    for (int r = 0; r < R; ++r) {
      const __m512i p0 = _mm512_mul_epu32(c0[r], mul0);
      const __m512i p1 = _mm512_mul_epu32(c2[r], mul1);
      constexpr int kXor3 = 0x96;  // the truth table of a ^ b ^ c
      c0[r] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[r], key0, kXor3);
      c1[r] = p1;
      c2[r] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[r], key1, kXor3);
      c3[r] = p0;
    }
  }
  // Lane g holds group g's words 0 to 3 in the low halves of c0..c3. Pair them into
  // 64-bit lanes (w0 | w1 << 32, w2 | w3 << 32), then interleave the pairs of groups
  // 0-3 and of groups 4-7: 32-bit element 4 g + w is then word w of group g.
  constexpr __mmask16 kHighHalves = 0xAAAA;
  const __m512i groups_0_to_3 = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i groups_4_to_7 = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  for (int r = 0; r < R; ++r) {
    const __m512i words01 =
        _mm512_mask_blend_epi32(kHighHalves, c0[r], _mm512_slli_epi64(c1[r], 32));
    const __m512i words23 =
        _mm512_mask_blend_epi32(kHighHalves, c2[r], _mm512_slli_epi64(c3[r], 32));
    out[2 * r] = _mm512_permutex2var_epi64(words01, groups_0_to_3, words23);
    out[2 * r + 1] = _mm512_permutex2var_epi64(words01, groups_4_to_7, words23);
  }
}

/// keep_factors_portable, 128 elements at a time with AVX-512; the same bits. The run
/// must lie within one block (see kBlock): then its groups share their high word, since
/// 2^34 (where the group's high word steps) is a multiple of kBlock, and lo + 31 of a
/// whole call never wraps.
BIGBATCH_AVX512 void keep_factors_avx512(const MaskParams& mask, std::uint64_t first,
                                         std::int64_t count, float* factors) {
  const __m512 p = _mm512_set1_ps(mask.p), scale = _mm512_set1_ps(mask.scale);
  const PhiloxKeys keys(mask.seed, mask.stream);
  // Up to the first group boundary (a whole block starts on one: nothing to do).
  std::int64_t k = std::min<std::int64_t>(count, static_cast<std::int64_t>((4 - first % 4) % 4));
  keep_factors_portable(mask, first, k, factors);
  for (; k + kPhiloxWords <= count; k += kPhiloxWords) {
    const std::uint64_t group = (first + static_cast<std::uint64_t>(k)) / 4;
    __m512i bits[2 * kPhiloxRegisters];
    philox_groups_avx512(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                         keys, bits);
    for (int v = 0; v < 2 * kPhiloxRegisters; ++v) {
      // uniform_from_bits: the top 24 bits times 2^-24, exact in float
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bits[v], 8)),
                                     _mm512_set1_ps(0x1p-24f));
      const __mmask16 keep = _mm512_cmp_ps_mask(u, p, _CMP_GE_OQ);
      _mm512_storeu_ps(factors + k + 16 * v, _mm512_maskz_mov_ps(keep, scale));
    }
  }
  keep_factors_portable(mask, first + static_cast<std::uint64_t>(k), count - k, factors + k);
}

#undef BIGBATCH_AVX512
#pragma GCC diagnostic pop

/// factors[k] = keep(first + k) ? scale : 0, for k < count; the run [first, first + count)
/// lies within one block.
void keep_factors(const MaskParams& mask, std::uint64_t first, std::int64_t count, float* factors) {
  if (simd_level() == SimdLevel::avx512) return keep_factors_avx512(mask, first, count, factors);
  keep_factors_portable(mask, first, count, factors);
}

// in, out: the same shape; out[e] = in[e] * factor of global index first_index + e
template <class T>
void apply_dropout(const Tensor& in, const Tensor& out, const DropoutSpec& spec) {
  const T* source = in.data<T>();
  T* target = out.data<T>();
  const MaskParams mask{spec.seed, spec.stream, spec.p, detail::dropout_keep_scale(spec.p)};
  const std::uint64_t first_index = detail::dropout_first_index(in, spec);
  constexpr auto kElementsPerLine = static_cast<std::int64_t>(64 / sizeof(T));
  parallel_for(in.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    alignas(64) float factors[kBlock];
    std::int64_t count = 0;
    for (std::int64_t start = begin; start < end; start += count) {
      const std::uint64_t index = first_index + static_cast<std::uint64_t>(start);
      count = std::min(kBlock - static_cast<std::int64_t>(index % kBlock), end - start);
      const T* block_in = source + start;
      T* block_out = target + start;
      const std::int64_t after_next = count + kBlock;  // where the block after next starts
      const std::int64_t after_next_count = std::min(kBlock, end - start - after_next);
      for (std::int64_t k = 0; k < after_next_count; k += kElementsPerLine) {
        __builtin_prefetch(block_in + after_next + k, 0);
        __builtin_prefetch(block_out + after_next + k, 1);
      }
      keep_factors(mask, index, count, factors);
      run_vectorized([&] {
        for (std::int64_t k = 0; k < count; ++k) {
          store(block_out + k, load(block_in + k) * factors[k]);
        }
      });
    }
  });
}

/// A value rounded to T as storing it would, and read back in ComputeType<T>.
template <class T, class A>
A rounded(A value) {
  T stored;
  store(&stored, value);
  return load(&stored);
}

namespace math = activation_math;

/// {act(v), act'(v) * g} in ComputeType<T>, as gelu_forward and gelu_backward (or relu's)
/// compute them; GELU's two share one exponential.
struct GeluPair {
  template <class A>
  std::pair<A, A> operator()(A v, A g) const {
    const auto both = math::gelu_and_derivative(v);
    return {both.value, g * both.derivative};
  }
};
struct ReluPair {
  template <class A>
  std::pair<A, A> operator()(A v, A g) const {
    return {math::relu(v), math::relu_backward_of(v, g)};
  }
};

// The block loop of apply_dropout, with the mask of each block drawn once for dx and y.
template <class T, class Act>
void fused_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Tensor& y,
                    const DropoutSpec& spec, const Act& act) {
  const T* xs = x.data<T>();
  const T* dys = dy.data<T>();
  T* dxs = dx.data<T>();
  T* ys = y.defined() ? y.data<T>() : nullptr;
  const MaskParams mask{spec.seed, spec.stream, spec.p, detail::dropout_keep_scale(spec.p)};
  const bool draw = spec.p > 0.0f;  // p = 0: every factor is 1, and v * 1 is v exactly
  const std::uint64_t first_index = detail::dropout_first_index(x, spec);
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) {
    alignas(64) float factors[kBlock];
    if (!draw) std::fill(factors, factors + kBlock, 1.0f);
    std::int64_t count = 0;
    for (std::int64_t start = begin; start < end; start += count) {
      const std::uint64_t index = first_index + static_cast<std::uint64_t>(start);
      count = std::min(kBlock - static_cast<std::int64_t>(index % kBlock), end - start);
      if (draw) keep_factors(mask, index, count, factors);
      const T* block_x = xs + start;
      const T* block_dy = dys + start;
      T* block_dx = dxs + start;
      if (ys != nullptr) {
        T* block_y = ys + start;
        run_vectorized([&] {
          for (std::int64_t k = 0; k < count; ++k) {
            const auto g = rounded<T>(load(block_dy + k) * factors[k]);  // dropout_backward
            const auto [value, gradient] = act(load(block_x + k), g);
            store(block_dx + k, gradient);
            store(block_y + k, rounded<T>(value) * factors[k]);  // act, then dropout
          }
        });
      } else {
        run_vectorized([&] {
          for (std::int64_t k = 0; k < count; ++k) {
            const auto g = rounded<T>(load(block_dy + k) * factors[k]);
            store(block_dx + k, act(load(block_x + k), g).second);
          }
        });
      }
    }
  });
}

void dropout_typed(const Tensor& in, const Tensor& out, const DropoutSpec& spec) {
  with_float_type("dropout", in.dtype(), [&](auto element) {
    apply_dropout<decltype(element)>(in, out, spec);
  });
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  dropout_typed(x, y, spec);
}

void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec) {
  dropout_typed(dy, dx, spec);
}

void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec, const Tensor& y) {
  with_float_type("activation_dropout_backward", x.dtype(), [&](auto element) {
    using T = decltype(element);
    if (act == PointwiseActivation::gelu) {
      fused_backward<T>(x, dy, dx, y, spec, GeluPair{});
    } else {
      fused_backward<T>(x, dy, dx, y, spec, ReluPair{});
    }
  });
}

}  // namespace cpu
}  // namespace bigbatch

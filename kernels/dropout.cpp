#include "kernels/dropout.hpp"

#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "common/half.hpp"
#include "common/rng.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch {
namespace {

Device check_dropout(const char* op, const char* in_name, const Tensor& in, const char* out_name,
                     const Tensor& out, const DropoutSpec& spec) {
  const Device device = detail::common_device(op, {&in, &out});
  const DType dtype = in.dtype();
  BIGBATCH_CHECK(
      dtype == DType::f32 || dtype == DType::f16 || (dtype == DType::f64 && device.is_cpu()), op,
      ": ", in_name, " must be f32 or f16 (f64 on the CPU), got ", in.describe());
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

namespace cpu {
namespace {

// The mask is computed a block at a time into `factors` (scale where kept, 0 where
// dropped), then applied in a second loop over the block, still in L1. Drawing the
// random numbers costs more than moving the data (one Philox 4x32-10 per element), so
// the next block's memory is prefetched while this block's numbers are drawn; with
// blocks of 256 the two overlap best (measured: 1.45 ns per element and core instead
// of 1.72 with blocks of 1024 and no prefetch).
constexpr std::int64_t kBlock = 256;

struct MaskParams {
  std::uint64_t seed, stream;
  float p, scale;
};

/// factors[k] = keep(first + k) ? scale : 0, for k < count; any instruction set.
void keep_factors_portable(const MaskParams& mask, std::uint64_t first, std::int64_t count,
                           float* factors) {
  run_vectorized([&] {
    for (std::int64_t k = 0; k < count; ++k) {
      const float u = random_uniform(mask.seed, mask.stream, first + static_cast<std::uint64_t>(k));
      factors[k] = u >= mask.p ? mask.scale : 0.0f;
    }
  });
}

// GCC 12 warns, falsely, that the unmasked AVX-512 intrinsics read an uninitialised
// register (the placeholder operand of their masked builtins).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Philox 4x32-10 exactly as common/rng.hpp computes it (the tests compare the two bit
// for bit), for 8 counters at a time in the eight 64-bit lanes of an AVX-512 register.
// Each lane keeps its 32-bit word in its low half: vpmuludq multiplies exactly those
// low halves into the full 64-bit product, so the high halves may hold leftovers that
// nothing reads. Two multiplications of the plain form are skipped: in round 1 only
// counter word 0 differs between the lanes (the counters are lo + lane, hi, stream), so
// the product of word 2 and everything made from it is one scalar; in round 2 the same
// holds for word 0's product. (Round 10's product of word 0 feeds only words that the
// output does not use; the compiler drops it.) Four registers (32 counters) go through
// the rounds side by side, which keeps the multipliers busy while each chain waits.
constexpr std::uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;
constexpr int kPhiloxRegisters = 4;
constexpr std::int64_t kPhiloxCounters = 8 * kPhiloxRegisters;

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

/// Output word 0 of Philox 4x32-10 for the counters (lo + k, hi, stream), k < 32, in
/// out[k / 8], lane k % 8. lo + 31 must not wrap.
BIGBATCH_AVX512 inline void philox32_avx512(std::uint32_t lo, std::uint32_t hi,
                                            const PhiloxKeys& keys,
                                            __m256i (&out)[kPhiloxRegisters]) {
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
  for (int r = 0; r < R; ++r) out[r] = _mm512_cvtepi64_epi32(c0[r]);  // low 32 bits per lane
}

/// keep_factors_portable, 32 elements at a time with AVX-512; the same bits.
BIGBATCH_AVX512 void keep_factors_avx512(const MaskParams& mask, std::uint64_t first,
                                         std::int64_t count, float* factors) {
  const __m512 p = _mm512_set1_ps(mask.p), scale = _mm512_set1_ps(mask.scale);
  const PhiloxKeys keys(mask.seed, mask.stream);
  std::int64_t k = 0;
  for (; k + kPhiloxCounters <= count; k += kPhiloxCounters) {
    const std::uint64_t index = first + static_cast<std::uint64_t>(k);
    const auto lo = static_cast<std::uint32_t>(index), hi = static_cast<std::uint32_t>(index >> 32);
    if (lo > 0xffffffffu - (kPhiloxCounters - 1)) {  // the high word changes in here: rare
      keep_factors_portable(mask, index, kPhiloxCounters, factors + k);
      continue;
    }
    __m256i bits[kPhiloxRegisters];
    philox32_avx512(lo, hi, keys, bits);
    for (int half = 0; half < kPhiloxRegisters / 2; ++half) {
      const __m512i sixteen =
          _mm512_inserti64x4(_mm512_castsi256_si512(bits[2 * half]), bits[2 * half + 1], 1);
      // random_uniform: the top 24 bits times 2^-24, exact in float
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sixteen, 8)),
                                     _mm512_set1_ps(0x1p-24f));
      const __mmask16 keep = _mm512_cmp_ps_mask(u, p, _CMP_GE_OQ);
      _mm512_storeu_ps(factors + k + 16 * half, _mm512_maskz_mov_ps(keep, scale));
    }
  }
  keep_factors_portable(mask, first + static_cast<std::uint64_t>(k), count - k, factors + k);
}

#undef BIGBATCH_AVX512
#pragma GCC diagnostic pop

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
    for (std::int64_t start = begin; start < end; start += kBlock) {
      const std::int64_t count = std::min(kBlock, end - start);
      const T* block_in = source + start;
      T* block_out = target + start;
      const std::int64_t next_count = std::min(kBlock, end - start - count);
      for (std::int64_t k = 0; k < next_count; k += kElementsPerLine) {
        __builtin_prefetch(block_in + kBlock + k, 0);
        __builtin_prefetch(block_out + kBlock + k, 1);
      }
      keep_factors(mask, first_index + static_cast<std::uint64_t>(start), count, factors);
      run_vectorized([&] {
        for (std::int64_t k = 0; k < count; ++k) {
          store(block_out + k, load(block_in + k) * factors[k]);
        }
      });
    }
  });
}

void dropout_typed(const Tensor& in, const Tensor& out, const DropoutSpec& spec) {
  switch (in.dtype()) {
    case DType::f32: return apply_dropout<float>(in, out, spec);
    case DType::f16: return apply_dropout<f16>(in, out, spec);
    case DType::f64: return apply_dropout<double>(in, out, spec);
    case DType::i32: break;
  }
  BIGBATCH_CHECK(false, "dropout: unsupported ", in.describe());
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  dropout_typed(x, y, spec);
}

void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec) {
  dropout_typed(dy, dx, spec);
}

}  // namespace cpu
}  // namespace bigbatch

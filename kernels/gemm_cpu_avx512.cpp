// gemm_cpu_avx512.cpp: the CPU GEMM's AVX-512 building blocks (see gemm.hpp, IsaKernels).
//
// Only the functions marked BIGBATCH_AVX512 use AVX-512; they run only after gemm.cpp
// has asked cpu_supports (common/cpu_features.hpp), so the library still runs on any
// x86-64.
#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/address_sanitizer.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_internal.hpp"

#define BIGBATCH_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace bigbatch::gemm_detail {
namespace {

// The vector the tiles of gemm_cpu_tiles.inc are written in: 16 floats.
struct Vec {
  using type = __m512;
  static constexpr int kWidth = 16;
  BIGBATCH_AVX512 __attribute__((always_inline)) static type load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  BIGBATCH_AVX512 __attribute__((always_inline)) static void store(float* p, type v) {
    _mm512_storeu_ps(p, v);
  }
  BIGBATCH_AVX512 __attribute__((always_inline)) static type zero() { return _mm512_setzero_ps(); }
  BIGBATCH_AVX512 __attribute__((always_inline)) static type broadcast(const float* p) {
    return _mm512_set1_ps(*p);
  }
  BIGBATCH_AVX512 __attribute__((always_inline)) static type mul(type a, type b) {
    return _mm512_mul_ps(a, b);
  }
  BIGBATCH_AVX512 __attribute__((always_inline)) static type fma(type a, type b, type c) {
    return _mm512_fmadd_ps(a, b, c);
  }
};

// A 14 x 32 tile of C: 28 zmm accumulators, 2 zmm for the row of B at step k and one
// for the broadcast element of A (31 of the 32 registers). Each step k is 28 FMAs
// against 2 loads of B and 14 broadcasts of A.
constexpr int kMr = 14;
constexpr int kVectors = 2;  // zmm registers per row of the tile
constexpr int kNr = Vec::kWidth * kVectors;
// The transposed tile: 6 columns of C (rows of the stored B) by 64 of its rows (4 zmm):
// 24 accumulators. Six columns, not 14: 14 rows of a weight 4 KiB apart would evict each
// other from one set of the 8-way L1 at every step.
constexpr int kTransposedColumns = 6;
constexpr int kTransposedVectors = 4;

#define BIGBATCH_GEMM_TARGET BIGBATCH_AVX512
#include "kernels/gemm_cpu_tiles.inc"
#undef BIGBATCH_GEMM_TARGET

BIGBATCH_AVX512 void widen_f16(const std::uint16_t* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    // The masked forms (all lanes on) avoid GCC 12's false -Wmaybe-uninitialized on the
    // plain intrinsics' undefined pass-through operand.
    _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(0xFFFF, bits));
  }
  if (i + 8 <= n) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(bits));
    i += 8;
  }
  for (; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, src + i, sizeof bits);
    dst[i] = _cvtsh_ss(bits);
  }
}

BIGBATCH_AVX512 void narrow_to_f16(const float* src, std::uint16_t* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i bits =
        _mm512_maskz_cvtps_ph(0xFFFF, _mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bits);
  }
  for (; i < n; ++i) {
    const std::uint16_t bits = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

// Transposes the 16 x 16 floats of rows[0..15] in place: afterwards rows[c] holds
// element c of every original row. Three rounds of shuffles: pairs of floats, pairs of
// doubles, then 128-bit lanes (the masked forms with every lane on, as in widen_f16).
BIGBATCH_AVX512 void transpose_16x16(__m512 rows[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_ps(0xFFFF, rows[i], rows[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, rows[i], rows[i + 1]);
  }
  // u[4g + q]: in each 128-bit lane j, element 4j + q of rows 4g .. 4g + 3.
  __m512 u[16];
  for (int g = 0; g < 4; ++g) {
    const __m512d lo0 = _mm512_castps_pd(t[4 * g]), hi0 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d lo1 = _mm512_castps_pd(t[4 * g + 2]), hi1 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, lo0, lo1));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, lo0, lo1));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, hi0, hi1));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, hi0, hi1));
  }
  for (int q = 0; q < 4; ++q) {
    // Lane j of u[q], u[4 + q], u[8 + q], u[12 + q], side by side, is column 4j + q.
    // x0: lanes 0 and 1 of u[q], then of u[4 + q]; x1: lanes 2 and 3; y0, y1 the same
    // of u[8 + q] and u[12 + q].
    const __m512 x0 = _mm512_maskz_shuffle_f32x4(0xFFFF, u[q], u[4 + q], 0x44);
    const __m512 x1 = _mm512_maskz_shuffle_f32x4(0xFFFF, u[q], u[4 + q], 0xEE);
    const __m512 y0 = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + q], u[12 + q], 0x44);
    const __m512 y1 = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + q], u[12 + q], 0xEE);
    rows[q] = _mm512_maskz_shuffle_f32x4(0xFFFF, x0, y0, 0x88);
    rows[4 + q] = _mm512_maskz_shuffle_f32x4(0xFFFF, x0, y0, 0xDD);
    rows[8 + q] = _mm512_maskz_shuffle_f32x4(0xFFFF, x1, y1, 0x88);
    rows[12 + q] = _mm512_maskz_shuffle_f32x4(0xFFFF, x1, y1, 0xDD);
  }
}

// IsaKernels::transpose_pack: 16 steps by up to 16 lanes at a time through registers
// (the scalar loop's stores, one per element at a stride of width floats, made packing
// the weights cost a third of a micro-batch's GEMM time), the last steps element by
// element.
BIGBATCH_AVX512 void transpose_pack(const float* src, std::int64_t ld, std::int64_t lanes,
                                    std::int64_t steps, float scale, float* dst,
                                    std::int64_t width) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  std::int64_t k = 0;
  for (; k + 16 <= steps; k += 16) {
    for (std::int64_t lane0 = 0; lane0 < lanes; lane0 += 16) {
      const int group = static_cast<int>(lanes - lane0 < 16 ? lanes - lane0 : 16);
      __m512 rows[16];
      for (int l = 0; l < 16; ++l) {
        rows[l] = l < group ? _mm512_loadu_ps(src + (lane0 + l) * ld + k) : _mm512_setzero_ps();
      }
      transpose_16x16(rows);
      const auto mask = static_cast<__mmask16>((1u << group) - 1u);
      for (int c = 0; c < 16; ++c) {
        const __m512 v = scale == 1.0f ? rows[c] : _mm512_mul_ps(scale_v, rows[c]);
        _mm512_mask_storeu_ps(dst + (k + c) * width + lane0, mask, v);
      }
    }
  }
  transpose_pack_rest(src, ld, lanes, k, steps, scale, dst, width);
}

// Blocking, measured on a 2-core Zen 4 (1024^3, kc from 256 to 768): kc = 512 halves the
// passes over C against 256 and was 5% faster. mc x kc of A (336 KiB) stays in the 1 MiB
// L2; kc x nr of B (64 KiB) streams from L2 across the row panels; kc x nc of B (8 MiB)
// sits in L3.
constexpr std::int64_t kKc = 512, kMc = 12 * kMr, kNc = 4096;
static_assert(kMc % kMr == 0 && kNc % kNr == 0);
// op(B) read where it is stored in slices spanning at most 2 MiB of it: a micro-batch's
// dY W against chapter 01's fc2 at H 512 (rows of W 8 KiB apart, 512 steps) took
// 0.80-0.85 ms in one pass down each panel, 0.52-0.54 ms in two slices of 256 steps and
// 0.59 ms in four (OpenBLAS: 0.59-0.61), on a 2-core Intel Xeon (family 6, model 207;
// bench_kernels' BM_GemmTrainingShape, medians of 5 to 9). Against fc1 (2 KiB apart) one
// pass of 512 steps spans 1 MiB and is not sliced (0.47-0.49 ms). Not measured on Zen 4,
// whose one pass ran fc2's at 1.5 times OpenBLAS's speed.
constexpr std::int64_t kStridedMaxSpan = std::int64_t{2} << 20;
const IsaKernels kKernels{kMr,          kNr,        kKc,           kMc,
                          kNc,          &micro_kernel, &widen_f16, &narrow_to_f16,
                          &transpose_pack, &partial_micro_kernel,
                          &strided_b_micro_kernel, &transposed_micro_kernel,
                          kTransposedColumns, kTransposedLanes,
                          /*strided_b_max_ldb=*/0, kStridedMaxSpan};

}  // namespace

const IsaKernels& avx512_kernels() { return kKernels; }

}  // namespace bigbatch::gemm_detail

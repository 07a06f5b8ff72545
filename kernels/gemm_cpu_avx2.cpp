// gemm_cpu_avx2.cpp: the CPU GEMM's AVX2 + FMA building blocks (see gemm.hpp, IsaKernels).
//
// Only the functions marked BIGBATCH_AVX2 use AVX2; they run only after gemm.cpp has
// asked cpu_supports (common/cpu_features.hpp), so the library still runs on any x86-64.
#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/address_sanitizer.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_internal.hpp"

#define BIGBATCH_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace bigbatch::gemm_detail {
namespace {

// The vector the tiles of gemm_cpu_tiles.inc are written in: 8 floats.
struct Vec {
  using type = __m256;
  static constexpr int kWidth = 8;
  BIGBATCH_AVX2 __attribute__((always_inline)) static type load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  BIGBATCH_AVX2 __attribute__((always_inline)) static void store(float* p, type v) {
    _mm256_storeu_ps(p, v);
  }
  BIGBATCH_AVX2 __attribute__((always_inline)) static type zero() { return _mm256_setzero_ps(); }
  BIGBATCH_AVX2 __attribute__((always_inline)) static type broadcast(const float* p) {
    return _mm256_broadcast_ss(p);
  }
  BIGBATCH_AVX2 __attribute__((always_inline)) static type mul(type a, type b) {
    return _mm256_mul_ps(a, b);
  }
  BIGBATCH_AVX2 __attribute__((always_inline)) static type fma(type a, type b, type c) {
    return _mm256_fmadd_ps(a, b, c);
  }
};

// A 6 x 16 tile of C: 12 ymm accumulators, 2 ymm for the row of B at step k and one for
// the broadcast element of A (15 of the 16 registers).
constexpr int kMr = 6;
constexpr int kVectors = 2;  // ymm registers per row of the tile
constexpr int kNr = Vec::kWidth * kVectors;
// The transposed tile: 6 columns of C (rows of the stored B) by 16 of its rows (2 ymm):
// 12 accumulators, 2 ymm of the packed op(A)^T and one broadcast, as the tile above.
constexpr int kTransposedColumns = 6;
constexpr int kTransposedVectors = 2;

#define BIGBATCH_GEMM_TARGET BIGBATCH_AVX2
#include "kernels/gemm_cpu_tiles.inc"
#undef BIGBATCH_GEMM_TARGET

BIGBATCH_AVX2 void widen_f16(const std::uint16_t* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(bits));
  }
  for (; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, src + i, sizeof bits);
    dst[i] = _cvtsh_ss(bits);
  }
}

BIGBATCH_AVX2 void narrow_to_f16(const float* src, std::uint16_t* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bits = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bits);
  }
  for (; i < n; ++i) {
    const std::uint16_t bits = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

// Transposes the 8 x 8 floats of rows[0..7] in place: afterwards rows[c] holds element c
// of every original row. Pairs of floats, then pairs of pairs, then 128-bit halves.
BIGBATCH_AVX2 void transpose_8x8(__m256 rows[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  // u[4g + q]: in each 128-bit half h, element 4h + q of rows 4g .. 4g + 3.
  __m256 u[8];
  for (int g = 0; g < 2; ++g) {
    u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    rows[q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x20);
    rows[4 + q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x31);
  }
}

// IsaKernels::transpose_pack: 8 steps by up to 8 lanes at a time through registers (as
// the AVX-512 path does 16 by 16), the last steps element by element.
BIGBATCH_AVX2 void transpose_pack(const float* src, std::int64_t ld, std::int64_t lanes,
                                  std::int64_t steps, float scale, float* dst,
                                  std::int64_t width) {
  const __m256 scale_v = _mm256_set1_ps(scale);
  std::int64_t k = 0;
  for (; k + 8 <= steps; k += 8) {
    for (std::int64_t lane0 = 0; lane0 < lanes; lane0 += 8) {
      const int group = static_cast<int>(lanes - lane0 < 8 ? lanes - lane0 : 8);
      __m256 rows[8];
      for (int l = 0; l < 8; ++l) {
        rows[l] = l < group ? _mm256_loadu_ps(src + (lane0 + l) * ld + k) : _mm256_setzero_ps();
      }
      transpose_8x8(rows);
      // Lane l of the store is written when l < group (the sign bit of its mask).
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(group),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      for (int c = 0; c < 8; ++c) {
        const __m256 v = scale == 1.0f ? rows[c] : _mm256_mul_ps(scale_v, rows[c]);
        float* out = dst + (k + c) * width + lane0;
        if (group == 8) {
          _mm256_storeu_ps(out, v);
        } else {
          _mm256_maskstore_ps(out, mask, v);
        }
      }
    }
  }
  transpose_pack_rest(src, ld, lanes, k, steps, scale, dst, width);
}

// Blocking, measured on a 2-core Zen 4 (1024^3, kc from 256 to 512): kc = 512 was 4%
// faster than 256. kc x nr of B (32 KiB) fits L1 beside the streaming A panel; mc x kc
// of A (288 KiB) stays in L2; kc x nc of B (8 MiB) sits in L3.
constexpr std::int64_t kKc = 512, kMc = 24 * kMr, kNc = 4096;
static_assert(kMc % kMr == 0 && kNc % kNr == 0);
// op(B) read where it is stored only while its rows share a 4 KiB page: a micro-batch's
// dY W against chapter 01's fc2 at H 512 (rows of W 8 KiB apart) took 0.83 ms so and
// 0.72 ms packed (OpenBLAS: 0.70), against fc1 (2 KiB apart) 0.68 ms so and 0.78 packed.
constexpr std::int64_t kStridedMaxLdb = 1024;
const IsaKernels kKernels{kMr,          kNr,        kKc,           kMc,
                          kNc,          &micro_kernel, &widen_f16, &narrow_to_f16,
                          &transpose_pack, &partial_micro_kernel,
                          &strided_b_micro_kernel, &transposed_micro_kernel,
                          kTransposedColumns, kTransposedLanes, kStridedMaxLdb};

}  // namespace

const IsaKernels& avx2_kernels() { return kKernels; }

}  // namespace bigbatch::gemm_detail

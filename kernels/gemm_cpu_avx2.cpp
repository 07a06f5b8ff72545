// gemm_cpu_avx2.cpp: the CPU GEMM's AVX2 + FMA building blocks (see gemm.hpp, IsaKernels).
//
// Only the functions marked BIGBATCH_AVX2 use AVX2; they run only after gemm.cpp has
// asked cpu_supports (common/cpu_features.hpp), so the library still runs on any x86-64.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm.hpp"
#include "kernels/gemm_internal.hpp"

#define BIGBATCH_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace bigbatch::gemm_detail {
namespace {

// A 6 x 16 tile of C: 12 ymm accumulators, 2 ymm for the row of B at step k and one for
// the broadcast element of A (15 of the 16 registers).
constexpr int kMr = 6;
constexpr int kVectors = 2;  // ymm registers per row of the tile
constexpr int kNr = 8 * kVectors;
static_assert(kMr <= kMaxMr && kNr <= kMaxNr);

BIGBATCH_AVX2 void micro_kernel(std::int64_t kc, const float* a_panel, const float* b_panel,
                                float* c, std::int64_t ldc, AccumulatorStart start,
                                float beta) {
  __m256 acc[kMr][kVectors];
  const __m256 beta_v = _mm256_set1_ps(beta);
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      const float* c_rv = c + r * ldc + 8 * v;
      acc[r][v] = start == AccumulatorStart::zero       ? _mm256_setzero_ps()
                  : start == AccumulatorStart::scaled_c ? _mm256_mul_ps(beta_v, _mm256_loadu_ps(c_rv))
                                                        : _mm256_loadu_ps(c_rv);
    }
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    __m256 b_k[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) b_k[v] = _mm256_loadu_ps(b_panel + 8 * v);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const __m256 a_rk = _mm256_broadcast_ss(a_panel + r);
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm256_fmadd_ps(a_rk, b_k[v], acc[r][v]);
    }
    a_panel += kMr;
    b_panel += kNr;
  }
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
  }
}

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

// Blocking, measured on a 2-core Zen 4 (1024^3, kc from 256 to 512): kc = 512 was 4%
// faster than 256. kc x nr of B (32 KiB) fits L1 beside the streaming A panel; mc x kc
// of A (288 KiB) stays in L2; kc x nc of B (8 MiB) sits in L3.
constexpr std::int64_t kKc = 512, kMc = 24 * kMr, kNc = 4096;
static_assert(kMc % kMr == 0 && kNc % kNr == 0);
const IsaKernels kKernels{kMr, kNr, kKc, kMc, kNc, &micro_kernel, &widen_f16, &narrow_to_f16};

}  // namespace

const IsaKernels& avx2_kernels() { return kKernels; }

}  // namespace bigbatch::gemm_detail

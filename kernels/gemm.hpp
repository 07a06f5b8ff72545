// gemm.hpp: general matrix multiply, the one op every layer's forward and backward
// is made of.
//
//   gemm(a, trans_a, b, trans_b, c, alpha, beta)
//     C = alpha * op(A) op(B) + beta * C
//     op(A): [M, K]   A is stored [M, K], or [K, M] when trans_a
//     op(B): [K, N]   B is stored [K, N], or [N, K] when trans_b
//     C:     [M, N]   overwritten (=) when beta == 0: C is not read, so NaN or garbage
//                     in it does not propagate (as in BLAS); accumulated (+=, scaled
//                     by beta) otherwise.
//   dtypes: A, B f32 with C f32; or A, B both f16 (or both bf16) with C f32 or of their
//   dtype (products and sums in fp32, one rounding to the 16-bit type when C is stored);
//   or, on the CPU only, A, B and C f64 (the same chain in double, for the float64 runs of
//   whole models that the tests take finite differences of; simple loops, not fast).
//   All tensors rank 2, contiguous, on one device. M, N or K may be 0; K == 0 gives
//   C = beta * C (0 when beta == 0).
//
// The CPU arithmetic, exactly (every CPU path: portable, AVX2, AVX-512):
//
//   acc = (beta == 0) ? 0 : beta * C[i][j]   one float multiply; beta == 1 keeps C as is
//   for k = 0 .. K-1, in order:
//     acc = fma(alpha * a_ik, b_kj, acc)     alpha * a_ik rounded to float first (when
//                                            alpha == 1 it is a_ik itself); one fused
//                                            multiply-add, one rounding per term
//   C[i][j] = acc                            rounded once when C is f16 or bf16
//
// 16-bit operands (f16, bf16) are converted to float exactly as they are packed, so the
// chains above are the same for every dtype. Vector units work across
// output elements (j), never across k. Two properties follow, bit for bit:
//  - Batch invariance: an element's value never depends on M, N, the blocking, the
//    thread count or where the rows (or columns) are split. Rows computed in a batch of
//    1024 equal the same rows computed in micro-batches.
//  - Chaining over K (f32 C): one product over K equals the same product done as
//    consecutive chunks of K with beta = 1 after the first chunk, because each chunk
//    continues the same fma chain from the float stored in C. This is what makes
//    gradient accumulation over micro-batches (dW += dY_b^T X_b) exactly equal to the
//    full-batch weight gradient. (A 16-bit C is rounded between chunks, so chaining into
//    one is not exact: which is why gradients are accumulated in f32.)
// alpha == 0 is not special-cased: A and B are still read, so inf or NaN in them shows.
//
// The CUDA backend calls cuBLAS (f32: true fp32, no TF32; f16 and bf16: fp32
// accumulation on tensor cores). Its error obeys the same bound (tests/test_gemm.cpp
// explains it), but it makes no batch-invariance promise: cuBLAS may order the sums
// differently for different shapes.
//
// Host scratch used by the CPU path (packing buffers, the fp32 accumulator of a 16-bit C)
// is kept per thread for reuse and is not counted by the tracking allocator.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/tensor.hpp"

namespace bigbatch {

/// C = alpha * op(A) op(B) + beta * C; see the top of this file for shapes and dtypes.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);

namespace cpu {

/// The CPU implementation of bigbatch::gemm, on the path gemm_path() names; it checks
/// its arguments itself, all tensors on the CPU.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);

/// The CPU GEMM's instruction-set paths. All give bitwise identical results.
enum class GemmPath { portable, avx2, avx512 };

std::string_view gemm_path_name(GemmPath path);  ///< "portable", "avx2", "avx512"
/// The paths this CPU can run, portable first, fastest last.
std::vector<GemmPath> gemm_paths_supported();
/// The path cpu::gemm uses now on the calling thread: the fastest supported one unless
/// a ScopedGemmPath says otherwise.
GemmPath gemm_path();

/// Forces cpu::gemm on the calling thread to use `path` while the guard lives (for
/// tests and benchmarks). Throws std::invalid_argument if this CPU cannot run it.
class ScopedGemmPath {
 public:
  /// Forces `path` until destruction, which restores the thread's previous choice.
  explicit ScopedGemmPath(GemmPath path);
  ~ScopedGemmPath();
  ScopedGemmPath(const ScopedGemmPath&) = delete;
  ScopedGemmPath& operator=(const ScopedGemmPath&) = delete;

 private:
  int previous_;  // the thread's previous override, -1 for none
};

}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::gemm.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha = 1.0f, float beta = 0.0f);

/// Starts (true) or stops timing every CUDA GEMM (cuBLAS and the fused cuBLASLt epilogues)
/// with a pair of CUDA events around it, for benchmarks. Recording events adds no wait.
void set_gemm_timing(bool enabled);
/// Waits for the GEMMs timed since the last call and returns their total time in
/// milliseconds (cudaEventElapsedTime), forgetting them.
double take_gemm_milliseconds();
/// Records the start of a timed GEMM; the returned index goes to end_gemm_timing (-1 when
/// timing is off). For the .cu files that call cuBLAS.
int begin_gemm_timing();
/// Records the end of the timed GEMM `index` (nothing for -1).
void end_gemm_timing(int index);
}

}  // namespace bigbatch

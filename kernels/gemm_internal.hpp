// gemm_internal.hpp: what gemm.cpp, gemm.cu and the instruction-set files
// gemm_cpu_avx2.cpp / gemm_cpu_avx512.cpp share. Not part of the op API (gemm.hpp).
#pragma once

#include <cstdint>

#include "common/tensor.hpp"

namespace bigbatch {
namespace gemm_detail {

/// The sizes of a checked call: op(A) [m, k], op(B) [k, n], C [m, n].
struct GemmSizes {
  /// \var m
  /// Rows of op(A) and of C.
  /// \var n
  /// Columns of op(B) and of C.
  /// \var k
  /// Columns of op(A), rows of op(B): the length of each dot product.
  std::int64_t m = 0, n = 0, k = 0;
};

/// Checks ranks, dtypes and shapes (not devices); throws std::invalid_argument naming
/// the offending tensor. `op` prefixes the message.
GemmSizes check_gemm_arguments(const char* op, const Tensor& a, bool trans_a, const Tensor& b,
                               bool trans_b, const Tensor& c);

/// \var kMaxMr
/// Bound on every IsaKernels' mr (the driver keeps an edge tile on the stack).
/// \var kMaxNr
/// Bound on every IsaKernels' nr (the driver keeps an edge tile on the stack).
inline constexpr std::int64_t kMaxMr = 16, kMaxNr = 64;

/// How a micro-kernel starts its accumulators: 0, beta * C, or C itself.
enum class AccumulatorStart { zero, scaled_c, c };

/// One instruction set's building blocks for the blocked CPU driver in gemm.cpp.
struct IsaKernels {
  int mr;  ///< rows of C per micro-kernel call (A is packed in panels of mr rows)
  int nr;  ///< columns of C per micro-kernel call (B is packed in panels of nr columns)
  /// \var kc
  /// Cache blocking: the depth of a packed panel.
  /// \var mc
  /// Cache blocking: the rows of a packed A block, a multiple of mr.
  /// \var nc
  /// Cache blocking: the columns of a packed B block, a multiple of nr.
  std::int64_t kc, mc, nc;
  /// For r < mr, j < nr: starts acc per `start` from c[r * ldc + j], then for k < kc in
  /// order acc = fma(a_panel[k * mr + r], b_panel[k * nr + j], acc); stores acc there.
  void (*micro_kernel)(std::int64_t kc, const float* a_panel, const float* b_panel, float* c,
                       std::int64_t ldc, AccumulatorStart start, float beta);
  /// dst[i] = the binary16 value with bits src[i], as float (exact).
  void (*widen_f16)(const std::uint16_t* src, float* dst, std::int64_t n);
  /// dst[i] = the bits of src[i] rounded to binary16, to nearest even.
  void (*narrow_to_f16)(const float* src, std::uint16_t* dst, std::int64_t n);
  /// For lane < lanes, k < steps: dst[k * width + lane] = src[lane * ld + k], times scale
  /// unless scale is 1 (one rounded product, as the driver's own loop). Packs a panel whose
  /// lanes are rows of the stored matrix (op(B) transposed, op(A) not); lanes <= width
  /// and the padding lanes are left alone. nullptr: the driver's scalar loop does it.
  void (*transpose_pack)(const float* src, std::int64_t ld, std::int64_t lanes,
                         std::int64_t steps, float scale, float* dst, std::int64_t width) =
      nullptr;
  /// micro_kernel on the first `rows` rows of the tile only (0 < rows < mr; a_panel keeps
  /// its mr stride), for the last row panel of C; the same chains as micro_kernel. nullptr:
  /// the driver runs micro_kernel on a padded copy of the tile.
  void (*partial_micro_kernel)(int rows, std::int64_t kc, const float* a_panel,
                               const float* b_panel, float* c, std::int64_t ldc,
                               AccumulatorStart start, float beta) = nullptr;
  /// micro_kernel on the first `rows` (1 ... mr) rows of the tile, with op(B) read where it
  /// is stored, f32 [K, N]: row k of the panel at b + k * ldb (nr floats). The driver's
  /// way for a C of one row block (a micro-batch), whose op(B) would otherwise be packed
  /// again at every call. prefetch_b: a panel laid out the same way whose rows are asked
  /// of L2 meanwhile (the next one), or nullptr. nullptr: not offered.
  void (*strided_b_micro_kernel)(int rows, std::int64_t kc, const float* a_panel,
                                 const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                                 AccumulatorStart start, float beta,
                                 const float* prefetch_b) = nullptr;
  /// The same chains for a C of one row block whose op(B) is stored transposed, f32
  /// [N, K] (a forward's W), computed on C^T: for `columns` (1 ... transposed_columns)
  /// columns j of C and its transposed_lanes rows i, ct[j * transposed_lanes + i]
  /// continues acc = fma(a_panel[k * transposed_lanes + i], B[j][k], acc) for k < kc,
  /// where column j's row of B starts at b_rows + j * ldb and a_panel is a packed panel of
  /// alpha * op(A)^T whose lanes are the rows of C. next_rows: the b_rows of the next
  /// call, to prefetch (or nullptr). nullptr: not offered (transpose_pack must be offered
  /// with it: the driver transposes C with it).
  void (*transposed_micro_kernel)(int columns, std::int64_t kc, const float* b_rows,
                                  std::int64_t ldb, const float* a_panel, float* ct,
                                  AccumulatorStart start, float beta,
                                  const float* next_rows) = nullptr;
  /// \var transposed_columns
  /// Columns of C per transposed_micro_kernel call.
  /// \var transposed_lanes
  /// Rows of C per transposed_micro_kernel call: the lanes of its packed panel.
  std::int64_t transposed_columns = 0, transposed_lanes = 0;
  /// The largest ldb (floats) at which strided_b_micro_kernel beats packing op(B); 0: any.
  /// A panel row of one cache line (AVX2's nr of 16) whose rows lie pages apart costs a
  /// page walk per line read; packing the panel costs less there.
  std::int64_t strided_b_max_ldb = 0;
  /// The most bytes of op(B) one strided_b_micro_kernel call may span (its steps times
  /// the row stride); 0: any. A deeper block goes down the panel in slices of that span,
  /// every row tile through one slice before the next: rows pages apart are not
  /// prefetched by the hardware, and a deep panel of them evicts itself from L2 before
  /// the next row tile reads it again.
  std::int64_t strided_b_max_span = 0;
};


const IsaKernels& avx2_kernels();    ///< gemm_cpu_avx2.cpp; needs AVX2, FMA, F16C
const IsaKernels& avx512_kernels();  ///< gemm_cpu_avx512.cpp; needs AVX-512F, FMA, F16C

}  // namespace gemm_detail
}  // namespace bigbatch

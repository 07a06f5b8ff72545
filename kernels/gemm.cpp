#include "kernels/gemm.hpp"
#include "common/integer_math.hpp"
#include "kernels/gemm_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "common/cpu_features.hpp"
#include "common/bfloat16.hpp"
#include "common/half.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/dispatch.hpp"

namespace bigbatch {

// ---- argument checks and dispatch ---------------------------------------------------------

namespace gemm_detail {

GemmSizes check_gemm_arguments(const char* op, const Tensor& a, bool trans_a, const Tensor& b,
                               bool trans_b, const Tensor& c) {
  detail::check_rank(op, "A", a, 2);
  detail::check_rank(op, "B", b, 2);
  detail::check_rank(op, "C", c, 2);
  const DType ta = a.dtype(), tb = b.dtype(), tc = c.dtype();
  const bool f32 = ta == DType::f32 && tb == DType::f32 && tc == DType::f32;
  // 16-bit operands (both f16 or both bf16) with an f32 C or a C of their dtype.
  const bool half = is_half_width(ta) && tb == ta && (tc == DType::f32 || tc == ta);
  // f64 everywhere, on the CPU only: the oracles' float64 runs of whole models.
  const bool f64 = ta == DType::f64 && tb == DType::f64 && tc == DType::f64 &&
                   a.device().is_cpu() && b.device().is_cpu() && c.device().is_cpu();
  BIGBATCH_CHECK(f32 || half || f64, op, ": unsupported dtypes: A ", a.describe(), ", B ",
                 b.describe(), ", C ", c.describe(),
                 "; supported are A, B f32 with C f32, or A, B both f16 or both bf16 with C "
                 "f32 or of their dtype (and A, B, C f64 on the CPU)");

  GemmSizes sizes;
  sizes.m = a.dim(trans_a ? 1 : 0);
  sizes.k = a.dim(trans_a ? 0 : 1);
  const std::int64_t k_of_b = b.dim(trans_b ? 1 : 0);
  sizes.n = b.dim(trans_b ? 0 : 1);
  BIGBATCH_CHECK(sizes.k == k_of_b, op, ": inner dimensions differ: op(A) is [M, K] = [",
                 sizes.m, ", ", sizes.k, "] from A ", a.describe(),
                 trans_a ? " (transposed)" : "", ", but op(B) is [K, N] = [", k_of_b, ", ",
                 sizes.n, "] from B ", b.describe(), trans_b ? " (transposed)" : "");
  BIGBATCH_CHECK(c.dim(0) == sizes.m && c.dim(1) == sizes.n, op,
                 ": C must have shape [M, N] = [", sizes.m, ", ", sizes.n, "], got ",
                 c.describe());
  return sizes;
}

}  // namespace gemm_detail

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha, float beta) {
  const Device device = detail::common_device("gemm", {&a, &b, &c});
  gemm_detail::check_gemm_arguments("gemm", a, trans_a, b, trans_b, c);
  if (device.is_cuda()) BIGBATCH_RUN_CUDA("gemm", cuda::gemm(a, trans_a, b, trans_b, c, alpha, beta));
  cpu::gemm(a, trans_a, b, trans_b, c, alpha, beta);
}

// ---- CPU: instruction-set paths -------------------------------------------------------------

namespace cpu {

using gemm_detail::AccumulatorStart;
using gemm_detail::IsaKernels;

namespace {

// The portable path: scalar code with std::fma, which is one correctly rounded fused
// multiply-add (glibc uses the FMA instruction where there is one, exact software
// otherwise), so it matches the vector paths bit for bit.
constexpr int kPortableMr = 4;
constexpr int kPortableNr = 16;

// snippet: k-order
void portable_micro_kernel(std::int64_t kc, const float* a_panel, const float* b_panel,
                           float* c, std::int64_t ldc, AccumulatorStart start, float beta) {
  float acc[kPortableMr][kPortableNr];
  for (int r = 0; r < kPortableMr; ++r) {
    for (int j = 0; j < kPortableNr; ++j) {
      acc[r][j] = start == AccumulatorStart::zero       ? 0.0f
                  : start == AccumulatorStart::scaled_c ? beta * c[r * ldc + j]
                                                        : c[r * ldc + j];
    }
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* a_k = a_panel + k * kPortableMr;
    const float* b_k = b_panel + k * kPortableNr;
    for (int r = 0; r < kPortableMr; ++r) {
      for (int j = 0; j < kPortableNr; ++j) acc[r][j] = std::fma(a_k[r], b_k[j], acc[r][j]);
    }
  }
  for (int r = 0; r < kPortableMr; ++r) {
    for (int j = 0; j < kPortableNr; ++j) c[r * ldc + j] = acc[r][j];
  }
}
// snippet end: k-order

// The buffers hold f16 objects; they travel as uint16_t only to keep _Float16 out of
// the header that nvcc also reads.
void portable_widen_f16(const std::uint16_t* src, float* dst, std::int64_t n) {
  const f16* values = reinterpret_cast<const f16*>(src);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(values[i]);
}

void portable_narrow_to_f16(const float* src, std::uint16_t* dst, std::int64_t n) {
  f16* values = reinterpret_cast<f16*>(dst);
  for (std::int64_t i = 0; i < n; ++i) values[i] = static_cast<f16>(src[i]);
}

// Its time goes to the scalar fmas, so the blocking is only roughly sized to the caches.
const IsaKernels kPortableKernels{kPortableMr,      kPortableNr,          /*kc=*/256,
                                  /*mc=*/128,       /*nc=*/2048,          &portable_micro_kernel,
                                  &portable_widen_f16, &portable_narrow_to_f16};

bool cpu_can_run(GemmPath path) {
  switch (path) {
    case GemmPath::portable: return true;
    case GemmPath::avx2:
      return cpu_supports(CpuFeature::avx2) && cpu_supports(CpuFeature::fma) &&
             cpu_supports(CpuFeature::f16c);
    case GemmPath::avx512:
      return cpu_supports(CpuFeature::avx512f) && cpu_supports(CpuFeature::fma) &&
             cpu_supports(CpuFeature::f16c);
  }
  return false;
}

const IsaKernels& kernels_for(GemmPath path) {
  switch (path) {
    case GemmPath::portable: return kPortableKernels;
    case GemmPath::avx2: return gemm_detail::avx2_kernels();
    case GemmPath::avx512: return gemm_detail::avx512_kernels();
  }
  return kPortableKernels;
}

thread_local int forced_path = -1;  // a GemmPath set by ScopedGemmPath, or -1

}  // namespace

std::string_view gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::portable: return "portable";
    case GemmPath::avx2: return "avx2";
    case GemmPath::avx512: return "avx512";
  }
  return "?";
}

std::vector<GemmPath> gemm_paths_supported() {
  std::vector<GemmPath> paths;
  for (const GemmPath path : {GemmPath::portable, GemmPath::avx2, GemmPath::avx512}) {
    if (cpu_can_run(path)) paths.push_back(path);
  }
  return paths;
}

GemmPath gemm_path() {
  if (forced_path >= 0) return static_cast<GemmPath>(forced_path);
  static const GemmPath fastest = gemm_paths_supported().back();
  return fastest;
}

ScopedGemmPath::ScopedGemmPath(GemmPath path) : previous_(forced_path) {
  BIGBATCH_CHECK(cpu_can_run(path), "ScopedGemmPath: this CPU cannot run the ",
                 gemm_path_name(path), " GEMM path");
  forced_path = static_cast<int>(path);
}

ScopedGemmPath::~ScopedGemmPath() { forced_path = previous_; }

// ---- CPU: the blocked driver ------------------------------------------------------------------
//
// The classic BLIS loop nest, arranged so that every element of C follows the one fma
// chain of the header comment:
//
//   for each block of nc columns of C                                    (jc)
//     [16-bit C: for each chunk of rows, an fp32 accumulator; else C itself]
//     for each block of kc steps of K, in order                           (pc)
//       pack op(B)[pc, jc] into nr-column panels
//       for each block of mc rows                                         (ic)
//         pack alpha * op(A)[ic, pc] into mr-row panels
//         every mr x nr tile: the micro-kernel continues the tile's chains
//           for these kc steps from the values stored in the accumulator
//
// The first kc block starts each chain (0 or beta * C); later blocks load what the
// previous block stored, so splitting K changes no bit. Threads share no work: C is
// cut into one block of rows (or columns) per thread, and each thread runs the loop
// nest above on its block with its own packing buffers, with no barrier to wait at (a
// thread that the OS pauses delays only itself). Packing the shared operand once per
// thread costs little: one packed element per 2 x (rows of the block) flops.

namespace {

using gemm_detail::kMaxMr;
using gemm_detail::kMaxNr;
constexpr std::int64_t kParallelMinFlops = std::int64_t{1} << 22;  // below: one thread


/// A grow-only 64-byte aligned float buffer, reused across calls.
class AlignedFloats {
 public:
  float* get(std::int64_t count) {
    const auto n = static_cast<std::size_t>(count);
    if (n > size_) {
      data_.reset(static_cast<float*>(::operator new(n * sizeof(float), std::align_val_t{64})));
      size_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, Free> data_;
  std::size_t size_ = 0;
};

/// Packing buffers of the calling thread, kept for its next call.
struct Scratch {
  AlignedFloats packed_a, packed_b, half_accumulator;
  AlignedFloats transposed_a, transposed_c;  // the transposed micro-kernel's
};

Scratch& scratch_of_this_thread() {
  thread_local Scratch scratch;
  return scratch;
}

/// A GEMM operand as stored: element (row, col) of the stored matrix is at
/// data[row * ld + col], in f32, or (as raw 16 bits) f16 or bf16.
struct Operand {
  const void* data;
  DType dtype;
  std::int64_t ld;
  bool trans;
};

/// op(A): [m, k], op(B): [k, n], C: [m, n] with row stride ldc (a block of a larger C).
struct Problem {
  std::int64_t m, n, k;
  Operand a, b;
  float alpha, beta;
  void* c;  // f32, or (as raw 16 bits) f16 or bf16
  DType c_dtype;
  std::int64_t ldc;
};

const void* element_address(const void* data, DType dtype, std::int64_t offset) {
  return static_cast<const char*>(data) + offset * static_cast<std::int64_t>(dtype_size(dtype));
}

/// Whether C is kept in a 16-bit type (then the chains run in an fp32 accumulator).
bool half_c(const Problem& p) { return p.c_dtype != DType::f32; }

/// dst[i] = float(src[i]) for i < n, exactly, from f16 or bf16 bits. (bf16's widening is a
/// shift, the same instructions on every path.)
void widen(const IsaKernels& isa, DType dtype, const std::uint16_t* src, float* dst,
           std::int64_t n) {
  if (dtype == DType::f16) return isa.widen_f16(src, dst, n);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(bf16{src[i]});
}

/// dst[i] = the bits of src[i] rounded to f16 or bf16, to nearest even, for i < n.
void narrow(const IsaKernels& isa, DType dtype, const float* src, std::uint16_t* dst,
            std::int64_t n) {
  if (dtype == DType::f16) return isa.narrow_to_f16(src, dst, n);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]).bits;
}

/// The block of `p` with rows [row0, row0 + rows) and columns [col0, col0 + cols) of C.
Problem sub_problem(const Problem& p, std::int64_t row0, std::int64_t rows, std::int64_t col0,
                    std::int64_t cols) {
  Problem block = p;
  block.m = rows;
  block.n = cols;
  // Row i of op(A) starts at element i * ld of A, or at element i when A is transposed.
  block.a.data = element_address(p.a.data, p.a.dtype, p.a.trans ? row0 : row0 * p.a.ld);
  // Column j of op(B) starts at element j of B, or at element j * ld when transposed.
  block.b.data = element_address(p.b.data, p.b.dtype, p.b.trans ? col0 * p.b.ld : col0);
  block.c = const_cast<void*>(element_address(p.c, p.c_dtype, row0 * p.ldc + col0));
  return block;
}

/// dst[i] = src[i] for i < n: a panel's row of a few floats (mr or nr of them), where
/// std::copy's call to memmove cost more than the copy.
void copy_floats(const float* src, std::int64_t n, float* dst) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(dst + i, src + i, 8 * sizeof(float));
  if (i + 4 <= n) {
    std::memcpy(dst + i, src + i, 4 * sizeof(float));
    i += 4;
  }
  for (; i < n; ++i) dst[i] = src[i];
}

/// A contiguous run of n elements as floats: the run itself, or widened into `buffer`.
const float* run_as_floats(const void* run, DType dtype, std::int64_t n, const IsaKernels& isa,
                           float* buffer) {
  if (dtype == DType::f32) return static_cast<const float*>(run);
  widen(isa, dtype, static_cast<const std::uint16_t*>(run), buffer, n);
  return buffer;
}

/// Packs one panel of `width` lanes (rows of op(A) or columns of op(B)) by kc steps:
/// dst[k * width + lane] = scale * src(lane, k) for lane < lanes, 0 for the padding lanes.
/// src(lane, k) is element `first` + lane * lane_stride + k * k_stride of x; when
/// lanes_contiguous, lane_stride is 1 and k_stride = outer_stride (each k is a run of
/// lanes), else k_stride is 1 and lane_stride = outer_stride (each lane is a run along
/// k). scale == 1 copies the values unchanged.
void pack_panel(const Operand& x, std::int64_t first, bool lanes_contiguous,
                std::int64_t outer_stride, std::int64_t lanes, std::int64_t width,
                std::int64_t kc, float scale, const IsaKernels& isa, float* dst) {
  // Runs along k are packed kPackSteps at a time, so that the slice of the panel being
  // scattered into (kPackSteps x width floats) stays in L1.
  constexpr std::int64_t kPackSteps = 64;
  alignas(64) float run_buffer[kPackSteps > kMaxNr ? kPackSteps : kMaxNr];
  if (lanes_contiguous) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const float* run = run_as_floats(
          element_address(x.data, x.dtype, first + k * outer_stride), x.dtype, lanes, isa,
          run_buffer);
      float* out = dst + k * width;
      if (scale == 1.0f) {
        copy_floats(run, lanes, out);
      } else {
        for (std::int64_t lane = 0; lane < lanes; ++lane) out[lane] = scale * run[lane];
      }
      std::fill(out + lanes, out + width, 0.0f);
    }
    return;
  }
  if (x.dtype == DType::f32 && isa.transpose_pack != nullptr) {
    isa.transpose_pack(static_cast<const float*>(x.data) + first, outer_stride, lanes, kc,
                       scale, dst, width);
    if (lanes < width) {
      for (std::int64_t k = 0; k < kc; ++k) {
        std::fill(dst + k * width + lanes, dst + (k + 1) * width, 0.0f);
      }
    }
    return;
  }
  for (std::int64_t k0 = 0; k0 < kc; k0 += kPackSteps) {
    const std::int64_t steps = std::min(kPackSteps, kc - k0);
    float* out = dst + k0 * width;
    for (std::int64_t lane = 0; lane < lanes; ++lane) {
      const float* run = run_as_floats(
          element_address(x.data, x.dtype, first + lane * outer_stride + k0), x.dtype, steps, isa,
          run_buffer);
      if (scale == 1.0f) {
        for (std::int64_t k = 0; k < steps; ++k) out[k * width + lane] = run[k];
      } else {
        for (std::int64_t k = 0; k < steps; ++k) out[k * width + lane] = scale * run[k];
      }
    }
    for (std::int64_t k = 0; k < steps; ++k) {
      std::fill(out + k * width + lanes, out + (k + 1) * width, 0.0f);
    }
  }
}

/// Asks the cache (Locality as __builtin_prefetch's: 3 for L1, 2 for L2) for elements
/// [first, first + length) of the stored rows [row_begin, row_end) of x: every line of each
/// run, its last included.
template <int Locality>
void prefetch_runs(const Operand& x, std::int64_t row_begin, std::int64_t row_end,
                   std::int64_t first, std::int64_t length) {
  const auto bytes = length * static_cast<std::int64_t>(dtype_size(x.dtype));
  for (std::int64_t row = row_begin; row < row_end; ++row) {
    const auto* run =
        static_cast<const char*>(element_address(x.data, x.dtype, row * x.ld + first));
    for (std::int64_t byte = 0; byte < bytes; byte += 64) {
      __builtin_prefetch(run + byte, 0, Locality);
    }
    __builtin_prefetch(run + bytes - 1, 0, Locality);
  }
}

/// Steps of K per sweep across a block's panels, where each step is a run of lanes (a row
/// of the stored matrix) and the block has several panels. A panel at a time, every step
/// would read a line or two of a row that the next panel reads again, after rows enough to
/// evict it: rows a multiple of 4 KiB apart share one set of L1, which holds 8 to 12 of
/// them. A sweep of 8 steps stays in L1 across the panels, and the next sweep's rows are
/// asked for meanwhile (the hardware prefetchers follow runs within a page, and these rows
/// lie pages apart). Packing dY^T of fc1's weight gradient at 1024 rows (AVX2, one thread)
/// took 14% of the GEMM's time a panel at a time, 9% in sweeps.
constexpr std::int64_t kSweepSteps = 8;

/// Packs the block of `block_lanes` lanes from lane0 into panels of `width` lanes by kc
/// steps from k0 (panel q at packed + q * width * kc), each as pack_panel does. Lane l,
/// step k is element (k * ld + l) of x when lanes_contiguous, else (l * ld + k).
void pack_panels(const Operand& x, std::int64_t lane0, std::int64_t block_lanes,
                 std::int64_t width, std::int64_t k0, std::int64_t kc, bool lanes_contiguous,
                 float scale, const IsaKernels& isa, float* packed) {
  const std::int64_t ld = x.ld;
  const bool sweeping = lanes_contiguous && block_lanes > width;
  const std::int64_t sweep = sweeping ? kSweepSteps : kc;
  for (std::int64_t k1 = 0; k1 < kc; k1 += sweep) {
    const std::int64_t steps = std::min(sweep, kc - k1), k = k0 + k1;
    if (sweeping) {  // the next sweep's rows
      prefetch_runs<3>(x, k + steps, std::min(k + steps + sweep, k0 + kc), lane0, block_lanes);
    }
    for (std::int64_t q = 0; q * width < block_lanes; ++q) {
      const std::int64_t lane = lane0 + q * width;
      const std::int64_t lanes = std::min(width, lane0 + block_lanes - lane);
      const std::int64_t first = lanes_contiguous ? k * ld + lane : lane * ld + k;
      pack_panel(x, first, lanes_contiguous, /*outer_stride=*/ld, lanes, width, steps, scale, isa,
                 packed + q * width * kc + k1 * width);
    }
  }
}

/// Packs alpha * op(A)[rows, ks] into mr-row panels of kc steps. A is stored [M, K] (row
/// i, col k) or, when trans, [K, M] (row k, col i: each step a run of rows of op(A)).
void pack_a_block(const Problem& p, const IsaKernels& isa, std::int64_t row0, std::int64_t rows,
                  std::int64_t k0, std::int64_t kc, float* packed) {
  pack_panels(p.a, row0, rows, isa.mr, k0, kc, /*lanes_contiguous=*/p.a.trans, p.alpha, isa,
              packed);
}

/// Packs op(B)[ks, cols] into nr-column panels of kc steps. B is stored [K, N] (row k, col
/// j: each step a run of columns) or, when trans, [N, K] (row j, col k).
void pack_b_block(const Problem& p, const IsaKernels& isa, std::int64_t k0, std::int64_t kc,
                  std::int64_t col0, std::int64_t cols, float* packed) {
  pack_panels(p.b, col0, cols, isa.nr, k0, kc, /*lanes_contiguous=*/!p.b.trans, 1.0f, isa,
              packed);
}

/// Asks L2 for the elements of op(B)[k0 : k0 + kc, col0 : col0 + cols] ahead of their
/// packing: while the tiles of one panel are computed, the next panel's source arrives.
void prefetch_b_panel(const Problem& p, std::int64_t k0, std::int64_t kc, std::int64_t col0,
                      std::int64_t cols) {
  if (p.b.trans) {  // B stored [N, K]: one run of kc elements per column
    prefetch_runs<2>(p.b, col0, col0 + cols, k0, kc);
  } else {  // B stored [K, N]: one run of cols elements per step k
    prefetch_runs<2>(p.b, k0, k0 + kc, col0, cols);
  }
}

/// A tile at the edge of C (rows < mr or cols < nr): the micro-kernel runs on a full
/// tile in a local buffer, so every valid element gets exactly the same arithmetic.
void edge_tile(const IsaKernels& isa, std::int64_t kc, const float* a_panel,
               const float* b_panel, float* c, std::int64_t ldc, std::int64_t rows,
               std::int64_t cols, AccumulatorStart start, float beta) {
  alignas(64) float tile[kMaxMr * kMaxNr] = {};
  const std::int64_t nr = isa.nr;
  if (start != AccumulatorStart::zero) {
    for (std::int64_t r = 0; r < rows; ++r) std::copy(c + r * ldc, c + r * ldc + cols, tile + r * nr);
  }
  isa.micro_kernel(kc, a_panel, b_panel, tile, nr, start, beta);
  for (std::int64_t r = 0; r < rows; ++r) std::copy(tile + r * nr, tile + r * nr + cols, c + r * ldc);
}

/// Asks the cache for the C tile at `c` ahead of time: a micro-kernel's first loads are
/// of its C tile, which an earlier kc block (or the caller) left in memory.
void prefetch_tile(const float* c, std::int64_t ldc, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < cols; j += 16) __builtin_prefetch(c + r * ldc + j, 1, 3);
    __builtin_prefetch(c + r * ldc + cols - 1, 1, 3);
  }
}

/// One tile of C from its packed panels: the full micro-kernel, the partial one for a last
/// row panel, or a padded copy.
void compute_tile(const IsaKernels& isa, std::int64_t kc, const float* a_panel,
                  const float* b_panel, float* c, std::int64_t ld_acc, std::int64_t tile_rows,
                  std::int64_t tile_cols, AccumulatorStart start, float beta) {
  if (tile_rows == isa.mr && tile_cols == isa.nr) {
    isa.micro_kernel(kc, a_panel, b_panel, c, ld_acc, start, beta);
  } else if (tile_cols == isa.nr && isa.partial_micro_kernel != nullptr) {
    isa.partial_micro_kernel(static_cast<int>(tile_rows), kc, a_panel, b_panel, c, ld_acc,
                             start, beta);
  } else {
    edge_tile(isa, kc, a_panel, b_panel, c, ld_acc, tile_rows, tile_cols, start, beta);
  }
}

/// Below this many steps a kc block moves more bytes of C than of packed B (a micro-batch's
/// weight gradient, K = its rows): the tiles then go along C's rows.
constexpr std::int64_t kShortK = 128;

/// Every tile of an [rows, cols] block of the accumulator, for one kc block.
void compute_block(const IsaKernels& isa, std::int64_t kc, const float* packed_a,
                   std::int64_t rows, const float* packed_b, std::int64_t cols, float* acc,
                   std::int64_t ld_acc, AccumulatorStart start, float beta) {
  const std::int64_t mr = isa.mr, nr = isa.nr;
  if (kc < kShortK) {
    // Row panel outermost: each tile's C follows the last one's along the same rows, and
    // the next tile's C is asked for while this one computes.
    for (std::int64_t i = 0; i < rows; i += mr) {
      const float* a_panel = packed_a + i * kc;
      const std::int64_t tile_rows = std::min(mr, rows - i);
      for (std::int64_t j = 0; j < cols; j += nr) {
        float* c = acc + i * ld_acc + j;
        const std::int64_t tile_cols = std::min(nr, cols - j);
        if (j + nr < cols) {
          prefetch_tile(c + nr, ld_acc, tile_rows, std::min(nr, cols - j - nr));
        } else if (i + mr < rows) {
          prefetch_tile(acc + (i + mr) * ld_acc, ld_acc, std::min(mr, rows - i - mr),
                        std::min(nr, cols));
        }
        compute_tile(isa, kc, a_panel, packed_b + j * kc, c, ld_acc, tile_rows, tile_cols,
                     start, beta);
      }
    }
    return;
  }
  // Column panel outermost, so one packed B panel stays in cache across row panels.
  for (std::int64_t j = 0; j < cols; j += nr) {
    const float* b_panel = packed_b + j * kc;
    const std::int64_t tile_cols = std::min(nr, cols - j);
    for (std::int64_t i = 0; i < rows; i += mr) {
      float* c = acc + i * ld_acc + j;
      const std::int64_t tile_rows = std::min(mr, rows - i);
      // The next tile down this column panel, or the first of the next one.
      if (i + mr < rows) {
        prefetch_tile(c + mr * ld_acc, ld_acc, std::min(mr, rows - i - mr), tile_cols);
      } else if (j + nr < cols) {
        prefetch_tile(acc + j + nr, ld_acc, std::min(mr, rows), std::min(nr, cols - j - nr));
      }
      compute_tile(isa, kc, packed_a + i * kc, b_panel, c, ld_acc, tile_rows, tile_cols,
                   start, beta);
    }
  }
}

/// Whether the transposed micro-kernel serves `p`: offered, with an f32 C.
bool transposed_kernel_fits(const Problem& p, const IsaKernels& isa) {
  return isa.transposed_micro_kernel != nullptr && isa.transpose_pack != nullptr && !half_c(p);
}

/// One kc block of a C of one row block (rows <= mc) with f32 operands, where op(B) is
/// read where it is stored rather than packed at every call (a micro-batch's GEMMs meet
/// the same weights 16 times a step at 64 rows): op(B) stored [K, N] (a backward's dY W)
/// goes to the strided-B micro-kernel, a panel at a time; stored transposed [N, K] (a
/// forward's x W^T) to the transposed micro-kernel, transposed_columns columns of C at a
/// time against alpha * op(A)^T packed with the rows of C as its transposed_lanes lanes,
/// on a transposed copy of C. A column panel narrower than nr is packed as usual.
/// Returns false, having done nothing, when the instruction set offers no such kernel.
bool compute_block_from_stored_b(const Problem& p, const IsaKernels& isa, Scratch& scratch,
                                 std::int64_t chunk0, std::int64_t rows, std::int64_t k0,
                                 std::int64_t kc, std::int64_t col0, std::int64_t cols,
                                 float* acc, std::int64_t ld_acc, AccumulatorStart start,
                                 float* packed_a, float* packed_b) {
  const std::int64_t mr = isa.mr, nr = isa.nr;
  const auto* b = static_cast<const float*>(p.b.data);
  if (p.b.trans) {
    // C's rows as lanes, its columns as the broadcast side, on a transposed copy of C's
    // block (each panel of rows: cols x lanes floats), written back at the end.
    if (!transposed_kernel_fits(p, isa)) return false;
    const std::int64_t lanes = isa.transposed_lanes, width = isa.transposed_columns;
    const std::int64_t row_panels = ceil_div(rows, lanes);
    float* packed = scratch.transposed_a.get(row_panels * lanes * kc);
    float* ct = scratch.transposed_c.get(row_panels * lanes * cols);
    for (std::int64_t q = 0; q < row_panels; ++q) {
      const std::int64_t i = chunk0 + q * lanes;
      const std::int64_t panel_rows = std::min(lanes, chunk0 + rows - i);
      const std::int64_t first = p.a.trans ? k0 * p.a.ld + i : i * p.a.ld + k0;
      pack_panel(p.a, first, /*lanes_contiguous=*/p.a.trans, /*outer_stride=*/p.a.ld,
                 panel_rows, lanes, kc, p.alpha, isa, packed + q * lanes * kc);
      // ct[j * lanes + r] = C[r][j] (the padding rows start at 0 and are never stored).
      float* ct_q = ct + q * lanes * cols;
      if (start == AccumulatorStart::zero) continue;
      if (panel_rows < lanes) std::fill(ct_q, ct_q + lanes * cols, 0.0f);
      isa.transpose_pack(acc + q * lanes * ld_acc, ld_acc, panel_rows, cols, 1.0f, ct_q, lanes);
    }
    for (std::int64_t j = 0; j < cols; j += width) {
      const int columns = static_cast<int>(std::min(width, cols - j));
      const float* b_rows = b + (col0 + j) * p.b.ld + k0;  // B[col0 + j][k0]
      // The last panel of rows prefetches the next columns' rows of B (the first
      // panels re-read this call's from L1), when the next tile is a whole one.
      const float* next_rows = j + 2 * width <= cols ? b_rows + width * p.b.ld : nullptr;
      for (std::int64_t q = 0; q < row_panels; ++q) {
        isa.transposed_micro_kernel(columns, kc, b_rows, p.b.ld, packed + q * lanes * kc,
                                    ct + q * lanes * cols + j * lanes, start, p.beta,
                                    q + 1 == row_panels ? next_rows : nullptr);
      }
    }
    for (std::int64_t q = 0; q < row_panels; ++q) {  // C[r][j] = ct[j * lanes + r]
      isa.transpose_pack(ct + q * lanes * cols, lanes, cols, std::min(lanes, rows - q * lanes),
                         1.0f, acc + q * lanes * ld_acc, ld_acc);
    }
    return true;
  }
  if (isa.strided_b_micro_kernel == nullptr ||
      (isa.strided_b_max_ldb > 0 && p.b.ld > isa.strided_b_max_ldb)) {
    return false;
  }
  pack_a_block(p, isa, chunk0, rows, k0, kc, packed_a);
  // The fewest equal slices of the kc steps (to a step) whose rows each span about
  // strided_b_max_span bytes of op(B) or less.
  const std::int64_t span = kc * p.b.ld * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t slices =
      isa.strided_b_max_span > 0 ? ceil_div(span, isa.strided_b_max_span) : 1;
  const std::int64_t slice = ceil_div(kc, slices);
  for (std::int64_t j = 0; j < cols; j += nr) {
    const std::int64_t width = std::min(nr, cols - j);
    if (width < nr) {  // the last, narrow panel: packed, with its padding
      pack_b_block(p, isa, k0, kc, col0 + j, width, packed_b);
      compute_block(isa, kc, packed_a, rows, packed_b, width, acc + j, ld_acc, start, p.beta);
      continue;
    }
    const float* b_panel = b + k0 * p.b.ld + col0 + j;  // B[k0][col0 + j]
    const float* next_panel = j + 2 * nr <= cols ? b_panel + nr : nullptr;
    // The panel in slices of steps (one slice unless its rows lie far apart), every row
    // tile through one slice before the next (C carries each chain from slice to slice,
    // as from one kc block to the next). The first row tile of the last slice asks L2 for
    // the next full panel's first slice while it reads its own from memory; the other
    // tiles find their slice there. Not the next slice of this panel: its rows fall in
    // the same sets of L2 as this slice's and would evict them.
    for (std::int64_t s0 = 0; s0 < kc; s0 += slice) {
      const std::int64_t steps = std::min(slice, kc - s0);
      const float* next = s0 + steps == kc ? next_panel : nullptr;
      for (std::int64_t i = 0; i < rows; i += mr) {
        isa.strided_b_micro_kernel(static_cast<int>(std::min(mr, rows - i)), steps,
                                   packed_a + i * kc + s0 * mr, b_panel + s0 * p.b.ld, p.b.ld,
                                   acc + i * ld_acc + j, ld_acc,
                                   s0 == 0 ? start : AccumulatorStart::c, p.beta,
                                   i == 0 ? next : nullptr);
      }
    }
  }
  return true;
}

/// acc[r][j] = beta == 0 ? 0 : beta * float(C[r][j]) for a 16-bit C (f16 or bf16).
void load_half_block(DType dtype, const std::uint16_t* c, std::int64_t ldc, std::int64_t rows,
                     std::int64_t cols, float beta, const IsaKernels& isa, float* acc,
                     std::int64_t ld_acc) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out = acc + r * ld_acc;
    if (beta == 0.0f) {
      std::fill(out, out + cols, 0.0f);
      continue;
    }
    widen(isa, dtype, c + r * ldc, out, cols);
    if (beta != 1.0f) {
      for (std::int64_t j = 0; j < cols; ++j) out[j] = beta * out[j];
    }
  }
}

/// C[r][j] = acc[r][j] rounded to C's 16-bit dtype.
void store_half_block(DType dtype, const float* acc, std::int64_t ld_acc, std::int64_t rows,
                      std::int64_t cols, const IsaKernels& isa, std::uint16_t* c,
                      std::int64_t ldc) {
  for (std::int64_t r = 0; r < rows; ++r) narrow(isa, dtype, acc + r * ld_acc, c + r * ldc, cols);
}

AccumulatorStart first_block_start(const Problem& p) {
  if (half_c(p)) return AccumulatorStart::c;  // load_half_block applied beta already
  if (p.beta == 0.0f) return AccumulatorStart::zero;
  return p.beta == 1.0f ? AccumulatorStart::c : AccumulatorStart::scaled_c;
}

/// Rows of C per pass over K: all of them for an f32 C (the chains live in C itself);
/// for a 16-bit C, chunks whose fp32 accumulator (chunk x nc floats) stays a few MiB,
/// large enough that repacking B once per chunk costs little.
std::int64_t rows_per_chunk(const Problem& p, const IsaKernels& isa) {
  return half_c(p) ? std::min(p.m, round_up(512, isa.mc)) : p.m;
}

/// The loop nest above, on one thread, with that thread's scratch.
void run_blocked(const Problem& p, const IsaKernels& isa) {
  Scratch& scratch = scratch_of_this_thread();
  const std::int64_t chunk_rows = rows_per_chunk(p, isa);
  const std::int64_t nc_max = std::min(isa.nc, round_up(p.n, isa.nr));
  const std::int64_t kc_max = std::min(isa.kc, p.k);
  float* packed_a = scratch.packed_a.get(std::min(isa.mc, round_up(p.m, isa.mr)) * kc_max);
  float* packed_b = scratch.packed_b.get(kc_max * nc_max);
  float* half_accumulator =
      half_c(p) ? scratch.half_accumulator.get(chunk_rows * nc_max) : nullptr;

  for (std::int64_t col0 = 0; col0 < p.n; col0 += isa.nc) {
    const std::int64_t cols = std::min(isa.nc, p.n - col0);
    for (std::int64_t chunk0 = 0; chunk0 < p.m; chunk0 += chunk_rows) {
      const std::int64_t chunk = std::min(chunk_rows, p.m - chunk0);
      // The fp32 values the chains continue from: C itself, or a copy of a 16-bit C.
      float* acc = half_c(p) ? half_accumulator
                             : static_cast<float*>(p.c) + chunk0 * p.ldc + col0;
      const std::int64_t ld_acc = half_c(p) ? cols : p.ldc;
      auto* c_half = static_cast<std::uint16_t*>(p.c) + chunk0 * p.ldc + col0;
      if (half_c(p)) {
        load_half_block(p.c_dtype, c_half, p.ldc, chunk, cols, p.beta, isa, acc, ld_acc);
      }
      // The transposed micro-kernel transposes C in and out at every K block: it takes K
      // in longer blocks (up to 4 kc: a packed panel of at most 4 kc x 64 floats).
      // compute_block_from_stored_b takes every such block (the other paths' buffers hold
      // kc steps only).
      const bool transposed = chunk <= isa.mc && p.b.dtype == DType::f32 && p.b.trans &&
                              transposed_kernel_fits(p, isa);
      const std::int64_t k_block = transposed ? 4 * isa.kc : isa.kc;
      for (std::int64_t k0 = 0; k0 < p.k; k0 += k_block) {
        const std::int64_t kc = std::min(k_block, p.k - k0);
        const AccumulatorStart start = k0 == 0 ? first_block_start(p) : AccumulatorStart::c;
        if (chunk <= isa.mc) {
          // One block of rows (a micro-batch): op(B) is read where it is stored, or packed
          // one panel at a time, just before the tiles that use it, while the next
          // panel's source is prefetched.
          if (p.b.dtype == DType::f32 &&
              compute_block_from_stored_b(p, isa, scratch, chunk0, chunk, k0, kc, col0, cols,
                                          acc, ld_acc, start, packed_a, packed_b)) {
            continue;
          }
          pack_a_block(p, isa, chunk0, chunk, k0, kc, packed_a);
          for (std::int64_t j = 0; j < cols; j += isa.nr) {
            const std::int64_t panel_cols = std::min<std::int64_t>(isa.nr, cols - j);
            pack_b_block(p, isa, k0, kc, col0 + j, panel_cols, packed_b);
            if (j + isa.nr < cols) {
              prefetch_b_panel(p, k0, kc, col0 + j + isa.nr,
                               std::min<std::int64_t>(isa.nr, cols - j - isa.nr));
            }
            compute_block(isa, kc, packed_a, chunk, packed_b, panel_cols, acc + j, ld_acc,
                          start, p.beta);
          }
          continue;
        }
        pack_b_block(p, isa, k0, kc, col0, cols, packed_b);
        for (std::int64_t row0 = 0; row0 < chunk; row0 += isa.mc) {
          const std::int64_t rows = std::min(isa.mc, chunk - row0);
          pack_a_block(p, isa, chunk0 + row0, rows, k0, kc, packed_a);
          compute_block(isa, kc, packed_a, rows, packed_b, cols, acc + row0 * ld_acc, ld_acc,
                        start, p.beta);
        }
      }
      if (half_c(p)) store_half_block(p.c_dtype, acc, ld_acc, chunk, cols, isa, c_half, p.ldc);
    }
  }
}

/// How C is cut among threads: row_parts x col_parts blocks, one per thread.
struct Partition {
  int row_parts, col_parts;
};

/// The cut into the most blocks (at most `threads`) that each hold whole mr x nr tiles;
/// among those, the one that packs the least twice: each extra row part repacks all of
/// op(B) (k x n), each extra column part all of op(A) (m x k). Ties go to more row parts,
/// whose blocks of C are contiguous.
Partition partition_for(const Problem& p, const IsaKernels& isa, int threads) {
  const std::int64_t row_panels = ceil_div(p.m, isa.mr);
  const std::int64_t col_panels = ceil_div(p.n, isa.nr);
  Partition best{1, 1};
  double best_cost = static_cast<double>(p.n) + static_cast<double>(p.m);
  for (int row_parts = 1; row_parts <= threads && row_parts <= row_panels; ++row_parts) {
    const int col_parts = static_cast<int>(std::min<std::int64_t>(threads / row_parts, col_panels));
    const double cost = static_cast<double>(row_parts) * static_cast<double>(p.n) +
                        static_cast<double>(col_parts) * static_cast<double>(p.m);
    const int blocks = row_parts * col_parts, best_blocks = best.row_parts * best.col_parts;
    if (blocks > best_blocks || (blocks == best_blocks && cost <= best_cost)) {
      best = {row_parts, col_parts};
      best_cost = cost;
    }
  }
  return best;
}

/// Part `part` of `parts` of `count` elements, cut at multiples of `unit`: [begin, end).
std::pair<std::int64_t, std::int64_t> part_range(std::int64_t count, std::int64_t unit,
                                                 int part, int parts) {
  const std::int64_t units = ceil_div(count, unit);
  const std::int64_t begin = units * part / parts * unit;
  const std::int64_t end = std::min(count, units * (part + 1) / parts * unit);
  return {begin, end};
}

/// Computes block `part` (row-major numbering) of the cut of C.
void run_part(const Problem& p, const IsaKernels& isa, Partition cut, int part) {
  const auto [row0, row1] = part_range(p.m, isa.mr, part / cut.col_parts, cut.row_parts);
  const auto [col0, col1] = part_range(p.n, isa.nr, part % cut.col_parts, cut.col_parts);
  if (row0 < row1 && col0 < col1) {
    run_blocked(sub_problem(p, row0, row1 - row0, col0, col1 - col0), isa);
  }
}

void run_threaded(const Problem& p, const IsaKernels& isa) {
  const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) *
                       static_cast<double>(p.k);
  const int threads = flops < static_cast<double>(kParallelMinFlops) ? 1 : max_threads();
  const Partition cut = partition_for(p, isa, threads);
  if (cut.row_parts * cut.col_parts <= 1) {
    run_blocked(p, isa);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel num_threads(cut.row_parts * cut.col_parts)
  {
    // A nested call may get fewer threads than asked: then each takes several parts.
    for (int part = omp_get_thread_num(); part < cut.row_parts * cut.col_parts;
         part += omp_get_num_threads()) {
      run_part(p, isa, cut, part);
    }
  }
#else
  run_blocked(p, isa);  // unreachable: without OpenMP max_threads() is 1
#endif
}

/// K == 0: C = beta * C (0 when beta == 0), with the same roundings as the chain's start.
void scale_c(const Problem& p, const IsaKernels& isa) {
  if (p.beta == 1.0f) return;  // C stays exactly as it is
  if (!half_c(p)) {
    float* c = static_cast<float*>(p.c);
    for (std::int64_t i = 0; i < p.m * p.n; ++i) c[i] = p.beta == 0.0f ? 0.0f : p.beta * c[i];
    return;
  }
  std::vector<float> row(static_cast<std::size_t>(p.n));
  auto* c = static_cast<std::uint16_t*>(p.c);
  for (std::int64_t i = 0; i < p.m; ++i) {
    load_half_block(p.c_dtype, c + i * p.n, p.n, 1, p.n, p.beta, isa, row.data(), p.n);
    narrow(isa, p.c_dtype, row.data(), c + i * p.n, p.n);
  }
}

/// The f64 path (CPU only, for float64 oracles): the header's chain in double, element by
/// element, with std::fma in double; no packing, no vectors, parallel over rows.
void gemm_float64(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  const gemm_detail::GemmSizes& sizes, float alpha, float beta) {
  const double* as = a.data<double>();
  const double* bs = b.data<double>();
  double* cs = c.data<double>();
  const std::int64_t lda = a.dim(1), ldb = b.dim(1), n = sizes.n, k_end = sizes.k;
  parallel_for(sizes.m, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = beta == 0.0f ? 0.0 : double{beta} * cs[i * n + j];
        for (std::int64_t k = 0; k < k_end; ++k) {
          const double a_ik = trans_a ? as[k * lda + i] : as[i * lda + k];
          const double b_kj = trans_b ? bs[j * ldb + k] : bs[k * ldb + j];
          acc = std::fma(alpha == 1.0f ? a_ik : double{alpha} * a_ik, b_kj, acc);
        }
        cs[i * n + j] = acc;
      }
    }
  });
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          float alpha, float beta) {
  const auto sizes = gemm_detail::check_gemm_arguments("cpu::gemm", a, trans_a, b, trans_b, c);
  BIGBATCH_CHECK(a.device().is_cpu() && b.device().is_cpu() && c.device().is_cpu(),
                 "cpu::gemm: all tensors must be on the CPU, got A ", a.describe(), ", B ",
                 b.describe(), ", C ", c.describe());
  if (sizes.m == 0 || sizes.n == 0) return;
  if (a.dtype() == DType::f64) {
    gemm_float64(a, trans_a, b, trans_b, c, sizes, alpha, beta);
    return;
  }
  const Problem p{sizes.m,
                  sizes.n,
                  sizes.k,
                  Operand{a.raw_data(), a.dtype(), a.dim(1), trans_a},
                  Operand{b.raw_data(), b.dtype(), b.dim(1), trans_b},
                  alpha,
                  beta,
                  c.raw_data(),
                  c.dtype(),
                  sizes.n};
  const IsaKernels& isa = kernels_for(gemm_path());
  if (sizes.k == 0) {
    scale_c(p, isa);
    return;
  }
  run_threaded(p, isa);
}

}  // namespace cpu
}  // namespace bigbatch

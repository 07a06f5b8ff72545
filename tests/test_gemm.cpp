// gemm: C = alpha * op(A) op(B) + beta * C against a float64 oracle on every backend;
// on the CPU also bit-for-bit batch invariance, chaining over K, thread-count and
// instruction-set independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common/address_sanitizer.hpp"
#include "common/cpu_features.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_internal.hpp"
#include "tests/harness.hpp"

#if BIGBATCH_HAVE_CUDA
#include <cstdlib>
#include <fstream>

#include "kernels/cublas_library.cuh"
#endif

namespace bigbatch {
namespace {

using testing::DeviceTest;

// ---- the oracle and its error bound --------------------------------------------------------

struct GemmCase {
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  float alpha, beta;
  DType operands, output;  // dtype of A and B; dtype of C
};

std::string describe(const GemmCase& g) {
  return "M=" + std::to_string(g.m) + " N=" + std::to_string(g.n) + " K=" + std::to_string(g.k) +
         " trans_a=" + std::to_string(g.trans_a) + " trans_b=" + std::to_string(g.trans_b) +
         " alpha=" + std::to_string(g.alpha) + " beta=" + std::to_string(g.beta) + " A,B " +
         std::string(dtype_name(g.operands)) + " C " + std::string(dtype_name(g.output));
}

Shape a_shape(const GemmCase& g) { return g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}; }
Shape b_shape(const GemmCase& g) { return g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}; }

/// The exact result, and the magnitude |alpha| sum_k |a_ik b_kj| + |beta c_ij| that the
/// rounding error is proportional to.
struct Oracle {
  std::vector<double> value, magnitude;
};

Oracle gemm_oracle(const GemmCase& g, const std::vector<double>& a, const std::vector<double>& b,
                   const std::vector<double>& c_before) {
  Oracle o;
  o.value.resize(static_cast<std::size_t>(g.m * g.n));
  o.magnitude.resize(o.value.size());
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < g.n; ++j) {
      double sum = 0, sum_abs = 0;
      for (std::int64_t k = 0; k < g.k; ++k) {
        const double a_ik = g.trans_a ? a[k * g.m + i] : a[i * g.k + k];
        const double b_kj = g.trans_b ? b[j * g.k + k] : b[k * g.n + j];
        sum += a_ik * b_kj;
        sum_abs += std::abs(a_ik * b_kj);
      }
      const std::size_t ij = static_cast<std::size_t>(i * g.n + j);
      const double c_term = g.beta == 0.0f ? 0.0 : double{g.beta} * c_before[ij];
      o.value[ij] = double{g.alpha} * sum + c_term;
      o.magnitude[ij] = std::abs(double{g.alpha}) * sum_abs + std::abs(c_term);
    }
  }
  return o;
}

/// Why this bound is rigorous (Higham, "Accuracy and Stability of Numerical Algorithms",
/// 2nd ed., section 3.1 and Lemma 3.1): every floating-point operation returns
/// x(1 + d) with |d| <= u. Each term alpha*a_ik*b_kj of the result passes through at
/// most K + 2 roundings whatever the evaluation order: on our CPU, alpha*a_ik (1) and
/// the fma of its step plus one fma per later step (at most K); in a library that forms
/// alpha * (sum of products) + beta*c, the product (1), at most K - 1 additions, the
/// multiply by alpha (1) and the final addition (1). beta*c passes through at most
/// K + 1. A product of n factors (1 + d_i) is 1 + theta with |theta| <= gamma(n) =
/// n u / (1 - n u) (Lemma 3.1), so
///   |computed - exact| <= gamma(K + 2) * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|).
/// Products of f16 or bf16 operands are exact in fp32 (11 + 11 or 8 + 8 significant bits
/// fit in 24), so the same bound holds for them. The
/// model ignores underflow, which cannot matter here: products of the test's inputs are
/// 0 or at least 2^-50 in magnitude, far above fp32's 2^-126, and additions that
/// underflow are exact.
/// An f16 C adds one rounding of the fp32 value c32: |fl16(c32) - c32| <= u16 |c32| +
/// 2^-25 (the 2^-25 for the subnormal range), with |c32| <= |ref| + gamma*magnitude. A bf16
/// C likewise with u = 2^-8 and 2^-134 (its subnormals are fp32's, spaced 2^-133).
/// On CUDA that is an assumption too: cublas_api.h says cuBLAS may run reductions in the
/// output type when it is smaller than the accumulator's, unless the math mode includes
/// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, which gemm.cu does not set.
/// The float64 oracle itself is off by at most gamma_f64(K + 2) * magnitude.
/// `gamma_acc` is the bound of the fp32 accumulation on the path taken (accumulation_gamma).
/// The spacing of the subnormals of a 16-bit C: f16 2^-24, bf16 (fp32's) 2^-133.
double half_subnormal_spacing(DType output) { return output == DType::f16 ? 0x1p-24 : 0x1p-133; }

double error_bound(const GemmCase& g, double gamma_acc, double ref, double magnitude) {
  double bound = (gamma_acc + testing::gamma(g.k + 2, DType::f64)) * magnitude;
  if (is_half_width(g.output)) {
    const double u = testing::unit_roundoff(g.output);
    bound += u * (std::abs(ref) + gamma_acc * magnitude) + half_subnormal_spacing(g.output) / 2;
  }
  return bound;
}

/// gamma_u(n) = n u / (1 - n u) for a unit roundoff u.
double gamma_of(double n, double u) { return n * u / (1 - n * u); }

/// The fp32 accumulation's bound, path by path (kernels/gemm.cu says which cuBLAS call runs).
/// - CPU, f32, f16 or bf16 operands: every operation rounds to nearest in fp32 (u = 2^-24), at most
///   K + 2 roundings per term (above): gamma_{2^-24}(K + 2).
/// - CUDA, f32 operands: gemm.cu asks for CUBLAS_COMPUTE_32F_PEDANTIC, which the cuBLAS
///   documentation (cublasComputeType_t; the same words in cublas_api.h) says ensures
///   "standard arithmetic and exact specified internal storage format": IEEE fp32 rounding
///   to nearest, no TF32 or other down-conversion. Whatever order or split cuBLAS chooses,
///   the count above holds: gamma_{2^-24}(K + 2), derived.
/// - CUDA, f16 or bf16 operands (CUBLAS_COMPUTE_32F on tensor cores): NVIDIA documents
///   only that the internal storage has at least fp32's precision and range, not how the
///   tensor cores round. So this bound rests on an ASSUMPTION: the model Fasi, Higham, Mikaitis and
///   Pranesh measured on V100, T4 and A100 ("Numerical behavior of NVIDIA tensor cores",
///   PeerJ Comput. Sci. 7:e330, 2021; A100 with bf16 operands too), not yet measured by us
///   on Hopper. In it the 16-bit products are exact, and one multiply-accumulate block d = c + (n products) aligns the
///   n + 1 addends to the largest, drops (truncates) the bits below fp32's last significand
///   bit, adds, and truncates the normalised sum. Each of the n smaller addends then loses
///   less than 2^-23 max|addend| and the normalisation less than 2^-23 |d|: one block errs
///   by at most (n + 1) 2^-23 S, S = |c| + sum |products| <= the magnitude (first order).
///   Over a dot product of K products in B blocks the sum of (n + 1) is K + B <= 2K, for any
///   block size n >= 1; a split-K reduction adds one rounding per split but shortens each
///   split by as much. With the epilogue's alpha * acc + beta * c (two fp32 roundings):
///   gamma_{2^-23}(2K + 2). (Counting one truncation per term, gamma_{2^-23}(K + 2), would
///   understate it: an aligned addend loses bits relative to the block's largest addend.)
double accumulation_gamma(Device device, const GemmCase& g) {
  if (device.is_cuda() && is_half_width(g.operands)) {
    return gamma_of(2.0 * static_cast<double>(g.k) + 2, 0x1p-23);
  }
  return gamma_of(static_cast<double>(g.k) + 2, 0x1p-24);
}

struct GemmRun {
  Tensor a, b, c;
  std::vector<double> c_before;
};

/// Random A, B; C random when beta != 0, else NaN (it must not be read).
GemmRun make_run(const GemmCase& g, Device device, std::uint64_t seed) {
  GemmRun run;
  run.a = testing::random_tensor(a_shape(g), g.operands, device, seed);
  run.b = testing::random_tensor(b_shape(g), g.operands, device, seed + 1);
  run.c = testing::random_tensor({g.m, g.n}, g.output, device, seed + 2);
  if (g.beta == 0.0f) testing::poison(run.c);
  run.c_before = testing::to_doubles(run.c);
  return run;
}

::testing::AssertionResult matches_oracle(const GemmCase& g, const GemmRun& run, Device device) {
  const Oracle o = gemm_oracle(g, testing::to_doubles(run.a), testing::to_doubles(run.b),
                               run.c_before);
  const double gamma_acc = accumulation_gamma(device, g);
  return testing::all_close(testing::to_doubles(run.c), o.value, [&](std::size_t i) {
    return error_bound(g, gamma_acc, o.value[i], o.magnitude[i]);
  });
}

// Sizes around the edges of the CPU blocking: 1s, 7 and 1025 in each position, K across
// several kc blocks, M past an f16 accumulator chunk, N past a column block (nc).
const std::vector<std::array<std::int64_t, 3>> kSizes = {
    {1, 1, 1},   {7, 1025, 33}, {1025, 7, 1},   {1, 7, 1025}, {33, 1, 7},
    {64, 48, 300}, {130, 70, 513}, {3, 4100, 5}, {700, 9, 300},
};

struct AlphaBeta {
  float alpha, beta;
};
const std::vector<AlphaBeta> kAlphaBetas = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.75f, 1.5f}, {0.3f, 0.0f}};

struct DTypes {
  DType operands, output;
};
const std::vector<DTypes> kDTypes = {{DType::f32, DType::f32},   {DType::f16, DType::f32},
                                     {DType::f16, DType::f16},   {DType::bf16, DType::f32},
                                     {DType::bf16, DType::bf16}};

/// Calls fn(case) for every size, transpose, alpha/beta and dtype combination.
void for_each_case(const std::function<void(const GemmCase&)>& fn) {
  for (const auto& [m, n, k] : kSizes) {
    for (const DTypes& types : kDTypes) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          for (const AlphaBeta& ab : kAlphaBetas) {
            fn(GemmCase{m, n, k, trans_a, trans_b, ab.alpha, ab.beta, types.operands,
                        types.output});
          }
        }
      }
    }
  }
}

class Gemm : public DeviceTest {};

TEST_P(Gemm, MatchesTheFloat64OracleWithinTheRoundingBound) {
  std::uint64_t seed = 100;
  for_each_case([&](const GemmCase& g) {
    GemmRun run = make_run(g, device(), seed += 3);
    gemm(run.a, g.trans_a, run.b, g.trans_b, run.c, g.alpha, g.beta);
    EXPECT_TRUE(matches_oracle(g, run, device())) << describe(g);
  });
}

TEST(GemmCuda, MatchesTheCpuReference) {
  const Device cuda = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(cuda);
  std::uint64_t seed = 900;
  for_each_case([&](const GemmCase& g) {
    GemmRun run = make_run(g, cuda, seed += 3);
    const Tensor a = run.a.to(Device::cpu()), b = run.b.to(Device::cpu());
    const Tensor c_cpu = run.c.to(Device::cpu());
    gemm(run.a, g.trans_a, run.b, g.trans_b, run.c, g.alpha, g.beta);
    cpu::gemm(a, g.trans_a, b, g.trans_b, c_cpu, g.alpha, g.beta);
    // Both are within their bound of the exact value, so within the sum of each other.
    const Oracle o = gemm_oracle(g, testing::to_doubles(a), testing::to_doubles(b), run.c_before);
    const double gamma_cpu = accumulation_gamma(Device::cpu(), g);
    const double gamma_cuda = accumulation_gamma(cuda, g);
    EXPECT_TRUE(testing::all_close(testing::to_doubles(run.c), testing::to_doubles(c_cpu),
                                   [&](std::size_t i) {
                                     return error_bound(g, gamma_cpu, o.value[i], o.magnitude[i]) +
                                            error_bound(g, gamma_cuda, o.value[i], o.magnitude[i]);
                                   }))
        << describe(g);
  });
}

TEST_P(Gemm, EmptyInnerDimensionGivesBetaTimesC) {
  for (const DTypes& types : kDTypes) {
    for (const float beta : {0.0f, 1.0f, -2.5f}) {
      const GemmCase g{5, 7, 0, false, false, 1.0f, beta, types.operands, types.output};
      GemmRun run = make_run(g, device(), 7);
      gemm(run.a, false, run.b, false, run.c, 1.0f, beta);
      // beta * c is one rounding of an exact product: bound u |want| (f32), or
      // u |want| + half a subnormal spacing for a 16-bit C (error_bound's terms).
      const double u = testing::unit_roundoff(types.output);
      const double eta =
          is_half_width(types.output) ? half_subnormal_spacing(types.output) / 2 : 0.0;
      const auto got = testing::to_doubles(run.c);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double want = beta == 0.0f ? 0.0 : double{beta} * run.c_before[i];
        EXPECT_LE(std::abs(got[i] - want), u * std::abs(want) + eta) << describe(g) << " [" << i << "]";
      }
    }
  }
}

TEST_P(Gemm, EmptyOutputIsAllowed) {
  for (const auto& [m, n] : {std::pair<std::int64_t, std::int64_t>{0, 5}, {5, 0}, {0, 0}}) {
    const Tensor a = testing::random_tensor({m, 3}, DType::f32, device(), 1);
    const Tensor b = testing::random_tensor({3, n}, DType::f32, device(), 2);
    const Tensor c({m, n}, DType::f32, device());
    EXPECT_NO_THROW(gemm(a, false, b, false, c, 1.0f, 1.0f)) << m << "x" << n;
  }
}

// ---- f16 operands: fp32 accumulation, one rounding on store ---------------------------------

/// A [1, k] x [k, 1] product of `operands` (f16 or bf16) vectors into a 1x1 C of `output`.
double half_dot(Device device, DType operands, const std::vector<double>& a,
                const std::vector<double>& b, DType output, double c_before = 0,
                float beta = 0) {
  const auto k = static_cast<std::int64_t>(a.size());
  const Tensor ta = testing::make_tensor(a, {1, k}, operands, device);
  const Tensor tb = testing::make_tensor(b, {k, 1}, operands, device);
  const Tensor tc = testing::make_tensor({c_before}, {1, 1}, output, device);
  gemm(ta, false, tb, false, tc, 1.0f, beta);
  return testing::to_doubles(tc)[0];
}

/// half_dot of f16 vectors.
double f16_dot(Device device, const std::vector<double>& a, const std::vector<double>& b,
               DType output, double c_before = 0, float beta = 0) {
  return half_dot(device, DType::f16, a, b, output, c_before, beta);
}

TEST_P(Gemm, F16ProductsBeyondTheF16RangeStayFiniteInFp32) {
  // 300 * 300 = 90000 > 65504, the largest f16; exact in fp32.
  EXPECT_EQ(f16_dot(device(), {300}, {300}, DType::f32), 90000.0);
  // The partial sum passes 90000 and comes back: fp32 accumulation makes it exact, where
  // an f16 accumulator would have overflowed to inf and then given inf - inf = NaN.
  EXPECT_EQ(f16_dot(device(), {300, 300, 1}, {300, -300, 0.5}, DType::f32), 0.5);
  EXPECT_EQ(f16_dot(device(), {300, 300, 1}, {300, -300, 0.5}, DType::f16), 0.5);
}

// The rounding of an f16 C, exactly: ties to even, and overflow to infinity as IEEE 754
// rounding to nearest does (what gemm.hpp promises for the CPU). NVIDIA's cuBLAS
// documentation does not say how cublasGemmEx converts an fp32 result to an f16 C (whether
// it rounds to nearest even, or saturates at 65504 instead of overflowing), so the exact
// checks run on the CPU only; the CUDA instance checks what error_bound assumes: one
// rounding of some kind, within u16 of the value, and a value past the f16 range stored as
// +inf or as the largest finite half (printed, so a GPU run shows which).
TEST_P(Gemm, F16OutputRoundsOnceAndOverflowsToInfinity) {
  const double u16 = testing::unit_roundoff(DType::f16);
  const auto within_one_rounding = [&](double got, double exact) {
    return std::abs(got - exact) <= u16 * std::abs(exact);
  };
  const double largest_half = 65504;
  const double over = f16_dot(device(), {300}, {300}, DType::f16);  // 90000
  const double tie_to_inf = f16_dot(device(), {4}, {4}, DType::f16, largest_half, 1.0f);
  const double below_tie = f16_dot(device(), {3}, {5}, DType::f16, largest_half, 1.0f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  const double tie = f16_dot(device(), {1, 0x1p-6}, {1, 0x1p-5}, DType::f16);
  // Just above the halfway point.
  const double above_tie =
      f16_dot(device(), {1, 0x1p-6, 0x1p-10}, {1, 0x1p-5, 0x1p-10}, DType::f16);
  if (device().is_cpu()) {
    EXPECT_TRUE(std::isinf(over));
    EXPECT_GT(over, 0);
    // 65504 + 16 = 65520 is halfway between 65504 and 65536 (= inf in f16): ties to even
    // gives inf. 65504 + 15 = 65519 rounds down to 65504.
    EXPECT_TRUE(std::isinf(tie_to_inf));
    EXPECT_EQ(below_tie, largest_half);
    EXPECT_EQ(tie, 1.0);  // ties to even
    EXPECT_EQ(above_tie, 1.0 + 0x1p-10);
    return;
  }
  const auto inf_or_largest = [&](double v) { return v == largest_half || std::isinf(v); };
  EXPECT_TRUE(inf_or_largest(over)) << over;
  EXPECT_GT(over, 0);
  EXPECT_TRUE(inf_or_largest(tie_to_inf)) << tie_to_inf;
  EXPECT_EQ(below_tie, largest_half);
  EXPECT_TRUE(within_one_rounding(tie, 1.0 + 0x1p-11)) << tie;
  EXPECT_TRUE(within_one_rounding(above_tie, 1.0 + 0x1p-11 + 0x1p-20)) << above_tie;
  std::cout << "[ cuBLAS   ] f16 C past the f16 range: " << over << " (90000), " << tie_to_inf
            << " (65520); halfway 1 + 2^-11 stored as 1 + " << (tie - 1) / 0x1p-10
            << " * 2^-10\n";
}

// bf16 operands and C: one rounding to nearest even on store, and fp32's range, where
// fp16 would overflow or flush. Exact on the CPU (gemm.hpp's promise); the CUDA instance
// checks one rounding of some kind, as for f16 above.
TEST_P(Gemm, Bf16OutputRoundsOnceToNearestEvenWithFp32sRange) {
  const double u = testing::unit_roundoff(DType::bf16);
  const auto dot = [&](const std::vector<double>& a, const std::vector<double>& b) {
    return half_dot(device(), DType::bf16, a, b, DType::bf16);
  };
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7, the next bf16.
  const double tie = dot({1, 0x1p-4}, {1, 0x1p-4});
  const double above_tie = dot({1, 0x1p-4, 0x1p-10}, {1, 0x1p-4, 0x1p-10});
  // 2^120 and 2^-120: far past fp16's 65504 and below its 2^-24, normal in fp32 and bf16.
  EXPECT_EQ(dot({0x1p60}, {0x1p60}), 0x1p120);
  EXPECT_EQ(dot({0x1p-60}, {0x1p-60}), 0x1p-120);
  // Into an f32 C the sum is not rounded to bf16 at all: 1 + 2^-8 + 2^-20 exactly.
  EXPECT_EQ(half_dot(device(), DType::bf16, {1, 0x1p-4, 0x1p-10}, {1, 0x1p-4, 0x1p-10},
                     DType::f32),
            1.0 + 0x1p-8 + 0x1p-20);
  if (device().is_cpu()) {
    EXPECT_EQ(tie, 1.0);  // ties to even
    EXPECT_EQ(above_tie, 1.0 + 0x1p-7);
    return;
  }
  EXPECT_LE(std::abs(tie - (1.0 + 0x1p-8)), u * (1.0 + 0x1p-8)) << tie;
  EXPECT_LE(std::abs(above_tie - (1.0 + 0x1p-8)), u * (1.0 + 0x1p-7)) << above_tie;
  std::cout << "[ cuBLAS   ] bf16 C: halfway 1 + 2^-8 stored as 1 + " << (tie - 1) / 0x1p-7
            << " * 2^-7\n";
}

// ---- argument errors ------------------------------------------------------------------------

void expect_invalid_argument(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning \"" << text << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << "message \"" << e.what() << "\" does not mention \"" << text << "\"";
  }
}

TEST_P(Gemm, RejectsBadArgumentsWithUsefulMessages) {
  const Device d = device();
  const Tensor a({3, 4}, DType::f32, d), b({4, 5}, DType::f32, d), c({3, 5}, DType::f32, d);
  expect_invalid_argument([&] { gemm(a.reshaped({12}), false, b, false, c); }, "A must have rank 2");
  expect_invalid_argument([&] { gemm(a, false, b, false, c.reshaped({15})); }, "C must have rank 2");
  expect_invalid_argument([&] { gemm(a, true, b, false, c); }, "inner dimensions differ");
  expect_invalid_argument([&] { gemm(a, false, b, true, c); }, "inner dimensions differ");
  expect_invalid_argument([&] { gemm(a, false, b, false, Tensor({5, 3}, DType::f32, d)); },
                          "C must have shape [M, N] = [3, 5]");
  const Tensor b16({4, 5}, DType::f16, d), a16({3, 4}, DType::f16, d);
  expect_invalid_argument([&] { gemm(a, false, b16, false, c); }, "unsupported dtypes");
  expect_invalid_argument([&] { gemm(a, false, b, false, Tensor({3, 5}, DType::f16, d)); },
                          "unsupported dtypes");
  expect_invalid_argument([&] { gemm(a16, false, b16, false, Tensor({3, 5}, DType::i32, d)); },
                          "unsupported dtypes");
  // f16 and bf16 do not mix: one operand type, and a 16-bit C only of that type.
  const Tensor a_bf16({3, 4}, DType::bf16, d), b_bf16({4, 5}, DType::bf16, d);
  expect_invalid_argument([&] { gemm(a16, false, b_bf16, false, c); }, "unsupported dtypes");
  expect_invalid_argument(
      [&] { gemm(a_bf16, false, b_bf16, false, Tensor({3, 5}, DType::f16, d)); },
      "unsupported dtypes");
  if (d.is_cuda()) {
    const Tensor c_host({3, 5}, DType::f32, Device::cpu());
    expect_invalid_argument([&] { gemm(a, false, b, false, c_host); }, "one device");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Gemm, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- CPU: bitwise invariance ----------------------------------------------------------------

/// Runs `body` once under every instruction-set path this CPU supports.
void for_each_cpu_path(const std::function<void(cpu::GemmPath)>& body) {
  for (const cpu::GemmPath path : cpu::gemm_paths_supported()) {
    SCOPED_TRACE(std::string("path ") + std::string(cpu::gemm_path_name(path)));
    cpu::ScopedGemmPath guard(path);
    body(path);
  }
}

/// Runs `g` on every CPU path, each from a copy of run.c, and expects the other paths to
/// give the portable path's bits; returns the portable path's C.
Tensor expect_the_portable_bits_on_every_path(const GemmCase& g, const GemmRun& run) {
  Tensor reference;
  for_each_cpu_path([&](cpu::GemmPath path) {
    const Tensor c = run.c.clone();
    cpu::gemm(run.a, g.trans_a, run.b, g.trans_b, c, g.alpha, g.beta);
    if (path == cpu::GemmPath::portable) {
      reference = c;
    } else {
      EXPECT_TRUE(testing::bitwise_equal(c, reference)) << describe(g);
    }
  });
  return reference;
}

constexpr std::int64_t kBatch = 1024, kIn = 96, kOut = 80;

TEST(GemmCpu, RowsOfABatchEqualTheSameRowsComputedInSlices) {
  // The forward of a linear layer, Y = X W^T (+ beta Y): X [batch, in], W [out, in].
  for (const DTypes& types : kDTypes) {
    for (const float beta : {0.0f, 0.5f}) {
      for_each_cpu_path([&](cpu::GemmPath) {
        const Tensor x = testing::random_tensor({kBatch, kIn}, types.operands, Device::cpu(), 1);
        const Tensor w = testing::random_tensor({kOut, kIn}, types.operands, Device::cpu(), 2);
        const Tensor y_before = testing::random_tensor({kBatch, kOut}, types.output, Device::cpu(), 3);
        const Tensor y = y_before.clone();
        gemm(x, false, w, true, y, 1.0f, beta);
        for (const std::int64_t slice : {1, 7, 64}) {
          const Tensor y_sliced = y_before.clone();
          for (std::int64_t r = 0; r < kBatch; r += slice) {
            const std::int64_t end = std::min(kBatch, r + slice);
            gemm(x.rows(r, end), false, w, true, y_sliced.rows(r, end), 1.0f, beta);
          }
          EXPECT_TRUE(testing::bitwise_equal(y_sliced, y))
              << "slices of " << slice << " rows, A,B " << dtype_name(types.operands) << " C "
              << dtype_name(types.output) << " beta " << beta;
        }
      });
    }
  }
}

/// Columns [col0, col0 + cols) of a [rows, n] tensor, as a new [rows, cols] tensor.
Tensor columns(const Tensor& t, std::int64_t col0, std::int64_t cols) {
  const std::int64_t rows = t.dim(0), n = t.dim(1);
  const std::size_t element = dtype_size(t.dtype());
  Tensor out({rows, cols}, t.dtype(), Device::cpu());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(out.raw_data()) + r * cols * element,
                static_cast<const char*>(t.raw_data()) + (r * n + col0) * element, cols * element);
  }
  return out;
}

TEST(GemmCpu, ColumnsOfTheOutputEqualTheSameColumnsComputedInSlices) {
  constexpr std::int64_t batch = 300;
  for (const DTypes& types : kDTypes) {
    for_each_cpu_path([&](cpu::GemmPath) {
      const Tensor x = testing::random_tensor({batch, kIn}, types.operands, Device::cpu(), 4);
      const Tensor w = testing::random_tensor({kOut, kIn}, types.operands, Device::cpu(), 5);
      const Tensor y({batch, kOut}, types.output, Device::cpu());
      testing::poison(y);
      gemm(x, false, w, true, y);
      for (const std::int64_t slice : {1, 7, 33}) {
        for (std::int64_t col = 0; col < kOut; col += slice) {
          const std::int64_t cols = std::min(kOut - col, slice);
          const Tensor y_part({batch, cols}, types.output, Device::cpu());
          testing::poison(y_part);
          gemm(x, false, w.rows(col, col + cols), true, y_part);  // rows of W = columns of Y
          ASSERT_TRUE(testing::bitwise_equal(y_part, columns(y, col, cols)))
              << "columns [" << col << ", " << col + cols << ") " << dtype_name(types.operands);
        }
      }
    });
  }
}

TEST(GemmCpu, WeightGradientOverABatchEqualsChainedMicroBatches) {
  // dW = alpha * dY^T X (+ beta dW): trans_a, K = batch rows. Chaining micro-batches of
  // K with beta = 1 continues each element's fma chain exactly, for an fp32 dW; also
  // when dY and X are f16 or bf16 (mixed precision with fp32 gradients).
  for (const DType operands : {DType::f32, DType::f16, DType::bf16}) {
    for (const std::int64_t batch : {std::int64_t{1024}, std::int64_t{1000}}) {
      for (const auto& [alpha, beta] : {AlphaBeta{1.0f, 0.0f}, AlphaBeta{0.3f, 1.0f}, AlphaBeta{1.0f, 0.5f}}) {
        for_each_cpu_path([&](cpu::GemmPath) {
          const Tensor dy = testing::random_tensor({batch, kOut}, operands, Device::cpu(), 6);
          const Tensor x = testing::random_tensor({batch, kIn}, operands, Device::cpu(), 7);
          const Tensor dw_before = testing::random_tensor({kOut, kIn}, DType::f32, Device::cpu(), 8);
          const Tensor dw = dw_before.clone();
          gemm(dy, true, x, false, dw, alpha, beta);
          const Tensor dw_chained = dw_before.clone();
          for (std::int64_t k = 0; k < batch; k += 64) {  // 1000 = 15 x 64 + 40
            const std::int64_t end = std::min(batch, k + 64);
            gemm(dy.rows(k, end), true, x.rows(k, end), false, dw_chained, alpha,
                 k == 0 ? beta : 1.0f);
          }
          EXPECT_TRUE(testing::bitwise_equal(dw_chained, dw))
              << "batch " << batch << " " << dtype_name(operands) << " alpha " << alpha
              << " beta " << beta;
        });
      }
    }
  }
}

TEST(GemmCpu, EveryInstructionSetPathGivesTheSameBits) {
  const auto paths = cpu::gemm_paths_supported();
  ASSERT_EQ(paths.front(), cpu::GemmPath::portable);
  // Sizes with edge tiles for every path's mr x nr, and K across kc blocks.
  const std::vector<std::array<std::int64_t, 3>> sizes = {
      {37, 75, 300}, {15, 33, 513}, {1025, 7, 33}, {5, 130, 1}, {29, 17, 258}};
  std::uint64_t seed = 40;
  for (const auto& [m, n, k] : sizes) {
    for (const DTypes& types : kDTypes) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          for (const AlphaBeta& ab : {AlphaBeta{1.0f, 0.0f}, AlphaBeta{-0.7f, 1.3f}}) {
            const GemmCase g{m, n, k, trans_a, trans_b, ab.alpha, ab.beta, types.operands,
                             types.output};
            expect_the_portable_bits_on_every_path(g, make_run(g, Device::cpu(), seed += 3));
          }
        }
      }
    }
  }
}

TEST(GemmCpu, EveryRowCountOfTheLastRowPanelGivesTheSameBits) {
  // The last row panel of C holds m mod mr rows (mr is 14 on the AVX-512 path, 6 on
  // AVX2); those rows run a partial micro-kernel or a padded tile. Every count from 1 to
  // 29 rows, at widths of whole and partial column panels, K across 16-step transposes
  // with a remainder, against the portable path's bits (a micro-batch of 64 ends on 8).
  std::uint64_t seed = 900;
  for (std::int64_t m = 1; m <= 29; ++m) {
    for (const std::int64_t n : {64, 47}) {
      for (const bool trans_b : {false, true}) {
        const GemmCase g{m, n, 41, false, trans_b, 1.0f, 1.0f, DType::f32, DType::f32};
        expect_the_portable_bits_on_every_path(g, make_run(g, Device::cpu(), seed += 3));
      }
    }
  }
}

TEST(GemmCpu, MicroBatchShapesGiveThePortableBits) {
  // A C of one row block (a micro-batch) reads op(B) where it is stored: the AVX-512 and
  // AVX2 paths broadcast a transposed op(B)'s rows against panels of op(A)^T (64 rows on
  // AVX-512, 16 on AVX2), with C itself transposed in and out, and take K in blocks of up
  // to 2048; a plain op(B) is read a panel at a time, on AVX-512 in slices of steps where
  // its rows lie far apart (20 x 2100 x 600: 512 steps of rows 8400 bytes apart in three
  // slices, then 88 in one). Rows past one panel (70 = 64 + 6), K past one block (2100),
  // a beta that scales C, and a transposed A.
  std::uint64_t seed = 1300;
  for (const auto& [m, n, k] : std::vector<std::array<std::int64_t, 3>>{
           {70, 13, 2100}, {64, 97, 600}, {129, 40, 70}, {20, 2100, 600}}) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        for (const AlphaBeta& ab : {AlphaBeta{1.0f, 0.0f}, AlphaBeta{0.6f, -1.7f}}) {
          const GemmCase g{m, n, k, trans_a, trans_b, ab.alpha, ab.beta, DType::f32,
                           DType::f32};
          const GemmRun run = make_run(g, Device::cpu(), seed += 3);
          const Tensor c = expect_the_portable_bits_on_every_path(g, run);
          EXPECT_TRUE(matches_oracle(g, GemmRun{run.a, run.b, c, run.c_before}, Device::cpu()))
              << describe(g);
        }
      }
    }
  }
}

TEST(GemmCpu, EveryPathRoundsExtremeF16ValuesAlike) {
  // Operands whose products reach past the f16 range (|a b| up to 90000, so some outputs
  // are inf) or into its subnormals (|a b| below 2^-14): the f16 conversions of every
  // path must agree there too.
  for (const auto& [lo, hi] : {std::pair<double, double>{-300, 300}, {-0x1p-8, 0x1p-8}}) {
    const Tensor a = testing::random_tensor({37, 3}, DType::f16, Device::cpu(), 11, lo, hi);
    const Tensor b = testing::random_tensor({3, 45}, DType::f16, Device::cpu(), 12, lo, hi);
    Tensor reference;
    for_each_cpu_path([&](cpu::GemmPath path) {
      const Tensor c({37, 45}, DType::f16, Device::cpu());
      cpu::gemm(a, false, b, false, c);
      if (path == cpu::GemmPath::portable) {
        reference = c;
      } else {
        EXPECT_TRUE(testing::bitwise_equal(c, reference)) << "values in [" << lo << ", " << hi << ")";
      }
    });
    const auto values = testing::to_doubles(reference);
    const bool reaches_the_edge =
        std::any_of(values.begin(), values.end(), [&](double v) {
          return hi > 1 ? std::isinf(v) : v != 0 && std::abs(v) < 0x1p-14;
        });
    EXPECT_TRUE(reaches_the_edge) << "no output reached the f16 edge for [" << lo << ", " << hi << ")";
  }
}

TEST(GemmCpu, ThreadCountDoesNotChangeTheBits) {
#if defined(_OPENMP)
  const int saved = omp_get_max_threads();
  const GemmCase g{301, 257, 600, false, true, 1.0f, 0.0f, DType::f32, DType::f32};
  GemmRun run = make_run(g, Device::cpu(), 77);
  Tensor reference;
  for (const int threads : {1, 2, 3, 5}) {
    omp_set_num_threads(threads);
    const Tensor c({g.m, g.n}, DType::f32, Device::cpu());
    testing::poison(c);
    cpu::gemm(run.a, g.trans_a, run.b, g.trans_b, c);
    if (threads == 1) {
      reference = c;
    } else {
      EXPECT_TRUE(testing::bitwise_equal(c, reference)) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
#else
  GTEST_SKIP() << "built without OpenMP: one thread only";
#endif
}

// The f64 path (CPU only, for the float64 runs of whole models) is the header's chain in
// double: acc = beta * c, then acc = fma(alpha * a_ik, b_kj, acc) for k in order. Written out
// here element by element, it must give the same bits, for every transpose and beta; and a
// CUDA f64 GEMM is refused (f64 exists only on the CPU).
TEST(GemmCpu, Float64RunsTheHeadersChainInDouble) {
  const std::int64_t m = 5, n = 7, k = 9;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const float beta : {0.0f, 1.0f, 0.5f}) {
        const auto a = testing::random_values(m * k, 1), b = testing::random_values(k * n, 2);
        const auto c0 = testing::random_values(m * n, 3);
        const Tensor c = testing::make_tensor(c0, {m, n}, DType::f64, Device::cpu());
        gemm(testing::make_tensor(a, trans_a ? Shape{k, m} : Shape{m, k}, DType::f64, Device::cpu()),
             trans_a,
             testing::make_tensor(b, trans_b ? Shape{n, k} : Shape{k, n}, DType::f64, Device::cpu()),
             trans_b, c, 0.75f, beta);
        std::vector<double> want(m * n);
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            double acc = beta == 0.0f ? 0.0 : double{beta} * c0[i * n + j];
            for (std::int64_t q = 0; q < k; ++q) {
              const double a_iq = trans_a ? a[q * m + i] : a[i * k + q];
              const double b_qj = trans_b ? b[j * k + q] : b[q * n + j];
              acc = std::fma(0.75 * a_iq, b_qj, acc);
            }
            want[i * n + j] = acc;
          }
        }
        EXPECT_EQ(testing::to_doubles(c), want) << trans_a << trans_b << " beta " << beta;
      }
    }
  }
  EXPECT_THROW(gemm(Tensor({2, 2}, DType::f64), false, Tensor({2, 2}, DType::f32), false,
                    Tensor({2, 2}, DType::f64)),
               std::invalid_argument);
}

// (16-bit exact) f16 and bf16 operands run the header's chain in float on every CPU path:
// acc = beta * C (C widened when it is 16-bit), then acc = fmaf(alpha * a_ik, b_kj, acc) for
// k in order, rounded once to nearest even where a 16-bit C is stored. Written out here
// element by element, it must give the same bits for every transpose, beta and C dtype, at
// sizes past one micro-kernel tile and one K block.
TEST(GemmCpu, SixteenBitOperandsRunTheHeadersChainInFloat) {
  const std::int64_t m = 37, n = 41, k = 600;  // past a 512-step K block
  const auto widen = [](DType dtype, const std::vector<double>& values) {
    const auto size = static_cast<std::int64_t>(values.size());
    return testing::to_doubles(testing::make_tensor(values, {size}, dtype, Device::cpu()));
  };
  for (const cpu::GemmPath path : cpu::gemm_paths_supported()) {
    const cpu::ScopedGemmPath forced(path);
    for (const DType dtype : {DType::f16, DType::bf16}) {
      for (const DType c_dtype : {dtype, DType::f32}) {
        for (const bool trans_a : {false, true}) {
          for (const bool trans_b : {false, true}) {
            for (const float beta : {0.0f, 1.0f, 0.5f}) {
              // The values the kernel sees: the operands (and a 16-bit C) as stored.
              const auto a = widen(dtype, testing::random_values(m * k, 1));
              const auto b = widen(dtype, testing::random_values(k * n, 2));
              const auto c0 = widen(c_dtype, testing::random_values(m * n, 3));
              const Tensor c = testing::make_tensor(c0, {m, n}, c_dtype, Device::cpu());
              gemm(testing::make_tensor(a, trans_a ? Shape{k, m} : Shape{m, k}, dtype,
                                        Device::cpu()),
                   trans_a,
                   testing::make_tensor(b, trans_b ? Shape{n, k} : Shape{k, n}, dtype,
                                        Device::cpu()),
                   trans_b, c, 0.75f, beta);
              std::vector<double> want(m * n);
              for (std::int64_t i = 0; i < m; ++i) {
                for (std::int64_t j = 0; j < n; ++j) {
                  const auto c_ij = static_cast<float>(c0[i * n + j]);
                  float acc = beta == 0.0f ? 0.0f : beta == 1.0f ? c_ij : beta * c_ij;
                  for (std::int64_t q = 0; q < k; ++q) {
                    const auto a_iq = static_cast<float>(trans_a ? a[q * m + i] : a[i * k + q]);
                    const auto b_qj = static_cast<float>(trans_b ? b[j * k + q] : b[q * n + j]);
                    acc = std::fma(0.75f * a_iq, b_qj, acc);
                  }
                  want[i * n + j] = acc;
                }
              }
              // The chain's floats stored as C's dtype stores them (one rounding when 16-bit).
              if (c_dtype != DType::f32) want = widen(c_dtype, want);
              EXPECT_EQ(testing::to_doubles(c), want)
                  << cpu::gemm_path_name(path) << ", " << dtype_name(dtype) << " into "
                  << dtype_name(c_dtype) << ", " << trans_a << trans_b << " beta " << beta;
            }
          }
        }
      }
    }
  }
}

TEST(GemmCpu, ScopedPathForcesAndRestoresThePath) {
  const cpu::GemmPath fastest = cpu::gemm_paths_supported().back();
  EXPECT_EQ(cpu::gemm_path(), fastest);
  {
    cpu::ScopedGemmPath guard(cpu::GemmPath::portable);
    EXPECT_EQ(cpu::gemm_path(), cpu::GemmPath::portable);
  }
  EXPECT_EQ(cpu::gemm_path(), fastest);
}

#if BIGBATCH_HAVE_CUDA
/// Whether a file whose path contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// cuBLAS is opened by the first GEMM on a GPU, not with the program (cublas_library.cuh):
// a program that runs on the CPU does not pay its start-up. This needs no GPU, so it runs
// on every machine. The check runs in a process of its own, started for it ("threadsafe"
// re-runs the test program with this test alone), so that no earlier test has opened the
// library in it; it exits 0 when the library was absent before the call and present after.
TEST(CublasLibraryDeathTest, OpensOnTheFirstCallNotWithTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const bool before = mapped("libcublas");
        const cuda::CublasLibrary& library = cuda::cublas_library();
        const bool after = mapped("libcublasLt.so") && mapped("libcublas.so");
        std::exit(!before && after && &library == &cuda::cublas_library() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// Every function is looked up (a missing one throws), and one that needs no GPU answers.
TEST(CublasLibrary, ResolvesEveryFunctionAndNamesAStatus) {
  const cuda::CublasLibrary& library = cuda::cublas_library();
  EXPECT_STREQ(library.cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED),
               "CUBLAS_STATUS_NOT_INITIALIZED");
  try {
    cuda::check_cublas(CUBLAS_STATUS_INVALID_VALUE, "cuBLAS", "cublasGemmEx");
    ADD_FAILURE() << "check_cublas did not throw for a failed status";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 ("cuBLAS error in cublasGemmEx: CUBLAS_STATUS_INVALID_VALUE (" +
                  std::string(library.cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) +
                  ")")
                     .c_str());
  }
  EXPECT_NO_THROW(cuda::check_cublas(CUBLAS_STATUS_SUCCESS, "cuBLAS", "cublasGemmEx"));
}
#endif

// ---- the micro-kernels under AddressSanitizer ------------------------------------------------

// The micro-kernels are not instrumented (common/address_sanitizer.hpp): they check the
// spans they read and write once per call. Each span one float short of what the kernel
// reads must still be reported, as the per-access check would report it; the spans the
// driver passes are exact (every other test of this file runs the kernels on them under
// scripts/sanitize.sh). Runs under AddressSanitizer only; elsewhere it says why it skips.
TEST(MicroKernelSpansDeathTest, ASpanOneFloatShortIsReportedUnderAddressSanitizer) {
#if !BIGBATCH_ADDRESS_SANITIZER
  GTEST_SKIP() << "needs AddressSanitizer's report: runs under scripts/sanitize.sh";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  using gemm_detail::AccumulatorStart;
  std::vector<std::pair<std::string, const gemm_detail::IsaKernels*>> sets;
  if (cpu_supports(CpuFeature::avx2) && cpu_supports(CpuFeature::fma)) {
    sets.emplace_back("AVX2", &gemm_detail::avx2_kernels());
  }
  if (cpu_supports(CpuFeature::avx512f)) {
    sets.emplace_back("AVX-512", &gemm_detail::avx512_kernels());
  }
  ASSERT_FALSE(sets.empty()) << "no instruction set with micro-kernels on this CPU";
  const std::int64_t kc = 8;
  // Span `which` of a kernel's three, in an allocation of its own `floats` long, less
  // `short_by` when it is the span under test: the first float past it is a red zone.
  const auto span = [](std::int64_t floats, int which, int under_test, std::int64_t short_by,
                       float value) {
    const std::int64_t size = floats - (which == under_test ? short_by : 0);
    return std::vector<float>(static_cast<std::size_t>(size), value);
  };
  for (const auto& [name, isa] : sets) {
    SCOPED_TRACE(name);
    const std::int64_t mr = isa->mr, nr = isa->nr;
    const std::int64_t columns = isa->transposed_columns, lanes = isa->transposed_lanes;
    // Spans 0, 1, 2: micro_kernel's A panel, B panel and C; 3, 4, 5: transposed_micro_kernel's
    // rows of B, packed op(A)^T and C^T. Returns C's first element (kc: all ones summed).
    const auto run = [&](int under_test, std::int64_t short_by) {
      if (under_test < 3) {
        std::vector<float> a = span(kc * mr, 0, under_test, short_by, 1.0f);
        std::vector<float> b = span(kc * nr, 1, under_test, short_by, 1.0f);
        std::vector<float> c = span(mr * nr, 2, under_test, short_by, 0.0f);
        isa->micro_kernel(kc, a.data(), b.data(), c.data(), nr, AccumulatorStart::zero, 0.0f);
        return c[0];
      }
      std::vector<float> b = span(columns * kc, 3, under_test, short_by, 1.0f);
      std::vector<float> a = span(kc * lanes, 4, under_test, short_by, 1.0f);
      std::vector<float> ct = span(columns * lanes, 5, under_test, short_by, 0.0f);
      isa->transposed_micro_kernel(static_cast<int>(columns), kc, b.data(), kc, a.data(),
                                   ct.data(), AccumulatorStart::zero, 0.0f, nullptr);
      return ct[0];
    };
    for (int under_test = 0; under_test < 6; ++under_test) {
      EXPECT_EQ(run(under_test, 0), static_cast<float>(kc)) << "the exact spans run";
      EXPECT_DEATH(run(under_test, 1), "AddressSanitizer: heap-buffer-overflow")
          << "span " << under_test << " one float short";
    }
  }
#endif
}

}  // namespace
}  // namespace bigbatch

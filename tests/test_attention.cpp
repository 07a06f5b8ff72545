// Causal self-attention: the forward and the backward against a float64 oracle that carries
// the kernel's rounding bound (running_error.hpp) in every dtype, with and without dropout;
// the float64 backward against finite differences of the float64 forward; the causal mask;
// micro-batches of sequences against the batch, bit for bit; scores past fp16's range; the
// argument checks; the header's operations replayed in float, to every stored bit of every
// dtype; and CUDA against the CPU, bit for bit (skipped, saying why, without a GPU).
// The memory-efficient kernels (tiles of keys, the running max and sum) the same way, and
// against the plain kernels within both bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "common/bfloat16.hpp"
#include "common/half.hpp"
#include "common/rng.hpp"
#include "kernels/activation_math.hpp"
#include "kernels/attention.hpp"
#include "tests/finite_difference.hpp"
#include "tests/harness.hpp"
#include "tests/running_error.hpp"

namespace bigbatch {
namespace {

using testing::Bounded;
using testing::RoundingModel;

// ---- the problem ------------------------------------------------------------------------

struct Problem {
  std::int64_t B, T, heads, D;
  DType dtype;
  DropoutSpec dropout;
  std::vector<double> qkv;  // [B, T, 3C], exactly the values the kernel sees
  std::vector<double> dy;   // [B, T, C]
  std::int64_t C() const { return heads * D; }
};

/// Entries uniform in [-spread, spread) rounded to the dtype.
Problem make_problem(std::int64_t B, std::int64_t T, std::int64_t heads, std::int64_t D,
                     DType dtype, std::uint64_t seed, float p = 0.0f, double spread = 1.0) {
  Problem problem{B, T, heads, D, dtype, DropoutSpec{p, seed + 7, 3, 0}, {}, {}};
  const auto rounded = [&](std::int64_t n, std::uint64_t s) {
    return testing::to_doubles(testing::make_tensor(testing::random_values(n, s, -spread, spread),
                                                    {n}, dtype, Device::cpu()));
  };
  problem.qkv = rounded(B * T * 3 * heads * D, seed);
  problem.dy = rounded(B * T * heads * D, seed + 1);
  return problem;
}

Tensor qkv_tensor(const Problem& p, Device device) {
  return testing::make_tensor(p.qkv, {p.B, p.T, 3 * p.C()}, p.dtype, device);
}
Tensor dy_tensor(const Problem& p, Device device) {
  return testing::make_tensor(p.dy, {p.B, p.T, p.C()}, p.dtype, device);
}

/// The forward's and the backward's outputs, from fresh poisoned tensors.
struct Outputs {
  Tensor y, probabilities, dqkv;
};

Outputs run(const Problem& p, Device device, bool backward = true) {
  const Tensor qkv = qkv_tensor(p, device);
  Outputs out{Tensor({p.B, p.T, p.C()}, p.dtype, device),
              Tensor({p.B, p.heads, p.T, p.T}, p.dtype, device),
              Tensor({p.B, p.T, 3 * p.C()}, p.dtype, device)};
  testing::poison(out.y);
  testing::poison(out.probabilities);
  testing::poison(out.dqkv);
  causal_attention_forward(qkv, out.y, out.probabilities, p.heads, p.dropout);
  if (backward) {
    causal_attention_backward(qkv, out.probabilities, dy_tensor(p, device), out.dqkv, p.heads,
                              p.dropout);
  }
  return out;
}

// ---- the oracle ----------------------------------------------------------------------------
//
// The header's operations in the header's order, in double, each with the bound of a kernel
// that rounds it once in its compute type (f32, or f64 for f64 data); 16-bit results are
// rounded once more where they are stored (P, y, dqkv). The exponential: exp_nonpositive is
// within 1.25 ulp (2.5 u) of e^y, and may flush results below 2^-126 (activation_math.hpp);
// glibc's exp, the f64 path, is within 1 ulp. The scale 1/sqrt(D) is rounded twice in float
// (sqrt, then the division): relative error at most 2^-23 + 2^-48.

RoundingModel model_for(DType dtype) {
  const DType compute = dtype == DType::f64 ? DType::f64 : DType::f32;
  const double u = testing::unit_roundoff(compute);
  return {u, 2.5 * u, compute == DType::f32 ? 0x1p-126 : 0.0};
}

/// Rounding on store: 16-bit outputs only (f32 and f64 results are stored as computed).
double store_roundoff(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? testing::unit_roundoff(dtype) : 0.0;
}

/// A result rounded to a 16-bit dtype where it is stored: the relative rounding, and half the
/// spacing of the dtype's subnormals, the absolute error of a value stored below its
/// smallest normal (fp16's 2^-14: the small gradients of long rows land there), where the
/// relative bound does not hold.
Bounded stored(Bounded x, DType dtype) {
  const Bounded rounded = RoundingModel::store(x, store_roundoff(dtype));
  const double half_spacing = dtype == DType::f16 ? 0x1p-25 : dtype == DType::bf16 ? 0x1p-134 : 0.0;
  return {rounded.v, rounded.e + half_spacing};
}

/// m_ij as the header defines it: the global index, Philox's uniform, the kept scale.
double mask_factor(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::int64_t j) {
  const float keep = p.dropout.p < 1.0f ? 1.0f / (1.0f - p.dropout.p) : 0.0f;
  if (p.dropout.p == 0.0f) return 1.0;
  const auto index =
      static_cast<std::uint64_t>((((p.dropout.first_row + b) * p.heads + h) * p.T + i) * p.T + j);
  return random_uniform(p.dropout.seed, p.dropout.stream, index) >= p.dropout.p ? keep : 0.0;
}

struct Oracle {
  std::vector<Bounded> y, probabilities, dqkv;  // the kernel's shapes
};

Oracle oracle(const Problem& p) {
  const RoundingModel m = model_for(p.dtype);
  const std::int64_t T = p.T, C = p.C(), D = p.D, H = p.heads;
  const double exact_scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Bounded scale{exact_scale, (0x1p-23 + 0x1p-48) * exact_scale};
  const auto q = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return Bounded{p.qkv[(b * T + t) * 3 * C + h * D + d], 0};
  };
  const auto k = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return Bounded{p.qkv[(b * T + t) * 3 * C + C + h * D + d], 0};
  };
  const auto v = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return Bounded{p.qkv[(b * T + t) * 3 * C + 2 * C + h * D + d], 0};
  };
  const auto dy = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return Bounded{p.dy[(b * T + t) * C + h * D + d], 0};
  };
  Oracle o{std::vector<Bounded>(p.B * T * C), std::vector<Bounded>(p.B * H * T * T),
           std::vector<Bounded>(p.B * T * 3 * C)};
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<Bounded> dk(T * D), dv(T * D);
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<Bounded> score(i + 1), P(i + 1), dropped(i + 1), dP(i + 1);
        Bounded max{-INFINITY, 0};
        for (std::int64_t j = 0; j <= i; ++j) {
          Bounded dot;
          for (std::int64_t d = 0; d < D; ++d)
            dot = m.add(dot, m.mul(q(b, i, h, d), k(b, j, h, d)));
          score[j] = m.mul(dot, scale);
          max = RoundingModel::max(max, score[j]);
        }
        Bounded sum;
        for (std::int64_t j = 0; j <= i; ++j) {
          score[j] = m.exp(m.sub(score[j], max));
          sum = m.add(sum, score[j]);
        }
        for (std::int64_t j = 0; j < T; ++j) {
          Bounded& out = o.probabilities[((b * H + h) * T + i) * T + j];
          out = j <= i ? stored(m.div(score[j], sum), p.dtype) : Bounded{0, 0};
          if (j <= i) {
            P[j] = out;
            dropped[j] = m.mul(P[j], {mask_factor(p, b, h, i, j), 0});
          }
        }
        for (std::int64_t d = 0; d < D; ++d) {
          Bounded acc;
          for (std::int64_t j = 0; j <= i; ++j) acc = m.add(acc, m.mul(dropped[j], v(b, j, h, d)));
          o.y[(b * T + i) * C + h * D + d] = stored(acc, p.dtype);
        }
        // The backward of row i.
        Bounded r;
        for (std::int64_t j = 0; j <= i; ++j) {
          Bounded dot;
          for (std::int64_t d = 0; d < D; ++d)
            dot = m.add(dot, m.mul(dy(b, i, h, d), v(b, j, h, d)));
          dP[j] = m.mul(dot, {mask_factor(p, b, h, i, j), 0});
          r = m.add(r, m.mul(P[j], dP[j]));
        }
        std::vector<Bounded> g(i + 1);
        for (std::int64_t j = 0; j <= i; ++j) g[j] = m.mul(m.mul(P[j], m.sub(dP[j], r)), scale);
        for (std::int64_t d = 0; d < D; ++d) {
          Bounded acc;
          for (std::int64_t j = 0; j <= i; ++j) acc = m.add(acc, m.mul(g[j], k(b, j, h, d)));
          o.dqkv[(b * T + i) * 3 * C + h * D + d] = stored(acc, p.dtype);
          for (std::int64_t j = 0; j <= i; ++j) {
            dk[j * D + d] = m.add(dk[j * D + d], m.mul(g[j], q(b, i, h, d)));
            dv[j * D + d] = m.add(dv[j * D + d], m.mul(dropped[j], dy(b, i, h, d)));
          }
        }
      }
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t d = 0; d < D; ++d) {
          o.dqkv[(b * T + t) * 3 * C + C + h * D + d] = stored(dk[t * D + d], p.dtype);
          o.dqkv[(b * T + t) * 3 * C + 2 * C + h * D + d] = stored(dv[t * D + d], p.dtype);
        }
      }
    }
  }
  return o;
}

::testing::AssertionResult within_bounds(const char* what, const Tensor& got,
                                         const std::vector<Bounded>& want,
                                         const RoundingModel& model) {
  std::vector<double> exact, bound;
  for (const Bounded& b : want) {
    exact.push_back(b.v);
    bound.push_back(testing::tolerance(b, model));
  }
  return testing::all_close(testing::to_doubles(got), exact,
                            [&](std::size_t i) { return bound[i]; })
         << " (" << what << ")";
}

// ---- against the oracle ---------------------------------------------------------------------

using testing::DeviceTest;

class AttentionOracle : public DeviceTest {};

TEST_P(AttentionOracle, ForwardAndBackwardWithinTheRoundingBoundOfEveryDtype) {
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;  // f64 exists on the CPU only
    for (const float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (p > 0 ? ", dropout 0.25" : ", no dropout"));
      // Odd sizes: 3 heads of 5 channels, 9 positions, 2 sequences.
      const Problem problem = make_problem(2, 9, 3, 5, dtype, 11, p);
      const Outputs out = run(problem, device());
      const Oracle want = oracle(problem);
      const RoundingModel model = model_for(dtype);
      EXPECT_TRUE(within_bounds("probabilities", out.probabilities, want.probabilities, model));
      EXPECT_TRUE(within_bounds("y", out.y, want.y, model));
      EXPECT_TRUE(within_bounds("dqkv", out.dqkv, want.dqkv, model));
    }
  }
}

// q . k = 64 * 40 * 40 = 102400 is past fp16's largest finite value (65504): a 16-bit GEMM
// that stored q k^T before the scale would make it inf, and the row NaN. The kernel keeps the
// product in float and scales it there (to 12800), so P and y are finite and right.
TEST_P(AttentionOracle, ScoresPastFp16RangeStayFiniteInFp16) {
  Problem problem = make_problem(1, 4, 1, 64, DType::f16, 5);
  for (std::int64_t t = 0; t < problem.T; ++t) {
    for (std::int64_t d = 0; d < 2 * problem.D; ++d) problem.qkv[t * 3 * problem.D + d] = 40.0;
  }
  const Outputs out = run(problem, device());
  const Oracle want = oracle(problem);
  EXPECT_TRUE(
      within_bounds("probabilities", out.probabilities, want.probabilities, model_for(DType::f16)));
  EXPECT_TRUE(within_bounds("y", out.y, want.y, model_for(DType::f16)));
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionOracle, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// ---- finite differences --------------------------------------------------------------------
//
// The f64 backward against Richardson-extrapolated central differences of L = sum(G * y), the
// f64 forward, by every element of qkv (dropout 0.3: the mask is a fixed function of the
// index, so L stays smooth). The inputs are O(1) and the scores O(sqrt(D)) at most, so the
// step and fifth-derivative bound of NormalizationFiniteDifference with sigma = 1 apply: L is
// a composition of products, exponentials and one division by a sum >= 1, whose derivatives
// stay far below 1e6 at this size; the evaluation error is the oracle's bound on L.
/// The f64 backward that `run_kernels(problem, true)` computes against finite differences of
/// L = sum(G * y) by the f64 forward `run_kernels(problem, false)`, the evaluation error
/// from the oracle's bounds on y.
template <class Run>
void expect_backward_is_derivative(Problem problem, Run run_kernels,
                                   const std::vector<Bounded>& y_bound) {
  const std::vector<double> analytic = testing::to_doubles(run_kernels(problem, true).dqkv);
  const auto loss = [&] {
    const std::vector<double> y = testing::to_doubles(run_kernels(problem, false).y);
    double total = 0;
    for (std::size_t n = 0; n < y.size(); ++n) total += problem.dy[n] * y[n];
    return total;
  };
  double evaluation_error = 0;
  for (std::size_t n = 0; n < y_bound.size(); ++n) {
    evaluation_error += std::abs(problem.dy[n]) * (y_bound[n].e + 0x1p-52 * std::abs(y_bound[n].v));
  }
  evaluation_error *= 1 + testing::gamma(static_cast<std::int64_t>(y_bound.size()), DType::f64);
  const testing::NormalizationFiniteDifference fd(1.0);
  fd.expect_gradient("dqkv", analytic, problem.qkv, loss, evaluation_error);
}

TEST(AttentionFiniteDifferences, BackwardIsTheDerivativeOfTheForward) {
  const Problem problem = make_problem(2, 5, 2, 3, DType::f64, 21, 0.3f);
  expect_backward_is_derivative(
      problem, [](const Problem& p, bool backward) { return run(p, Device::cpu(), backward); },
      oracle(problem).y);
}

// ---- memory-efficient attention ------------------------------------------------------------
//
// The oracle below runs the header's tiles in double with the same running error model: the
// rescalings a = exp(m - m') and the products by them are each one more rounding on what a
// tile carries forward, so the bound grows with the number of tiles a row crosses (its
// derivation is the model's arithmetic, operation by operation). The exact values are the
// plain kernel's (in exact arithmetic the rescaled sums equal the sums from the final max),
// so against the plain kernel the two kernels' results may differ by at most the sum of
// their two bounds. The problems cross tiles: T = 150 is three tiles of kKeyTile = 64 keys,
// the last one partial.

struct EfficientOutputs {
  Tensor y, stats, dqkv;
};

EfficientOutputs run_efficient(const Problem& p, Device device, bool backward = true) {
  const Tensor qkv = qkv_tensor(p, device);
  const DType stats_dtype = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  EfficientOutputs out{Tensor({p.B, p.T, p.C()}, p.dtype, device),
                       Tensor({p.B, p.heads, p.T, 2}, stats_dtype, device),
                       Tensor({p.B, p.T, 3 * p.C()}, p.dtype, device)};
  testing::poison(out.y);
  testing::poison(out.stats);
  testing::poison(out.dqkv);
  efficient_attention_forward(qkv, out.y, out.stats, p.heads, p.dropout);
  if (backward) {
    efficient_attention_backward(qkv, out.y, out.stats, dy_tensor(p, device), out.dqkv, p.heads,
                                 p.dropout);
  }
  return out;
}

struct EfficientOracle {
  std::vector<Bounded> y, stats, dqkv;  // the kernel's shapes
};

EfficientOracle efficient_oracle(const Problem& p) {
  const RoundingModel m = model_for(p.dtype);
  const std::int64_t T = p.T, C = p.C(), D = p.D, H = p.heads;
  const double exact_scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Bounded scale{exact_scale, (0x1p-23 + 0x1p-48) * exact_scale};
  const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h,
                      std::int64_t d) {
    return Bounded{p.qkv[(b * T + t) * 3 * C + part * C + h * D + d], 0};
  };
  const auto dy = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return Bounded{p.dy[(b * T + t) * C + h * D + d], 0};
  };
  const auto score = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    Bounded dot;
    for (std::int64_t d = 0; d < D; ++d) dot = m.add(dot, m.mul(at(b, i, 0, h, d), at(b, j, 1, h, d)));
    return m.mul(dot, scale);
  };
  EfficientOracle o{std::vector<Bounded>(p.B * T * C), std::vector<Bounded>(p.B * H * T * 2),
                    std::vector<Bounded>(p.B * T * 3 * C)};
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      // The forward, tile by tile.
      for (std::int64_t i = 0; i < T; ++i) {
        Bounded run_max{-INFINITY, 0}, sum;
        std::vector<Bounded> acc(D);
        for (std::int64_t t0 = 0; t0 <= i; t0 += kKeyTile) {
          const std::int64_t t1 = std::min(i + 1, t0 + kKeyTile);
          std::vector<Bounded> e;
          Bounded tile_max{-INFINITY, 0};
          for (std::int64_t j = t0; j < t1; ++j) {
            e.push_back(score(b, h, i, j));
            tile_max = RoundingModel::max(tile_max, e.back());
          }
          const Bounded new_max = RoundingModel::max(run_max, tile_max);
          // Before the first tile there is nothing to rescale: the kernel's exp(-inf) is 0.
          const Bounded rescale = t0 == 0 ? Bounded{0, 0} : m.exp(m.sub(run_max, new_max));
          for (Bounded& x : e) x = m.exp(m.sub(x, new_max));
          sum = m.mul(sum, rescale);
          for (const Bounded& x : e) sum = m.add(sum, x);
          for (std::int64_t d = 0; d < D; ++d) {
            acc[d] = m.mul(acc[d], rescale);
            for (std::int64_t j = t0; j < t1; ++j) {
              const Bounded weight = m.mul(e[j - t0], {mask_factor(p, b, h, i, j), 0});
              acc[d] = m.add(acc[d], m.mul(weight, at(b, j, 2, h, d)));
            }
          }
          run_max = new_max;
        }
        for (std::int64_t d = 0; d < D; ++d) {
          o.y[(b * T + i) * C + h * D + d] = stored(m.div(acc[d], sum), p.dtype);
        }
        o.stats[((b * H + h) * T + i) * 2] = run_max;
        o.stats[((b * H + h) * T + i) * 2 + 1] = sum;
      }
      // The backward, row by row, from the stored y and statistics.
      std::vector<Bounded> dk(T * D), dv(T * D);
      for (std::int64_t i = 0; i < T; ++i) {
        Bounded d_i;
        for (std::int64_t d = 0; d < D; ++d) {
          d_i = m.add(d_i, m.mul(dy(b, i, h, d), o.y[(b * T + i) * C + h * D + d]));
        }
        const Bounded row_max = o.stats[((b * H + h) * T + i) * 2];
        const Bounded row_sum = o.stats[((b * H + h) * T + i) * 2 + 1];
        std::vector<Bounded> g(i + 1), dropped(i + 1);
        for (std::int64_t j = 0; j <= i; ++j) {
          const Bounded P = m.div(m.exp(m.sub(score(b, h, i, j), row_max)), row_sum);
          Bounded dot;
          for (std::int64_t d = 0; d < D; ++d) dot = m.add(dot, m.mul(dy(b, i, h, d), at(b, j, 2, h, d)));
          const Bounded factor{mask_factor(p, b, h, i, j), 0};
          g[j] = m.mul(m.mul(P, m.sub(m.mul(dot, factor), d_i)), scale);
          dropped[j] = m.mul(P, factor);
        }
        for (std::int64_t d = 0; d < D; ++d) {
          Bounded acc;
          for (std::int64_t j = 0; j <= i; ++j) acc = m.add(acc, m.mul(g[j], at(b, j, 1, h, d)));
          o.dqkv[(b * T + i) * 3 * C + h * D + d] = stored(acc, p.dtype);
          for (std::int64_t j = 0; j <= i; ++j) {
            dk[j * D + d] = m.add(dk[j * D + d], m.mul(g[j], at(b, i, 0, h, d)));
            dv[j * D + d] = m.add(dv[j * D + d], m.mul(dropped[j], dy(b, i, h, d)));
          }
        }
      }
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t d = 0; d < D; ++d) {
          o.dqkv[(b * T + t) * 3 * C + C + h * D + d] = stored(dk[t * D + d], p.dtype);
          o.dqkv[(b * T + t) * 3 * C + 2 * C + h * D + d] = stored(dv[t * D + d], p.dtype);
        }
      }
    }
  }
  return o;
}

class EfficientAttentionOracle : public DeviceTest {};

TEST_P(EfficientAttentionOracle, ForwardAndBackwardWithinTheRoundingBoundOfEveryDtype) {
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (dtype == DType::f64 && device().is_cuda()) continue;  // f64 exists on the CPU only
    for (const float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (p > 0 ? ", dropout 0.25" : ", no dropout"));
      // 150 positions: three tiles of keys, the last partial; 2 heads of 5 channels.
      const Problem problem = make_problem(2, 150, 2, 5, dtype, 13, p);
      const EfficientOutputs out = run_efficient(problem, device());
      const EfficientOracle want = efficient_oracle(problem);
      const RoundingModel model = model_for(dtype);
      EXPECT_TRUE(within_bounds("row statistics", out.stats, want.stats, model));
      EXPECT_TRUE(within_bounds("y", out.y, want.y, model));
      EXPECT_TRUE(within_bounds("dqkv", out.dqkv, want.dqkv, model));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EfficientAttentionOracle,
                         ::testing::ValuesIn(testing::all_devices()), testing::device_test_name);

// Both kernels compute the same exact function: each result lies within its own bound of
// the exact value, so the two lie within the sum of the two bounds of each other.
TEST(EfficientAttention, AgreesWithThePlainKernelWithinBothBounds) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Problem problem = make_problem(1, 150, 2, 8, dtype, 17, 0.1f);
    const Outputs plain = run(problem, Device::cpu());
    const EfficientOutputs efficient = run_efficient(problem, Device::cpu());
    const Oracle plain_bound = oracle(problem);
    const EfficientOracle efficient_bound = efficient_oracle(problem);
    const RoundingModel model = model_for(dtype);
    for (const auto& [name, a, b, bound_a, bound_b] :
         {std::tuple{"y", plain.y, efficient.y, &plain_bound.y, &efficient_bound.y},
          std::tuple{"dqkv", plain.dqkv, efficient.dqkv, &plain_bound.dqkv,
                     &efficient_bound.dqkv}}) {
      const std::vector<double> x = testing::to_doubles(a), z = testing::to_doubles(b);
      std::int64_t differing = 0;
      for (std::size_t n = 0; n < x.size(); ++n) {
        const double allowed =
            testing::tolerance((*bound_a)[n], model) + testing::tolerance((*bound_b)[n], model);
        ASSERT_LE(std::abs(x[n] - z[n]), allowed) << name << " element " << n;
        differing += x[n] != z[n];
      }
      // The rescalings did change some bits: a bound with nothing to bound tests nothing.
      EXPECT_GT(differing, 0) << name;
    }
  }
}

TEST(EfficientAttention, MicroBatchesOfSequencesGiveTheBatchBitsForBit) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Problem batch = make_problem(4, 70, 2, 4, dtype, 43, 0.2f);
    const EfficientOutputs whole = run_efficient(batch, Device::cpu());
    std::int64_t first = 0;
    for (const std::int64_t size : {1, 2, 1}) {
      Problem micro = batch;
      micro.B = size;
      micro.dropout.first_row = first;
      const std::int64_t per_qkv = batch.T * 3 * batch.C(), per_y = batch.T * batch.C();
      micro.qkv.assign(batch.qkv.begin() + first * per_qkv,
                       batch.qkv.begin() + (first + size) * per_qkv);
      micro.dy.assign(batch.dy.begin() + first * per_y, batch.dy.begin() + (first + size) * per_y);
      const EfficientOutputs part = run_efficient(micro, Device::cpu());
      EXPECT_TRUE(testing::bitwise_equal(part.y, whole.y.rows(first, first + size))) << first;
      EXPECT_TRUE(testing::bitwise_equal(part.stats, whole.stats.rows(first, first + size)))
          << first;
      EXPECT_TRUE(testing::bitwise_equal(part.dqkv, whole.dqkv.rows(first, first + size)))
          << first;
      first += size;
    }
  }
}

// The same finite differences through 70 positions: two tiles of keys.
TEST(EfficientAttention, BackwardIsTheDerivativeOfTheForward) {
  const Problem problem = make_problem(1, 70, 1, 2, DType::f64, 23, 0.3f);
  expect_backward_is_derivative(
      problem,
      [](const Problem& p, bool backward) { return run_efficient(p, Device::cpu(), backward); },
      efficient_oracle(problem).y);
}

TEST(EfficientAttention, CudaComputesTheCpuBits) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // 300 positions: five tiles, and more keys than a block has threads.
    const Problem problem = make_problem(2, 300, 3, 24, dtype, 53, 0.1f);
    const EfficientOutputs cpu = run_efficient(problem, Device::cpu());
    const EfficientOutputs gpu = run_efficient(problem, Device::cuda());
    EXPECT_TRUE(testing::bitwise_equal(gpu.stats.to(Device::cpu()), cpu.stats));
    EXPECT_TRUE(testing::bitwise_equal(gpu.y.to(Device::cpu()), cpu.y));
    EXPECT_TRUE(testing::bitwise_equal(gpu.dqkv.to(Device::cpu()), cpu.dqkv));
  }
}

TEST(EfficientAttention, ArgumentsAreCheckedWithReadableErrors) {
  const Tensor qkv({2, 4, 18}, DType::f32);  // C = 6
  const Tensor y({2, 4, 6}, DType::f32), stats({2, 3, 4, 2}, DType::f32);
  const auto refusal = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refusal([&] { efficient_attention_forward(qkv, y, Tensor({2, 3, 4}, DType::f32), 3); })
                .find("row_stats"),
            std::string::npos);
  EXPECT_NE(refusal([&] { efficient_attention_forward(qkv, y, Tensor({2, 3, 4, 2}, DType::bf16), 3); })
                .find("row_stats"),
            std::string::npos);
  EXPECT_NE(refusal([&] { efficient_attention_forward(qkv, qkv, stats, 3); }).find("y"),
            std::string::npos);
  EXPECT_NO_THROW(efficient_attention_forward(qkv, y, stats, 3));
}

// ---- what the contract promises beyond the values ------------------------------------------

TEST(AttentionCausality, LaterPositionsChangeNothingBefore) {
  const Problem problem = make_problem(1, 8, 2, 4, DType::f32, 31);
  Problem changed = problem;
  const std::int64_t cut = 5;  // positions >= 5 get other queries, keys and values
  for (std::int64_t n = cut * 3 * problem.C(); n < static_cast<std::int64_t>(changed.qkv.size());
       ++n) {
    changed.qkv[n] = -changed.qkv[n] + 0.5;
  }
  const Outputs a = run(problem, Device::cpu(), false), b = run(changed, Device::cpu(), false);
  EXPECT_TRUE(testing::bitwise_equal(a.y.rows(0, 1).reshaped({8, problem.C()}).rows(0, cut),
                                     b.y.rows(0, 1).reshaped({8, problem.C()}).rows(0, cut)));
  // Every probability above the diagonal is exactly 0, and every row sums to 1 within
  // i + 1 roundings of the division (the oracle test bounds each term).
  const std::vector<double> P = testing::to_doubles(a.probabilities);
  for (std::int64_t h = 0; h < problem.heads; ++h) {
    for (std::int64_t i = 0; i < problem.T; ++i) {
      for (std::int64_t j = i + 1; j < problem.T; ++j) {
        EXPECT_EQ(P[(h * problem.T + i) * problem.T + j], 0.0)
            << "h " << h << " i " << i << " j " << j;
      }
    }
  }
}

// ---- the header's arithmetic, replayed ------------------------------------------------------
//
// attention.hpp states every operation and its order in float, so the kernel's bits can be
// replayed here one scalar operation at a time: chains from 0 in the stated order, each
// product and sum rounded once (the tests, like the kernels, compile with
// -ffp-contract=off), P rounded to the dtype where it is stored and read back from there,
// 16-bit results rounded to nearest even on store.

/// x rounded to the dtype and widened back (16-bit stores; f32 as it is).
float stored_as(DType dtype, float x) {
  if (dtype == DType::f16) return static_cast<float>(static_cast<f16>(x));
  if (dtype == DType::bf16) return to_float(to_bf16(x));
  return x;
}

struct Replayed {
  std::vector<float> y, probabilities, dqkv;  // the kernel's shapes, as stored
};

Replayed replay(const Problem& p) {
  const std::int64_t T = p.T, D = p.D, C = p.C();
  const float scale = attention_scale(D);
  Replayed out{std::vector<float>(p.B * T * C), std::vector<float>(p.B * p.heads * T * T, 0.0f),
               std::vector<float>(p.B * T * 3 * C)};
  // Element d of part 0 (q), 1 (k) or 2 (v) of head h at position t of sequence b.
  const auto in = [&](std::int64_t b, std::int64_t t, int part, std::int64_t h, std::int64_t d) {
    return static_cast<float>(p.qkv[((b * T + t) * 3 + part) * C + h * D + d]);
  };
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      float* P = out.probabilities.data() + (b * p.heads + h) * T * T;
      std::vector<float> dk(T * D, 0.0f), dv(T * D, 0.0f);
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t keys = i + 1;
        std::vector<float> e(keys), m(keys);
        float max = -INFINITY;
        for (std::int64_t j = 0; j < keys; ++j) {
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) dot = dot + in(b, i, 0, h, d) * in(b, j, 1, h, d);
          e[j] = dot * scale;
          max = std::max(max, e[j]);
          m[j] = static_cast<float>(mask_factor(p, b, h, i, j));
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j < keys; ++j) e[j] = activation_math::exp_nonpositive(e[j] - max);
        for (std::int64_t j = 0; j < keys; ++j) sum = sum + e[j];
        for (std::int64_t j = 0; j < keys; ++j) P[i * T + j] = stored_as(p.dtype, e[j] / sum);
        for (std::int64_t d = 0; d < D; ++d) {
          float acc = 0.0f;
          for (std::int64_t j = 0; j < keys; ++j) {
            acc = acc + (P[i * T + j] * m[j]) * in(b, j, 2, h, d);
          }
          out.y[(b * T + i) * C + h * D + d] = stored_as(p.dtype, acc);
        }
        // The backward of row i: dP, r, g; dq_i now, dk and dv accumulated over i ascending.
        std::vector<float> g(keys);
        const auto dy = [&](std::int64_t d) {
          return static_cast<float>(p.dy[(b * T + i) * C + h * D + d]);
        };
        for (std::int64_t j = 0; j < keys; ++j) {
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) dot = dot + dy(d) * in(b, j, 2, h, d);
          g[j] = dot * m[j];
        }
        float r = 0.0f;
        for (std::int64_t j = 0; j < keys; ++j) r = r + P[i * T + j] * g[j];
        for (std::int64_t j = 0; j < keys; ++j) g[j] = (P[i * T + j] * (g[j] - r)) * scale;
        for (std::int64_t d = 0; d < D; ++d) {
          float acc = 0.0f;
          for (std::int64_t j = 0; j < keys; ++j) acc = acc + g[j] * in(b, j, 1, h, d);
          out.dqkv[((b * T + i) * 3 + 0) * C + h * D + d] = stored_as(p.dtype, acc);
        }
        for (std::int64_t j = 0; j < keys; ++j) {
          for (std::int64_t d = 0; d < D; ++d) {
            dk[j * D + d] = dk[j * D + d] + g[j] * in(b, i, 0, h, d);
            dv[j * D + d] = dv[j * D + d] + (P[i * T + j] * m[j]) * dy(d);
          }
        }
      }
      for (std::int64_t j = 0; j < T; ++j) {
        for (std::int64_t d = 0; d < D; ++d) {
          out.dqkv[((b * T + j) * 3 + 1) * C + h * D + d] = stored_as(p.dtype, dk[j * D + d]);
          out.dqkv[((b * T + j) * 3 + 2) * C + h * D + d] = stored_as(p.dtype, dv[j * D + d]);
        }
      }
    }
  }
  return out;
}

std::vector<float> floats_of(const Tensor& t) {
  const std::vector<double> values = testing::to_doubles(t);
  return {values.begin(), values.end()};
}

// (16-bit exact) The CPU kernels compute exactly the operations the header states, in f32,
// f16 and bf16, with and without dropout: every stored bit of y, P and dqkv is the replay's.
// (CUDA computes the CPU's bits: AttentionBackends.CudaComputesTheCpuBits.)
TEST(AttentionReplay, EveryStoredBitIsTheHeadersOperationsInFloat) {
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const float p : {0.0f, 0.25f}) {
      const Problem problem = make_problem(2, 9, 2, 8, dtype, 41, p);
      const Outputs got = run(problem, Device::cpu());
      const Replayed want = replay(problem);
      const std::string at = std::string(dtype_name(dtype)) + ", dropout " + std::to_string(p);
      EXPECT_EQ(floats_of(got.probabilities), want.probabilities) << at;
      EXPECT_EQ(floats_of(got.y), want.y) << at;
      EXPECT_EQ(floats_of(got.dqkv), want.dqkv) << at;
    }
  }
}

TEST(AttentionBatchInvariance, MicroBatchesOfSequencesGiveTheBatchBitsForBit) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Problem batch = make_problem(5, 7, 2, 4, dtype, 41, 0.2f);
    const Outputs whole = run(batch, Device::cpu());
    std::int64_t first = 0;
    for (const std::int64_t size : {1, 3, 1}) {
      Problem micro = batch;
      micro.B = size;
      micro.dropout.first_row = first;
      const std::int64_t per_sequence_qkv = batch.T * 3 * batch.C(),
                         per_sequence_y = batch.T * batch.C();
      micro.qkv.assign(batch.qkv.begin() + first * per_sequence_qkv,
                       batch.qkv.begin() + (first + size) * per_sequence_qkv);
      micro.dy.assign(batch.dy.begin() + first * per_sequence_y,
                      batch.dy.begin() + (first + size) * per_sequence_y);
      const Outputs part = run(micro, Device::cpu());
      EXPECT_TRUE(testing::bitwise_equal(part.y, whole.y.rows(first, first + size))) << first;
      EXPECT_TRUE(
          testing::bitwise_equal(part.probabilities, whole.probabilities.rows(first, first + size)))
          << first;
      EXPECT_TRUE(testing::bitwise_equal(part.dqkv, whole.dqkv.rows(first, first + size))) << first;
      first += size;
    }
  }
}

// Selective attention recomputation rebuilds P from qkv alone: the forward's P, bit for bit,
// whatever the forward's dropout (which acts after P), on every dtype and backend.
void expect_probabilities_of_the_forward(Device device, std::initializer_list<DType> dtypes) {
  for (const DType dtype : dtypes) {
    SCOPED_TRACE(device.name() + " " + std::string(dtype_name(dtype)));
    const Problem problem = make_problem(3, 37, 2, 8, dtype, 61, 0.3f);
    const Outputs forward = run(problem, device, /*backward=*/false);
    const Tensor P({problem.B, problem.heads, problem.T, problem.T}, dtype, device);
    testing::poison(P);
    causal_attention_probabilities(qkv_tensor(problem, device), P, problem.heads);
    EXPECT_TRUE(testing::bitwise_equal(P.to(Device::cpu()),
                                       forward.probabilities.to(Device::cpu())));
  }
}

TEST(AttentionProbabilities, AreTheForwardsStoredPBitForBit) {
  expect_probabilities_of_the_forward(Device::cpu(),
                                      {DType::f32, DType::f16, DType::bf16, DType::f64});
  const Tensor qkv({2, 4, 18}, DType::f32), wrong({2, 3, 4, 5}, DType::f32);
  EXPECT_THROW(causal_attention_probabilities(qkv, wrong, 3), std::invalid_argument);
}

TEST(AttentionProbabilities, AreTheForwardsStoredPBitForBitOnTheGpu) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  expect_probabilities_of_the_forward(Device::cuda(), {DType::f32, DType::f16, DType::bf16});
}

TEST(AttentionBackends, CudaComputesTheCpuBits) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // 300 positions: more keys than a block has threads, so the strided loops wrap.
    const Problem problem = make_problem(2, 300, 3, 24, dtype, 51, 0.1f);
    const Outputs cpu = run(problem, Device::cpu()), gpu = run(problem, Device::cuda());
    EXPECT_TRUE(testing::bitwise_equal(gpu.probabilities.to(Device::cpu()), cpu.probabilities));
    EXPECT_TRUE(testing::bitwise_equal(gpu.y.to(Device::cpu()), cpu.y));
    EXPECT_TRUE(testing::bitwise_equal(gpu.dqkv.to(Device::cpu()), cpu.dqkv));
  }
}

TEST(AttentionArguments, AreCheckedWithReadableErrors) {
  const Tensor qkv({2, 4, 18}, DType::f32);  // C = 6
  const Tensor y({2, 4, 6}, DType::f32), P({2, 3, 4, 4}, DType::f32);
  EXPECT_NO_THROW(causal_attention_forward(qkv, y, P, 3));
  EXPECT_THROW(causal_attention_forward(qkv, y, P, 4), std::invalid_argument);  // 6 % 4 != 0
  EXPECT_THROW(causal_attention_forward(qkv, y, Tensor({2, 2, 4, 4}, DType::f32), 3),
               std::invalid_argument);
  EXPECT_THROW(causal_attention_forward(qkv, Tensor({2, 4, 6}, DType::bf16), P, 3),
               std::invalid_argument);
  EXPECT_THROW(causal_attention_forward(qkv, y, P, 3, DropoutSpec{1.5f}), std::invalid_argument);
  EXPECT_THROW(
      causal_attention_forward(qkv, qkv.reshaped({48, 3}).rows(0, 16).reshaped({2, 4, 6}), P, 3),
      std::invalid_argument);  // y inside qkv
  const Tensor dy({2, 4, 6}, DType::f32);
  EXPECT_THROW(causal_attention_backward(qkv, P, dy, qkv, 3), std::invalid_argument);  // in place
}

}  // namespace
}  // namespace bigbatch

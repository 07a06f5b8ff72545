// The linear layer's GEMM with its GELU (kernels/gemm_epilogue.hpp): the unfused path is
// exactly gemm, add_bias and the GELU ops; the cuBLASLt-fused path (CUDA, f16) agrees with it
// within a bound derived below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/bias.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_epilogue.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

/// Restores the fused-epilogue setting when the test ends.
class ScopedFusedEpilogues {
 public:
  explicit ScopedFusedEpilogues(bool enabled) : previous_(fused_epilogues_enabled()) {
    set_fused_epilogues(enabled);
  }
  ~ScopedFusedEpilogues() { set_fused_epilogues(previous_); }

 private:
  bool previous_;
};

class GemmEpilogue : public testing::DeviceTest {};

// The unfused path is the reference: the three ops' bits, whatever the setting on the CPU
// (which never fuses) and with the setting off on CUDA.
TEST_P(GemmEpilogue, UnfusedIsTheComposedOps) {
  const ScopedFusedEpilogues setting(device().is_cpu());
  const std::int64_t calls = fused_epilogue_calls();
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Tensor x = testing::random_tensor({37, 24}, dtype, device(), 1);
    const Tensor w = testing::random_tensor({40, 24}, dtype, device(), 2);
    const Tensor bias = testing::random_tensor({40}, DType::f32, device(), 3);
    const Tensor pre({37, 40}, dtype, device()), y({37, 40}, dtype, device());
    testing::poison(pre);
    testing::poison(y);
    linear_bias_gelu_forward(x, w, bias, pre, y);
    const Tensor want_pre({37, 40}, dtype, device()), want_y({37, 40}, dtype, device());
    gemm(x, false, w, true, want_pre);
    add_bias(want_pre, bias);
    gelu_forward(want_pre, want_y);
    EXPECT_TRUE(testing::bitwise_equal(pre, want_pre)) << dtype_name(dtype);
    EXPECT_TRUE(testing::bitwise_equal(y, want_y)) << dtype_name(dtype);

    const Tensor dy = testing::random_tensor({37, 16}, dtype, device(), 4);
    const Tensor w2 = testing::random_tensor({16, 40}, dtype, device(), 5);
    const Tensor dh({37, 40}, dtype, device()), want_dh({37, 40}, dtype, device());
    testing::poison(dh);
    gemm_gelu_backward(dy, w2, pre, dh);
    gemm(dy, false, w2, false, want_dh);
    gelu_backward(pre, want_dh, want_dh);
    EXPECT_TRUE(testing::bitwise_equal(dh, want_dh)) << dtype_name(dtype);
  }
  EXPECT_EQ(fused_epilogue_calls(), calls) << "nothing fused";
}

TEST_P(GemmEpilogue, RejectsMismatchedShapes) {
  const Tensor x({4, 3}, DType::f32, device()), w({5, 3}, DType::f32, device());
  const Tensor bias({5}, DType::f32, device()), out({4, 5}, DType::f32, device());
  EXPECT_THROW(linear_bias_gelu_forward(x, w, bias, Tensor({4, 4}, DType::f32, device()), out),
               std::invalid_argument);
  EXPECT_THROW(linear_bias_gelu_forward(x, w, bias, out, Tensor({4, 5}, DType::f16, device())),
               std::invalid_argument);
  EXPECT_THROW(gemm_gelu_backward(out, w, out, Tensor({4, 4}, DType::f32, device())),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, GemmEpilogue, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// Fused against unfused, f16 operands, fp32 accumulation. With u = 2^-11 (f16's unit
// roundoff), S_ij = sum_k |x_ik w_jk| and a_ij the exact product sum:
//  - each path's fp32 accumulation is within gamma_32(K) S_ij of a_ij, in any order (Higham
//    (3.5)): 2 gamma_32(K) S_ij between the paths;
//  - pre: unfused rounds a to f16, adds the f32 bias, rounds again (<= u (|a| + |pre|)); fused
//    adds an f16-rounded bias (<= u |b|) and rounds once (<= u |pre|); |pre| <= |a| + |b|, so
//    the roundings stay within 4 u (|a_ij| + |b_j|);
//  - y = gelu(pre): the tanh-approximation GELU on both paths, |gelu'| <= 1.13 everywhere, so
//    the pre difference grows by at most 1.13; each path rounds y once to f16 (u |y| each)
//    and evaluates GELU in float with its own formula. That evaluation error is NOT derived
//    for cuBLASLt (its code is not public): we allow 2 u |y| more for it (four f16 half-ulps
//    in all), an assumption the printed margin measures.
//  - dh = (dy w2) gelu'(pre): the same reasoning, |gelu'| <= 1.13 multiplying the product's
//    2 gamma_32(K) S + u |g| (unfused rounds g to f16 first), 2 u |dh| for the two final
//    roundings, 2 u |dh| more for cuBLASLt's gelu' (assumed, as above).
TEST(GemmEpilogueCuda, FusedMatchesUnfusedWithinTheDerivedBound) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const std::int64_t M = 1000, K = 264, N = 512, N2 = 136;
  const double u = testing::unit_roundoff(DType::f16);
  const Tensor x = testing::random_tensor({M, K}, DType::f16, device, 11);
  const Tensor w = testing::random_tensor({N, K}, DType::f16, device, 12);
  const Tensor bias = testing::random_tensor({N}, DType::f32, device, 13);
  const Tensor dy = testing::random_tensor({M, N2}, DType::f16, device, 14);
  const Tensor w2 = testing::random_tensor({N2, N}, DType::f16, device, 15);
  struct Outputs {
    Tensor pre, y, dh;
  };
  const auto run = [&](bool fused) {
    const ScopedFusedEpilogues setting(fused);
    Outputs o{Tensor({M, N}, DType::f16, device), Tensor({M, N}, DType::f16, device),
              Tensor({M, N}, DType::f16, device)};
    for (const Tensor* t : {&o.pre, &o.y, &o.dh}) testing::poison(*t);
    linear_bias_gelu_forward(x, w, bias, o.pre, o.y);
    gemm_gelu_backward(dy, w2, o.pre, o.dh);
    return o;
  };
  const std::int64_t calls = fused_epilogue_calls();
  const Outputs unfused = run(false);
  const Outputs fused = run(true);
  if (fused_epilogue_calls() != calls + 2) {
    GTEST_SKIP() << "cuBLASLt offered no fused algorithm on this GPU: the unfused path ran";
  }
  const auto xs = testing::to_doubles(x), ws = testing::to_doubles(w), b = testing::to_doubles(bias);
  const auto dys = testing::to_doubles(dy), w2s = testing::to_doubles(w2);
  const auto pre_u = testing::to_doubles(unfused.pre), pre_f = testing::to_doubles(fused.pre);
  const auto y_u = testing::to_doubles(unfused.y), y_f = testing::to_doubles(fused.y);
  const auto dh_u = testing::to_doubles(unfused.dh), dh_f = testing::to_doubles(fused.dh);
  const double g32 = testing::gamma(std::max(K, N2), DType::f32);
  double worst = 0;  // the largest |difference| / bound, printed as the measured margin
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double a = 0, s = 0, g = 0, sg = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        a += xs[i * K + k] * ws[j * K + k];
        s += std::fabs(xs[i * K + k] * ws[j * K + k]);
      }
      for (std::int64_t k = 0; k < N2; ++k) {
        g += dys[i * N2 + k] * w2s[k * N + j];
        sg += std::fabs(dys[i * N2 + k] * w2s[k * N + j]);
      }
      const std::size_t e = static_cast<std::size_t>(i * N + j);
      const double pre_bound = 2 * g32 * s + 4 * u * (std::fabs(a) + std::fabs(b[j]));
      const double y_bound = 1.13 * pre_bound + 4 * u * std::max(std::fabs(y_u[e]), std::fabs(y_f[e]));
      const double dh_bound = 1.13 * (2 * g32 * sg + u * std::fabs(g)) + 1.13 * pre_bound * std::fabs(g) +
                              4 * u * std::max(std::fabs(dh_u[e]), std::fabs(dh_f[e]));
      ASSERT_LE(std::fabs(pre_f[e] - pre_u[e]), pre_bound) << "pre[" << i << "][" << j << "]";
      ASSERT_LE(std::fabs(y_f[e] - y_u[e]), y_bound) << "y[" << i << "][" << j << "]";
      ASSERT_LE(std::fabs(dh_f[e] - dh_u[e]), dh_bound) << "dh[" << i << "][" << j << "]";
      worst = std::max({worst, std::fabs(pre_f[e] - pre_u[e]) / pre_bound,
                        std::fabs(y_f[e] - y_u[e]) / y_bound, std::fabs(dh_f[e] - dh_u[e]) / dh_bound});
    }
  }
  std::printf("fused vs unfused: largest difference / bound = %.3f\n", worst);
}

}  // namespace
}  // namespace bigbatch

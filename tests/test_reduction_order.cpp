// The fixed orders of the CUDA backend's sums over the batch (kernels/reduction_order.hpp):
// computed on the host here, so that the orders themselves are checked on any machine,
// and, where a GPU is present, the kernels against them (bit for bit where the terms are
// the same floats) and against themselves (two runs, the same bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/batchnorm.hpp"
#include "kernels/bias.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/reduction_order.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

namespace order = reduction_order;

TEST(ReductionOrder, TilesCoverTheRows) {
  EXPECT_EQ(order::tile_count(0), 0);
  EXPECT_EQ(order::tile_count(1), 1);
  EXPECT_EQ(order::tile_count(32), 1);
  EXPECT_EQ(order::tile_count(33), 2);
  EXPECT_EQ(order::tile_count(1024), 32);
  // Every row in exactly one tile: the tile sums of ones count the rows.
  for (const std::int64_t rows : {1, 31, 32, 33, 100, 1025}) {
    std::int64_t counted = 0;
    for (std::int64_t t = 0; t < order::tile_count(rows); ++t) {
      counted += static_cast<std::int64_t>(order::tile_sum(t, rows, [](std::int64_t) { return 1.0f; }));
    }
    EXPECT_EQ(counted, rows);
  }
}

// One tile from 0 is the plain sum in row order.
TEST(ReductionOrder, OneTileFromZeroIsTheRowOrder) {
  const auto values = testing::random_values(32, 1);
  float sequential = 0.0f;
  for (const double v : values) sequential += static_cast<float>(v);
  const float tiled = order::tiled_column_sum(0.0f, 32, [&](std::int64_t i) {
    return static_cast<float>(values[static_cast<std::size_t>(i)]);
  });
  EXPECT_EQ(tiled, sequential);
}

// The tile is summed before it meets the buffer: 32 terms of 2^-25 make 2^-20 on their own,
// and 1 + 2^-20 is exact; added to 1 one by one, each 2^-25 (a quarter ulp of 1) rounds away.
TEST(ReductionOrder, ATileMeetsTheBufferAsOneSum) {
  const auto term = [](std::int64_t) { return 0x1p-25f; };
  EXPECT_EQ(order::tiled_column_sum(1.0f, 32, term), 1.0f + 0x1p-20f);
  float sequential = 1.0f;
  for (int i = 0; i < 32; ++i) sequential += term(i);
  EXPECT_EQ(sequential, 1.0f);
}

// Micro-batches whose rows are multiples of the tile give the whole batch's bits: the tiles
// are the same, and the buffer continues from one micro-batch to the next.
TEST(ReductionOrder, MicroBatchesOfWholeTilesGiveTheBatchBits) {
  const std::int64_t rows = 1000;  // 15 x 64 + 40
  const auto values = testing::random_values(rows, 2);
  const auto term = [&](std::int64_t i) { return static_cast<float>(values[static_cast<std::size_t>(i)]); };
  const float whole = order::tiled_column_sum(0.5f, rows, term);
  float micro = 0.5f;
  for (std::int64_t begin = 0; begin < rows; begin += 64) {
    const std::int64_t end = std::min(begin + 64, rows);
    micro = order::tiled_column_sum(micro, end - begin, [&](std::int64_t i) { return term(begin + i); });
  }
  EXPECT_EQ(micro, whole);
}

// Any order of n float additions is within gamma(n) * sum |terms| of the exact sum (Higham,
// Accuracy and Stability of Numerical Algorithms, (4.4)); both orders are such orders.
TEST(ReductionOrder, BothOrdersAreWithinTheSummationBound) {
  const std::int64_t n = 3 * 4096 + 777;
  const auto values = testing::random_values(n, 3, -1.0, 1.0);
  double exact = 0.5, magnitude = 0.5;
  for (const double v : values) {
    exact += static_cast<float>(v);
    magnitude += std::fabs(static_cast<float>(v));
  }
  const auto term = [&](std::int64_t i) { return static_cast<float>(values[static_cast<std::size_t>(i)]); };
  const double bound = testing::gamma(n + 1, DType::f32) * magnitude;
  EXPECT_NEAR(order::tiled_column_sum(0.5f, n, term), exact, bound);
  EXPECT_NEAR(0.5 + order::chunked_sum(n, term), exact, bound);
}

// The lanes meet in the halving tree: lane 1 (elements 1 and 129, 2^-24 each: lane 1 takes
// lane 129 at s = 128) reaches lane 0 only at s = 1, as 2^-23, so the sum is 1 + 2^-23. In
// row order each 2^-24 (half an ulp of 1) rounds to even, away, and the sum stays 1.
TEST(ReductionOrder, TheLanesMeetInTheHalvingTree) {
  std::vector<float> values(300, 0.0f);
  values[0] = 1.0f;
  values[1] = values[129] = 0x1p-24f;
  const auto value = [&](std::int64_t i) { return values[static_cast<std::size_t>(i)]; };
  EXPECT_EQ(order::chunked_sum(300, value), 1.0f + 0x1p-23f);
  float sequential = 0.0f;
  for (const float v : values) sequential += v;
  EXPECT_EQ(sequential, 1.0f);
}

// Several chunks: each chunk's lane sum first, then the partials in the same way.
TEST(ReductionOrder, ChunksAreSummedThenTheirPartials) {
  const std::int64_t n = 2 * 4096 + 5;
  const auto values = testing::random_values(n, 4);
  const auto value = [&](std::int64_t i) { return static_cast<float>(values[static_cast<std::size_t>(i)]); };
  float partials[3] = {order::lane_sum(0, 4096, value), order::lane_sum(4096, 8192, value),
                       order::lane_sum(8192, n, value)};
  float lanes[order::kSumLanes] = {partials[0], partials[1], partials[2]};
  EXPECT_EQ(order::chunked_sum(n, value), order::halving_tree_sum(lanes));
  EXPECT_EQ(order::chunked_sum(0, value), 0.0f);
}

// ---- the CUDA kernels --------------------------------------------------------------------

// More tiles than a grid's y dimension holds (65535), so the kernel's tile loop strides:
// bit for bit the host's order 1.
TEST(ReductionsCuda, BiasGradientOfTwoMillionRowsFollowsTheOrder) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const std::int64_t rows = 65535 * 32 + 33, cols = 3;
  const Tensor dy = testing::random_tensor({rows, cols}, DType::f32, device, 5);
  const Tensor dbias = testing::random_tensor({cols}, DType::f32, device, 6);
  std::vector<float> want = dbias.to_vector<float>();
  const auto g = dy.to_vector<float>();
  for (std::int64_t j = 0; j < cols; ++j) {
    want[static_cast<std::size_t>(j)] = order::tiled_column_sum(
        want[static_cast<std::size_t>(j)], rows,
        [&](std::int64_t i) { return g[static_cast<std::size_t>(i * cols + j)]; });
  }
  bias_backward(dy, dbias);
  EXPECT_TRUE(testing::bitwise_equal(dbias, Tensor::from_vector(want, {cols})));
}

// Two identical runs of every reduction over the batch give the same bytes.
TEST(ReductionsCuda, TwoRunsGiveTheSameBytes) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const std::int64_t M = 9001, N = 257, C = 10;
  for (const DType dtype : {DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = testing::random_tensor({M, N}, dtype, device, 7);
    const Tensor dy = testing::random_tensor({M, N}, dtype, device, 8);
    const Tensor weight = testing::random_tensor({N}, DType::f32, device, 9);
    const Tensor bias = testing::random_tensor({N}, DType::f32, device, 10);
    const auto run = [&] {
      std::vector<Tensor> out;
      const Tensor y({M, N}, dtype, device), dx({M, N}, dtype, device);
      const Tensor row_mean({M}, DType::f32, device), row_rstd({M}, DType::f32, device);
      const Tensor dweight = Tensor::zeros({N}, DType::f32, device);
      const Tensor dbias = Tensor::zeros({N}, DType::f32, device);
      layernorm_forward(x, weight, bias, y, row_mean, row_rstd);
      layernorm_backward(x, weight, row_mean, row_rstd, dy, dx, dweight, dbias);
      out.insert(out.end(), {dx, dweight, dbias});
      const Tensor mean({N}, DType::f32, device), rstd({N}, DType::f32, device);
      const Tensor running_mean = Tensor::zeros({N}, DType::f32, device);
      const Tensor running_var = Tensor::zeros({N}, DType::f32, device);
      const Tensor bn_dx({M, N}, dtype, device);
      const Tensor bn_dweight = Tensor::zeros({N}, DType::f32, device);
      const Tensor bn_dbias = Tensor::zeros({N}, DType::f32, device);
      batchnorm_forward_train(x, weight, bias, y, mean, rstd, running_mean, running_var, 0.1f,
                              1e-5f);
      batchnorm_backward(x, weight, mean, rstd, dy, bn_dx, bn_dweight, bn_dbias);
      out.insert(out.end(), {mean, rstd, running_var, bn_dx, bn_dweight, bn_dbias});
      const Tensor bias_grad = Tensor::zeros({N}, DType::f32, device);
      bias_backward(dy, bias_grad);
      out.push_back(bias_grad);
      return out;
    };
    const std::vector<Tensor> first = run(), second = run();
    for (std::size_t k = 0; k < first.size(); ++k) {
      EXPECT_TRUE(testing::bitwise_equal(first[k], second[k])) << "output " << k;
    }
  }
  // The loss: 9001 rows are three chunks of the vector sum.
  const Tensor logits = testing::random_tensor({M, C}, DType::f32, device, 11);
  std::vector<std::int32_t> label_values(static_cast<std::size_t>(M));
  for (std::int64_t i = 0; i < M; ++i) label_values[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % C);
  const Tensor labels = Tensor::from_vector(label_values, {M}, device);
  const Tensor loss_a = Tensor::zeros({1}, DType::f32, device);
  const Tensor loss_b = Tensor::zeros({1}, DType::f32, device);
  cross_entropy_forward(logits, labels, loss_a, static_cast<float>(M));
  cross_entropy_forward(logits, labels, loss_b, static_cast<float>(M));
  EXPECT_TRUE(testing::bitwise_equal(loss_a, loss_b));
}

}  // namespace
}  // namespace bigbatch

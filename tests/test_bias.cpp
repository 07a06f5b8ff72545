// bias: add_bias against a float64 oracle; bias_backward's summation order (the contract
// that makes gradient accumulation exact) and its accuracy; finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/bias.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/reduction_order.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

const std::vector<Shape> kShapes = {{1, 1}, {7, 1025}, {1025, 7}, {3, 1}, {1, 1025}, {1027, 1021}};

class Bias : public DeviceTest {};

// y + bias is one float addition: the sum of two floats computed in double and rounded
// to float is the correctly rounded float sum (double has more than 2*24+2 bits), so the
// oracle gives the exact expected bits. For f16, the float sum is rounded once more.
TEST_P(Bias, AddBiasIsOneRoundedSum) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const Shape& shape : kShapes) {
      const std::int64_t rows = shape[0], cols = shape[1];
      const Tensor y = testing::random_tensor(shape, dtype, device(), 1, -4.0, 4.0);
      const Tensor bias = testing::random_tensor({cols}, DType::f32, device(), 2, -4.0, 4.0);
      const auto before = testing::to_doubles(y), b = testing::to_doubles(bias);
      add_bias(y, bias);
      std::vector<double> want(before.size());
      for (std::int64_t i = 0; i < rows; ++i) {
        for (std::int64_t j = 0; j < cols; ++j) {
          const auto k = static_cast<std::size_t>(i * cols + j);
          const float sum = static_cast<float>(before[k] + b[static_cast<std::size_t>(j)]);
          want[k] = dtype == DType::f16 ? static_cast<double>(static_cast<f16>(sum)) : sum;
        }
      }
      const auto exact = [](std::size_t) { return 0.0; };
      ASSERT_TRUE(testing::all_close(testing::to_doubles(y), want, exact))
          << dtype_name(dtype) << " " << shape_string(shape);
    }
  }
}

// The contract: on the CPU dbias[j] = (((dbias[j] + dy[0][j]) + dy[1][j]) + ...) in float,
// exactly; on CUDA the tiles of 32 rows in order (reduction_order.hpp's order 1), exactly.
TEST_P(Bias, BackwardAddsTheRowsInTheStatedOrder) {
  for (const Shape& shape : kShapes) {
    const std::int64_t rows = shape[0], cols = shape[1];
    const Tensor dy = testing::random_tensor(shape, DType::f32, device(), 3);
    const Tensor dbias = testing::random_tensor({cols}, DType::f32, device(), 4);
    const auto g = dy.to_vector<float>();
    std::vector<float> want = dbias.to_vector<float>();
    if (device().is_cuda()) {
      for (std::int64_t j = 0; j < cols; ++j) {
        auto& out = want[static_cast<std::size_t>(j)];
        out = reduction_order::tiled_column_sum(out, rows, [&](std::int64_t i) {
          return g[static_cast<std::size_t>(i * cols + j)];
        });
      }
    } else {
      for (std::int64_t i = 0; i < rows; ++i) {
        for (std::int64_t j = 0; j < cols; ++j) {
          want[static_cast<std::size_t>(j)] += g[static_cast<std::size_t>(i * cols + j)];
        }
      }
    }
    bias_backward(dy, dbias);
    EXPECT_TRUE(testing::bitwise_equal(dbias, Tensor::from_vector(want, {cols}, device())))
        << shape_string(shape);
  }
}

// Against float64: rows + 1 terms summed in float in some order are within
// gamma(rows) * sum |terms| of the exact sum (Higham, Accuracy and Stability, (4.4)).
TEST_P(Bias, BackwardIsAccurate) {
  const std::int64_t rows = 4099, cols = 33;
  const Tensor dy = testing::random_tensor({rows, cols}, DType::f32, device(), 5);
  const Tensor dbias = testing::random_tensor({cols}, DType::f32, device(), 6);
  const auto g = testing::to_doubles(dy), initial = testing::to_doubles(dbias);
  std::vector<double> exact = initial, magnitude(initial.size());
  for (std::size_t j = 0; j < exact.size(); ++j) magnitude[j] = std::fabs(initial[j]);
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const double term = g[static_cast<std::size_t>(i * cols + j)];
      exact[static_cast<std::size_t>(j)] += term;
      magnitude[static_cast<std::size_t>(j)] += std::fabs(term);
    }
  }
  bias_backward(dy, dbias);
  EXPECT_TRUE(testing::all_close(testing::to_doubles(dbias), exact, [&](std::size_t j) {
    return testing::gamma(rows, DType::f32) * magnitude[j];
  }));
}

/// dbias after accumulating bias_backward over consecutive row slices of the given sizes.
Tensor accumulate_in_slices(const Tensor& dy, const std::vector<std::int64_t>& sizes) {
  Tensor dbias = Tensor::zeros({dy.dim(1)}, DType::f32, dy.device());
  std::int64_t begin = 0;
  for (const std::int64_t size : sizes) {
    bias_backward(dy.rows(begin, begin + size), dbias);
    begin += size;
  }
  EXPECT_EQ(begin, dy.dim(0)) << "the slices must cover the batch";
  return dbias;
}

std::vector<std::int64_t> slices_of(std::int64_t size, std::int64_t total) {
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(total / size), size);
  if (total % size != 0) sizes.push_back(total % size);
  return sizes;
}

// Gradient accumulation reproduces the large batch bit for bit: the same additions in
// the same order, whatever the micro-batch size (CPU), or for micro-batches of multiples
// of 32 rows (CUDA: its tiles), the last one uneven included.
TEST_P(Bias, MicroBatchesGiveTheBatchGradientBitForBit) {
  for (const std::int64_t batch : {1000, 1024}) {
    const Tensor dy = testing::random_tensor({batch, 77}, DType::f32, device(), 7 + batch);
    const Tensor whole = accumulate_in_slices(dy, {batch});
    std::vector<std::vector<std::int64_t>> splits;
    if (batch == 1000) splits.push_back(slices_of(64, 1000));  // 15 x 64 + 40
    if (batch == 1024) {
      for (const std::int64_t size : {1, 7, 32, 64}) {
        if (device().is_cuda() && size % reduction_order::kTileRows != 0) continue;
        splits.push_back(slices_of(size, 1024));
      }
    }
    for (const auto& split : splits) {
      EXPECT_TRUE(testing::bitwise_equal(accumulate_in_slices(dy, split), whole))
          << "batch " << batch << " in " << split.size() << " micro-batches of " << split[0];
    }
  }
}

// Mixed precision: an f16 dy is widened exactly to f32, so its sum is the f32 path's on
// the widened values, addition for addition (an independent route: cast, then f32).
TEST_P(Bias, HalfGradientsAreSummedInFloatLikeTheirWidenedCopy) {
  const Tensor dy16 = testing::random_tensor({1000, 77}, DType::f16, device(), 18);
  const Tensor dy32({1000, 77}, DType::f32, device());
  cast(dy16, dy32);
  const Tensor start = testing::random_tensor({77}, DType::f32, device(), 19);
  const Tensor from_half = start.clone(), from_float = start.clone();
  bias_backward(dy16, from_half);
  bias_backward(dy32, from_float);
  EXPECT_TRUE(testing::bitwise_equal(from_half, from_float));
  EXPECT_FALSE(testing::bitwise_equal(from_half, start)) << "nothing was added";
}

// add_bias is one rounded addition on both backends: bit for bit. bias_backward adds in
// another order on CUDA: each backend is within gamma(rows) * sum_i |dy[i][j]| (plus
// |dbias[j]|) of the exact sum, so the two are within twice that of each other; and the GPU
// sums in a fixed order, so a second run gives the same bits.
TEST(BiasCuda, MatchesTheCpuAndRepeatsItsBits) {
  const Device device = Device::cuda();
  BIGBATCH_SKIP_WITHOUT_DEVICE(device);
  const Shape shape = {1027, 1021};
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Tensor y = testing::random_tensor(shape, dtype, device, 8);
    const Tensor y_cpu = y.to(Device::cpu());
    const Tensor bias = testing::random_tensor({shape[1]}, DType::f32, device, 9);
    add_bias(y, bias);
    add_bias(y_cpu, bias.to(Device::cpu()));
    EXPECT_TRUE(testing::bitwise_equal(y, y_cpu)) << dtype_name(dtype);
  }
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Tensor dy = testing::random_tensor(shape, dtype, device, 10);
    const Tensor dbias = testing::random_tensor({shape[1]}, DType::f32, device, 11);
    const Tensor start = dbias.clone(), dbias_cpu = dbias.to(Device::cpu());
    bias_backward(dy, dbias);
    bias_backward(dy.to(Device::cpu()), dbias_cpu);
    const auto g = testing::to_doubles(dy), initial = testing::to_doubles(start);
    std::vector<double> bound(initial.size());
    for (std::size_t j = 0; j < bound.size(); ++j) {
      double magnitude = std::fabs(initial[j]);
      for (std::int64_t i = 0; i < shape[0]; ++i) {
        magnitude += std::fabs(g[static_cast<std::size_t>(i * shape[1]) + j]);
      }
      bound[j] = 2 * testing::gamma(shape[0], DType::f32) * magnitude;
    }
    EXPECT_TRUE(testing::all_close(testing::to_doubles(dbias), testing::to_doubles(dbias_cpu),
                                   [&](std::size_t j) { return bound[j]; }))
        << dtype_name(dtype);
    const Tensor again = start.clone();
    bias_backward(dy, again);
    EXPECT_TRUE(testing::bitwise_equal(again, dbias)) << "two runs, two results";
  }
}

TEST_P(Bias, RejectsBadArguments) {
  const Tensor y({4, 3}, DType::f32, device()), bias({3}, DType::f32, device());
  EXPECT_THROW(add_bias(y, Tensor({4}, DType::f32, device())), std::invalid_argument);
  EXPECT_THROW(add_bias(y, Tensor({3}, DType::f16, device())), std::invalid_argument);
  EXPECT_THROW(add_bias(Tensor({12}, DType::f32, device()), bias), std::invalid_argument);
  EXPECT_THROW(add_bias(Tensor({4, 3}, DType::i32, device()), bias), std::invalid_argument);
  EXPECT_THROW(bias_backward(Tensor({4, 3}, DType::i32, device()), bias), std::invalid_argument);
  EXPECT_THROW(bias_backward(Tensor({4, 3}, DType::f16, device()), Tensor({3}, DType::f16, device())),
               std::invalid_argument);
  EXPECT_THROW(bias_backward(y, Tensor({4}, DType::f32, device())), std::invalid_argument);
  EXPECT_THROW(bias_backward(y, Tensor({3}, DType::f64, device())), std::invalid_argument);
  if (device().is_cuda()) {
    EXPECT_THROW(add_bias(y, Tensor({3}, DType::f32)), std::invalid_argument);
    EXPECT_THROW(bias_backward(y, Tensor({3}, DType::f32)), std::invalid_argument);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Bias, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

// bias_backward is the gradient of add_bias: with L(b) = sum_ij w_ij (y_ij + b_j),
// dL/db_j = sum_i w_ij = bias_backward(w). L is linear in b, so central differences
// have no truncation error, whatever h; what is left is the rounding of the two sums L,
// each within gamma(rows * cols) * sum |w (y + b)| (Higham (4.4)), over 2h.
TEST(BiasGradients, BackwardIsTheDerivativeOfForward) {
  const std::int64_t rows = 37, cols = 19;
  const double h = 0.5;
  const Tensor y = testing::random_tensor({rows, cols}, DType::f64, Device::cpu(), 12);
  const Tensor w = testing::random_tensor({rows, cols}, DType::f64, Device::cpu(), 13);
  std::vector<double> b = testing::random_values(cols, 14);
  const auto weights = testing::to_doubles(w);
  double magnitude = 0;  // bounds sum |w (y + b)| at b and at b +- h
  const auto loss = [&] {
    const Tensor out = y.clone();
    add_bias(out, testing::make_tensor(b, {cols}, DType::f64, Device::cpu()));
    const auto values = testing::to_doubles(out);
    double sum = 0, sum_of_magnitudes = 0;
    for (std::size_t k = 0; k < values.size(); ++k) {
      sum += weights[k] * values[k];
      sum_of_magnitudes += std::fabs(weights[k] * values[k]);
    }
    magnitude = std::max(magnitude, sum_of_magnitudes);
    return sum;
  };
  Tensor dbias = Tensor::zeros({cols}, DType::f64);
  bias_backward(w, dbias);
  const auto gradient = testing::to_doubles(dbias);
  for (std::int64_t j = 0; j < cols; ++j) {
    const double numeric = testing::central_difference(loss, b[static_cast<std::size_t>(j)], h);
    const double tolerance = 2 * testing::gamma(rows * cols, DType::f64) * magnitude / (2 * h);
    EXPECT_NEAR(gradient[static_cast<std::size_t>(j)], numeric, tolerance) << "j = " << j;
  }
}

TEST(BiasSimd, EveryLevelGivesTheBaselineBits) {
  const Shape shape = {301, 1025};
  for (const DType dtype : {DType::f32, DType::f16}) {
    const Tensor y = testing::random_tensor(shape, dtype, Device::cpu(), 15);
    const Tensor bias = testing::random_tensor({shape[1]}, DType::f32, Device::cpu(), 16);
    const Tensor dy = testing::random_tensor(shape, DType::f32, Device::cpu(), 17);
    SCOPED_TRACE(dtype_name(dtype));
    testing::expect_every_simd_level_agrees([&] {
      const Tensor out = y.clone();
      add_bias(out, bias);
      Tensor dbias = Tensor::zeros({shape[1]}, DType::f32);
      bias_backward(dy, dbias);
      return std::vector<Tensor>{out, dbias};
    });
  }
}

}  // namespace
}  // namespace bigbatch

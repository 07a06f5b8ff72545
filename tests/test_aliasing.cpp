// BatchNorm's backward under memory sharing (layernorm.hpp states the rules; LayerNorm's
// own cases are in test_layernorm.cpp): dx may be dy or x itself, with the gradients of a
// separate dx bit for bit, and any other sharing is refused with a message naming both.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/batchnorm.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

class BatchNormAliasing : public DeviceTest {};

/// dx written over dy, and over x, against a separate dx: every reduction over the batch
/// must be finished before dx is written, or dweight, dbias and dx itself would read
/// overwritten values.
void expect_in_place_backward_matches(std::int64_t M, std::int64_t N, DType dtype,
                                      std::uint64_t seed, Device device) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " [" << M << ", " << N << "] on "
                                    << device.name());
  const auto x_values = testing::random_values(M * N, seed, -2, 2);
  const auto dy_values = testing::random_values(M * N, seed + 1, -1, 1);
  const auto w_values = testing::random_values(N, seed + 2, 0.5, 1.5);
  const auto dweight0 = testing::random_values(N, seed + 3, -1, 1);
  const auto dbias0 = testing::random_values(N, seed + 4, -1, 1);
  const auto make_x = [&] { return testing::make_tensor(x_values, {M, N}, dtype, device); };
  const auto make_dy = [&] { return testing::make_tensor(dy_values, {M, N}, dtype, device); };
  const Tensor w = testing::make_tensor(w_values, {N}, DType::f32, device);

  // The batch statistics as the training forward saves them.
  const Tensor mean({N}, DType::f32, device), rstd({N}, DType::f32, device);
  const Tensor y({M, N}, dtype, device);
  batchnorm_forward_train(make_x(), w, Tensor::zeros({N}, DType::f32, device), y, mean, rstd,
                          Tensor::zeros({N}, DType::f32, device),
                          Tensor::zeros({N}, DType::f32, device));

  struct Gradients {
    Tensor dweight, dbias;
  };
  const auto make_gradients = [&] {
    return Gradients{testing::make_tensor(dweight0, {N}, DType::f32, device),
                     testing::make_tensor(dbias0, {N}, DType::f32, device)};
  };
  const Tensor dx({M, N}, dtype, device);
  testing::poison(dx);
  const Gradients apart = make_gradients();
  batchnorm_backward(make_x(), w, mean, rstd, make_dy(), dx, apart.dweight, apart.dbias);

  const Tensor dy_in_place = make_dy();
  const Gradients over_dy = make_gradients();
  batchnorm_backward(make_x(), w, mean, rstd, dy_in_place, dy_in_place, over_dy.dweight,
                     over_dy.dbias);
  EXPECT_TRUE(testing::bitwise_equal(dy_in_place, dx)) << "dx written over dy";
  EXPECT_TRUE(testing::bitwise_equal(over_dy.dweight, apart.dweight)) << "dx written over dy";
  EXPECT_TRUE(testing::bitwise_equal(over_dy.dbias, apart.dbias)) << "dx written over dy";

  const Tensor x_in_place = make_x();
  const Gradients over_x = make_gradients();
  batchnorm_backward(x_in_place, w, mean, rstd, make_dy(), x_in_place, over_x.dweight,
                     over_x.dbias);
  EXPECT_TRUE(testing::bitwise_equal(x_in_place, dx)) << "dx written over x";
  EXPECT_TRUE(testing::bitwise_equal(over_x.dweight, apart.dweight)) << "dx written over x";
  EXPECT_TRUE(testing::bitwise_equal(over_x.dbias, apart.dbias)) << "dx written over x";
}

TEST_P(BatchNormAliasing, BackwardInPlaceOverDyOrXGivesTheSameGradients) {
  for (const DType dtype : {DType::f32, DType::f16}) {
    expect_in_place_backward_matches(37, 19, dtype, 40, device());
    // 300 x 129: several parallel chunks of rows and of features on the CPU.
    expect_in_place_backward_matches(300, 129, dtype, 50, device());
  }
}

TEST_P(BatchNormAliasing, BackwardRefusesMemorySharedOtherwise) {
  const std::int64_t M = 4, N = 8;
  const auto zeros = [&](Shape shape) { return Tensor::zeros(shape, DType::f32, device()); };
  const Tensor x = zeros({M, N}), dy = zeros({M, N}), dx = zeros({M, N});
  const Tensor w = zeros({N}), mean = zeros({N}), rstd = zeros({N});
  const Tensor dweight = zeros({N}), dbias = zeros({N});
  // dx one row past dy (or x) in the same buffer: row i of dx is row i + 1 of dy.
  const Tensor shared = zeros({M + 1, N});
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] {
        batchnorm_backward(x, w, mean, rstd, shared.rows(0, M), shared.rows(1, M + 1), dweight,
                           dbias);
      }),
      {"batchnorm_backward", "dx", "shares memory with dy"}));
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] {
        batchnorm_backward(shared.rows(1, M + 1), w, mean, rstd, dy, shared.rows(0, M), dweight,
                           dbias);
      }),
      {"batchnorm_backward", "dx", "shares memory with x"}));
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] { batchnorm_backward(x, w, mean, rstd, dy, dx, dbias, dbias); }),
      {"batchnorm_backward", "dweight", "shares memory with dbias"}));
  EXPECT_TRUE(testing::mentions(testing::error_of([&] {
                                  batchnorm_backward(x, w, mean, rstd, dy, dx, dweight,
                                                     dy.reshaped({M * N}).rows(N, 2 * N));
                                }),
                                {"batchnorm_backward", "dbias", "shares memory with dy"}));
  EXPECT_TRUE(testing::mentions(
      testing::error_of([&] {
        batchnorm_backward(x, dx.reshaped({M * N}).rows(0, N), mean, rstd, dy, dx, dweight,
                           dbias);
      }),
      {"batchnorm_backward", "dx", "shares memory with weight"}));
  EXPECT_NO_THROW(batchnorm_backward(x, w, mean, rstd, x, dx, dweight, dbias));
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchNormAliasing, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace bigbatch

// test_half_paths.cpp: every op's 16-bit path (f16 and bf16) is its f32 path in disguise.
//
// The kernels compute in float whatever the element type: a 16-bit input is widened to
// float exactly (every f16 and bf16 value is a float), the float arithmetic is the f32
// path's, and a 16-bit output is rounded once, on store. So, for each op and each 16-bit
// dtype W, exactly and on both backends:
//
//   op(inputs in W)  ==  round_W(op(the same values as f32))    (16-bit outputs)
//   op(inputs in W)  ==  op(the same values as f32)             (f32 outputs: statistics,
//                                                                parameter gradients, loss)
//
// This is an oracle with no tolerance: the f32 paths are checked against float64 oracles in
// each op's own test, and this file carries those checks over to f16 and bf16 bit for bit.
// The GEMM (whose cuBLAS order differs between dtypes) is tested in test_gemm.cpp; ops whose
// 16-bit path rounds between steps (activation_dropout_backward rounds as the separate calls
// do) are not of this form and are left to their own tests.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/bias.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/dropout.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/optimizer.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using testing::DeviceTest;

const DType kHalfTypes[] = {DType::f16, DType::bf16};

/// The values of `t` (a 16-bit tensor) as an f32 tensor on the same device: exact.
Tensor widened(const Tensor& t) {
  Tensor out(t.shape(), DType::f32, t.device());
  cast(t, out);
  return out;
}

/// `t` (f32) rounded to `dtype` by the cast kernel, which rounds as every store does.
Tensor rounded(const Tensor& t, DType dtype) {
  Tensor out(t.shape(), dtype, t.device());
  cast(t, out);
  return out;
}

/// A 16-bit output against the f32 path's output rounded once.
::testing::AssertionResult is_rounded_f32(const Tensor& half_out, const Tensor& f32_out) {
  return testing::bitwise_equal(half_out, rounded(f32_out, half_out.dtype()));
}

class HalfPaths : public DeviceTest {
 protected:
  /// Values across several binades, rounded to `dtype` (f32 for the reference's copy).
  Tensor input(Shape shape, DType dtype, std::uint64_t seed, double lo = -3, double hi = 3) {
    return testing::random_tensor(std::move(shape), dtype, device(), seed, lo, hi);
  }
  /// An output tensor of `dtype`, poisoned so that an element left unwritten shows.
  Tensor output(Shape shape, DType dtype) {
    Tensor t(std::move(shape), dtype, device());
    testing::poison(t);
    return t;
  }
};

TEST_P(HalfPaths, ScaleAndAxpy) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const Tensor x = input({1000}, w, 1), y = input({1000}, w, 2);
    const Tensor x32 = widened(x), y32 = widened(y);
    scale(x, 0.37f);
    scale(x32, 0.37f);
    EXPECT_TRUE(is_rounded_f32(x, x32));
    axpy(-1.25f, x, y);  // a 16-bit y: the residual stream
    axpy(-1.25f, widened(x), y32);
    EXPECT_TRUE(is_rounded_f32(y, y32));
    const Tensor acc = input({1000}, DType::f32, 3), acc_ref = acc.clone();
    axpy(0.5f, x, acc);  // an f32 y, a 16-bit x
    axpy(0.5f, widened(x), acc_ref);
    EXPECT_TRUE(testing::bitwise_equal(acc, acc_ref));
  }
}

TEST_P(HalfPaths, Activations) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const Tensor x = input({33, 65}, w, 4, -6, 6), dy = input({33, 65}, w, 5);
    const Tensor x32 = widened(x), dy32 = widened(dy);
    using Forward = void (*)(const Tensor&, const Tensor&);
    using Backward = void (*)(const Tensor&, const Tensor&, const Tensor&);
    for (const auto& [name, forward, backward] :
         {std::tuple<const char*, Forward, Backward>{"gelu", &gelu_forward, &gelu_backward},
          {"relu", &relu_forward, &relu_backward}}) {
      SCOPED_TRACE(name);
      const Tensor y = output(x.shape(), w), y32 = output(x.shape(), DType::f32);
      forward(x, y);
      forward(x32, y32);
      EXPECT_TRUE(is_rounded_f32(y, y32));
      const Tensor dx = output(x.shape(), w), dx32 = output(x.shape(), DType::f32);
      backward(x, dy, dx);
      backward(x32, dy32, dx32);
      EXPECT_TRUE(is_rounded_f32(dx, dx32));
    }
  }
}

TEST_P(HalfPaths, Dropout) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const DropoutSpec spec{0.3f, 17, 2, 40};
    const Tensor x = input({20, 50}, w, 6);
    const Tensor y = output(x.shape(), w), y32 = output(x.shape(), DType::f32);
    dropout_forward(x, y, spec);
    dropout_forward(widened(x), y32, spec);
    EXPECT_TRUE(is_rounded_f32(y, y32));
    const Tensor dx = output(x.shape(), w), dx32 = output(x.shape(), DType::f32);
    dropout_backward(x, dx, spec);
    dropout_backward(widened(x), dx32, spec);
    EXPECT_TRUE(is_rounded_f32(dx, dx32));
  }
}

TEST_P(HalfPaths, BiasForwardAndBackward) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const Tensor y = input({70, 45}, w, 7), bias = input({45}, DType::f32, 8);
    const Tensor y32 = widened(y);
    add_bias(y, bias);
    add_bias(y32, bias);
    EXPECT_TRUE(is_rounded_f32(y, y32));
    // The bias gradient is f32 in every precision: the f32 path's bits exactly.
    const Tensor dbias = input({45}, DType::f32, 9), dbias32 = dbias.clone();
    bias_backward(y, dbias);
    bias_backward(widened(y), dbias32);
    EXPECT_TRUE(testing::bitwise_equal(dbias, dbias32));
  }
}

TEST_P(HalfPaths, LayerNorm) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const std::int64_t rows = 37, features = 96;
    const Tensor x = input({rows, features}, w, 10), dy = input({rows, features}, w, 11);
    const Tensor weight = input({features}, DType::f32, 12), bias = input({features}, DType::f32, 13);
    const Tensor x32 = widened(x), dy32 = widened(dy);
    const Tensor y = output({rows, features}, w), y32 = output({rows, features}, DType::f32);
    const Tensor mean = output({rows}, DType::f32), rstd = output({rows}, DType::f32);
    const Tensor mean32 = output({rows}, DType::f32), rstd32 = output({rows}, DType::f32);
    layernorm_forward(x, weight, bias, y, mean, rstd);
    layernorm_forward(x32, weight, bias, y32, mean32, rstd32);
    EXPECT_TRUE(is_rounded_f32(y, y32));
    EXPECT_TRUE(testing::bitwise_equal(mean, mean32));
    EXPECT_TRUE(testing::bitwise_equal(rstd, rstd32));
    const Tensor dx = output({rows, features}, w), dx32 = output({rows, features}, DType::f32);
    const Tensor dweight = input({features}, DType::f32, 14), dbias = input({features}, DType::f32, 15);
    const Tensor dweight32 = dweight.clone(), dbias32 = dbias.clone();
    layernorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
    layernorm_backward(x32, weight, mean32, rstd32, dy32, dx32, dweight32, dbias32);
    EXPECT_TRUE(is_rounded_f32(dx, dx32));
    EXPECT_TRUE(testing::bitwise_equal(dweight, dweight32));
    EXPECT_TRUE(testing::bitwise_equal(dbias, dbias32));
  }
}

TEST_P(HalfPaths, BatchNorm) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const std::int64_t rows = 41, features = 30;
    const Tensor x = input({rows, features}, w, 16), dy = input({rows, features}, w, 17);
    const Tensor weight = input({features}, DType::f32, 18), bias = input({features}, DType::f32, 19);
    const Tensor x32 = widened(x), dy32 = widened(dy);
    const Tensor running_mean = input({features}, DType::f32, 20);
    const Tensor running_var = input({features}, DType::f32, 21, 0.5, 2);
    const Tensor running_mean32 = running_mean.clone(), running_var32 = running_var.clone();
    const Tensor y = output({rows, features}, w), y32 = output({rows, features}, DType::f32);
    const Tensor mean = output({features}, DType::f32), rstd = output({features}, DType::f32);
    const Tensor mean32 = output({features}, DType::f32), rstd32 = output({features}, DType::f32);
    batchnorm_forward_train(x, weight, bias, y, mean, rstd, running_mean, running_var);
    batchnorm_forward_train(x32, weight, bias, y32, mean32, rstd32, running_mean32, running_var32);
    EXPECT_TRUE(is_rounded_f32(y, y32));
    EXPECT_TRUE(testing::bitwise_equal(mean, mean32));
    EXPECT_TRUE(testing::bitwise_equal(rstd, rstd32));
    EXPECT_TRUE(testing::bitwise_equal(running_mean, running_mean32));
    EXPECT_TRUE(testing::bitwise_equal(running_var, running_var32));
    const Tensor eval = output({rows, features}, w), eval32 = output({rows, features}, DType::f32);
    batchnorm_forward_eval(x, weight, bias, running_mean, running_var, eval);
    batchnorm_forward_eval(x32, weight, bias, running_mean32, running_var32, eval32);
    EXPECT_TRUE(is_rounded_f32(eval, eval32));
    const Tensor dx = output({rows, features}, w), dx32 = output({rows, features}, DType::f32);
    const Tensor dweight = Tensor::zeros({features}, DType::f32, device());
    const Tensor dbias = Tensor::zeros({features}, DType::f32, device());
    const Tensor dweight32 = dweight.clone(), dbias32 = dbias.clone();
    batchnorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
    batchnorm_backward(x32, weight, mean32, rstd32, dy32, dx32, dweight32, dbias32);
    EXPECT_TRUE(is_rounded_f32(dx, dx32));
    EXPECT_TRUE(testing::bitwise_equal(dweight, dweight32));
    EXPECT_TRUE(testing::bitwise_equal(dbias, dbias32));
  }
}

TEST_P(HalfPaths, CrossEntropy) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const std::int64_t rows = 50, classes = 11;
    const Tensor logits = input({rows, classes}, w, 22, -8, 8);
    const Tensor logits32 = widened(logits);
    std::vector<std::int32_t> label_values(rows);
    for (std::int64_t i = 0; i < rows; ++i) label_values[i] = static_cast<std::int32_t>(i % classes);
    const Tensor labels = Tensor::from_vector(label_values, {rows}).to(device());
    const Tensor loss = Tensor::zeros({1}, DType::f32, device()), loss32 = loss.clone();
    cross_entropy_forward(logits, labels, loss, 64.0f, 8.0f);
    cross_entropy_forward(logits32, labels, loss32, 64.0f, 8.0f);
    EXPECT_TRUE(testing::bitwise_equal(loss, loss32));
    const Tensor dlogits = output({rows, classes}, DType::f32);
    const Tensor dlogits32 = output({rows, classes}, DType::f32);
    cross_entropy_backward(logits, labels, dlogits, 64.0f, 8.0f);
    cross_entropy_backward(logits32, labels, dlogits32, 64.0f, 8.0f);
    EXPECT_TRUE(testing::bitwise_equal(dlogits, dlogits32));
    EXPECT_EQ(count_correct(logits, labels), count_correct(logits32, labels));
  }
}

// The optimizer's working copy is the updated f32 master rounded once, in either type; the
// master and the optimizer state do not depend on whether a copy is written.
TEST_P(HalfPaths, OptimizerWritesTheWorkingCopyAsTheRoundedMaster) {
  for (const DType w : kHalfTypes) {
    SCOPED_TRACE(dtype_name(w));
    const std::int64_t n = 3000;
    const Tensor grad = input({n}, DType::f32, 23);
    for (const bool adamw : {false, true}) {
      const Tensor param = input({n}, DType::f32, 24), param_alone = param.clone();
      const Tensor state_a = Tensor::zeros({n}, DType::f32, device());
      const Tensor state_b = Tensor::zeros({n}, DType::f32, device());
      const Tensor state_a_alone = state_a.clone(), state_b_alone = state_b.clone();
      const Tensor copy = output({n}, w);
      for (std::int64_t step = 1; step <= 3; ++step) {
        if (adamw) {
          adamw_step(param, grad, state_a, state_b, AdamWOptions{}, step, copy);
          adamw_step(param_alone, grad, state_a_alone, state_b_alone, AdamWOptions{}, step);
        } else {
          const SgdOptions sgd{.lr = 0.1f, .momentum = 0.9f};
          sgd_step(param, grad, state_a, sgd, step, copy);
          sgd_step(param_alone, grad, state_a_alone, sgd, step);
        }
      }
      EXPECT_TRUE(testing::bitwise_equal(param, param_alone)) << (adamw ? "adamw" : "sgd");
      EXPECT_TRUE(testing::bitwise_equal(state_a, state_a_alone)) << (adamw ? "adamw" : "sgd");
      EXPECT_TRUE(is_rounded_f32(copy, param)) << (adamw ? "adamw" : "sgd");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, HalfPaths, ::testing::ValuesIn(testing::all_devices()),
                         testing::device_test_name);

}  // namespace
}  // namespace bigbatch

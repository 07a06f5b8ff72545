// Chapter 00: the foundations every later chapter relies on, shown and checked.
// See README.md in this folder for the story; run with --quick for the CTest setting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/format.hpp"
#include "common/half.hpp"
#include "common/memory.hpp"
#include "common/report.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "kernels/dropout.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"
#include "kernels/gemm.hpp"

namespace bb = bigbatch;
using bb::DType;
using bb::MemoryCategory;
using bb::Tensor;

namespace {

/// Number of elements whose bits differ between two f32 tensors of one shape.
std::int64_t count_bit_differences(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return differ;
}

/// max over elements of |a - b| / max |b| (0 when b is all zero).
double max_relative_difference(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(double{x[i]} - y[i]));
    scale = std::max(scale, std::abs(double{y[i]}));
  }
  return scale > 0 ? diff / scale : 0;
}

/// Whether C = C0 + op(A) op(B) holds for every element within the rounding bound of its
/// K-term sum: |c - exact| <= gamma(K + 1) (|c0| + sum_k |a_ik b_kj|), gamma(n) =
/// n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms,
/// ch. 3). The exact value is formed in double (53 bits: its own error is negligible
/// beside fp32's). An independent check: a product that writes nothing, skips C0 or
/// transposes wrongly fails it.
bool matches_float64_product(const Tensor& c, const Tensor& c0, const Tensor& a, bool trans_a,
                             const Tensor& b, bool trans_b) {
  const auto cv = c.to_vector<float>(), c0v = c0.to_vector<float>();
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  const std::int64_t m = c.dim(0), n = c.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  const double u = 0x1p-24, gamma = (k + 1) * u / (1 - (k + 1) * u);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double exact = c0v[i * n + j], magnitude = std::abs(exact);
      for (std::int64_t l = 0; l < k; ++l) {
        const double term = double{av[trans_a ? l * m + i : i * k + l]} *
                            bv[trans_b ? j * k + l : l * n + j];
        exact += term;
        magnitude += std::abs(term);
      }
      if (!(std::abs(cv[i * n + j] - exact) <= gamma * magnitude)) return false;
    }
  }
  return true;
}

std::string relative(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2g", value);
  return text;
}

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                     MemoryCategory category) {
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 2 * bb::random_uniform(seed, 0, i) - 1;
  return Tensor::from_vector(values, {rows, cols}, bb::Device::cpu(), category);
}

void memory_is_counted(bb::SelfCheck& report) {
  report.section("1. Memory is counted, not guessed");
  bb::TrackingAllocator& cpu = bb::allocator_for(bb::Device::cpu());
  const std::size_t before = cpu.stats().live_of(MemoryCategory::parameters);
  // A 784-256-10 MLP: two weight matrices and two bias vectors, in fp32.
  const Tensor w1({256, 784}, DType::f32, bb::Device::cpu(), MemoryCategory::parameters);
  const Tensor b1({256}, DType::f32, bb::Device::cpu(), MemoryCategory::parameters);
  const Tensor w2({10, 256}, DType::f32, bb::Device::cpu(), MemoryCategory::parameters);
  const Tensor b2({10}, DType::f32, bb::Device::cpu(), MemoryCategory::parameters);
  const std::size_t predicted = (256 * 784 + 256 + 10 * 256 + 10) * sizeof(float);
  const std::size_t measured = cpu.stats().live_of(MemoryCategory::parameters) - before;
  report.note("predicted by hand: (256*784 + 256 + 10*256 + 10) * 4 = " + std::to_string(predicted) + " bytes");
  report.note("counted by the allocator:                          " + std::to_string(measured) + " bytes");
  report.check(measured == predicted, "the allocator's count equals the prediction, to the byte");

  // Now pretend the device is small: the parameters fit, a batch of activations does not.
  const std::size_t cap = cpu.stats().live_total + (std::size_t{1} << 20);
  bb::ScopedMemoryCap small_device(bb::Device::cpu(), cap);
  std::string message;
  try {
    const Tensor activations({4096, 256}, DType::f32, bb::Device::cpu(), MemoryCategory::activations);
  } catch (const bb::OutOfMemoryError& error) {
    message = error.what();
  }
  report.note("capping the device 1 MiB above what is live, then asking for 4096 x 256 activations:");
  report.note("  " + message);
  report.check(message.find("activations") != std::string::npos &&
                   message.find("parameters") != std::string::npos,
               "the request fails with an error naming the request and what was live");
}

void fp16_is_real(bb::SelfCheck& report) {
  report.section("2. fp16 is IEEE binary16, on the CPU as on a GPU");
  const std::vector<float> inputs = {1e-8f, 6e-8f, 1e-5f, 1.0f + 0x1p-11f, 65504.0f, 70000.0f};
  const Tensor wide = Tensor::from_vector(inputs, {6});
  const Tensor narrow({6}, DType::f16);
  bb::cast(wide, narrow);
  const auto halves = narrow.to_vector<bb::f16>();
  const char* meaning[] = {"underflows to zero (below half the smallest subnormal, 2^-25)",
                           "becomes the subnormal 2^-24 = 5.96e-8",
                           "is below 2^-14, a subnormal: 8 significant bits survive",
                           "is a tie and rounds to even: 1",
                           "is the largest finite half",
                           "overflows to infinity"};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    char line[160];
    std::snprintf(line, sizeof line, "%-12.6g -> %-12.6g %s", inputs[i],
                  static_cast<double>(halves[i]), meaning[i]);
    report.note(line);
  }
  report.check(halves[0] == 0 && static_cast<double>(halves[1]) == 0x1p-24 &&
                   static_cast<float>(halves[3]) == 1.0f && static_cast<float>(halves[4]) == 65504.0f &&
                   std::isinf(static_cast<float>(halves[5])),
               "underflow, subnormals, ties-to-even and overflow behave as IEEE binary16");
}

void gemm_is_batch_invariant(bb::SelfCheck& report, bool quick) {
  report.section("3. The CPU matrix product is batch-invariant");
  const std::int64_t batch = quick ? 256 : 1024, in = 784, out = 256;
  const Tensor x = random_matrix(batch, in, 1, MemoryCategory::data);
  const Tensor w = random_matrix(out, in, 2, MemoryCategory::parameters);
  // Forward: Y = X W^T for the whole batch, then 7 rows at a time. Outputs start as NaN:
  // a product that wrote nothing would leave them so (beta = 0 ignores what is there).
  const float nan = std::nanf("");
  const Tensor y_batch({batch, out}, DType::f32), y_micro({batch, out}, DType::f32);
  bb::fill(y_batch, nan);
  bb::fill(y_micro, nan);
  bb::gemm(x, false, w, true, y_batch);
  for (std::int64_t row = 0; row < batch; row += 7) {
    const std::int64_t end = std::min(batch, row + 7);
    bb::gemm(x.rows(row, end), false, w, true, y_micro.rows(row, end));
  }
  const Tensor zero = Tensor::zeros({batch, out}, DType::f32);
  report.check(matches_float64_product(y_batch, zero, x, false, w, true),
               "Y = X W^T is the product, within fp32's rounding bound of a float64 oracle");
  report.check(count_bit_differences(y_batch, y_micro) == 0,
               "Y = X W^T: " + std::to_string(batch) + " rows at once equal the same rows 7 at a time, bit for bit");

  // Backward: dW += dY^T X over samples, whole batch vs chained micro-batches. Both start
  // from the same random "earlier gradient" G0, so beta = 1 must continue it.
  const std::int64_t samples = 1000;
  const Tensor dy = random_matrix(samples, out, 3, MemoryCategory::activations);
  const Tensor xs = random_matrix(samples, in, 4, MemoryCategory::data);
  const Tensor g0 = random_matrix(out, in, 6, MemoryCategory::gradients);
  const Tensor dw_batch = g0.clone(), dw_chained = g0.clone(), dw_naive = g0.clone();
  bb::gemm(dy, true, xs, false, dw_batch, 1.0f, 1.0f);
  const Tensor partial({out, in}, DType::f32);
  for (std::int64_t row = 0; row < samples; row += 64) {
    const std::int64_t end = std::min(samples, row + 64);
    // Memory-free accumulation: the product continues the sum already in dW (beta = 1).
    bb::gemm(dy.rows(row, end), true, xs.rows(row, end), false, dw_chained, 1.0f, 1.0f);
    // Naive accumulation: a separate partial gradient (poisoned first), added afterwards.
    bb::fill(partial, nan);
    bb::gemm(dy.rows(row, end), true, xs.rows(row, end), false, partial);
    bb::axpy(1.0f, partial, dw_naive);
  }
  report.check(matches_float64_product(dw_batch, g0, dy, true, xs, false),
               "dW = G0 + dY^T X is the product, within fp32's rounding bound of a float64 oracle");
  report.check(count_bit_differences(dw_batch, dw_chained) == 0,
               "dW over 1000 samples equals 15 x 64 + 40 chained with beta = 1, bit for bit");
  const std::int64_t naive_differ = count_bit_differences(dw_batch, dw_naive);
  report.note("the naive way (sum each micro-batch apart, then add) differs in " +
              std::to_string(naive_differ) + " of " + std::to_string(out * in) +
              " elements, by at most " + relative(max_relative_difference(dw_naive, dw_batch)) +
              " of the largest element: same math, another summation order (rounding)");
  report.check(matches_float64_product(dw_naive, g0, dy, true, xs, false),
               "the naive sum is within the same rounding bound of the float64 oracle");
}

void dropout_follows_the_sample(bb::SelfCheck& report) {
  report.section("4. Dropout masks follow the sample, not the call");
  const std::int64_t batch = 128, width = 64;
  const Tensor x = random_matrix(batch, width, 5, MemoryCategory::activations);
  const Tensor y_batch({batch, width}, DType::f32);
  bb::dropout_forward(x, y_batch, {0.25f, 42, 0, 0});
  const Tensor y_micro({batch, width}, DType::f32);
  for (std::int64_t row = 0; row < batch; row += 32) {
    bb::dropout_forward(x.rows(row, row + 32), y_micro.rows(row, row + 32), {0.25f, 42, 0, row});
  }
  report.check(count_bit_differences(y_batch, y_micro) == 0,
               "4 micro-batches of 32 drop exactly the units one batch of 128 drops");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (argc > 1 && !quick) {
    std::printf("usage: %s [--quick]\n  Shows and checks the foundations (see chapters/00_foundations/README.md).\n", argv[0]);
    return std::string(argv[1]) == "--help" ? 0 : 2;
  }
  std::printf("Chapter 00: the foundations\n");
  bb::SelfCheck report("chapter 00");
  memory_is_counted(report);
  fp16_is_real(report);
  gemm_is_batch_invariant(report, quick);
  dropout_follows_the_sample(report);
  return report.finish();
}

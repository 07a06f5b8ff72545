// Chapter 00: the foundations every later chapter relies on, shown and checked.
// See README.md in this folder for the story; run with --quick for the CTest setting.
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
  // Forward: Y = X W^T for the whole batch, then 7 rows at a time.
  const Tensor y_batch({batch, out}, DType::f32);
  bb::gemm(x, false, w, true, y_batch);
  const Tensor y_micro({batch, out}, DType::f32);
  for (std::int64_t row = 0; row < batch; row += 7) {
    const std::int64_t end = std::min(batch, row + 7);
    bb::gemm(x.rows(row, end), false, w, true, y_micro.rows(row, end));
  }
  report.check(count_bit_differences(y_batch, y_micro) == 0,
               "Y = X W^T: " + std::to_string(batch) + " rows at once equal the same rows 7 at a time, bit for bit");

  // Backward: dW = dY^T X summed over samples, whole batch vs chained micro-batches.
  const std::int64_t samples = 1000;
  const Tensor dy = random_matrix(samples, out, 3, MemoryCategory::activations);
  const Tensor xs = random_matrix(samples, in, 4, MemoryCategory::data);
  const Tensor dw_batch = Tensor::zeros({out, in}, DType::f32);
  bb::gemm(dy, true, xs, false, dw_batch, 1.0f, 1.0f);
  const Tensor dw_chained = Tensor::zeros({out, in}, DType::f32);
  const Tensor dw_naive = Tensor::zeros({out, in}, DType::f32);
  const Tensor partial({out, in}, DType::f32);
  for (std::int64_t row = 0; row < samples; row += 64) {
    const std::int64_t end = std::min(samples, row + 64);
    // Memory-free accumulation: the product continues the sum already in dW (beta = 1).
    bb::gemm(dy.rows(row, end), true, xs.rows(row, end), false, dw_chained, 1.0f, 1.0f);
    // Naive accumulation: a separate partial gradient, added afterwards.
    bb::gemm(dy.rows(row, end), true, xs.rows(row, end), false, partial);
    bb::axpy(1.0f, partial, dw_naive);
  }
  report.check(count_bit_differences(dw_batch, dw_chained) == 0,
               "dW over 1000 samples equals 15 x 64 + 40 chained with beta = 1, bit for bit");
  const std::int64_t naive_differ = count_bit_differences(dw_batch, dw_naive);
  report.note("the naive way (sum each micro-batch apart, then add) differs in " +
              std::to_string(naive_differ) + " of " + std::to_string(out * in) +
              " elements: same math, another summation order");
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

// bench_gemm: our GEMM (CPU fp32 and fp16, CUDA) and OpenBLAS sgemm as the CPU peer,
// square sizes, the same thread count for both CPU libraries.
//
// Counters: FLOP/s (2*M*N*K per call, as a rate), bytes (A, B and C once per call) and
// bytes_per_second, all per wall-clock second (the CPU work runs on several threads).
// The label names the CPU path (or OpenBLAS's kernel) and the thread count.
// OpenBLAS picks its kernel when it loads, and on some virtual machines picks a slow
// fallback; measure it at its best by naming the kernel in the environment for that
// run, e.g. OPENBLAS_CORETYPE=SKYLAKEX on a CPU with AVX-512 (scripts/run-benchmarks.sh
// does this). The context key gemm_openblas_kernel records the kernel it actually used.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_runtime.hpp"
#include "common/half.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/gemm.hpp"

#if BIGBATCH_HAVE_BLAS_PEER
// OpenBLAS's CBLAS entry point and extensions, declared here so that no cblas.h is
// needed (the enum values are CBLAS's).
extern "C" {
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int threads);
char* openblas_get_corename();
}
constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;
#endif

namespace bigbatch {
namespace {

/// A [rows, cols] tensor of values uniform in [-1, 1), rounded to the dtype.
Tensor random_matrix(std::int64_t rows, std::int64_t cols, DType dtype, Device device,
                     std::uint64_t seed) {
  const std::int64_t n = rows * cols;
  if (dtype == DType::f16) {
    std::vector<f16> values(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      values[static_cast<std::size_t>(i)] = static_cast<f16>(2.0f * random_uniform(seed, 0, i) - 1.0f);
    }
    return Tensor::from_vector(values, {rows, cols}, device);
  }
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = 2.0f * random_uniform(seed, 0, i) - 1.0f;
  }
  return Tensor::from_vector(values, {rows, cols}, device);
}

/// FLOP/s and bytes for an n x n x n product reading A and B and writing C once.
void set_counters(benchmark::State& state, std::int64_t n, std::size_t operand_bytes,
                  std::size_t output_bytes) {
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const double bytes = static_cast<double>(n * n) * static_cast<double>(2 * operand_bytes + output_bytes);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes"] = benchmark::Counter(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

// Args: {n, path}; path -1 is the default (fastest supported) CPU path.
constexpr std::int64_t kDefaultPath = -1;

void run_cpu_gemm(benchmark::State& state, DType operands, DType output) {
  const std::int64_t n = state.range(0);
  const std::int64_t path_arg = state.range(1);
  cpu::GemmPath path = cpu::gemm_path();
  if (path_arg != kDefaultPath) {
    path = static_cast<cpu::GemmPath>(path_arg);
    bool supported = false;
    for (const cpu::GemmPath p : cpu::gemm_paths_supported()) supported |= p == path;
    if (!supported) {
      state.SkipWithError("this CPU cannot run that GEMM path");
      return;
    }
  }
  cpu::ScopedGemmPath guard(path);
  const Tensor a = random_matrix(n, n, operands, Device::cpu(), 1);
  const Tensor b = random_matrix(n, n, operands, Device::cpu(), 2);
  const Tensor c({n, n}, output, Device::cpu());
  for (auto _ : state) {
    gemm(a, false, b, false, c);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n, dtype_size(operands), dtype_size(output));
  state.SetLabel(std::string(cpu::gemm_path_name(path)) + ", " +
                 std::to_string(cpu::max_threads()) + " threads");
}

void BM_GemmCpuF32(benchmark::State& state) { run_cpu_gemm(state, DType::f32, DType::f32); }
void BM_GemmCpuF16(benchmark::State& state) { run_cpu_gemm(state, DType::f16, DType::f16); }

BENCHMARK(BM_GemmCpuF32)
    ->ArgNames({"n", "path"})
    ->Args({256, kDefaultPath})
    ->Args({512, kDefaultPath})
    ->Args({1024, kDefaultPath})
    ->Args({2048, kDefaultPath})
    ->Args({1024, static_cast<std::int64_t>(cpu::GemmPath::avx2)})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmCpuF16)
    ->ArgNames({"n", "path"})
    ->Args({256, kDefaultPath})
    ->Args({512, kDefaultPath})
    ->Args({1024, kDefaultPath})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

#if BIGBATCH_HAVE_BLAS_PEER
std::string openblas_kernel() { return openblas_get_corename(); }

// Recorded once in the JSON context: which kernel OpenBLAS chose for this CPU and run.
[[maybe_unused]] const bool kOpenBlasContextAdded = [] {
  benchmark::AddCustomContext("gemm_openblas_kernel", openblas_kernel());
  return true;
}();

void BM_OpenBlasSgemm(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const int threads = cpu::max_threads();
  openblas_set_num_threads(threads);
  const Tensor a = random_matrix(n, n, DType::f32, Device::cpu(), 1);
  const Tensor b = random_matrix(n, n, DType::f32, Device::cpu(), 2);
  const Tensor c({n, n}, DType::f32, Device::cpu());
  const int ni = static_cast<int>(n);
  for (auto _ : state) {
    cblas_sgemm(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, ni, ni, ni, 1.0f, a.data<float>(),
                ni, b.data<float>(), ni, 0.0f, c.data<float>(), ni);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n, sizeof(float), sizeof(float));
  state.SetLabel("OpenBLAS " + openblas_kernel() + ", " + std::to_string(threads) + " threads");
}
BENCHMARK(BM_OpenBlasSgemm)
    ->ArgName("n")
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Arg(2048)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
#endif

// ---- the GEMMs a training step runs ------------------------------------------------------
// A Linear layer of a block (chapter 01's MLP at H 512: fc1 is W [2048, 512], fc2 is
// W [512, 2048]) on a micro-batch of `rows` rows, in each of its step's three products:
//   forward          Y  = X W^T      [rows, out] = [rows, in] [out, in]^T
//   input gradient   dX = dY W       [rows, in]  = [rows, out] [out, in]
//   weight gradient  dW = dY^T X     [out, in]   = [rows, out]^T [rows, in]
// Args: {product (0 forward, 1 input gradient, 2 weight gradient), layer (1 fc1, 2 fc2),
// rows}; ours and OpenBLAS's on the same operands, the same threads.
struct TrainingShape {
  bool trans_a, trans_b;
  std::int64_t m, n, k;          // C [m, n] = op(A) [m, k] op(B) [k, n]
  std::int64_t a_rows, a_cols, b_rows, b_cols;
  std::string name;
};

TrainingShape training_shape(std::int64_t product, std::int64_t layer, std::int64_t rows) {
  const std::int64_t out = layer == 1 ? 2048 : 512, in = layer == 1 ? 512 : 2048;
  const std::string fc = layer == 1 ? "fc1" : "fc2";
  switch (product) {
    case 0: return {false, true, rows, out, in, rows, in, out, in, fc + " forward x W^T"};
    case 1: return {false, false, rows, in, out, rows, out, out, in, fc + " input gradient dY W"};
    default: return {true, false, out, in, rows, rows, out, rows, in, fc + " weight gradient dY^T x"};
  }
}

void set_shape_counters(benchmark::State& state, const TrainingShape& s) {
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) *
                       static_cast<double>(s.k);
  const double bytes = 4.0 * static_cast<double>(s.a_rows * s.a_cols + s.b_rows * s.b_cols + s.m * s.n);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes"] = benchmark::Counter(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

void BM_GemmTrainingShape(benchmark::State& state) {
  const TrainingShape s = training_shape(state.range(0), state.range(1), state.range(2));
  const Tensor a = random_matrix(s.a_rows, s.a_cols, DType::f32, Device::cpu(), 1);
  const Tensor b = random_matrix(s.b_rows, s.b_cols, DType::f32, Device::cpu(), 2);
  const Tensor c({s.m, s.n}, DType::f32, Device::cpu());
  for (auto _ : state) {
    gemm(a, s.trans_a, b, s.trans_b, c);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_shape_counters(state, s);
  state.SetLabel(s.name + ", " + std::string(cpu::gemm_path_name(cpu::gemm_path())) + ", " +
                 std::to_string(cpu::max_threads()) + " threads");
}

void training_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"product", "layer", "rows"});
  for (const std::int64_t rows : {64, 1024}) {
    for (const std::int64_t layer : {1, 2}) {
      for (const std::int64_t product : {0, 1, 2}) b->Args({product, layer, rows});
    }
  }
}
BENCHMARK(BM_GemmTrainingShape)->Apply(training_shapes)->UseRealTime()->Unit(benchmark::kMillisecond);

#if BIGBATCH_HAVE_BLAS_PEER
constexpr int kCblasTrans = 112;

void BM_OpenBlasTrainingShape(benchmark::State& state) {
  const TrainingShape s = training_shape(state.range(0), state.range(1), state.range(2));
  const int threads = cpu::max_threads();
  openblas_set_num_threads(threads);
  const Tensor a = random_matrix(s.a_rows, s.a_cols, DType::f32, Device::cpu(), 1);
  const Tensor b = random_matrix(s.b_rows, s.b_cols, DType::f32, Device::cpu(), 2);
  const Tensor c({s.m, s.n}, DType::f32, Device::cpu());
  for (auto _ : state) {
    cblas_sgemm(kCblasRowMajor, s.trans_a ? kCblasTrans : kCblasNoTrans,
                s.trans_b ? kCblasTrans : kCblasNoTrans, static_cast<int>(s.m),
                static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data<float>(),
                static_cast<int>(s.a_cols), b.data<float>(), static_cast<int>(s.b_cols), 0.0f,
                c.data<float>(), static_cast<int>(s.n));
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_shape_counters(state, s);
  state.SetLabel(s.name + ", OpenBLAS " + openblas_kernel() + ", " + std::to_string(threads) +
                 " threads");
}
BENCHMARK(BM_OpenBlasTrainingShape)
    ->Apply(training_shapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
#endif

// CUDA: registered always, skipped with the reason where no GPU can be used.
void run_cuda_gemm(benchmark::State& state, DType operands, DType output) {
  std::string why_not;
  if (!cuda_rt::available(&why_not)) {
    state.SkipWithError(("no GPU: " + why_not).c_str());
    return;
  }
  const std::int64_t n = state.range(0);
  const Tensor a = random_matrix(n, n, operands, Device::cuda(), 1);
  const Tensor b = random_matrix(n, n, operands, Device::cuda(), 2);
  const Tensor c({n, n}, output, Device::cuda());
  gemm(a, false, b, false, c);  // warm-up: creates the cuBLAS handle
  cuda_rt::synchronize();
  for (auto _ : state) {
    gemm(a, false, b, false, c);
    cuda_rt::synchronize();
  }
  set_counters(state, n, dtype_size(operands), dtype_size(output));
  state.SetLabel(cuda_rt::device_name());
}

void BM_GemmCudaF32(benchmark::State& state) { run_cuda_gemm(state, DType::f32, DType::f32); }
void BM_GemmCudaF16(benchmark::State& state) { run_cuda_gemm(state, DType::f16, DType::f16); }
BENCHMARK(BM_GemmCudaF32)->ArgName("n")->Arg(1024)->Arg(4096)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmCudaF16)->ArgName("n")->Arg(1024)->Arg(4096)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace bigbatch

// bench_norm.cpp: LayerNorm forward and backward at [4096, 1024] f32, and softmax
// cross-entropy forward + backward at [4096, 1000] f32, on the CPU and on CUDA (the CUDA
// cases skip with the reason where no GPU answers).
//
// Counters: bytes_per_second is the op's minimum memory traffic (every input read once,
// every output written once, accumulated outputs read and written) per second of wall time,
// so it compares with the machine's memory bandwidth; "threads" is the CPU thread count.
// The CUDA cases synchronise after every call, so a call's whole latency is timed; the
// cross-entropy calls include the host-side label check (a device-to-host copy of 16 KiB).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_runtime.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "kernels/cpu_parallel.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/fill.hpp"
#include "kernels/layernorm.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kRows = 4096, kFeatures = 1024, kClasses = 1000;

/// Values uniform in [lo, hi) from the counter-based RNG, as f32 on `device`.
Tensor random_f32(Shape shape, Device device, std::uint64_t seed, float lo = -1, float hi = 1) {
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = lo + (hi - lo) * random_uniform(seed, 0, i);
  }
  return Tensor::from_vector(values, std::move(shape), device);
}

/// False (and the benchmark marked skipped, with the reason) when `device` cannot run.
bool usable(benchmark::State& state, Device device) {
  std::string why_not;
  if (device.is_cuda() && !cuda_rt::available(&why_not)) {
    state.SkipWithError(("CUDA benchmark skipped: " + why_not).c_str());
    return false;
  }
  return true;
}

void finish(Device device) {
  if (device.is_cuda()) cuda_rt::synchronize();
}

void report(benchmark::State& state, double bytes_per_iteration) {
  state.counters["bytes_per_second"] = benchmark::Counter(
      bytes_per_iteration * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = cpu::max_threads();
}

void BM_LayerNormForward(benchmark::State& state, Device device) {
  if (!usable(state, device)) return;
  const std::int64_t M = kRows, N = kFeatures;
  const Tensor x = random_f32({M, N}, device, 1);
  const Tensor weight = random_f32({N}, device, 2), bias = random_f32({N}, device, 3);
  const Tensor y({M, N}, DType::f32, device);
  const Tensor mean({M}, DType::f32, device), rstd({M}, DType::f32, device);
  for (auto _ : state) {
    layernorm_forward(x, weight, bias, y, mean, rstd);
    finish(device);
  }
  // read x, weight, bias; write y, mean, rstd
  report(state, 4.0 * (2 * M * N + 2 * N + 2 * M));
}

void BM_LayerNormBackward(benchmark::State& state, Device device) {
  if (!usable(state, device)) return;
  const std::int64_t M = kRows, N = kFeatures;
  const Tensor x = random_f32({M, N}, device, 1), dy = random_f32({M, N}, device, 4);
  const Tensor weight = random_f32({N}, device, 2), bias = random_f32({N}, device, 3);
  const Tensor y({M, N}, DType::f32, device), dx({M, N}, DType::f32, device);
  const Tensor mean({M}, DType::f32, device), rstd({M}, DType::f32, device);
  const Tensor dweight = Tensor::zeros({N}, DType::f32, device);
  const Tensor dbias = Tensor::zeros({N}, DType::f32, device);
  layernorm_forward(x, weight, bias, y, mean, rstd);
  for (auto _ : state) {
    layernorm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias);
    finish(device);
  }
  // read x, dy, weight, mean, rstd; write dx; read and write dweight, dbias
  report(state, 4.0 * (3 * M * N + N + 2 * M + 4 * N));
}

void BM_CrossEntropyForwardBackward(benchmark::State& state, Device device) {
  if (!usable(state, device)) return;
  const std::int64_t M = kRows, C = kClasses;
  const Tensor logits = random_f32({M, C}, device, 5, -4, 4);
  std::vector<std::int32_t> label_values(M);
  for (std::int64_t i = 0; i < M; ++i) {
    label_values[i] = static_cast<std::int32_t>(random_bits(6, 0, i) % C);
  }
  const Tensor labels = Tensor::from_vector(label_values, {M}, device);
  const Tensor loss = Tensor::zeros({1}, DType::f32, device);
  const Tensor dlogits({M, C}, DType::f32, device);
  for (auto _ : state) {
    cross_entropy_forward(logits, labels, loss, static_cast<float>(M));
    cross_entropy_backward(logits, labels, dlogits, static_cast<float>(M));
    finish(device);
  }
  // forward: read logits, labels; read and write loss. backward: read logits, labels; write dlogits
  report(state, 4.0 * (3 * M * C + 2 * M + 2));
}

BENCHMARK_CAPTURE(BM_LayerNormForward, cpu, Device::cpu())
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LayerNormForward, cuda, Device::cuda())
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LayerNormBackward, cpu, Device::cpu())
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LayerNormBackward, cuda, Device::cuda())
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CrossEntropyForwardBackward, cpu, Device::cpu())
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CrossEntropyForwardBackward, cuda, Device::cuda())
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace bigbatch

// bench_attention.cpp: causal self-attention's forward and backward, the plain kernels
// (kernels/attention.hpp: P stored, b heads T^2) against the memory-efficient ones (tiles of
// keys: only the row's max and sum stored), for one sequence of T positions with 6 heads of
// 64 channels (shakespeare-char's width, 384), f32, dropout 0.1, on the CPU and on CUDA (the
// CUDA cases skip with the reason where no GPU answers).
//
// Counters (exact, from the tracking allocator, not timed):
//   kept_bytes       what the forward leaves for the backward besides y: P, or (m, l)
//   peak_bytes       the device's peak during one forward and backward, inputs included
// Time is one forward and one backward; compare the two kernels at the same T within a run.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_runtime.hpp"
#include "common/memory.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "kernels/attention.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kHeads = 6, kHeadChannels = 64, kChannels = kHeads * kHeadChannels;

/// Values uniform in [-1, 1) from the counter-based RNG, as f32 on `device`.
Tensor uniform_f32(Shape shape, Device device, std::uint64_t seed) {
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 2 * random_uniform(seed, 0, i) - 1;
  return Tensor::from_vector(values, std::move(shape), device);
}

/// args: efficient (0: plain, 1: memory-efficient), T.
void BM_Attention(benchmark::State& state, Device device) {
  std::string why_not;
  if (device.is_cuda() && !cuda_rt::available(&why_not)) {
    state.SkipWithError(("CUDA benchmark skipped: " + why_not).c_str());
    return;
  }
  const bool efficient = state.range(0) == 1;
  const std::int64_t T = state.range(1);
  const Tensor qkv = uniform_f32({1, T, 3 * kChannels}, device, 1);
  const Tensor dy = uniform_f32({1, T, kChannels}, device, 2);
  const Tensor y({1, T, kChannels}, DType::f32, device);
  const Tensor dqkv({1, T, 3 * kChannels}, DType::f32, device);
  const DropoutSpec dropout{0.1f, 5, 1, 0};
  TrackingAllocator& allocator = allocator_for(device);
  std::size_t kept = 0, peak = 0;
  for (auto _ : state) {
    allocator.reset_peak();
    if (efficient) {
      const Tensor stats({1, kHeads, T, 2}, DType::f32, device, MemoryCategory::activations);
      efficient_attention_forward(qkv, y, stats, kHeads, dropout);
      efficient_attention_backward(qkv, y, stats, dy, dqkv, kHeads, dropout);
      kept = stats.nbytes();
    } else {
      const Tensor P({1, kHeads, T, T}, DType::f32, device, MemoryCategory::activations);
      causal_attention_forward(qkv, y, P, kHeads, dropout);
      causal_attention_backward(qkv, P, dy, dqkv, kHeads, dropout);
      kept = P.nbytes();
    }
    if (device.is_cuda()) cuda_rt::synchronize();
    peak = allocator.stats().peak_total;
  }
  state.counters["kept_bytes"] = static_cast<double>(kept);
  state.counters["peak_bytes"] = static_cast<double>(peak);
  state.counters["T"] = static_cast<double>(T);
  state.SetLabel(std::string(efficient ? "efficient" : "plain") + " T " + std::to_string(T));
}

void attention_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"efficient", "T"});
  for (const std::int64_t T : {256, 1024, 4096}) {
    for (const std::int64_t efficient : {0, 1}) b->Args({efficient, T});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Attention, cpu, Device::cpu())->Apply(attention_arguments);
BENCHMARK_CAPTURE(BM_Attention, cuda, Device::cuda())->Apply(attention_arguments);

}  // namespace
}  // namespace bigbatch

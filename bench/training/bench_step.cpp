// bench_step: one whole optimizer step of the residual MLP (zero_grad, forward and
// backward over the micro-batches, AdamW), in fp32 and in fp16 mixed precision, with the
// memory the step needs as counters (exact, from the tracking allocator):
//   activations_peak   the most bytes of saved activations alive at once
//   peak_total         the device's peak during the step
// Time per step is the benchmark's time; samples/s is items_per_second.
// Run: bench_training --benchmark_out=training.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_runtime.hpp"
#include "common/memory.hpp"
#include "common/rng.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kInputs = 784, kClasses = 10;

/// args: precision (0 fp32, 1 fp16), depth, hidden, batch, micro-batch.
void BM_TrainingStep(benchmark::State& state, Device device) {
  std::string why_not;
  if (device.is_cuda() && !cuda_rt::available(&why_not)) {
    state.SkipWithError(("skipped: " + why_not).c_str());
    return;
  }
  const bool fp16 = state.range(0) == 1;
  const std::int64_t batch = state.range(3), micro_batch = state.range(4);
  nn::ModelConfig config{.inputs = kInputs, .hidden = state.range(2), .expansion = 4,
                         .classes = kClasses, .depth = state.range(1), .seed = 1};
  config.precision = fp16 ? nn::Precision::fp16 : nn::Precision::fp32;
  nn::Model model(config, device);
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  std::vector<float> x(static_cast<std::size_t>(batch * kInputs));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = random_uniform(7, 0, i);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int32_t>(random_bits(7, 1, i) % kClasses);
  }
  const Tensor x_device = Tensor::from_vector(x, {batch, kInputs}).to(device);
  const Tensor labels_device = Tensor::from_vector(labels, {batch}).to(device);
  TrackingAllocator& allocator = allocator_for(device);
  const std::size_t activations_before = allocator.stats().live_of(MemoryCategory::activations);
  allocator.reset_peak();
  std::int64_t step = 0;
  for (auto _ : state) {
    model.zero_grad();
    const float loss = nn::accumulate_gradients(model, x_device, labels_device, micro_batch,
                                                {true, 3, step * batch});
    optimizer.step();
    benchmark::DoNotOptimize(loss);  // the loss is read back: the step has finished
    ++step;
  }
  const MemoryStats stats = allocator.stats();
  state.counters["activations_peak"] = static_cast<double>(
      stats.peak_of(MemoryCategory::activations) - activations_before);
  state.counters["peak_total"] = static_cast<double>(stats.peak_total);
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetLabel(std::string(fp16 ? "fp16" : "fp32") + " depth " +
                 std::to_string(config.depth) + " H " + std::to_string(config.hidden) +
                 " B " + std::to_string(batch) + " micro " + std::to_string(micro_batch));
}

void step_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fp16", "depth", "hidden", "batch", "micro"});
  for (const std::int64_t precision : {0, 1}) b->Args({precision, 4, 512, 1024, 1024});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_TrainingStep, cpu, Device::cpu())->Apply(step_arguments);
BENCHMARK_CAPTURE(BM_TrainingStep, cuda, Device::cuda())->Apply(step_arguments);

}  // namespace
}  // namespace bigbatch

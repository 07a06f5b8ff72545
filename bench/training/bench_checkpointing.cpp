// bench_checkpointing: chapter 05's trade, measured. One forward and backward of the
// residual MLP (H 256, E 4, batch 64, dropout 0.1) under each checkpoint policy and depth,
// with the bytes as counters (exact, from the tracking allocator):
//   activation_bytes   activations + checkpoints at the step's peak
//   step_bytes         all the step adds at its peak to what was live before it
//   predicted_...      the same two from chapter 05's memory model, before the step runs
//   block_forwards     block forward evaluations per step (the depth without checkpointing)
// Time per step is the benchmark's time. Compare policies by their ratio to "none" at the
// same depth, within one run (the machine's speed drifts between runs).
// Run: bench_checkpointing --benchmark_out=checkpointing.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "common/memory.hpp"
#include "common/rng.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kInputs = 784, kClasses = 10, kBatch = 64;
const std::vector<std::string> kPolicies = {"none",      "sqrt",      "every:4",
                                            "optimal:3", "selective", "sqrt+selective"};

/// args: the policy's index in kPolicies, depth.
void BM_CheckpointedStep(benchmark::State& state) {
  const std::string policy = kPolicies.at(static_cast<std::size_t>(state.range(0)));
  const std::int64_t depth = state.range(1);
  const nn::ModelConfig config{.inputs = kInputs, .hidden = 256, .expansion = 4,
                               .classes = kClasses, .depth = depth, .dropout = 0.1f,
                               .seed = 1};
  nn::Model model(config, Device::cpu());
  std::shared_ptr<checkpointing::ScheduledRunner> runner;
  if (policy != "none") {
    runner = checkpointing::ScheduledRunner::for_policy(policy, depth);
    model.set_block_runner(runner);
  }
  std::vector<float> x(static_cast<std::size_t>(kBatch * kInputs));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(kBatch));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = random_uniform(7, 0, i);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int32_t>(random_bits(7, 1, i) % kClasses);
  }
  const Tensor x_cpu = Tensor::from_vector(x, {kBatch, kInputs});
  const Tensor labels_cpu = Tensor::from_vector(labels, {kBatch});
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  std::size_t activation_bytes = 0, step_bytes = 0;
  for (auto _ : state) {
    allocator.reset_peak();
    const float loss = nn::accumulate_gradients(model, x_cpu, labels_cpu, kBatch, {true, 3, 0});
    benchmark::DoNotOptimize(loss);
    const MemoryStats stats = allocator.stats();
    activation_bytes = stats.at_peak_of(MemoryCategory::activations) +
                       stats.at_peak_of(MemoryCategory::checkpoints);
    step_bytes = stats.peak_total - stats.live_total;  // the step leaves nothing live
  }
  const nn::StepPrediction predicted =
      checkpointing::predict_policy({config, kBatch, kBatch, AdamWOptions{}}, policy);
  state.counters["activation_bytes"] = static_cast<double>(activation_bytes);
  state.counters["step_bytes"] = static_cast<double>(step_bytes);
  state.counters["predicted_activation_bytes"] =
      static_cast<double>(predicted.stats.at_peak_of(MemoryCategory::activations) +
                          predicted.stats.at_peak_of(MemoryCategory::checkpoints));
  state.counters["predicted_step_bytes"] =
      static_cast<double>(predicted.stats.peak_total - predicted.stats.live_total);
  state.counters["block_forwards"] = static_cast<double>(
      runner ? runner->evaluations() / static_cast<std::int64_t>(state.iterations()) : depth);
  state.SetLabel(policy + " depth " + std::to_string(depth));
}

void arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"policy", "depth"});
  for (const std::int64_t depth : {4, 8, 16, 32, 64}) {
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(kPolicies.size()); ++p) {
      b->Args({p, depth});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_CheckpointedStep)->Apply(arguments);

}  // namespace
}  // namespace bigbatch

// bench_step: one whole optimizer step of the residual MLP as `bigbatch train` runs it,
// through train::Trainer (zero_grad; forward and backward over the micro-batches, each
// gathered from a host data set and copied to the device first; the optimizer boundary;
// AdamW), in fp32 and in fp16 mixed precision, with the
// memory the step needs as counters (exact, from the tracking allocator):
//   activations_peak   the most bytes of saved activations alive at once
//   peak_total         the device's peak during the step
// Time per step is the benchmark's time; samples/s is items_per_second. On CUDA also:
//   gemm_ms            milliseconds per step inside GEMMs (cuBLAS and the fused cuBLASLt
//                      epilogues), from CUDA events around each call
//   gemm_share         gemm_ms over the step's wall time
//   driver_allocations cudaMalloc calls during the timed steps (0 once the cache is warm)
// and the argument `fused` (1: the cuBLASLt GEMM epilogues, kernels/gemm_epilogue.hpp).
//
// BM_Accumulation/cpu: the same CPU model (fp32, depth 4, H 512) and effective batch 1024,
// one optimizer step as micro-batches of 1, 2, 4, ..., 1024, in the two ways of chapter 02
// (argument `naive`): 0 the memory-free way (zero_grad, then nn::accumulate_gradients), 1
// the naive way (accumulation::NaiveAccumulator: one more gradients-sized fp32 buffer,
// each micro-batch's mean loss, / N at the end). Counters (bytes, exact, from the tracking
// allocator, over the timed steps):
//   peak_total         the device's peak
//   peak_CATEGORY      the most bytes of each of gradients, activations, workspace,
//                      parameters and optimizer_state live at once
//   activations_peak   as for BM_TrainingStep
// Time per optimizer step is the benchmark's time, samples/s items_per_second. Micro-batch
// 1 is 1024 forwards and backwards per step: the small micro-batches run one step each.
// Run: bench_training --benchmark_out=training.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/training/step_counters.hpp"
#include "chapters/02_gradient_accumulation/accumulation.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/dataset.hpp"
#include "common/cuda_runtime.hpp"
#include "common/memory.hpp"
#include "common/rng.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_epilogue.hpp"
#include "nn/model.hpp"
#include "nn/training.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kInputs = 784, kClasses = 10;

/// A batch of `batch` random inputs and labels on `device` (the same for every benchmark).
struct Batch {
  Tensor x, labels;
};
Batch random_batch(std::int64_t batch, Device device) {
  std::vector<float> x(static_cast<std::size_t>(batch * kInputs));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = random_uniform(7, 0, i);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int32_t>(random_bits(7, 1, i) % kClasses);
  }
  return {Tensor::from_vector(x, {batch, kInputs}).to(device),
          Tensor::from_vector(labels, {batch}).to(device)};
}

/// `batch` samples of synthetic data on the host (one data set per size, made once).
const Dataset& step_data(std::int64_t batch) {
  static std::map<std::int64_t, Dataset> sets;
  auto [place, made] = sets.try_emplace(batch);
  if (made) place->second = make_synthetic({.samples = batch, .features = kInputs});
  return place->second;
}

/// args: precision (0 fp32, 1 fp16), depth, hidden, batch, micro-batch, fused epilogues.
void BM_TrainingStep(benchmark::State& state, Device device) {
  if (bench::skipped_without(state, device)) return;
  const bool fp16 = state.range(0) == 1;
  const std::int64_t batch = state.range(3), micro_batch = state.range(4);
  nn::ModelConfig config{.inputs = kInputs, .hidden = state.range(2), .expansion = 4,
                         .classes = kClasses, .depth = state.range(1), .seed = 1};
  config.precision = fp16 ? nn::Precision::fp16 : nn::Precision::fp32;
  nn::Model model(config, device);
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  // The program's step (bigbatch train): zero_grad, the micro-batches (each gathered from
  // the host data set and copied to the device), the optimizer boundary, AdamW.
  const Dataset& data = step_data(batch);
  train::TrainConfig run;
  run.batch = batch;
  run.micro_batch = micro_batch;
  run.steps = std::int64_t{1} << 40;  // as many as the benchmark takes
  run.seed = 3;
  train::Trainer trainer(model, optimizer, data, run);
  const bool fused = state.range(5) == 1;
  set_fused_epilogues(fused);
  const auto one_step = [&] {
    return trainer.step().loss;  // read back: the step has finished
  };
  one_step();  // warm-up: the caching allocator takes its blocks, cuBLAS its workspaces
  const bench::StepMemory memory(device);
  const std::size_t driver_allocations_before = memory.stats().driver_allocations;
#if BIGBATCH_HAVE_CUDA
  if (device.is_cuda()) {
    cuda::take_gemm_milliseconds();
    cuda::set_gemm_timing(true);
  }
#endif
  double step_ms = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(one_step());
    step_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                   .count();
  }
  double gemm_ms = 0;
#if BIGBATCH_HAVE_CUDA
  if (device.is_cuda()) {
    cuda::set_gemm_timing(false);
    gemm_ms = cuda::take_gemm_milliseconds();
  }
#endif
  set_fused_epilogues(false);
  const auto steps = static_cast<double>(state.iterations());
  if (device.is_cuda()) {
    state.counters["gemm_ms"] = gemm_ms / steps;
    state.counters["gemm_share"] = step_ms > 0 ? gemm_ms / step_ms : 0.0;
  }
  const MemoryStats stats = memory.stats();
  state.counters["driver_allocations"] =
      static_cast<double>(stats.driver_allocations - driver_allocations_before);
  state.counters["reserved_peak"] = static_cast<double>(stats.reserved_peak);
  memory.write(state);
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetLabel(std::string(fp16 ? "fp16" : "fp32") + " depth " +
                 std::to_string(config.depth) + " H " + std::to_string(config.hidden) +
                 " B " + std::to_string(batch) + " micro " + std::to_string(micro_batch) +
                 (fused ? " fused" : ""));
}

void step_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fp16", "depth", "hidden", "batch", "micro", "fused"});
  for (const std::int64_t precision : {0, 1}) b->Args({precision, 4, 512, 1024, 1024, 0});
  // Accumulation's price: the same step as 16 micro-batches of 64 (chapter 06's cost model
  // calls it the fixed cost per micro-batch).
  b->Args({0, 4, 512, 1024, 64, 0});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

/// The GPU's grid: depth 4 and 16, H 1024 and 4096, a batch of 1024 in one micro-batch or
/// in four of 256 (accumulation), fp32, and fp16 with and without the fused epilogues.
void gpu_step_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fp16", "depth", "hidden", "batch", "micro", "fused"});
  for (const std::int64_t depth : {4, 16}) {
    for (const std::int64_t hidden : {1024, 4096}) {
      for (const std::int64_t micro : {1024, 256}) {
        b->Args({0, depth, hidden, 1024, micro, 0});
        b->Args({1, depth, hidden, 1024, micro, 0});
        b->Args({1, depth, hidden, 1024, micro, 1});
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_TrainingStep, cpu, Device::cpu())->Apply(step_arguments);
BENCHMARK_CAPTURE(BM_TrainingStep, cuda, Device::cuda())->Apply(gpu_step_arguments);

/// args: naive (0 the memory-free way, 1 chapter 02's NaiveAccumulator), micro-batch.
void BM_Accumulation(benchmark::State& state) {
  constexpr std::int64_t batch = 1024;
  const bool naive = state.range(0) == 1;
  const std::int64_t micro_batch = state.range(1);
  const nn::ModelConfig config{.inputs = kInputs, .hidden = 512, .expansion = 4,
                               .classes = kClasses, .depth = 4, .seed = 1};
  const Device device = Device::cpu();
  nn::Model model(config, device);
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  const auto [x, labels] = random_batch(batch, device);
  std::optional<accumulation::NaiveAccumulator> accumulator;  // its buffers live from here
  if (naive) accumulator.emplace(model);
  const auto one_step = [&](std::int64_t step, std::int64_t micro) {
    const nn::ForwardContext context{true, 3, step * batch};
    float loss = 0;
    if (naive) {
      loss = accumulator->gradients(model, x, labels, micro, context);
    } else {
      model.zero_grad();
      loss = nn::accumulate_gradients(model, x, labels, micro, context);
    }
    optimizer.step();
    return loss;  // read back: the step has finished
  };
  // Warm-up: one step of the same way. Below 64 rows a step is many micro-batches, which
  // warm each other up, so this one runs as micro-batches of 64 (the peaks are measured
  // only over the timed steps).
  one_step(0, std::max<std::int64_t>(micro_batch, 64));
  const bench::StepMemory memory(device);
  std::int64_t step = 1;
  for (auto _ : state) benchmark::DoNotOptimize(one_step(step++, micro_batch));
  const MemoryStats stats = memory.stats();
  memory.write(state);
  for (const MemoryCategory c : {MemoryCategory::gradients, MemoryCategory::activations,
                                 MemoryCategory::workspace, MemoryCategory::parameters,
                                 MemoryCategory::optimizer_state}) {
    state.counters["peak_" + std::string(category_name(c))] =
        static_cast<double>(stats.peak_of(c));
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetLabel(std::string(naive ? "naive" : "memory-free") + " fp32 depth 4 H 512 B " +
                 std::to_string(batch) + " micro " + std::to_string(micro_batch));
}

// One registration per (way, micro-batch), each with its own iteration count: a step of
// micro-batches of 1 takes seconds on two cores, one of 1024 a quarter of a second.
[[maybe_unused]] const bool accumulation_registered = [] {
  for (std::int64_t micro = 1; micro <= 1024; micro *= 2) {
    for (const std::int64_t naive : {0, 1}) {
      benchmark::RegisterBenchmark("BM_Accumulation/cpu", BM_Accumulation)
          ->ArgNames({"naive", "micro"})
          ->Args({naive, micro})
          ->Iterations(micro < 64 ? 1 : 3)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  return true;
}();

}  // namespace
}  // namespace bigbatch

// bench_checkpointing: chapter 05's trade, measured. One forward and backward of the
// residual MLP (H 256, E 4, batch 64, dropout 0.1) under each checkpoint policy and depth,
// with the bytes as counters (exact, from the tracking allocator):
//   activation_bytes   activations + checkpoints at the step's peak
//   step_bytes         all the step adds at its peak to what was live before it
//   predicted_...      the same two from chapter 05's memory model, before the step runs
//   block_forwards     block forward evaluations per step (the depth without checkpointing)
// Time per step is the benchmark's time. Compare policies by their ratio to "none" at the
// same depth, within one run (the machine's speed drifts between runs).
//
// BM_PlannedStep: chapter 06's question across budgets. For chapter 01's model and batch
// (4096) and each device budget, the planner's fastest plan (its cost model measured once,
// at the first budget), then that plan's optimizer steps on synthetic data through
// train::Trainer, the step `bigbatch train --plan auto` and chapter 06's demo run (fp16
// with dynamic loss scaling). Counters: the budget, the plan (micro_batch, fp16,
// block_forwards: its recomputation per micro-batch), the predicted step seconds and peak,
// the measured step peak (the trainer's record of the whole step: the predicted peak plus
// boundary_bytes, what the loss scaler keeps for the run) and the peak of each category
// then; samples/s is items_per_second.
// Run: bench_checkpointing --benchmark_out=checkpointing.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chapters/01_large_batch_baseline/baseline.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/dataset.hpp"
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
  const std::string text = kPolicies.at(static_cast<std::size_t>(state.range(0)));
  const checkpointing::Policy policy = checkpointing::Policy::parse(text);
  const std::int64_t depth = state.range(1);
  const nn::ModelConfig config{.inputs = kInputs, .hidden = 256, .expansion = 4,
                               .classes = kClasses, .depth = depth, .dropout = 0.1f,
                               .seed = 1};
  nn::Model model(config, Device::cpu());
  std::shared_ptr<checkpointing::ScheduledRunner> runner;
  if (policy.needs_runner()) {
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
      checkpointing::predict_policy(
          {std::make_shared<nn::ModelLedger>(config), kBatch, kBatch, AdamWOptions{}}, policy);
  state.counters["activation_bytes"] = static_cast<double>(activation_bytes);
  state.counters["step_bytes"] = static_cast<double>(step_bytes);
  state.counters["predicted_activation_bytes"] =
      static_cast<double>(predicted.stats.at_peak_of(MemoryCategory::activations) +
                          predicted.stats.at_peak_of(MemoryCategory::checkpoints));
  state.counters["predicted_step_bytes"] =
      static_cast<double>(predicted.stats.peak_total - predicted.stats.live_total);
  state.counters["block_forwards"] = static_cast<double>(
      runner ? runner->evaluations() / static_cast<std::int64_t>(state.iterations()) : depth);
  state.SetLabel(text + " depth " + std::to_string(depth));
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

/// The planner's cost model for chapter 01's model, measured at its first use.
const planning::CostModel& chapter_01_cost_model() {
  static const planning::CostModel cost =
      planning::calibrate(planning::MlpPlanned(baseline::model_config()),
                          baseline::adamw_options(), Device::cpu(), baseline::kWantedBatch);
  return cost;
}

/// args: the budget in MiB.
void BM_PlannedStep(benchmark::State& state) {
  const std::size_t budget = static_cast<std::size_t>(state.range(0)) << 20;
  const planning::PlanResult result = planning::make_plan(
      {{std::make_shared<planning::MlpPlanned>(baseline::model_config())},
       baseline::kWantedBatch, baseline::adamw_options(), budget},
      {chapter_01_cost_model()});
  if (result.feasible.empty()) {
    state.SkipWithError("no plan fits this budget");
    return;
  }
  const planning::Plan& plan = result.best();
  nn::ModelConfig config = baseline::model_config();
  config.precision = plan.precision;
  nn::Model model(config, Device::cpu());
  if (plan.checkpoint.needs_runner()) {
    model.set_block_runner(checkpointing::ScheduledRunner::for_policy(plan.checkpoint,
                                                                      config.depth));
  }
  nn::Optimizer optimizer(model.parameters(), baseline::adamw_options());
  static const Dataset data = make_synthetic({.samples = 2 * baseline::kWantedBatch});
  // The program's step (bigbatch train --plan auto): fp16 trains with dynamic loss scaling.
  const bool fp16 = plan.precision == nn::Precision::fp16;
  train::TrainConfig run;
  run.batch = baseline::kWantedBatch;
  run.micro_batch = plan.micro_batch;
  run.steps = std::int64_t{1} << 40;  // as many as the benchmark takes
  run.seed = 5;
  run.loss_scaling = fp16 ? train::LossScaling::dynamic : train::LossScaling::none;
  train::Trainer trainer(model, optimizer, data, run);
  MemoryStats step_memory;
  const auto one_step = [&] {
    const train::StepRecord record = trainer.step();
    step_memory = record.memory;
    return record.loss;
  };
  one_step();  // warm-up
  for (auto _ : state) benchmark::DoNotOptimize(one_step());
  state.counters["budget"] = static_cast<double>(budget);
  state.counters["micro_batch"] = static_cast<double>(plan.micro_batch);
  state.counters["fp16"] = fp16 ? 1.0 : 0.0;
  state.counters["bf16"] = plan.precision == nn::Precision::bf16 ? 1.0 : 0.0;
  state.counters["block_forwards"] = plan.recompute;
  state.counters["predicted_seconds"] = plan.seconds;
  state.counters["predicted_peak"] = static_cast<double>(plan.prediction.peak());
  state.counters["step_peak"] = static_cast<double>(step_memory.peak_total);
  state.counters["boundary_bytes"] = static_cast<double>(trainer.boundary_bytes());
  for (const MemoryCategory category :
       {MemoryCategory::parameters, MemoryCategory::master_weights, MemoryCategory::gradients,
        MemoryCategory::optimizer_state, MemoryCategory::activations,
        MemoryCategory::checkpoints, MemoryCategory::workspace, MemoryCategory::data}) {
    state.counters["at_peak_" + std::string(category_name(category))] =
        static_cast<double>(step_memory.at_peak_of(category));
  }
  state.SetItemsProcessed(state.iterations() * baseline::kWantedBatch);
  state.SetLabel(planning::describe(plan, baseline::kWantedBatch));
}

BENCHMARK(BM_PlannedStep)
    ->ArgName("budget_mib")
    ->DenseRange(34, 46, 4)
    ->Arg(64)
    ->Arg(96)
    ->Arg(160)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace bigbatch

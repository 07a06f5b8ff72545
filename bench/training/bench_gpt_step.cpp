// bench_gpt_step: one whole optimizer step of chapter 08's GPT as `bigbatch train --model gpt`
// runs it, through train::Trainer (zero_grad; forward and backward over the micro-batches of
// sequences, each gathered from a host data set and copied to the device; the loss of every
// target token over the step's count; the tied head completed; AdamW), with the memory the
// step needs as counters (exact, from the tracking allocator):
//   activations_peak   the most bytes of saved activations alive at once
//   peak_total         the device's peak during the step
// Time per step is the benchmark's time; items_per_second counts tokens (batch x T).
//
// BM_GptStep/cpu: nanoGPT's "shakespeare-char" shape (6 blocks, width 384, 6 heads, T 256,
// batch 64; dropout 0, so that the peer computes the same function), in one micro-batch and in
// micro-batches of 8; bench/pytorch_step.py --model gpt times the same step in PyTorch.
// BM_GptStep/cuda: GPT-2 small's shape (12 blocks, width 768, 12 heads, T 1024), fp32 and
// bf16, a batch of 16 in one micro-batch and in four.
// The tokens are random bytes (a step's time does not depend on their values), every
// sequence full (no padding).
// Run: bench_training --benchmark_filter=BM_GptStep --benchmark_out=gpt.json ...
#include <benchmark/benchmark.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>

#include "bench/training/step_counters.hpp"
#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/train/trainer.hpp"
#include "common/data/text_corpus.hpp"
#include "common/memory.hpp"
#include "common/rng.hpp"
#include "nn/gpt.hpp"
#include "nn/training.hpp"

namespace bigbatch {
namespace {

constexpr std::int64_t kVocabulary = 256;

/// `count` full sequences of T random bytes, each target the next byte of the row.
Dataset random_tokens(std::int64_t count, std::int64_t T) {
  TokenSequences s;
  s.length = T;
  for (std::int64_t i = 0; i < count; ++i) {
    std::int32_t next = static_cast<std::int32_t>(random_bits(11, i, 0) % kVocabulary);
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t token = next;
      next = static_cast<std::int32_t>(random_bits(11, i, static_cast<std::uint64_t>(t + 1)) %
                                       kVocabulary);
      s.tokens.push_back(token);
      s.targets.push_back(next);
    }
  }
  return make_token_dataset(s, "random bytes");
}

/// args: precision (0 fp32, 1 bf16), layers, width, heads, T, batch, micro-batch.
void BM_GptStep(benchmark::State& state, Device device) {
  if (bench::skipped_without(state, device)) return;
  const bool bf16 = state.range(0) == 1;
  const std::int64_t T = state.range(4), batch = state.range(5), micro_batch = state.range(6);
  nn::GptConfig config{.vocabulary = kVocabulary, .context = T, .layers = state.range(1),
                       .width = state.range(2), .heads = state.range(3), .seed = 1};
  config.precision = bf16 ? nn::Precision::bf16 : nn::Precision::fp32;
  nn::Gpt model(config, device);
  nn::Optimizer optimizer(model.parameters(), AdamWOptions{});
  const Dataset data = random_tokens(batch, T);
  train::TrainConfig run;
  run.batch = batch;
  run.micro_batch = micro_batch;
  run.steps = std::int64_t{1} << 40;  // as many as the benchmark takes
  run.seed = 3;
  train::Trainer trainer(model, optimizer, data, run);
  trainer.step();  // warm-up: the caching allocator takes its blocks, cuBLAS its workspaces
  const bench::StepMemory memory(device);
  for (auto _ : state) {
    benchmark::DoNotOptimize(trainer.step().loss);  // read back: the step has finished
  }
  memory.write(state);
  state.SetItemsProcessed(state.iterations() * batch * T);
  state.SetLabel(std::string(bf16 ? "bf16" : "fp32") + " layers " +
                 std::to_string(config.layers) + " C " + std::to_string(config.width) +
                 " heads " + std::to_string(config.heads) + " T " + std::to_string(T) + " B " +
                 std::to_string(batch) + " micro " + std::to_string(micro_batch));
}

void gpt_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bf16", "layers", "width", "heads", "T", "batch", "micro"});
  for (const std::int64_t micro : {64, 8}) b->Args({0, 6, 384, 6, 256, 64, micro});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

void gpu_gpt_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bf16", "layers", "width", "heads", "T", "batch", "micro"});
  for (const std::int64_t precision : {0, 1}) {
    for (const std::int64_t micro : {16, 4}) b->Args({precision, 12, 768, 12, 1024, 16, micro});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

/// Attention's memory against the sequence length (issue: chapter 08's second half): one
/// forward and backward of one sequence of T tokens through a GPT of 2 blocks of
/// shakespeare-char's width (384, 6 heads, fp32, no dropout), under each way of keeping
/// the attention: none (every block keeps its probabilities P, b heads T^2), every:1 (full
/// recomputation: each block's input kept, the block run again in its backward), attention
/// (selective attention recomputation: everything but P kept, P rebuilt from q and k),
/// efficient (memory-efficient attention: no P at all, each query row's max and sum kept,
/// P rebuilt tile by tile in the backward; no checkpointing).
/// Counters: activation_bytes, the activations and checkpoints at the step's peak (measured
/// by the tracking allocator); predicted_activation_bytes, the same from the memory model;
/// block_forwards per step; kept_per_block, what each block holds from its forward to its
/// backward (nn::gpt_saved_bytes' per-block count, less P under attention, and a block
/// input alone under every:1, whose one taped block at a time the peak holds besides).
const char* const kAttentionPolicies[] = {"none", "every:1", "attention", "efficient"};

void BM_GptAttentionMemory(benchmark::State& state) {
  const std::string text = kAttentionPolicies[state.range(0)];
  const bool efficient = text == "efficient";
  const checkpointing::Policy policy = checkpointing::Policy::parse(efficient ? "none" : text);
  const std::int64_t T = state.range(1), layers = 2;
  const nn::GptConfig config{
      .vocabulary = kVocabulary, .context = T, .layers = layers, .width = 384, .heads = 6,
      .seed = 1,
      .attention = efficient ? nn::AttentionKernel::efficient : nn::AttentionKernel::plain};
  nn::Gpt model(config, Device::cpu());
  std::shared_ptr<checkpointing::GptScheduledRunner> runner;
  if (policy.needs_runner()) {
    runner = checkpointing::GptScheduledRunner::for_policy(policy, layers);
    model.set_block_runner(runner);
  }
  const Dataset data = random_tokens(1, T);
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  std::size_t activation_bytes = 0;
  for (auto _ : state) {
    allocator.reset_peak();
    model.zero_grad();
    benchmark::DoNotOptimize(
        nn::accumulate_gradients(model, data.features, data.labels, 1, {true, 3, 0}));
    const MemoryStats stats = allocator.stats();
    activation_bytes = stats.at_peak_of(MemoryCategory::activations) +
                       stats.at_peak_of(MemoryCategory::checkpoints);
  }
  const nn::StepPrediction predicted =
      checkpointing::predict_policy(
          {std::make_shared<nn::GptLedger>(config, T), 1, 1, AdamWOptions{}}, policy);
  state.counters["activation_bytes"] = static_cast<double>(activation_bytes);
  state.counters["predicted_activation_bytes"] =
      static_cast<double>(predicted.stats.at_peak_of(MemoryCategory::activations) +
                          predicted.stats.at_peak_of(MemoryCategory::checkpoints));
  state.counters["block_forwards"] = static_cast<double>(
      runner ? runner->evaluations() / static_cast<std::int64_t>(state.iterations()) : layers);
  const std::size_t per_block = nn::gpt_saved_bytes(config, 1, T).per_block;
  const std::size_t scores = static_cast<std::size_t>(config.heads * T * T) * sizeof(float);
  const std::size_t input = static_cast<std::size_t>(T * config.width) * sizeof(float);
  state.counters["kept_per_block"] = static_cast<double>(
      text == "attention" ? per_block - scores : text == "every:1" ? input : per_block);
  state.counters["T"] = static_cast<double>(T);
  state.SetItemsProcessed(state.iterations() * T);
  state.SetLabel(text + " T " + std::to_string(T));
}

void attention_memory_arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"policy", "T"});
  for (const std::int64_t T : {256, 1024, 4096}) {
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(std::size(kAttentionPolicies)); ++p) {
      b->Args({p, T});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_GptAttentionMemory)->Apply(attention_memory_arguments);

BENCHMARK_CAPTURE(BM_GptStep, cpu, Device::cpu())->Apply(gpt_arguments);
BENCHMARK_CAPTURE(BM_GptStep, cuda, Device::cuda())->Apply(gpu_gpt_arguments);

}  // namespace
}  // namespace bigbatch

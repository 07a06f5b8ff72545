// Chapter 07: when one device is not enough, R of them. The batch is split into the ranks'
// shares, each rank accumulates its share's gradient with no communication, and the
// ranks' gradients are summed once per optimizer step. In one process the demo simulates
// the ranks (sections a-c), prices the sum on a modelled cluster (d) and shards the
// optimizer state (e, ZeRO stage 1); started by mpirun (`mpirun -np 2
// chapter_07_data_parallel`) it also trains as one rank of the job and checks the job
// against its own simulation (section f). See README.md in this folder; --quick is the CTest setting.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chapters/02_gradient_accumulation/accumulation.hpp"
#include "chapters/06_planner/roofline.hpp"
#include "chapters/07_data_parallel/comm_model.hpp"
#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/train/trainer.hpp"
#include "collectives/communicator.hpp"
#include "common/data/dataset.hpp"
#include "common/integer_math.hpp"
#include "common/report.hpp"
#include "nn/memory_model.hpp"
#include "nn/sample_stream.hpp"

namespace bb = bigbatch;
namespace dp = bigbatch::data_parallel;
namespace collectives = bigbatch::collectives;

namespace {

using Gradients = std::vector<std::vector<float>>;

constexpr std::uint64_t kSeed = 11;

struct Setting {
  std::int64_t batch = 250;  // 250 over 4 ranks: 63, 63, 62, 62 samples (uneven)
  std::int64_t micro_batch = 16;
  std::int64_t steps = 6;
};

bb::Dataset demo_data() {
  bb::SyntheticOptions options;
  options.samples = 4000;
  options.features = 32;
  options.classes = 10;
  options.teacher_hidden = 32;
  return bb::make_synthetic(options);
}

bb::nn::ModelConfig demo_model(bool quick) {
  return {.inputs = 32, .hidden = quick ? 32 : 64, .expansion = 4, .classes = 10,
          .depth = 2, .dropout = 0.1f, .seed = 3};
}

bb::train::TrainConfig train_config(const Setting& s) {
  bb::train::TrainConfig config;
  config.batch = s.batch;
  config.micro_batch = s.micro_batch;
  config.steps = s.steps;
  config.shuffle = false;  // step 1 is samples 0..b-1, whose per-sample terms (a) bounds
  config.seed = kSeed;
  return config;
}

Gradients gradients_of(const bb::nn::Model& model) {
  Gradients all;
  for (const auto& p : model.parameters()) {
    if (p.grad.defined()) all.push_back(p.grad.to_vector<float>());  // ZeRO 2 releases them
  }
  return all;
}

Gradients values_of(const bb::nn::Model& model) {
  Gradients all;
  for (const auto& p : model.parameters()) all.push_back(p.value.to_vector<float>());
  return all;
}

/// What a run of `steps` optimizer steps (SGD, momentum 0.9) leaves: the gradients of its
/// first step and the parameters at the end. `ranks` null: one process on whole batches.
struct Outcome {
  Gradients first_gradients, parameters;
  double seconds_per_step = 0;
  bb::MemoryStats last_step;  ///< the allocator's books of the last step (this process's)
  /// Device bytes live before the run made its model: the demo's other objects, in every
  /// step's total but no part of it.
  std::size_t live_before = 0;
  /// Of them gradients (the simulations' buffers).
  std::size_t gradients_before = 0;
  /// The last step's peak without them: what the step itself held at its peak.
  std::size_t step_peak() const { return last_step.peak_total - live_before; }
  /// The gradients the step itself held at its peak.
  std::size_t gradients_at_peak() const {
    return last_step.at_peak_of(bb::MemoryCategory::gradients) - gradients_before;
  }
};

const bb::nn::Optimizer::Options kOptimizer = bb::SgdOptions{.lr = 0.05, .momentum = 0.9};

Outcome train(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
              const Setting& s, dp::RankGroup* ranks) {
  Outcome outcome;
  const bb::MemoryStats before = bb::allocator_for(bb::Device::cpu()).stats();
  outcome.live_before = before.live_total;
  outcome.gradients_before = before.live_of(bb::MemoryCategory::gradients);
  bb::nn::Model model(model_config, bb::Device::cpu());
  if (ranks) ranks->take_model(model);  // ZeRO under MPI: its masters' and gradients' shards
  // Under ZeRO a rank's optimizer steps (and holds state for) its shard alone.
  bb::nn::Optimizer optimizer(ranks ? ranks->stepped_parameters(model) : model.parameters(),
                              kOptimizer);
  bb::train::Trainer trainer(model, optimizer, data, train_config(s), ranks);
  outcome.last_step = trainer.step().memory;
  outcome.first_gradients = gradients_of(model);
  const auto start = std::chrono::steady_clock::now();
  trainer.run([&](const bb::train::StepRecord& record) { outcome.last_step = record.memory; });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  outcome.seconds_per_step = seconds / static_cast<double>(std::max<std::int64_t>(1, s.steps - 1));
  if (ranks) ranks->gather_master_weights(model);  // ZeRO in 16 bits: each rank had a shard
  outcome.parameters = values_of(model);
  return outcome;
}

/// The largest |a - b| / (factor M) over every element with M > 0, and whether every
/// element is within factor M (M = the per-sample magnitude).
struct Comparison {
  double worst_fraction = 0;  // of the bound
  bool within = true;
  std::int64_t differing = 0;
};

Comparison compare(const Gradients& a, const Gradients& b,
                   const std::vector<std::vector<double>>& magnitude, double factor) {
  Comparison c;
  for (std::size_t p = 0; p < a.size(); ++p) {
    for (std::size_t i = 0; i < a[p].size(); ++i) {
      const double difference = std::fabs(double(a[p][i]) - double(b[p][i]));
      const double bound = factor * magnitude[p][i];
      c.within &= difference <= bound;
      c.differing += difference > 0;
      if (bound > 0) c.worst_fraction = std::max(c.worst_fraction, difference / bound);
    }
  }
  return c;
}

bool bitwise_equal(const Gradients& a, const Gradients& b) { return a == b; }

std::string number(double value, const char* format = "%.3g") {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

/// The shares of `batch` over `ranks`, "63, 63, 62, 62".
std::string shares(std::int64_t batch, int ranks) {
  std::string text;
  for (int r = 0; r < ranks; ++r) {
    text += (r ? ", " : "") + std::to_string(collectives::share_of(batch, ranks, r).size);
  }
  return text;
}

/// Step 1's batch of `batch` samples (data order, as train_config runs it): x and labels.
std::pair<bb::Tensor, bb::Tensor> first_batch(const bb::Dataset& data, std::int64_t batch) {
  const bb::nn::SampleStream stream(data, batch, false, kSeed, bb::nn::LastBatch::keep_short);
  bb::Tensor x(bb::Shape{batch, data.feature_dim()}, bb::DType::f32);
  bb::Tensor labels(bb::Shape{batch}, bb::DType::i32);
  stream.gather(0, x, labels);
  return {x, labels};
}

/// Step 1's gradient accumulated over the ranks' shares into one buffer, each share's loss
/// divided by `count_of(share size)`: the global count b (right) or R n_r (the mistake of
/// a per-rank mean averaged over the ranks).
template <class CountOf>
Gradients share_gradients(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
                          const Setting& s, int ranks, CountOf count_of) {
  bb::nn::Model model(model_config, bb::Device::cpu());
  const auto [x, labels] = first_batch(data, s.batch);
  model.zero_grad();
  for (int r = 0; r < ranks; ++r) {
    const collectives::Share share = collectives::share_of(s.batch, ranks, r);
    const std::int64_t end = share.begin + share.size;
    bb::nn::accumulate_gradients(model, x.rows(share.begin, end), labels.rows(share.begin, end),
                                 s.micro_batch,
                                 {true, bb::nn::dropout_seed_for_run(kSeed), share.begin},
                                 count_of(share.size));
  }
  return gradients_of(model);
}

/// Section (d): the gradient sum of a larger model on 8 to 512 H200s, modelled (the
/// alpha-beta model of comm_model.hpp, the compute from chapter 06's roofline). Returns
/// the figure's data: the sum's share of the step for k = 1, 2, 4, ..., 128 micro-batches.
bb::Json on_modelled_cluster(bb::SelfCheck& report) {
  // 24 blocks of width 1024 (about 201 million parameters), bf16, micro-batches of 256.
  const bb::nn::ModelConfig model{.inputs = 784, .hidden = 1024, .expansion = 4, .classes = 10,
                                  .depth = 24, .precision = bb::nn::Precision::bf16};
  const std::int64_t rows = 256;
  const bb::planning::DeviceSpec h200 = bb::planning::h200_spec();
  const double micro = bb::planning::roofline_micro_batch_seconds(model, rows, h200, false);
  const double bytes = static_cast<double>(bb::nn::predict_memory(model, 1).gradients);
  // Assumed, not measured (comm_model.hpp): NVLink 900 GB/s per GPU counts both directions
  // (450 each way), InfiniBand 400 Gb/s is 50 GB/s, one NIC per GPU; the latencies are guesses.
  const dp::Cluster cluster = dp::h200_cluster();
  const dp::Link nvlink = cluster.inside, infiniband = cluster.between;
  const int kPerNode = cluster.per_node;
  report.section("(d) The same sum on 8 to 512 H200s, modelled, not measured");
  report.note("a model of 24 blocks of width 1024, bf16, " + number(bytes / 1e6, "%.0f") +
              " MB of f32 gradients; one micro-batch of " + std::to_string(rows) + " rows " +
              number(micro * 1e3, "%.2f") + " ms on chapter 06's H200 roofline; NVLink " +
              "assumed at 450 GB/s each way and 5 us, InfiniBand at 50 GB/s per GPU and 10 us, " +
              "8 GPUs a node");
  std::printf("   %-28s %12s   share of the step in the sum, micro-batches per rank k =\n",
              "GPUs", "sum (ms)");
  std::printf("   %-28s %12s   %8s %8s %8s %8s\n", "", "", "1", "4", "16", "64");
  double share_512_k1 = 0, share_512_k64 = 0;
  bb::Json figure = {{"model", "24 blocks of width 1024, bf16, micro-batches of 256 rows"},
                     {"gradient_bytes", bytes},
                     {"micro_batch_seconds", micro},
                     {"assumed", "NVLink 450 GB/s each way and 5 us; InfiniBand 50 GB/s per GPU "
                                 "and 10 us; 8 GPUs a node"},
                     {"clusters", bb::Json::array()}};
  for (const int gpus : {8, 64, 512}) {
    const double sum = dp::cluster_all_reduce_seconds(bytes, gpus, cluster);
    bb::Json shares = bb::Json::array();
    for (int k = 1; k <= 128; k *= 2) {
      shares.push_back({{"micro_batches", k}, {"share", dp::data_parallel_step(micro, k, sum).share}});
    }
    figure["clusters"].push_back({{"gpus", gpus}, {"sum_seconds", sum}, {"shares", shares}});
    std::string row;
    for (const int k : {1, 4, 16, 64}) {
      const double share = dp::data_parallel_step(micro, k, sum).share;
      row += number(100 * share, "%7.1f%%") + " ";
      if (gpus == 512 && k == 1) share_512_k1 = share;
      if (gpus == 512 && k == 64) share_512_k64 = share;
    }
    std::printf("   %-28s %12.2f   %s\n",
                (std::to_string(gpus) + " (" + std::to_string(gpus / kPerNode) +
                 (gpus == kPerNode ? " node)" : " nodes)")).c_str(),
                sum * 1e3, row.c_str());
  }
  report.note("the ring's bandwidth term, 2 (R - 1) / R of the bytes, hardly grows with R; "
              "the sum grows from 8 to 512 GPUs because it leaves the node for a link " +
              number(nvlink.bytes_per_second / infiniband.bytes_per_second, "%.0f") +
              " times slower. Accumulation is the knob: at 512 GPUs the sum is " +
              number(100 * share_512_k1, "%.0f") + "% of a step of one micro-batch per rank "
              "and " + number(100 * share_512_k64, "%.1f") + "% of a step of 64");
  return figure;
}

/// Section (e)'s table: rank 0's step of scripts/data-parallel-bench.sh's run (Fashion-MNIST
/// shapes, depth 4, width 512, batch 1024 in micro-batches of 256, AdamW, fp32), predicted
/// by the memory model for R = 1, 2, 4 at stages 0, 1 and 2. The bench measures R = 2.
void report_rank_memory(bb::SelfCheck& report) {
  const bb::nn::ModelConfig model{.inputs = 784, .hidden = 512, .expansion = 4, .classes = 10,
                                  .depth = 4, .seed = 0};
  bb::nn::ModelLedger ledger(model);
  const bb::AdamWOptions adamw;
  const auto state = static_cast<std::size_t>(bb::MemoryCategory::optimizer_state);
  const auto gradients = static_cast<std::size_t>(bb::MemoryCategory::gradients);
  const auto mib = [](std::size_t bytes) { return number(static_cast<double>(bytes) / (1 << 20), "%.2f"); };
  report.note("rank 0's step of scripts/data-parallel-bench.sh's run (depth 4, width 512, "
              "batch 1024 in micro-batches of 256, AdamW), by the memory model, in MiB "
              "(gradients: between steps, and at the step's peak):");
  std::printf("   %-8s %-6s %16s %22s %12s\n", "ranks", "stage", "optimizer state",
              "gradients (at peak)", "step peak");
  std::size_t replicated_state = 0, sharded_state = 0, shard_gradients = 0, peak_gradients = 0;
  for (const int ranks : {1, 2, 4}) {
    for (const dp::ZeroStage zero : {dp::ZeroStage::replicated, dp::ZeroStage::optimizer_state,
                                     dp::ZeroStage::gradients}) {
      const bb::MemoryStats rank0 =
          dp::predict_rank_step(ledger, 1024, 256, adamw, ranks, 0, zero).stats;
      std::printf("   %-8d %-6s %16s %22s %12s\n", ranks, dp::setting_text(zero).c_str(),
                  mib(rank0.live[state]).c_str(),
                  (mib(rank0.live[gradients]) + " (" + mib(rank0.at_peak[gradients]) + ")").c_str(),
                  mib(rank0.peak_total).c_str());
      if (ranks != 4) continue;
      if (zero == dp::ZeroStage::replicated) replicated_state = rank0.live[state];
      if (zero == dp::ZeroStage::optimizer_state) sharded_state = rank0.live[state];
      if (zero == dp::ZeroStage::gradients) {
        shard_gradients = rank0.live[gradients];
        peak_gradients = rank0.at_peak[gradients];
      }
    }
  }
  // Rank 0's share of a tensor of n elements is ceil(n / 4): 4 ceil(n / 4) - n <= 3 elements
  // more than a quarter, of 8 bytes each (AdamW's two moments), per trainable tensor.
  const std::size_t rounding = 3 * 8 * ledger.trainable_sizes().size();
  report.check(sharded_state * 4 >= replicated_state &&
                   sharded_state * 4 <= replicated_state + rounding,
               "at 4 ranks stage 1 keeps a quarter of the optimizer state on rank 0 (its "
               "shares round up by at most 3 elements per tensor of the whole): " + mib(sharded_state) +
               " of " + mib(replicated_state) + " MiB; the parameters and gradients stay whole");
  // Stage 2: between steps the gradient shards, 4 bytes per element of the optimizer's
  // shard; at the peak also the largest group a backward allocates, a block's (ln 2H, fc1
  // and fc2 E H^2 + E H and E H^2 + H), larger than the stem's (784 H + H) here.
  const std::size_t h = 512, e = 4 * h;
  const std::size_t block = 4 * (2 * h + (e * h + e) + (h * e + h));
  report.check(shard_gradients == sharded_state / 2 && peak_gradients == shard_gradients + block,
               "at 4 ranks stage 2 keeps rank 0's shard of the gradients between steps (" +
                   mib(shard_gradients) + " MiB, half its AdamW state), and at the step's peak "
                   "one block's gradients more, allocated by its backward and released after "
                   "their sum (" + mib(peak_gradients) + " MiB)");
  // In bf16 the f32 masters of the Linear weights are sharded too (4 bytes an element, the
  // same rounding per weight tensor); the bf16 working copies stay whole.
  bb::nn::ModelConfig bf16 = model;
  bf16.precision = bb::nn::Precision::bf16;
  const auto masters = static_cast<std::size_t>(bb::MemoryCategory::master_weights);
  bb::nn::ModelLedger bf16_ledger(bf16);
  const std::size_t all_masters =
      dp::predict_rank_step(bf16_ledger, 1024, 256, adamw, 4, 0, dp::ZeroStage::replicated)
          .stats.live[masters];
  const std::size_t shard_masters =
      dp::predict_rank_step(bf16_ledger, 1024, 256, adamw, 4, 0, dp::ZeroStage::optimizer_state)
          .stats.live[masters];
  const std::size_t master_rounding = 3 * 4 * bf16_ledger.master_weight_sizes().size();
  report.check(shard_masters * 4 >= all_masters && shard_masters * 4 <= all_masters + master_rounding,
               "in bf16, at 4 ranks stages 1 and 2 keep a quarter of the f32 master weights "
               "on rank 0 too: " + mib(shard_masters) + " of " + mib(all_masters) +
                   " MiB; the bf16 working copies the forward reads stay whole, and the "
                   "all-gather after the step moves them, 2 bytes an element where the "
                   "masters have 4");
}

/// What section (a) leaves the later sections: the single process's run, the simulated
/// ranks' runs (2, 3 and 4 of them) and step 1's rounding bound, M and gamma(b + 1).
struct SimulatedRuns {
  Outcome single;
  std::vector<Outcome> simulated;
  std::vector<std::vector<double>> magnitude;
  double gamma = 0;
};

/// Section (a): R simulated ranks against the single process. One rank is it, bit for bit;
/// 2, 3 and 4 ranks' step-1 gradients are within rounding of the batch's.
SimulatedRuns simulate_ranks(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
                             const Setting& s, bb::SelfCheck& report) {
  report.section("(a) R ranks x micro-batches of " + std::to_string(s.micro_batch) +
                 " = the batch of " + std::to_string(s.batch) + " (simulated in this process)");
  const Outcome single = train(data, model_config, s, nullptr);
  dp::SimulatedRanks one(1, bb::nn::Model(model_config, bb::Device::cpu()));
  const Outcome alone = train(data, model_config, s, &one);
  report.check(bitwise_equal(alone.parameters, single.parameters) &&
                   bitwise_equal(alone.first_gradients, single.first_gradients),
               "one rank is the single process, bit for bit (" + std::to_string(s.steps) +
                   " steps)");
  // Every sample's rows are the same bits on any split (batch-invariant ops, dropout keyed
  // by the global row): only the grouping of each gradient's sum of b per-sample terms
  // changes, so the ranks' gradient is within 2 gamma(b + 1) M of the batch's (M = sum of
  // the terms' magnitudes; the derivation is tests/test_data_parallel.cpp's).
  const auto magnitude = [&] {
    bb::nn::Model model(model_config, bb::Device::cpu());
    const auto [x, labels] = first_batch(data, s.batch);
    return bb::accumulation::per_sample_magnitude(
        model, x, labels, s.batch, {true, bb::nn::dropout_seed_for_run(kSeed), 0});
  }();
  const double u = 0x1p-24;
  const double gamma = (s.batch + 1) * u / (1 - (s.batch + 1) * u);
  std::vector<Outcome> simulated;
  for (const int ranks : {2, 3, 4}) {
    dp::SimulatedRanks group(ranks, bb::nn::Model(model_config, bb::Device::cpu()));
    simulated.push_back(train(data, model_config, s, &group));
    const Comparison c = compare(simulated.back().first_gradients, single.first_gradients,
                                 magnitude, 2 * gamma);
    report.check(c.within && c.differing > 0,
                 std::to_string(ranks) + " ranks (shares " + shares(s.batch, ranks) +
                     "): step 1's gradient within 2 gamma(b + 1) M of the batch's, " +
                     std::to_string(c.differing) + " elements differ, the largest by " +
                     number(100 * c.worst_fraction, "%.1f") + "% of the bound");
  }
  double drift = 0, largest = 0;
  for (std::size_t p = 0; p < single.parameters.size(); ++p) {
    for (std::size_t i = 0; i < single.parameters[p].size(); ++i) {
      drift = std::max(drift, double(std::fabs(simulated.back().parameters[p][i] -
                                               single.parameters[p][i])));
      largest = std::max(largest, double(std::fabs(single.parameters[p][i])));
    }
  }
  report.note("after " + std::to_string(s.steps) + " steps, 4 ranks' parameters are within " +
              number(drift) + " of the single process's (largest parameter " +
              number(largest) + "): rounding, carried by the optimizer");
  return {single, std::move(simulated), magnitude, gamma};
}

/// Section (b): each rank's mean loss averaged over the ranks, a mistake that even shares
/// hide (the same bits) and uneven ones show (outside rounding).
void per_rank_mean_mistake(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
                           const Setting& s, const std::vector<std::vector<double>>& magnitude,
                           double gamma, bb::SelfCheck& report) {
  report.section("(b) The mistake: each rank's mean loss, averaged over the ranks");
  // Dividing share r's loss by its n_r samples and the sum by R weighs its samples by
  // b / (R n_r) instead of 1. With equal shares R n_r = b: the same divisor, the same
  // bits, and the mistake hides; with uneven ones the short shares' samples weigh more.
  Setting even = s;
  even.batch = 256;
  const Gradients right_even = share_gradients(data, model_config, even, 4,
                                               [&](std::int64_t) { return even.batch; });
  const Gradients mean_even = share_gradients(data, model_config, even, 4,
                                              [](std::int64_t n) { return 4 * n; });
  report.check(bitwise_equal(mean_even, right_even),
               "batch 256 over 4 ranks (64 each): the per-rank mean gives the same bits "
               "(R n_r = b), so a test with even shares cannot see the mistake");
  const Gradients right = share_gradients(data, model_config, s, 4,
                                          [&](std::int64_t) { return s.batch; });
  const Gradients mean = share_gradients(data, model_config, s, 4,
                                         [](std::int64_t n) { return 4 * n; });
  const Comparison wrong = compare(mean, right, magnitude, 2 * gamma);
  report.check(!wrong.within,
               "batch 250 over 4 ranks (" + shares(s.batch, 4) + "): the per-rank mean is " +
                   "outside rounding (the largest error " + number(wrong.worst_fraction, "%.0f") +
                   " times the rounding bound): samples of a share of 62 weigh " +
                   number(250.0 / (4 * 62), "%.4f") + ", of 63 " +
                   number(250.0 / (4 * 63), "%.4f"));
}

/// Section (c): what one gradient sum per optimizer step saves over one per micro-batch.
/// Returns the model's parameter count (section f times sums of that many).
std::int64_t one_sum_per_step(const Setting& s, const Outcome& single, bb::SelfCheck& report) {
  report.section("(c) One sum per optimizer step, not one per micro-batch");
  std::int64_t parameter_count = 0;
  for (const auto& p : single.parameters) parameter_count += static_cast<std::int64_t>(p.size());
  const std::int64_t micro_batches =
      bb::ceil_div(collectives::share_of(s.batch, 4, 0).size, s.micro_batch);
  const double per_sum = 2.0 * 3 / 4 * 4 * static_cast<double>(parameter_count);
  report.note("a sum over R ranks moves about 2 (R - 1) / R of the gradient per rank: " +
              number(per_sum / 1024, "%.1f") + " KiB for these " +
              std::to_string(parameter_count) + " parameters at R = 4; summing after each of " +
              "a rank's " + std::to_string(micro_batches) + " micro-batches (what DDP does " +
              "outside no_sync) moves " + std::to_string(micro_batches) +
              " times that for the same step");
  return parameter_count;
}

/// Section (d), on_modelled_cluster, and its figure's data written to options.data_file
/// when one is named.
void on_cluster_with_data(const bb::DemoOptions& options, collectives::Communicator* world,
                          bb::SelfCheck& report) {
  const bb::Json cluster = on_modelled_cluster(report);
  // The figure's data (notebooks/data_parallel.ipynb), written by one process only; a
  // failure fails the report rather than leave the other ranks waiting.
  if (!options.data_file.empty() && (!world || world->rank() == 0)) {
    report.check(bb::write_demo_data(options, {{"cluster_model", cluster}}),
                 "section (d)'s data written to " + options.data_file);
  }
}

/// Section (e): ZeRO stages 1 and 2, simulated: stage 1 ends with stage 0's parameters
/// (`simulated`, section a's), and the memory model's table of a rank's step.
void zero_stages(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
                 const Setting& s, const std::vector<Outcome>& simulated, bb::SelfCheck& report) {
  report.section("(e) ZeRO stages 1 and 2: each rank holds the optimizer state of its shard, "
                 "then its gradients' too");
  dp::SimulatedRanks sharded(4, bb::nn::Model(model_config, bb::Device::cpu()),
                             dp::ZeroStage::optimizer_state);
  const Outcome zero1 = train(data, model_config, s, &sharded);
  report.check(bitwise_equal(zero1.parameters, simulated.back().parameters),
               "4 ranks at stage 1 end with stage 0's parameters, bit for bit (the optimizer "
               "steps element by element; each shard's sum has the all-reduce's bits)");
  report_rank_memory(report);
}

/// Section (f)'s ZeRO stages 1 and 2 (and stage 1 in bf16) under MPI against this process's
/// simulation of them, and each rank's step against predict_rank_step; `job` is stage 0's.
void sharded_jobs(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
                  const Setting& s, collectives::Communicator* world, int ranks, const Outcome& job,
                  bb::SelfCheck& report) {
  // A ZeRO stage under MPI against this process's simulation of it, bit for bit; the job's
  // outcome and rank r's step as predict_rank_step predicts it.
  struct ShardedJob {
    Outcome job;
    bb::MemoryStats predicted;
  };
  const auto sharded_job = [&](dp::ZeroStage zero, const std::string& how,
                               const bb::nn::ModelConfig& config) {
    dp::SimulatedRanks simulated(ranks, bb::nn::Model(config, bb::Device::cpu()), zero);
    const Outcome own = train(data, config, s, &simulated);
    dp::CommunicatorRanks communicator(*world, collectives::Reduction::deterministic, zero);
    bb::nn::ModelLedger ledger(config);
    ShardedJob sharded{train(data, config, s, &communicator),
                       dp::predict_rank_step(ledger, s.batch, s.micro_batch, kOptimizer, ranks,
                                             world->rank(), zero)
                           .stats};
    report.check(bitwise_equal(sharded.job.parameters, own.parameters),
                 "at ZeRO stage " + dp::setting_text(zero) + " too (" + how +
                     "): the simulation's parameters, bit for bit");
    return sharded;
  };
  const auto [job1, predicted1] =
      sharded_job(dp::ZeroStage::optimizer_state,
                  "a reduce-scatter, each rank stepping its shard, an all-gather", model_config);
  const auto state = static_cast<std::size_t>(bb::MemoryCategory::optimizer_state);
  report.check(job1.step_peak() == predicted1.peak_total &&
                   job1.last_step.live[state] == predicted1.live[state],
               "rank " + std::to_string(world->rank()) + "'s step at stage 1: " +
                   std::to_string(job1.step_peak()) + " bytes at its peak, " +
                   std::to_string(job1.last_step.live[state]) + " of them optimizer state " +
                   "(stage 0: " + std::to_string(job.last_step.live[state]) + "), as " +
                   "predict_rank_step predicts to the byte");
  const auto [job2, predicted2] =
      sharded_job(dp::ZeroStage::gradients,
                  "every micro-batch's gradients reduce-scattered as its backward finishes "
                  "them, each rank keeping its shard of the sum",
                  model_config);
  report.check(job2.step_peak() == predicted2.peak_total &&
                   job2.gradients_at_peak() ==
                       predicted2.at_peak_of(bb::MemoryCategory::gradients),
               "rank " + std::to_string(world->rank()) + "'s step at stage 2: " +
                   std::to_string(job2.step_peak()) + " bytes at its peak, " +
                   std::to_string(job2.gradients_at_peak()) + " of them gradients " +
                   "(stage 1: " + std::to_string(job1.gradients_at_peak()) + "), as " +
                   "predict_rank_step predicts to the byte");
  bb::nn::ModelConfig bf16_config = model_config;
  bf16_config.precision = bb::nn::Precision::bf16;
  const auto [job1_bf16, predicted1_bf16] =
      sharded_job(dp::ZeroStage::optimizer_state,
                  "in bf16, each rank stepping its shard of the f32 masters and gathering the "
                  "bf16 working copies; the masters gathered whole after the run",
                  bf16_config);
  const auto masters = bb::MemoryCategory::master_weights;
  report.check(job1_bf16.step_peak() == predicted1_bf16.peak_total &&
                   job1_bf16.last_step.at_peak_of(masters) == predicted1_bf16.at_peak_of(masters),
               "rank " + std::to_string(world->rank()) + "'s step at stage 1 in bf16: " +
                   std::to_string(job1_bf16.step_peak()) + " bytes at its peak, " +
                   std::to_string(job1_bf16.last_step.at_peak_of(masters)) + " of them f32 "
                   "masters (its shard), as predict_rank_step predicts to the byte");
}

/// Section (f)'s timings: one gradient sum of `parameter_count` floats, deterministic and
/// the engine's, against `job`'s step, and this machine's link fitted from the engine's.
void time_sums_here(collectives::Communicator* world, int ranks, std::int64_t parameter_count,
                    const Setting& s, const Outcome& job, bb::SelfCheck& report) {
  // The time one gradient sum takes, each way, against the step; and the engine's at four
  // sizes from a 64th of it, fitted by least squares for this machine's alpha and beta.
  std::vector<float> buffer(static_cast<std::size_t>(parameter_count), 1.0f);
  const auto time_sums = [&](collectives::Reduction reduction, std::size_t count) {
    const std::span<float> values(buffer.data(), count);
    world->all_reduce_sum(values, reduction);  // once untimed: first touches, connections
    world->barrier();
    const auto start = std::chrono::steady_clock::now();
    constexpr int kRepeats = 20;
    for (int k = 0; k < kRepeats; ++k) world->all_reduce_sum(values, reduction);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           kRepeats;
  };
  const double deterministic_seconds =
      time_sums(collectives::Reduction::deterministic, buffer.size());
  const double engine_seconds = time_sums(collectives::Reduction::engine, buffer.size());
  report.note("one sum of the " + std::to_string(parameter_count) + " gradients: " +
              number(deterministic_seconds * 1e6, "%.0f") + " us deterministic, " +
              number(engine_seconds * 1e6, "%.0f") + " us the engine's; a step " +
              number(job.seconds_per_step * 1e3, "%.1f") + " ms (mean of " +
              std::to_string(s.steps - 1) + ")");
  std::vector<std::pair<double, double>> measured;  // (bytes, seconds)
  for (const std::size_t part : {64, 16, 4}) {
    const std::size_t count = buffer.size() / part;
    measured.emplace_back(4.0 * static_cast<double>(count),
                          time_sums(collectives::Reduction::engine, count));
  }
  measured.emplace_back(4.0 * static_cast<double>(buffer.size()), engine_seconds);
  try {
    const dp::Link here = dp::fit_ring(measured, ranks);
    report.note("the engine's sums at " + std::to_string(measured.size()) + " sizes (" +
                number(measured.front().first / 1024, "%.0f") + " to " +
                number(measured.back().first / 1024, "%.0f") +
                " KiB) fitted as a ring here by least squares: alpha " +
                number(here.latency_seconds * 1e6, "%.1f") + " us, beta " +
                number(here.bytes_per_second / 1e9, "%.1f") + " GB/s (section d's links, " +
                "for comparison, are assumed at 5 us and 450 GB/s inside a node)");
  } catch (const std::invalid_argument& e) {
    report.note(std::string("no fit of this machine's link: ") + e.what());
  }
}

/// Section (f): R processes under MPI (`world`) against this process's simulation of them,
/// bit for bit; alone (`world` null or of one rank) a note that it did not run. Returns the
/// exit status: 0 when every rank's checks held.
int under_mpi(const bb::Dataset& data, const bb::nn::ModelConfig& model_config,
              const Setting& s, collectives::Communicator* world, std::int64_t parameter_count,
              bb::SelfCheck& report) {
  const int ranks = world ? world->size() : 1;
  if (!world || ranks == 1) {
    report.section("(f) R processes under MPI against this process's simulation of them");
    report.note("not run: start the demo under an MPI launcher for it, e.g. "
                "mpirun -np 2 build/chapters/chapter_07_data_parallel (the README says how)");
    return report.finish();
  }
  report.section("(f) " + std::to_string(ranks) +
                 " processes under MPI against this process's simulation of them");
  dp::SimulatedRanks group(ranks, bb::nn::Model(model_config, bb::Device::cpu()));
  const Outcome own = train(data, model_config, s, &group);
  dp::CommunicatorRanks deterministic(*world, collectives::Reduction::deterministic);
  const Outcome job = train(data, model_config, s, &deterministic);
  report.check(bitwise_equal(job.parameters, own.parameters),
               std::to_string(ranks) + " ranks under MPI (deterministic reduction) end with "
               "this process's simulation's parameters, bit for bit");
  // Overlap: every group of gradients its own bucket, started during the last backward.
  dp::CommunicatorRanks overlapped(*world, collectives::Reduction::deterministic,
                                   dp::ZeroStage::replicated, /*bucket_bytes=*/1);
  const Outcome overlapped_job = train(data, model_config, s, &overlapped);
  report.check(bitwise_equal(overlapped_job.parameters, own.parameters),
               "overlapping the sum with the last backward (each group of gradients its own "
               "bucket, started as the backward finishes it): the same bits");
  sharded_jobs(data, model_config, s, world, ranks, job, report);
  dp::CommunicatorRanks engine(*world, collectives::Reduction::engine);
  const Outcome engine_job = train(data, model_config, s, &engine);
  report.note(std::string("the engine's MPI_Allreduce: ") +
              (!bitwise_equal(engine_job.parameters, own.parameters)
                   ? "other bits (it adds in an order of its own)"
               : ranks == 2 ? "the same bits (with two ranks every order is the one addition "
                              "g_0 + g_1)"
                            : "the same bits this time (its order is its own: run with 3 or 4 "
                              "ranks and compare again)"));
  time_sums_here(world, ranks, parameter_count, s, job, report);
  // Every rank made the same checks; the job passes only if every rank's did.
  const int code = report.finish();
  for (const std::uint64_t other : world->all_gather(static_cast<std::uint64_t>(code))) {
    if (other != 0) return 1;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  bb::DemoOptions options;
  if (auto exit = bb::parse_demo_options(
          argc, argv,
          "Chapter 07: data parallel. R ranks x micro-batches = the batch; alone it simulates "
          "the ranks, under mpirun -np R it also trains as one of them.",
          options)) {
    return *exit;
  }
  // Under an MPI launcher every rank runs the whole demo (the simulations too) and rank 0
  // prints; alone, no MPI is started.
  collectives::Communicator* world =
      collectives::launched_by_mpi() && collectives::Communicator::available()
          ? &collectives::Communicator::world()
          : nullptr;
  if (world && world->rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;

  Setting s;
  if (options.quick) s.steps = 3;
  const bb::Dataset data = demo_data();
  const bb::nn::ModelConfig model_config = demo_model(options.quick);
  bb::SelfCheck report("chapter 07");

  // ---- (a) -----------------------------------------------------------------------------
  const SimulatedRuns a = simulate_ranks(data, model_config, s, report);

  // ---- (b) -----------------------------------------------------------------------------
  per_rank_mean_mistake(data, model_config, s, a.magnitude, a.gamma, report);

  // ---- (c) -----------------------------------------------------------------------------
  const std::int64_t parameter_count = one_sum_per_step(s, a.single, report);

  // ---- (d) -----------------------------------------------------------------------------
  on_cluster_with_data(options, world, report);

  // ---- (e) -----------------------------------------------------------------------------
  zero_stages(data, model_config, s, a.simulated, report);

  // ---- (f) -----------------------------------------------------------------------------
  return under_mpi(data, model_config, s, world, parameter_count, report);
}

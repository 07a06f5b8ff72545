// test_data_parallel.cpp: chapter 07 in one process. The split of a batch into ranks'
// shares; the rank-order sum; one simulated rank is the single process to the bit; and
// R = 2, 3, 4 simulated ranks (uneven shares, dropout on) give the single process's
// gradients within the bound that the changed order of the sum allows, derived below.
// The same simulated ranks against R processes under MPI, byte for byte, are
// tests/cli/check_data_parallel.sh's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "chapters/02_gradient_accumulation/accumulation.hpp"
#include "chapters/05_activation_checkpointing/scheduled_runner.hpp"
#include "chapters/06_planner/roofline.hpp"
#include "chapters/07_data_parallel/comm_model.hpp"
#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/07_data_parallel/rank_plan.hpp"
#include "chapters/train/trainer.hpp"
#include "collectives/communicator.hpp"
#include "common/integer_math.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/optimizer.hpp"
#include "nn/sample_stream.hpp"
#include "tests/harness.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using testing::gamma;
using testing::random_tensor;
using testing::tiny_data;
using testing::tiny_model;

TEST(DataParallelShares, CoverTheBatchInRankOrderTheFirstCountModRTakingOneMore) {
  for (const std::int64_t count : {0, 1, 7, 50, 64, 1000}) {
    for (const int ranks : {1, 2, 3, 4, 7, 8}) {
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const collectives::Share share = collectives::share_of(count, ranks, r);
        EXPECT_EQ(share.begin, next) << count << " over " << ranks << ", rank " << r;
        EXPECT_EQ(share.size, count / ranks + (r < count % ranks ? 1 : 0))
            << count << " over " << ranks << ", rank " << r;
        next += share.size;
      }
      EXPECT_EQ(next, count) << count << " over " << ranks;
    }
  }
  // 50 over 4: 13, 13, 12, 12 (the shares the CLI check runs).
  EXPECT_EQ(collectives::share_of(50, 4, 1).begin, 13);
  EXPECT_EQ(collectives::share_of(50, 4, 3).begin, 38);
  EXPECT_THROW(collectives::share_of(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(collectives::share_of(10, 2, 2), std::invalid_argument);
  EXPECT_THROW(collectives::share_of(-1, 2, 0), std::invalid_argument);
}

TEST(DataParallelSum, AddsInRankOrderOnePairAtATime) {
  // 1 + 2^-24 + 2^-24 in float: rank order loses both halves (1 + u rounds to 1 twice),
  // the other association keeps them (2^-23 + 1 = 1 + 2^-23 exactly).
  const std::vector<float> losses = {1.0f, 0x1p-24f, 0x1p-24f};
  EXPECT_EQ(data_parallel::sum_in_rank_order(losses), 1.0f);
  std::vector<float> total = {1.0f, 3.0f};
  const std::vector<float> next = {0x1p-24f, -1.0f};
  collectives::add_next_rank(total, next);
  collectives::add_next_rank(total, next);
  EXPECT_EQ(total[0], 1.0f);
  EXPECT_EQ(total[1], 1.0f);
  std::vector<float> shorter = {1.0f};
  EXPECT_THROW(collectives::add_next_rank(shorter, next), std::invalid_argument);
}

/// A model, its optimizer and the data of one trainer; SGD without momentum or decay, so
/// a step changes the parameters by lr times the gradient it was given.
struct TinyRun {
  Dataset data;
  nn::Model model;
  nn::Optimizer optimizer;
  explicit TinyRun(const Dataset& d, float dropout)
      : data(d),
        model(tiny_model(2, dropout), Device::cpu()),
        optimizer(model.parameters(), SgdOptions{.lr = 0.1, .momentum = 0, .weight_decay = 0}) {}
};

train::TrainConfig one_step(std::int64_t batch, std::int64_t micro_batch) {
  train::TrainConfig config;
  config.batch = batch;
  config.micro_batch = micro_batch;
  config.steps = 1;
  config.shuffle = false;  // step 1 is samples 0..b-1: the per-sample terms below
  config.seed = 3;
  return config;
}

/// The parameters' gradients, one vector per parameter.
std::vector<std::vector<float>> gradients(const nn::Model& model) {
  std::vector<std::vector<float>> all;
  for (const nn::NamedParameter& p : model.parameters()) all.push_back(p.grad.to_vector<float>());
  return all;
}

TEST(RankDevices, RanksSharingAMachineTakeAGpuEachAndAreRefusedWhenTheyCannot) {
  using data_parallel::device_of_rank;
  EXPECT_EQ(device_of_rank(Device::cpu(), 2, 4, 8), Device::cpu());
  EXPECT_EQ(device_of_rank(Device::cuda(), 2, 4, 8), Device::cuda(2));
  EXPECT_EQ(device_of_rank(Device::cuda(), 3, 4, 4), Device::cuda(3));
  // Alone on its machine a rank keeps what it asked for; without a GPU the device check,
  // not this rule, says so.
  EXPECT_EQ(device_of_rank(Device::cuda(3), 0, 1, 8), Device::cuda(3));
  EXPECT_EQ(device_of_rank(Device::cuda(), 1, 2, 0), Device::cuda());
  const auto refusal = [](Device requested, int local_rank, int local_ranks, int devices) {
    try {
      device_of_rank(requested, local_rank, local_ranks, devices);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(not refused)");
  };
  EXPECT_NE(refusal(Device::cuda(1), 0, 2, 8).find("--device cuda:1 with 2 ranks on this "
                                                   "machine"), std::string::npos);
  EXPECT_NE(refusal(Device::cuda(), 0, 4, 2).find("4 ranks on this machine and 2 GPU(s): "
                                                  "NCCL needs a GPU for each rank"),
            std::string::npos);
  EXPECT_NE(refusal(Device::cuda(), 2, 2, 8).find("device_of_rank"), std::string::npos);
}

TEST(SimulatedRanks, OneRankIsTheSingleProcessBitForBit) {
  const Dataset data = tiny_data(200);
  TinyRun single(data, 0.1f), simulated(data, 0.1f);
  train::TrainConfig config = one_step(37, 5);
  config.steps = 3;
  train::Trainer plain(single.model, single.optimizer, single.data, config);
  data_parallel::SimulatedRanks one(1, simulated.model);
  train::Trainer ranked(simulated.model, simulated.optimizer, simulated.data, config, &one);
  for (int step = 0; step < 3; ++step) {
    EXPECT_EQ(plain.step().loss, ranked.step().loss) << "step " << step + 1;
    EXPECT_EQ(gradients(single.model), gradients(simulated.model)) << "step " << step + 1;
  }
}

TEST(SimulatedRanks, AddTheirSharesInRankOrder) {
  // Each share's gradient computed on its own (from zero, the step's global count, its own
  // rows and dropout rows), then added by hand: ((g_0 + g_1) + g_2) + g_3, the deterministic
  // reduction's order. 138 samples in batches of 50: steps 1 and 2 give the 4 ranks shares
  // of 13, 13, 12 and 12; step 3, the epoch's short last batch of 38, shares of 10, 10, 9
  // and 9, each two micro-batches of 7 and a short one (a share taken from the full batch
  // would be another).
  const std::int64_t b = 50, micro_batch = 7;
  const int ranks = 4;
  const Dataset data = tiny_data(138);
  TinyRun ranked(data, 0.1f);
  data_parallel::SimulatedRanks group(ranks, ranked.model);
  train::TrainConfig config = one_step(b, micro_batch);
  config.steps = 3;
  train::Trainer trainer(ranked.model, ranked.optimizer, ranked.data, config, &group);

  TinyRun fresh(data, 0.1f);
  const nn::SampleStream stream(fresh.data, b, /*shuffle=*/false, 3, nn::LastBatch::keep_short);
  const std::vector<nn::NamedParameter> from = ranked.model.parameters();
  std::vector<nn::NamedParameter> to = fresh.model.parameters();
  for (const std::int64_t step : {0, 1, 2}) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    // The parameters the trainer's step starts from.
    for (std::size_t p = 0; p < from.size(); ++p) to[p].value.copy_from(from[p].value);
    trainer.step();

    const nn::BatchPosition batch = stream.position(step);
    ASSERT_EQ(batch.size, step < 2 ? b : 38);
    const Tensor x(Shape{batch.size, fresh.data.feature_dim()}, DType::f32);
    const Tensor labels(Shape{batch.size}, DType::i32);
    stream.gather(step, x, labels);
    std::vector<std::vector<float>> total;
    for (int r = 0; r < ranks; ++r) {
      const collectives::Share share = collectives::share_of(batch.size, ranks, r);
      fresh.model.zero_grad();
      nn::accumulate_gradients(fresh.model, x.rows(share.begin, share.begin + share.size),
                               labels.rows(share.begin, share.begin + share.size), micro_batch,
                               {true, nn::dropout_seed_for_run(3), batch.first_row + share.begin},
                               batch.size);
      const std::vector<std::vector<float>> g = gradients(fresh.model);
      if (r == 0) {
        total = g;
        continue;
      }
      for (std::size_t p = 0; p < g.size(); ++p) {
        for (std::size_t i = 0; i < g[p].size(); ++i) total[p][i] = total[p][i] + g[p][i];
      }
    }
    EXPECT_EQ(gradients(ranked.model), total);
  }
}

// The device stages one micro-batch of a share at a time, and no more than the largest
// share: 4 ranks of a batch of 37 take shares of 10, 9, 9 and 9, so a micro-batch of 37
// stages 10 rows (rank 0's share), not 37.
TEST(SimulatedRanks, StageNoMoreThanTheLargestShareWhereTheMicroBatchIsLarger) {
  const Dataset data = tiny_data(200);
  TinyRun run(data, 0.1f);
  data_parallel::SimulatedRanks four(4, run.model);
  train::Trainer trainer(run.model, run.optimizer, run.data, one_step(37, 37), &four);
  const train::StepRecord record = trainer.step();
  // A row is its features (f32) and its label (i32).
  const auto row_bytes = 4 * static_cast<std::size_t>(data.feature_dim()) + 4;
  EXPECT_EQ(record.memory.peak_of(MemoryCategory::data), 10 * row_bytes);
}

TEST(SimulatedRanks, TooManyRanksForABatchAreRefused) {
  const Dataset data = tiny_data(40);  // batches of 16, 16 and 8: 9 ranks find no sample
  TinyRun run(data, 0.0f);
  data_parallel::SimulatedRanks nine(9, run.model);
  train::TrainConfig config = one_step(16, 4);
  EXPECT_THROW(train::Trainer(run.model, run.optimizer, run.data, config, &nine),
               std::invalid_argument);
  data_parallel::SimulatedRanks eight(8, run.model);
  EXPECT_NO_THROW(train::Trainer(run.model, run.optimizer, run.data, config, &eight));
}

// ZeRO stage 1. A rank's shard of a parameter is elements share_of(numel, R, r) of it.
TEST(ZeroShards, PartitionEveryParameterInRankOrderAsViews) {
  const nn::Model model(tiny_model(2, 0.0f), Device::cpu());
  for (const int ranks : {1, 2, 3, 5}) {
    std::vector<std::vector<nn::NamedParameter>> shards;
    for (int r = 0; r < ranks; ++r) {
      shards.push_back(data_parallel::parameter_shards(model.parameters(), ranks, r));
    }
    const std::vector<nn::NamedParameter> parameters = model.parameters();
    for (std::size_t p = 0; p < parameters.size(); ++p) {
      const float* base = parameters[p].value.data<float>();
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const nn::NamedParameter& shard = shards[r][p];
        EXPECT_EQ(shard.name, parameters[p].name);
        EXPECT_EQ(shard.value.rank(), 1);
        EXPECT_EQ(shard.value.numel(),
                  collectives::share_of(parameters[p].value.numel(), ranks, r).size);
        if (shard.value.numel() > 0) {  // the shard's storage is the parameter's, from `next` on
          EXPECT_EQ(shard.value.data<float>(), base + next) << parameters[p].name << " rank " << r;
          EXPECT_EQ(shard.grad.data<float>(), parameters[p].grad.data<float>() + next);
        }
        next += shard.value.numel();
      }
      EXPECT_EQ(next, parameters[p].value.numel()) << parameters[p].name << ", " << ranks << " ranks";
    }
  }
}

/// Fills every gradient with values of another seed: a step's input for the optimizer.
void set_gradients(const nn::Model& model, std::uint64_t seed) {
  for (nn::NamedParameter p : model.parameters()) {
    p.grad.copy_from(random_tensor(p.grad.shape(), DType::f32, Device::cpu(), seed++));
  }
}

std::vector<std::vector<float>> values(const nn::Model& model) {
  std::vector<std::vector<float>> all;
  for (const nn::NamedParameter& p : model.parameters()) {
    all.push_back(p.value.to_vector<float>());
    if (p.half.defined()) {  // the working copy's bits, as floats
      const Tensor widened(p.half.shape(), DType::f32);
      cast(p.half, widened);
      all.push_back(widened.to_vector<float>());
    }
  }
  return all;
}

// The simulation of stage 1 steps one optimizer over every shard at once, and the saved
// parameters of stage 1 equal stage 0's: both rest on the optimizer acting element by
// element, whatever range of a tensor it is given (the last elements of a shard, a shard
// that starts mid-vector). Checked: three ranks' shard optimizers against one optimizer
// over the whole parameters, on every optimizer path, with the state carried over steps.
TEST(ZeroShards, ShardOptimizersStepAsOneOptimizerBitForBit) {
  nn::ModelConfig config = tiny_model(2, 0.0f);
  for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::fp16}) {
    config.precision = precision;
    for (const cpu::OptimizerPath path : cpu::optimizer_paths_supported()) {
      const cpu::ScopedOptimizerPath forced(path);
      for (const nn::Optimizer::Options& choice :
           {nn::Optimizer::Options(AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}),
            nn::Optimizer::Options(SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3})}) {
        const nn::Model whole(config, Device::cpu()), sharded(config, Device::cpu());
        nn::Optimizer one(whole.parameters(), choice);
        std::vector<nn::Optimizer> ranks;
        for (int r = 0; r < 3; ++r) {
          ranks.emplace_back(data_parallel::parameter_shards(sharded.parameters(), 3, r), choice);
        }
        for (std::uint64_t step = 0; step < 3; ++step) {
          set_gradients(whole, 100 * step);
          set_gradients(sharded, 100 * step);
          one.step();
          for (nn::Optimizer& rank : ranks) rank.step();
        }
        EXPECT_EQ(values(whole), values(sharded))
            << cpu::optimizer_path_name(path) << ", precision " << static_cast<int>(precision);
      }
    }
  }
}

TEST(ZeroShards, AShardsOptimizerHoldsTheStateOfItsShardAlone) {
  const nn::Model model(tiny_model(2, 0.0f), Device::cpu());
  TrackingAllocator& allocator = allocator_for(Device::cpu());
  const std::size_t before = allocator.stats().live_of(MemoryCategory::optimizer_state);
  for (int r = 0; r < 3; ++r) {
    std::size_t shard_elements = 0;
    for (const nn::NamedParameter& p : model.parameters()) {
      shard_elements += static_cast<std::size_t>(collectives::share_of(p.value.numel(), 3, r).size);
    }
    const nn::Optimizer adamw(data_parallel::parameter_shards(model.parameters(), 3, r),
                              AdamWOptions{});
    // exp_avg and exp_avg_sq, one f32 each per element of the shard.
    EXPECT_EQ(allocator.stats().live_of(MemoryCategory::optimizer_state) - before,
              2 * sizeof(float) * shard_elements) << "rank " << r;
  }
}

TEST(ZeroShards, TheSimulationMeasuresTheShardsTheRanksMeasure) {
  const nn::Model model(tiny_model(2, 0.0f), Device::cpu());
  for (const int ranks : {2, 3}) {
    data_parallel::SimulatedRanks stage1(ranks, model, data_parallel::ZeroStage::optimizer_state);
    const loss_scaling::GradientPieces pieces = stage1.boundary_pieces(model);
    ASSERT_EQ(pieces.parts.size(), static_cast<std::size_t>(ranks)) << "a part per rank";
    const std::vector<nn::NamedParameter> parameters = model.parameters();
    for (int r = 0; r < ranks; ++r) {
      ASSERT_EQ(pieces.parts[r].size(), parameters.size());
      for (std::size_t p = 0; p < parameters.size(); ++p) {
        const Tensor shard = data_parallel::shard_view(parameters[p].grad, ranks, r);
        EXPECT_EQ(pieces.parts[r][p].numel(), shard.numel()) << parameters[p].name << " rank " << r;
        if (shard.numel() > 0) {
          EXPECT_EQ(pieces.parts[r][p].data<float>(), shard.data<float>());
        }
      }
    }
    data_parallel::SimulatedRanks stage0(ranks, model);
    EXPECT_EQ(stage0.boundary_pieces(model).parts.size(), 1u) << "stage 0: every gradient, once";
  }
}

TEST(ZeroShards, StatisticsCombineInRankOrder) {
  using loss_scaling::stats_from;
  // 1e16 + 1 rounds back to 1e16 in double: rank order gives 0 here, another order 1.
  const std::vector<loss_scaling::GradientStats> parts = {stats_from(false, 1e16),
                                                          stats_from(false, 1.0),
                                                          stats_from(false, -1e16)};
  const loss_scaling::GradientStats all = data_parallel::combine_in_rank_order(parts);
  EXPECT_EQ(all.squared_norm, (1e16 + 1.0) + -1e16);
  EXPECT_EQ(all.norm, 0.0f);
  EXPECT_FALSE(all.overflow);
  const std::vector<loss_scaling::GradientStats> one_inf = {stats_from(false, 4.0),
                                                            stats_from(true, INFINITY)};
  EXPECT_TRUE(data_parallel::combine_in_rank_order(one_inf).overflow) << "any rank's inf counts";
  const loss_scaling::GradientStats alone = stats_from(false, 2.0);
  const loss_scaling::GradientStats same = data_parallel::combine_in_rank_order({&alone, 1});
  EXPECT_EQ(same.norm, alone.norm);
  EXPECT_EQ(same.squared_norm, alone.squared_norm);
  EXPECT_THROW(data_parallel::combine_in_rank_order({}), std::invalid_argument);
}

// Stage 1 simulated against stage 0 simulated: the same reduced gradients, so the same
// parameters whenever the norm is only reported. The norms are two float64 sums of the
// same squares in another grouping: relative difference below n * 2^-53 for n squares
// (far under a float ulp, 2^-24), so the float norms are equal or one ulp apart.
TEST(SimulatedRanks, ZeroStageOneMeasuresShardsAndStepsAsStageZero) {
  const Dataset data = tiny_data(200);
  train::TrainConfig config = one_step(50, 7);
  config.steps = 4;
  config.loss_scaling = loss_scaling::LossScaleRule::dynamic;  // the pass runs: norms measured
  nn::ModelConfig model_config = tiny_model(2, 0.1f);
  model_config.precision = nn::Precision::fp16;
  const auto run = [&](data_parallel::ZeroStage zero) {
    nn::Model model(model_config, Device::cpu());
    nn::Optimizer optimizer(model.parameters(), AdamWOptions{.lr = 1e-2});
    data_parallel::SimulatedRanks ranks(3, model, zero);
    train::Trainer trainer(model, optimizer, data, config, &ranks);
    std::vector<float> norms;
    for (int k = 0; k < config.steps; ++k) norms.push_back(trainer.step().grad_norm);
    EXPECT_GT(optimizer.steps_taken(), 0) << "every step skipped: nothing was compared";
    return std::pair{values(model), norms};
  };
  const auto [zero0, norms0] = run(data_parallel::ZeroStage::replicated);
  const auto [zero1, norms1] = run(data_parallel::ZeroStage::optimizer_state);
  EXPECT_NE(zero0, values(nn::Model(model_config, Device::cpu()))) << "the steps changed nothing";
  EXPECT_EQ(zero0, zero1);
  for (std::size_t k = 0; k < norms0.size(); ++k) {
    EXPECT_LE(std::abs(norms1[k] - norms0[k]),
              std::nextafter(norms0[k], INFINITY) - norms0[k]) << "step " << k + 1;
  }
}

// R ranks against one process on the batch of b samples. Every sample's forward and
// backward rows are the same bits in both (each op is batch invariant, test_gemm and
// test_gradient_accumulation; dropout is keyed by the sample's global row), so each
// parameter gradient element is, in both, a float sum of the same b per-sample terms
// t_s (dW: dy_s x_s^T, db: dy_s, LayerNorm's: dy_s xhat_s, each term's product rounded at
// most once), only grouped differently: one process chains the b terms; rank r chains its
// share's, then the R partial sums are added in rank order. Any grouping of b terms
// computed with b rounded operations or fewer on the path of each term lies within
// gamma(b) sum_s |t_s| of the exact sum (Higham, Accuracy and Stability, 2nd ed., sec. 4.2),
// so the two results differ by at most 2 gamma(b) sum_s |t_s|. The t_s are measured here
// as the gradient of sample s alone (global count b, its own global row): t_s itself for
// the products; gamma(b + 1) leaves room for a term rounded once more.
TEST(SimulatedRanks, RanksGiveTheBatchGradientWithinTheReorderedSumsBound) {
  const std::int64_t b = 37, micro_batch = 5;
  const Dataset data = tiny_data(200);
  TinyRun single(data, 0.1f);
  train::Trainer plain(single.model, single.optimizer, single.data, one_step(b, micro_batch));
  plain.step();
  const std::vector<std::vector<float>> whole = gradients(single.model);

  // sum_s |t_s| (chapter 02's per_sample_magnitude): the per-sample gradients of step 1's
  // samples (data order, their global rows 0..b-1), from the initial parameters.
  TinyRun fresh(data, 0.1f);
  const nn::SampleStream stream(fresh.data, b, /*shuffle=*/false, 3, nn::LastBatch::keep_short);
  const Tensor x(Shape{b, fresh.data.feature_dim()}, DType::f32);
  const Tensor labels(Shape{b}, DType::i32);
  stream.gather(0, x, labels);
  const std::vector<std::vector<double>> magnitude = accumulation::per_sample_magnitude(
      fresh.model, x, labels, b, {true, nn::dropout_seed_for_run(3), /*first_row=*/0});

  const double bound = 2 * gamma(b + 1, DType::f32);
  for (const int ranks : {2, 3, 4}) {
    TinyRun ranked(data, 0.1f);
    data_parallel::SimulatedRanks group(ranks, ranked.model);
    train::Trainer trainer(ranked.model, ranked.optimizer, ranked.data, one_step(b, micro_batch),
                           &group);
    trainer.step();
    const std::vector<std::vector<float>> split = gradients(ranked.model);
    std::int64_t differing = 0;
    for (std::size_t p = 0; p < whole.size(); ++p) {
      for (std::size_t i = 0; i < whole[p].size(); ++i) {
        const double difference = std::fabs(double(split[p][i]) - double(whole[p][i]));
        ASSERT_LE(difference, bound * magnitude[p][i])
            << ranks << " ranks, parameter " << p << " element " << i;
        differing += difference > 0;
      }
    }
    // The order did change the sum somewhere: a bound that holds with nothing to bound
    // would test nothing.
    EXPECT_GT(differing, 0) << ranks << " ranks";
  }
}

// The alpha-beta model against values worked by hand. The formulas are a few double
// operations on exact inputs, so the comparisons allow a relative 1e-12 (a few units of
// double rounding), not a modelling error.
TEST(CommunicationModel, TheClusterSumIsARingInANodeAndHierarchicalBeyond) {
  const data_parallel::Cluster cluster = data_parallel::h200_cluster();
  const double bytes = 1e9;
  EXPECT_EQ(data_parallel::cluster_all_reduce_seconds(bytes, 4, cluster),
            data_parallel::ring_all_reduce_seconds(bytes, 4, cluster.inside));
  EXPECT_EQ(data_parallel::cluster_all_reduce_seconds(bytes, 64, cluster),
            data_parallel::hierarchical_all_reduce_seconds(bytes, 64, 8, cluster.inside,
                                                           cluster.between));
  EXPECT_EQ(data_parallel::cluster_all_reduce_seconds(bytes, 1, cluster), 0.0);
  EXPECT_THROW(data_parallel::cluster_all_reduce_seconds(bytes, 12, cluster), std::invalid_argument);
}

// A rank's plans are chapter 06's plans of its share, the sum added to every step time:
// at stage 0 the same peaks; at stage 1 lower by the optimizer state of the other shards;
// at stage 2 lower still, and each plan's sum grows with its micro-batches. Batches of 256
// and of 300 over 8 ranks: 300 gives shares of 38 and 37, so rank 0's share, the one
// planned, is not the batch over the ranks rounded down.
TEST(RankPlans, AreTheSharesPlansWithTheSumInEveryStepTime) {
  nn::ModelConfig model = tiny_model(4, 0.0f);
  model.hidden = 64;
  const AdamWOptions adamw;
  const data_parallel::Cluster cluster = data_parallel::h200_cluster();
  for (const auto& [batch, rank_0_share] : {std::pair{256, 32}, std::pair{300, 38}}) {
    SCOPED_TRACE("a batch of " + std::to_string(batch) + " over 8 ranks");
    planning::PlanRequest request{
        {std::make_shared<planning::MlpPlanned>(model)}, batch, adamw, std::size_t{64} << 20};
    const planning::CostModel cost =
        planning::roofline_cost_model(model, adamw, planning::h200_spec(), request.batch);
    planning::PlanRequest share = request;
    share.batch = rank_0_share;
    const planning::PlanResult alone = planning::make_plan(share, {cost});
    ASSERT_FALSE(alone.feasible.empty());
    // A held count of -1 is the whole.
    const auto held_of = [](std::int64_t held, const std::vector<std::int64_t>& sizes) {
      std::int64_t whole = 0;
      for (const std::int64_t n : sizes) whole += n;
      return std::pair{held < 0 ? whole : held, whole};
    };
    for (const data_parallel::ZeroStage zero : {data_parallel::ZeroStage::replicated,
                                                data_parallel::ZeroStage::optimizer_state,
                                                data_parallel::ZeroStage::gradients}) {
      const bool stage2 = zero == data_parallel::ZeroStage::gradients;
      const data_parallel::RankPlans ranked = data_parallel::plan_ranks(request, cost, 8, zero, cluster);
      EXPECT_EQ(ranked.share, rank_0_share);
      nn::ModelConfig fp32 = model, bf16 = model;
      bf16.precision = nn::Precision::bf16;
      EXPECT_GT(ranked.sum_seconds_fp32, 0.0);
      EXPECT_EQ(ranked.sum_seconds_fp32, data_parallel::step_communication_seconds(nn::ModelLedger(fp32), 8, zero, cluster));
      EXPECT_EQ(ranked.sum_seconds_16bit, data_parallel::step_communication_seconds(nn::ModelLedger(bf16), 8, zero, cluster));
      ASSERT_EQ(ranked.result.feasible.size(), alone.feasible.size());
      EXPECT_EQ(ranked.seconds_per_further_micro_batch,
                stage2 ? data_parallel::step_communication_seconds(nn::ModelLedger(fp32), 8, zero, cluster, 2) -
                             ranked.sum_seconds_fp32
                       : 0.0);
      // The other shards' optimizer state (AdamW: 8 bytes per element) and, in 16 bits,
      // their f32 masters (4 bytes per Linear weight element); at stage 2 their gradients
      // too (4 bytes), less the largest group of gradients a backward holds.
      const nn::ModelLedger ledger(model);
      const nn::HeldElements held = data_parallel::held_elements(ledger, 8, 0, zero);
      const auto [state, trainable] = held_of(held.optimizer_state, ledger.trainable_sizes());
      const auto [masters, weights] = held_of(held.master_weights, ledger.master_weight_sizes());
      EXPECT_EQ(state < trainable, zero != data_parallel::ZeroStage::replicated);
      EXPECT_EQ(masters < weights, zero != data_parallel::ZeroStage::replicated);
      for (const planning::Plan& plan : ranked.result.feasible) {
        const auto same = std::find_if(alone.feasible.begin(), alone.feasible.end(),
                                       [&](const planning::Plan& p) {
                                         return p.micro_batch == plan.micro_batch &&
                                                p.precision == plan.precision &&
                                                p.checkpoint.text() == plan.checkpoint.text();
                                       });
        ASSERT_NE(same, alone.feasible.end()) << plan.checkpoint.text();
        const std::size_t saved = static_cast<std::size_t>(
            8 * (trainable - state) + (nn::is_mixed(plan.precision) ? 4 * (weights - masters) : 0));
        const double sum = plan.precision == nn::Precision::fp32 ? ranked.sum_seconds_fp32
                                                                 : ranked.sum_seconds_16bit;
        const std::int64_t micro_batches = ceil_div(rank_0_share, plan.micro_batch);
        // At stage 2 each further micro-batch adds a reduce-scatter of the f32 gradients, the
        // same in every precision.
        EXPECT_EQ(plan.seconds,
                  same->seconds + (stage2 ? data_parallel::step_communication_seconds(
                                                nn::ModelLedger(plan.precision == nn::Precision::fp32
                                                                    ? fp32
                                                                    : bf16),
                                                8, zero, cluster, micro_batches)
                                          : sum));
        if (stage2) {
          EXPECT_LT(plan.prediction.peak() + saved, same->prediction.peak())
              << "stage 2 holds fewer gradients too";
        } else {
          EXPECT_EQ(plan.prediction.peak() + saved, same->prediction.peak())
              << "stage " << data_parallel::setting_text(zero);
        }
      }
      EXPECT_TRUE(std::is_sorted(ranked.result.feasible.begin(), ranked.result.feasible.end(),
                                 planning::faster));
    }
  }
  // The sum: an all-reduce of the f32 gradients; at stage 1 a reduce-scatter of them and an
  // all-gather of what the optimizer writes: the f32 values, but of a Linear weight under
  // mixed precision only its 16-bit working copy (each rank keeps its shard of the master).
  const double gradients = static_cast<double>(nn::predict_memory(model, 1).gradients);
  const double all_reduce = data_parallel::cluster_all_reduce_seconds(gradients, 8, cluster);
  EXPECT_EQ(data_parallel::step_communication_seconds(nn::ModelLedger(model), 8, data_parallel::ZeroStage::replicated, cluster),
            all_reduce);
  EXPECT_EQ(data_parallel::step_communication_seconds(nn::ModelLedger(model), 8, data_parallel::ZeroStage::optimizer_state, cluster),
            0.5 * all_reduce + 0.5 * all_reduce);
  nn::ModelConfig mixed = model;
  mixed.precision = nn::Precision::bf16;
  // 4 bytes a master element, 2 its copy's: the gather moves half the masters' bytes less.
  const double copies = static_cast<double>(nn::predict_memory(mixed, 1).master_weights) / 2;
  EXPECT_EQ(data_parallel::step_communication_seconds(nn::ModelLedger(mixed), 8, data_parallel::ZeroStage::optimizer_state, cluster),
            0.5 * all_reduce + 0.5 * data_parallel::cluster_all_reduce_seconds(gradients - copies, 8, cluster));
  // Stage 2: a reduce-scatter after each of the step's micro-batches, one all-gather.
  EXPECT_EQ(data_parallel::step_communication_seconds(nn::ModelLedger(mixed), 8, data_parallel::ZeroStage::gradients, cluster, 4),
            4 * 0.5 * all_reduce + 0.5 * data_parallel::cluster_all_reduce_seconds(gradients - copies, 8, cluster));
  EXPECT_EQ(data_parallel::step_communication_seconds(nn::ModelLedger(model), 8, data_parallel::ZeroStage::optimizer_state, cluster, 4),
            data_parallel::step_communication_seconds(nn::ModelLedger(model), 8, data_parallel::ZeroStage::optimizer_state, cluster))
      << "stage 1 sums once, whatever the micro-batches";
  const planning::PlanRequest request{
      {std::make_shared<planning::MlpPlanned>(model)}, 256, adamw, std::size_t{64} << 20};
  const planning::CostModel cost =
      planning::roofline_cost_model(model, adamw, planning::h200_spec(), request.batch);
  EXPECT_THROW(data_parallel::plan_ranks(request, cost, 257, data_parallel::ZeroStage::replicated, cluster),
               std::invalid_argument);
}

// At stage 2 a rank pays a reduce-scatter per micro-batch of its share, the short last one
// included: ceil(share / micro-batch) of them. A batch of 296 over 8 ranks leaves rank 0 a
// share of 37, which no micro-batch but 1 and 37 divides; on a device too small for the
// whole share without recomputation, the planner lists smaller micro-batches too.
TEST(RankPlans, AStageTwoPlanPaysAReduceScatterForTheShortLastMicroBatchToo) {
  nn::ModelConfig model = tiny_model(4, 0.0f);
  model.hidden = 64;
  const AdamWOptions adamw;
  const data_parallel::Cluster cluster = data_parallel::h200_cluster();
  const auto zero = data_parallel::ZeroStage::gradients;
  const planning::PlanRequest request{
      {std::make_shared<planning::MlpPlanned>(model)}, 296, adamw, std::size_t{512} << 10};
  const planning::CostModel cost =
      planning::roofline_cost_model(model, adamw, planning::h200_spec(), request.batch);
  const data_parallel::RankPlans share = data_parallel::plan_share(request, cost, 8, zero);
  const data_parallel::RankPlans ranked = data_parallel::plan_ranks(request, cost, 8, zero, cluster);
  ASSERT_EQ(ranked.share, 37);
  ASSERT_EQ(ranked.result.feasible.size(), share.result.feasible.size());
  bool short_last = false;
  for (const planning::Plan& plan : ranked.result.feasible) {
    const auto same = std::find_if(share.result.feasible.begin(), share.result.feasible.end(),
                                   [&](const planning::Plan& p) {
                                     return p.micro_batch == plan.micro_batch &&
                                            p.precision == plan.precision &&
                                            p.checkpoint.text() == plan.checkpoint.text();
                                   });
    ASSERT_NE(same, share.result.feasible.end()) << plan.checkpoint.text();
    nn::ModelConfig priced = model;
    priced.precision = plan.precision == nn::Precision::fp32 ? nn::Precision::fp32
                                                            : nn::Precision::bf16;
    EXPECT_EQ(plan.seconds, same->seconds + data_parallel::step_communication_seconds(
                                                nn::ModelLedger(priced), 8, zero, cluster,
                                                ceil_div(std::int64_t{37}, plan.micro_batch)))
        << "micro-batch " << plan.micro_batch;
    short_last = short_last || 37 % plan.micro_batch != 0;
  }
  EXPECT_TRUE(short_last) << "no feasible plan leaves its share a short last micro-batch";
}

TEST(CommunicationModel, FollowsTheAlphaBetaFormulas) {
  const data_parallel::Link link{1e-5, 1e9};
  // 4 ranks, 4 MB: 2 (4 - 1) (1e-5 + 1e6 / 1e9) = 6 x 1.01e-3 = 6.06e-3 s.
  EXPECT_NEAR(data_parallel::ring_all_reduce_seconds(4e6, 4, link), 6.06e-3, 1e-12 * 6e-3);
  EXPECT_NEAR(data_parallel::reduce_scatter_seconds(4e6, 4, link), 3.03e-3, 1e-12 * 3e-3);
  EXPECT_EQ(data_parallel::ring_all_reduce_seconds(4e6, 1, link), 0.0);
  // One node holding every rank: the ring inside it.
  const data_parallel::Link slow{1e-4, 1e8};
  EXPECT_NEAR(data_parallel::hierarchical_all_reduce_seconds(8e6, 8, 8, link, slow),
              data_parallel::ring_all_reduce_seconds(8e6, 8, link), 1e-15);
  // 16 ranks in 2 nodes of 8: 2 x 7 (1e-5 + 8e6 / (8 x 1e9)) inside, then a ring of
  // 8e6 / 8 bytes over 2 nodes, 2 x 1 (1e-4 + 1e6 / (2 x 1e8)).
  EXPECT_NEAR(data_parallel::hierarchical_all_reduce_seconds(8e6, 16, 8, link, slow),
              14 * 1.01e-3 + 2 * 5.1e-3, 1e-12 * 0.025);
  EXPECT_THROW(data_parallel::hierarchical_all_reduce_seconds(8e6, 12, 8, link, slow),
               std::invalid_argument);
}

// Overlap's premise: during the last micro-batch's backward the model tells each group of
// gradients once, in backward order (the head, the last block, ..., the first, the stem),
// when it is final: what it holds when told is what it holds after the backward. The
// earlier micro-batches' backwards tell nobody. With every block's activations kept, and
// under checkpointing schedules (their runner calls the blocks' backward too); 20 rows in
// micro-batches of 7 (the last one short) and 21 (the last one whole).
TEST(GradientsReady, EachGroupIsToldOnceInBackwardOrderWhenItIsFinal) {
  const Dataset data = tiny_data(40);
  for (const std::int64_t rows : {20, 21}) {
    for (const char* policy : {"none", "sqrt", "every:2+selective"}) {
      SCOPED_TRACE(std::to_string(rows) + " rows");
      const nn::ModelConfig config = tiny_model(3, 0.1f);
      nn::Model model(config, Device::cpu());
      if (std::string(policy) != "none") {
        model.set_block_runner(checkpointing::ScheduledRunner::for_policy(
            checkpointing::Policy::parse(policy), config.depth));
      }
      const std::vector<nn::NamedParameter> parameters = model.parameters();
      std::vector<std::pair<std::size_t, std::size_t>> told;
      std::vector<std::vector<float>> when_told(parameters.size());
      const nn::GradientsReady ready = [&](std::size_t first, std::size_t end) {
        told.emplace_back(first, end);
        for (std::size_t i = first; i < end; ++i) {
          when_told[i] = parameters[i].grad.to_vector<float>();
        }
      };
      const nn::SampleStream stream(data, rows, /*shuffle=*/false, 0, nn::LastBatch::keep_short);
      nn::MicroBatchBuffer staging(7, data.feature_dim(), model.device());
      model.zero_grad();
      nn::accumulate_gradients(model, rows, staging.rows_of(stream, 0), /*micro_batch=*/7,
                               {true, 5, 0}, /*global_count=*/rows, 1.0f, ready);
      const std::vector<std::pair<std::size_t, std::size_t>> expected = {
          {20, 24}, {14, 20}, {8, 14}, {2, 8}, {0, 2}};
      EXPECT_EQ(told, expected)
          << policy << ": the head's four, each block's six, the stem's two";
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        EXPECT_EQ(when_told[i], parameters[i].grad.to_vector<float>())
            << policy << ": " << parameters[i].name << " changed after it was told final";
      }
    }
  }
}

TEST(CommunicationModel, TheFitRecoversTheLinkOfARing) {
  const data_parallel::Link truth{2e-5, 5e9};
  std::vector<std::pair<double, double>> measured;
  for (const double bytes : {1e5, 1e6, 1e7}) {
    measured.emplace_back(bytes, data_parallel::ring_all_reduce_seconds(bytes, 3, truth));
  }
  const data_parallel::Link fitted = data_parallel::fit_ring(measured, 3);
  EXPECT_NEAR(fitted.latency_seconds, truth.latency_seconds, 1e-9 * truth.latency_seconds);
  EXPECT_NEAR(fitted.bytes_per_second, truth.bytes_per_second, 1e-9 * truth.bytes_per_second);
  const std::vector<std::pair<double, double>> one_size = {{1e6, 1e-3}, {1e6, 2e-3}};
  EXPECT_THROW(data_parallel::fit_ring(one_size, 3), std::invalid_argument);
}

TEST(CommunicationModel, AccumulationShrinksTheSumsShareOfTheStep) {
  const data_parallel::StepEstimate one = data_parallel::data_parallel_step(2e-3, 1, 8e-3);
  const data_parallel::StepEstimate many = data_parallel::data_parallel_step(2e-3, 64, 8e-3);
  EXPECT_DOUBLE_EQ(one.step, 10e-3);
  EXPECT_DOUBLE_EQ(one.share, 0.8);
  EXPECT_DOUBLE_EQ(many.compute, 128e-3);
  EXPECT_DOUBLE_EQ(many.share, 8e-3 / 136e-3);
}

}  // namespace
}  // namespace bigbatch

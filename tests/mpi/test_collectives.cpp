// test_collectives.cpp: collectives::Communicator's collectives and chapter 07's ranks under MPI,
// one GoogleTest program per rank (tests/mpi/run_under_mpi.sh starts it as 3 ranks: shares
// of 3 ranks are uneven for most lengths). Every rank runs every test in the same order; a
// failure on any rank fails the job.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/train/trainer.hpp"
#include "collectives/bucketed_sum.hpp"
#include "collectives/communicator.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

collectives::Communicator& world() { return collectives::Communicator::world(); }

/// Rank r's contribution to element i: whole numbers, so that every order of the sum is
/// exact and the engine's sums can be compared bit for bit with the rank order's.
float term(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 1000 + i); }

float sum_of_terms(std::size_t i) {
  float total = 0;
  for (int r = 0; r < world().size(); ++r) total += term(r, i);
  return total;
}

TEST(Collectives, RunOnMoreThanOneRank) {
  ASSERT_GT(world().size(), 1) << "start this program under mpirun (tests/mpi/run_under_mpi.sh)";
}

// The ranks of this test all run on one machine (run_under_mpi.sh starts them here), so
// each is its own place on the machine: the GPU it would take (device_of_rank).
TEST(Collectives, RanksOnOneMachineHaveTheirWorldRankAsTheirPlaceOnIt) {
  EXPECT_EQ(world().local_size(), world().size());
  EXPECT_EQ(world().local_rank(), world().rank());
}

TEST(Collectives, AReduceScatterLeavesEachRankTheSumOfItsShard) {
  for (const collectives::Reduction reduction :
       {collectives::Reduction::deterministic, collectives::Reduction::engine}) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{2}, std::size_t{10}, std::size_t{1001}}) {
      std::vector<float> values(n);
      for (std::size_t i = 0; i < n; ++i) values[i] = term(world().rank(), i);
      world().reduce_scatter_sum(values, reduction);
      const collectives::Share mine =
          collectives::share_of(static_cast<std::int64_t>(n), world().size(), world().rank());
      for (std::int64_t i = mine.begin; i < mine.begin + mine.size; ++i) {
        ASSERT_EQ(values[i], sum_of_terms(i))
            << collectives::reduction_name(reduction) << ", n = " << n << ", element " << i;
      }
    }
  }
}

TEST(Collectives, TheDeterministicReduceScatterHasTheAllReducesBits) {
  // Terms that do not add exactly: the order shows in the bits.
  const std::size_t n = 777;
  std::vector<float> halves(n), whole(n);
  for (std::size_t i = 0; i < n; ++i) {
    halves[i] = whole[i] = std::sin(static_cast<float>(i) + 0.1f * world().rank()) * 1e-3f +
                           (world().rank() == 0 ? 1.0f : 0.0f);
  }
  world().reduce_scatter_sum(halves, collectives::Reduction::deterministic);
  world().all_gather_shares(halves);
  world().all_reduce_sum(whole, collectives::Reduction::deterministic);
  EXPECT_EQ(halves, whole);
}

// Buckets: several buffers (empty, shorter than R, uneven) started in two buckets, moved on
// by progress() and finished: the whole sum everywhere, or each rank's shard of each.
TEST(BucketedSum, LeavesEveryBufferItsSumInEitherReductionAndEitherResult) {
  for (const collectives::Reduction reduction :
       {collectives::Reduction::deterministic, collectives::Reduction::engine}) {
    for (const auto result : {collectives::BucketedSum::Result::every_rank,
                              collectives::BucketedSum::Result::own_shards}) {
      collectives::BucketedSum sum(world(), reduction, result);
      for (int round = 0; round < 2; ++round) {  // the second reuses the first's buffers
        const std::vector<std::size_t> lengths = {0, 2, 10, 1001, 64};
        std::vector<std::vector<float>> buffers;
        for (const std::size_t n : lengths) {
          std::vector<float> values(n);
          for (std::size_t i = 0; i < n; ++i) values[i] = term(world().rank(), i + round);
          buffers.push_back(std::move(values));
        }
        std::vector<std::span<float>> first = {buffers[0], buffers[1], buffers[2]};
        std::vector<std::span<float>> second = {buffers[3], buffers[4]};
        sum.start(first);
        sum.progress();
        sum.start(second);
        EXPECT_EQ(sum.started(), lengths.size());
        sum.progress();
        sum.finish();
        EXPECT_EQ(sum.started(), 0u);
        for (std::size_t b = 0; b < lengths.size(); ++b) {
          const collectives::Share mine = collectives::share_of(
              static_cast<std::int64_t>(lengths[b]), world().size(), world().rank());
          for (std::size_t i = 0; i < lengths[b]; ++i) {
            const bool held = result == collectives::BucketedSum::Result::every_rank ||
                              (static_cast<std::int64_t>(i) >= mine.begin &&
                               static_cast<std::int64_t>(i) < mine.begin + mine.size);
            if (!held) continue;
            ASSERT_EQ(buffers[b][i], sum_of_terms(i + round))
                << collectives::reduction_name(reduction) << ", buffer of " << lengths[b]
                << ", element " << i << ", round " << round;
          }
        }
      }
    }
  }
}

// The deterministic sum's bits do not depend on when, or in which bucket, a buffer's sum
// starts: terms that do not add exactly, bucketed and in one call each.
TEST(BucketedSum, TheDeterministicOneHasTheOneCallSumsBits) {
  const std::size_t n = 777;
  std::vector<float> a(n), b(n / 3), whole_a, whole_b;
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = std::sin(static_cast<float>(i) + 0.1f * world().rank()) * 1e-3f +
           (world().rank() == 0 ? 1.0f : 0.0f);
  }
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(static_cast<float>(i) * world().rank());
  whole_a = a;
  whole_b = b;
  world().all_reduce_sum(whole_a, collectives::Reduction::deterministic);
  world().all_reduce_sum(whole_b, collectives::Reduction::deterministic);
  collectives::BucketedSum sum(world(), collectives::Reduction::deterministic,
                               collectives::BucketedSum::Result::every_rank);
  const std::vector<std::span<float>> first = {b}, second = {a};
  sum.start(first);
  sum.start(second);
  sum.finish();
  EXPECT_EQ(a, whole_a);
  EXPECT_EQ(b, whole_b);
}

TEST(Collectives, AnAllGatherOfSharesGivesEveryRankEveryShard) {
  const std::size_t n = 1001;
  std::vector<float> values(n, -1.0f);
  std::vector<std::uint16_t> halves(n, 0xffff);
  const collectives::Share mine =
      collectives::share_of(static_cast<std::int64_t>(n), world().size(), world().rank());
  for (std::int64_t i = mine.begin; i < mine.begin + mine.size; ++i) {
    values[i] = static_cast<float>(i);
    halves[i] = static_cast<std::uint16_t>(i * 7);
  }
  world().all_gather_shares(values);
  world().all_gather_shares(halves);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(values[i], static_cast<float>(i)) << "element " << i;
    ASSERT_EQ(halves[i], static_cast<std::uint16_t>(i * 7)) << "element " << i;
  }
}

TEST(Collectives, ABroadcastGivesEveryRankRankZerosText) {
  const std::string mine = "rank " + std::to_string(world().rank()) + "'s plan";
  EXPECT_EQ(world().broadcast(mine), "rank 0's plan");
  EXPECT_EQ(world().broadcast(world().rank() == 0 ? std::string() : mine), "");
  const std::string long_text(100000, static_cast<char>('a' + world().rank()));
  EXPECT_EQ(world().broadcast(long_text), std::string(100000, 'a'));
}

TEST(Collectives, AnAllGatherOfDoublesIsInRankOrder) {
  const std::vector<double> all = world().all_gather(0.25 + world().rank());
  ASSERT_EQ(all.size(), static_cast<std::size_t>(world().size()));
  for (int r = 0; r < world().size(); ++r) EXPECT_EQ(all[r], 0.25 + r);
}

// ZeRO stage 1: a rank measures the shard it holds; the combination must give every rank
// every rank's found-inf and the squared norms of all shards, added in rank order.
TEST(ZeroStageOne, EveryRankSeesAnyRanksInfAndEveryShardsSquaredNorm) {
  nn::Model model(testing::tiny_model(2, 0.0f), Device::cpu());
  data_parallel::CommunicatorRanks ranks(world(), collectives::Reduction::deterministic,
                                         data_parallel::ZeroStage::optimizer_state);
  const loss_scaling::GradientPieces pieces = ranks.boundary_pieces(model);
  ASSERT_EQ(pieces.parts.size(), 1u) << "one part per process: its own shard";
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  ASSERT_EQ(pieces.parts[0].size(), parameters.size());
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const Tensor shard = data_parallel::shard_view(parameters[p].grad, world().size(), world().rank());
    EXPECT_EQ(pieces.parts[0][p].numel(), shard.numel()) << parameters[p].name;
    if (shard.numel() > 0) {
      EXPECT_EQ(pieces.parts[0][p].data<float>(), shard.data<float>());
    }
  }
  // Rank 1 alone found an inf; rank r's shard has squared norm 1e16 (rank 0), then 1, ...
  const double mine = world().rank() == 0 ? 1e16 : 1.0;
  const loss_scaling::GradientStats local = loss_scaling::stats_from(world().rank() == 1, mine);
  const loss_scaling::GradientStats all = pieces.combine({&local, 1});
  EXPECT_TRUE(all.overflow) << "rank " << world().rank() << " missed rank 1's inf";
  double expected = 1e16;
  for (int r = 1; r < world().size(); ++r) expected = expected + 1.0;
  EXPECT_EQ(all.squared_norm, expected) << "rank " << world().rank();
  const loss_scaling::GradientStats none = loss_scaling::stats_from(false, 2.0);
  EXPECT_FALSE(pieces.combine({&none, 1}).overflow);
  EXPECT_EQ(pieces.combine({&none, 1}).squared_norm, 2.0 * world().size());
}

/// Batches of 50 in micro-batches of 7 (shares of 17, 17 and 16 over 3 ranks: 7, 7, 3 and
/// 7, 7, 2), with a dynamic loss scale.
train::TrainConfig uneven_shares_run(std::int64_t steps) {
  train::TrainConfig run;
  run.batch = 50;
  run.micro_batch = 7;
  run.steps = steps;
  run.loss_scaling = loss_scaling::LossScaleRule::dynamic;
  return run;
}

// Rank r's step, measured by the tracking allocator, is predict_rank_step's to the byte,
// category by category at the peak, at stage 0, stage 1 (where the optimizer state is
// the rank's shard's: about a third of stage 0's here) and stage 2 (where the gradients
// are the rank's shards, and each group's own only from its backward to its sum; with
// buckets, to its bucket's sum, waited for when the next bucket is full or the backward
// ends). fp32 and fp16 (whose f32 masters stages 1 and 2 shard). On 3 ranks, shares of 17,
// 17 and 16 samples in micro-batches of 7 (7, 7, 3 and 7, 7, 2), and of 15, 14 and 14 (7,
// 7, 1 and 7, 7: ranks 1 and 2 join rank 0's third sum with zeros at stage 2; on 2 ranks,
// 22 and 21 do so with 7, 7, 7, 1 and 7, 7, 7), AdamW, a loss scale (the boundary's 12
// bytes).
TEST(RankMemory, EveryRanksStepIsPredictedToTheByte) {
  const Dataset data = testing::tiny_data(200);
  const AdamWOptions adamw{.lr = 1e-3};
  for (const std::int64_t batch : {50, 43}) {
    train::TrainConfig run = uneven_shares_run(2);
    run.batch = batch;
    // fp16: at stages 1 and 2 each rank holds its shard of the f32 masters alone.
    for (const nn::Precision precision : {nn::Precision::fp32, nn::Precision::fp16}) {
      nn::ModelConfig config = testing::tiny_model(2, 0.0f);
      config.precision = precision;
      // Stage 2 also in buckets: every group its own (two groups in flight at most), a
      // middle size, and one bucket of everything (the whole gradients at the backward's end).
      const std::pair<data_parallel::ZeroStage, std::size_t> stages[] = {
          {data_parallel::ZeroStage::replicated, 0},
          {data_parallel::ZeroStage::optimizer_state, 0},
          {data_parallel::ZeroStage::gradients, 0},
          {data_parallel::ZeroStage::gradients, 1},
          {data_parallel::ZeroStage::gradients, 3000},
          {data_parallel::ZeroStage::gradients, std::size_t{1} << 30}};
      for (const auto& [zero, bucket_bytes] : stages) {
        const std::string at = "batch " + std::to_string(batch) + ", stage " +
                               data_parallel::setting_text(zero) + ", buckets of " +
                               std::to_string(bucket_bytes) + " bytes, " +
                               nn::precision_name(precision) + ", rank " +
                               std::to_string(world().rank());
        nn::Model model(config, Device::cpu());
        data_parallel::CommunicatorRanks ranks(world(), collectives::Reduction::deterministic, zero,
                                               bucket_bytes);
        ranks.take_model(model);
        nn::Optimizer optimizer(ranks.stepped_parameters(model), adamw);
        train::Trainer trainer(model, optimizer, data, run, &ranks);
        nn::ModelLedger ledger(config);
        const nn::StepPrediction predicted = data_parallel::predict_rank_step(
            ledger, run.batch, run.micro_batch, adamw, world().size(), world().rank(), zero,
            nullptr, trainer.boundary_bytes(), bucket_bytes);
        for (int step = 1; step <= run.steps; ++step) {
          const MemoryStats measured = trainer.step().memory;
          EXPECT_EQ(measured.peak_total, predicted.stats.peak_total) << at << ", step " << step;
          MemoryStats::PerCategory at_peak = measured.at_peak;
          // The data set: no step's.
          at_peak[static_cast<std::size_t>(MemoryCategory::host_data)] = 0;
          EXPECT_EQ(at_peak, predicted.stats.at_peak) << at;
        }
      }
    }
  }
}

// Sharded masters (stages 1 and 2 in fp16): the model holds none from the moment the
// ranks take it (before the optimizer's state is made) and while it trains, and
// gathering them gives every rank the whole masters, the same bytes on every rank, which
// the next step shards again and steps from.
TEST(ShardedMasters, AreGatheredWholeBetweenStepsAndShardedAgain) {
  const Dataset data = testing::tiny_data(200);
  nn::ModelConfig config = testing::tiny_model(2, 0.1f);
  config.precision = nn::Precision::fp16;
  const train::TrainConfig run = uneven_shares_run(3);
  const auto masters = [](const nn::Model& model) {
    std::vector<float> all;
    for (const nn::NamedParameter& p : model.parameters()) {
      if (!p.half.defined()) continue;
      const std::vector<float> values = p.value.to_vector<float>();
      all.insert(all.end(), values.begin(), values.end());
    }
    return all;
  };
  for (const data_parallel::ZeroStage zero : {data_parallel::ZeroStage::optimizer_state,
                                              data_parallel::ZeroStage::gradients}) {
    std::vector<std::vector<float>> gathered;
    for (const bool gather_between : {false, true}) {
      nn::Model model(config, Device::cpu());
      const std::vector<float> initial = masters(model);
      data_parallel::CommunicatorRanks ranks(world(), collectives::Reduction::deterministic, zero);
      ranks.take_model(model);
      EXPECT_FALSE(model.holds_master_weights())
          << "the masters are released before the optimizer's state is made";
      nn::Optimizer optimizer(ranks.stepped_parameters(model), AdamWOptions{.lr = 1e-2});
      train::Trainer trainer(model, optimizer, data, run, &ranks);
      for (int step = 1; step <= run.steps; ++step) {
        trainer.step();
        EXPECT_FALSE(model.holds_master_weights()) << "the model holds its masters in training";
        if (gather_between) {
          ranks.gather_master_weights(model);
          ASSERT_TRUE(model.holds_master_weights());
        }
      }
      ranks.gather_master_weights(model);
      ASSERT_TRUE(model.holds_master_weights());
      const std::vector<float> mine = masters(model);
      EXPECT_NE(mine, initial) << "the steps changed no master";
      // Every rank's bytes are rank 0's: the CRC of each rank's masters, gathered.
      const std::uint32_t crc = collectives::fingerprint(
          {reinterpret_cast<const std::byte*>(mine.data()), mine.size() * sizeof(float)});
      for (const std::uint64_t other : world().all_gather(std::uint64_t{crc})) {
        EXPECT_EQ(other, crc) << "stage " << data_parallel::setting_text(zero);
      }
      gathered.push_back(mine);
    }
    EXPECT_EQ(gathered[1], gathered[0])
        << "gathering between steps changed the training, stage "
        << data_parallel::setting_text(zero);
  }
}

// Overlap: the trainer's ranks summing in buckets during the last micro-batch's backward
// (every group of gradients its own bucket, and one bucket of everything started at the
// end) save the bytes of the ranks that sum after the backward, at stages 0, 1 and 2 (2:
// during every backward, uneven micro-batch counts joining with zeros), with dropout;
// and the trainer counts the time spent in the backward's calls as the sum's.
TEST(Overlap, BucketsDuringTheLastBackwardGiveTheBitsOfOneSumAfterIt) {
  const Dataset data = testing::tiny_data(200);
  const nn::ModelConfig config = testing::tiny_model(3, 0.1f);
  const train::TrainConfig run = uneven_shares_run(3);
  for (const data_parallel::ZeroStage zero : {data_parallel::ZeroStage::replicated,
                                              data_parallel::ZeroStage::optimizer_state,
                                              data_parallel::ZeroStage::gradients}) {
    std::vector<std::vector<float>> saved;
    for (const std::size_t bucket_bytes : {std::size_t{0}, std::size_t{1}, std::size_t{1} << 30}) {
      nn::Model model(config, Device::cpu());
      data_parallel::CommunicatorRanks ranks(world(), collectives::Reduction::deterministic, zero,
                                             bucket_bytes);
      EXPECT_EQ(ranks.overlaps(), bucket_bytes > 0);
      ranks.take_model(model);
      nn::Optimizer optimizer(ranks.stepped_parameters(model), AdamWOptions{.lr = 1e-2});
      train::Trainer trainer(model, optimizer, data, run, &ranks);
      trainer.run([](const train::StepRecord& record) { EXPECT_GT(record.reduce_seconds, 0.0); });
      std::vector<float> parameters;
      for (const nn::NamedParameter& p : model.parameters()) {
        const std::vector<float> values = p.value.to_vector<float>();
        parameters.insert(parameters.end(), values.begin(), values.end());
      }
      saved.push_back(std::move(parameters));
    }
    EXPECT_EQ(saved[1], saved[0]) << "every group its own bucket, stage "
                                  << data_parallel::setting_text(zero);
    EXPECT_EQ(saved[2], saved[0]) << "one bucket started after the backward, stage "
                                  << data_parallel::setting_text(zero);
  }
}

}  // namespace
}  // namespace bigbatch

// test_device_communicator.cpp: chapter 07's ranks on CUDA tensors, summed by NCCL
// (collectives::DeviceCommunicator). One GPU is one NCCL rank (NCCL refuses two ranks on one
// device), so on one GPU these tests check what one rank can: the rank-order additions of
// the deterministic sum on the GPU against the host's, bit for bit; every collective
// leaving a one-rank buffer as it is; the overlapped sums ordered with the default stream;
// and a data-parallel trainer of one rank on the GPU, stages 0 and 1, with and without
// overlap, against the plain trainer on the GPU, bit for bit. Several ranks on
// NCCL need several GPUs. Skipped, saying why, without a GPU or without NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/train/trainer.hpp"
#include "collectives/communicator.hpp"
#include "collectives/device_communicator.hpp"
#include "common/cuda_runtime.hpp"
#include "kernels/fill.hpp"
#include "tests/harness.hpp"
#include "tests/tiny_training.hpp"

namespace bigbatch {
namespace {

using testing::tiny_data;
using testing::tiny_model;

/// Skips without a GPU or without NCCL in this build, saying which.
#define SKIP_WITHOUT_NCCL()                                                            \
  do {                                                                                 \
    BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());                                      \
    if (!collectives::DeviceCommunicator::compiled()) {                                       \
      GTEST_SKIP() << "CUDA test skipped: this build has no NCCL";                     \
    }                                                                                  \
  } while (false)

/// Values of mixed signs and magnitudes (2^-16 to 2^16), so that the order of a sum of a
/// few of them changes its rounding often.
std::vector<float> spread_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> values(n);
  std::uint32_t state = seed;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    const int exponent = static_cast<int>(state >> 27) - 16;                 // -16 .. 15
    const float mantissa = 1.0f + static_cast<float>((state >> 4) & 0xffff) / 65536.0f;
    v = std::ldexp((state & 1u) ? -mantissa : mantissa, exponent);
  }
  return values;
}

TEST(DeviceCommunicator, RankOrderAdditionsOnTheGpuAreTheHostsBitForBit) {
  SKIP_WITHOUT_NCCL();
  const int ranks = 5;
  const std::size_t n = 10'000;  // over one block of threads: the grid-stride loop runs
  const std::vector<float> pieces = spread_values(ranks * n, 7);
  // The host's sum: piece 0, then add_next_rank of pieces 1..R-1.
  std::vector<float> expected(pieces.begin(), pieces.begin() + n);
  for (int r = 1; r < ranks; ++r) {
    collectives::add_next_rank(expected, std::span<const float>(pieces.data() + r * n, n));
  }
  // The data must tell the orders apart: the reverse order differs somewhere.
  std::vector<float> reversed(pieces.begin() + (ranks - 1) * n, pieces.end());
  for (int r = ranks - 2; r >= 0; --r) {
    collectives::add_next_rank(reversed, std::span<const float>(pieces.data() + r * n, n));
  }
  ASSERT_NE(expected, reversed) << "the test's values do not tell the sums' orders apart";

  const Tensor device_pieces =
      Tensor::from_vector(pieces, {static_cast<std::int64_t>(ranks * n)}, Device::cuda());
  Tensor total({static_cast<std::int64_t>(n)}, DType::f32, Device::cuda());
  collectives::add_in_rank_order_on_device({total.data<float>(), n},
                                    {device_pieces.data<float>(), ranks * n});
  EXPECT_EQ(total.to_vector<float>(), expected);
}

TEST(DeviceCommunicator, OneRankLeavesEveryBufferAsItIs) {
  SKIP_WITHOUT_NCCL();
  collectives::Communicator& world = collectives::Communicator::world();
  if (world.size() != 1) GTEST_SKIP() << "one rank only (this process has " << world.size() << ")";
  collectives::DeviceCommunicator nccl(world);
  ASSERT_EQ(nccl.rank(), 0);
  ASSERT_EQ(nccl.size(), 1);
  const std::vector<float> values = spread_values(1001, 3);
  const auto n = static_cast<std::int64_t>(values.size());
  for (const collectives::Reduction reduction :
       {collectives::Reduction::deterministic, collectives::Reduction::engine}) {
    Tensor buffer = Tensor::from_vector(values, {n}, Device::cuda());
    const std::span<float> on_device(buffer.data<float>(), values.size());
    nccl.all_reduce_sum(on_device, reduction);
    EXPECT_EQ(buffer.to_vector<float>(), values) << collectives::reduction_name(reduction);
    nccl.reduce_scatter_sum(on_device, reduction);
    EXPECT_EQ(buffer.to_vector<float>(), values) << collectives::reduction_name(reduction);
    nccl.all_gather_shares(on_device);
    EXPECT_EQ(buffer.to_vector<float>(), values);
  }
  // 16-bit words (bf16 working copies), moved as bytes: any pattern comes back as it was.
  const std::vector<std::uint16_t> words = {1, 0x3c00, 0xfbff, 7, 0x8000};
  const std::size_t bytes = words.size() * sizeof(std::uint16_t);
  Tensor sixteen({static_cast<std::int64_t>(words.size())}, DType::bf16, Device::cuda());
  cuda_rt::memcpy(sixteen.raw_data(), words.data(), bytes, cuda_rt::CopyKind::host_to_device);
  nccl.all_gather_shares(
      std::span<std::uint16_t>(static_cast<std::uint16_t*>(sixteen.raw_data()), words.size()));
  std::vector<std::uint16_t> back(words.size());
  cuda_rt::memcpy(back.data(), sixteen.raw_data(), bytes, cuda_rt::CopyKind::device_to_host);
  EXPECT_EQ(back, words);
}

// Overlap's side stream is ordered by events: the sums it starts wait for the default
// stream's work queued before (here a fill that must land first), and after join_beside
// the default stream's next work waits for them (a fill that must land last). The
// deterministic sum of one rank copies its buffer out and writes the sum back, so a sum
// run out of order would leave the other value. A buffer of 64 Mi floats: long enough
// that a missing wait would lose the race.
TEST(DeviceCommunicator, SumsBesideTheDefaultStreamKeepItsOrder) {
  SKIP_WITHOUT_NCCL();
  collectives::Communicator& world = collectives::Communicator::world();
  if (world.size() != 1) GTEST_SKIP() << "one rank only (this process has " << world.size() << ")";
  collectives::DeviceCommunicator nccl(world);
  const std::int64_t n = std::int64_t{1} << 26;
  for (const bool own_shards : {false, true}) {
    Tensor buffer = Tensor::zeros({n}, DType::f32, Device::cuda());
    const std::span<float> on_device(buffer.data<float>(), static_cast<std::size_t>(n));
    const std::span<float> buckets[] = {on_device};
    fill(buffer, 2.0);  // queued: the sum must wait for it
    nccl.start_beside(buckets, collectives::Reduction::deterministic, own_shards);
    nccl.join_beside();
    const std::vector<float> after_sum = buffer.to_vector<float>();
    EXPECT_EQ(after_sum.front(), 2.0f);
    EXPECT_EQ(after_sum.back(), 2.0f);
    nccl.start_beside(buckets, collectives::Reduction::deterministic, own_shards);
    nccl.join_beside();
    fill(buffer, 3.0);  // queued after the join: it must land after the sum's write
    const std::vector<float> after_fill = buffer.to_vector<float>();
    EXPECT_EQ(after_fill.front(), 3.0f);
    EXPECT_EQ(after_fill.back(), 3.0f);
  }
}

std::vector<std::vector<float>> values(const nn::Model& model) {
  std::vector<std::vector<float>> all;
  for (const nn::NamedParameter& p : model.parameters()) all.push_back(p.value.to_vector<float>());
  return all;
}

// One rank on the GPU is the single process on the GPU: its sum over one rank leaves the
// gradients as they are, its stage 1 shard is every element (the f32 masters' too, held
// by the group and gathered back at the end), and its optimizer steps the same tensors (at
// stage 1 through views of them). fp16 with dynamic scaling, so that the boundary measures
// the pieces the ranks give it and the f16 working copies are gathered; the sums after
// the backward and overlapping it on NCCL's side stream (every group its own bucket).
TEST(DeviceCommunicator, OneRankTrainsAsTheSingleProcessOnTheGpuBitForBit) {
  SKIP_WITHOUT_NCCL();
  collectives::Communicator& world = collectives::Communicator::world();
  if (world.size() != 1) GTEST_SKIP() << "one rank only (this process has " << world.size() << ")";
  const Dataset data = tiny_data(200);
  train::TrainConfig config;
  config.batch = 37;
  config.micro_batch = 5;
  config.steps = 3;
  config.seed = 3;
  config.loss_scaling = loss_scaling::LossScaleRule::dynamic;
  nn::ModelConfig model_config = tiny_model(2, 0.1f);
  model_config.precision = nn::Precision::fp16;
  const auto run = [&](data_parallel::RankGroup* ranks) {
    nn::Model model(model_config, Device::cuda());
    if (ranks) ranks->take_model(model);
    nn::Optimizer optimizer(ranks ? ranks->stepped_parameters(model) : model.parameters(),
                            AdamWOptions{.lr = 1e-2});
    train::Trainer trainer(model, optimizer, data, config, ranks);
    std::vector<float> losses;
    for (int k = 0; k < config.steps; ++k) losses.push_back(trainer.step().loss);
    EXPECT_GT(optimizer.steps_taken(), 0) << "every step skipped: nothing was compared";
    if (ranks) ranks->gather_master_weights(model);
    return std::pair{losses, values(model)};
  };
  const auto plain = run(nullptr);
  for (const auto zero : {data_parallel::ZeroStage::replicated,
                          data_parallel::ZeroStage::optimizer_state}) {
    for (const collectives::Reduction reduction :
         {collectives::Reduction::deterministic, collectives::Reduction::engine}) {
      for (const std::size_t bucket_bytes : {std::size_t{0}, std::size_t{1}}) {
        data_parallel::CommunicatorRanks ranks(world, reduction, zero, bucket_bytes);
        EXPECT_EQ(run(&ranks), plain) << "stage " << data_parallel::setting_text(zero) << ", "
                                      << collectives::reduction_name(reduction) << ", buckets of "
                                      << bucket_bytes << " bytes";
      }
    }
  }
}

}  // namespace
}  // namespace bigbatch

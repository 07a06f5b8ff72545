// data_parallel.hpp: chapter 07's component, the ranks of a data-parallel step.
//
// The step's b samples are split into R contiguous shares (collectives::share_of); each rank
// accumulates its share locally, every sample's loss divided by the GLOBAL count b, and once
// per optimizer step the R gradients are summed, so that every rank steps on the same sum:
//
//   model.zero_grad()
//   for share r in ranks.parts(b):           // this rank's; every rank's when simulated
//     loss_r = accumulate_gradients(model, rows of share r, ..., global count b)
//     ranks.part_done(share r, model)
//   loss = ranks.reduce(model, {loss_r})     // the summed gradients in model's buffers
//   boundary: unscale, check, clip, step     // chapter 04, unchanged
//
// SimulatedRanks, one process, gives the bits of R processes under MPI (rank-order sums).
// Why and how: docs/internals.md#chapters07_data_paralleldata_parallelhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chapters/04_dynamic_loss_scaling/optimizer_boundary.hpp"
#include "chapters/train/gradient_sync.hpp"
#include "collectives/bucketed_sum.hpp"
#include "collectives/communicator.hpp"
#include "collectives/device_communicator.hpp"
#include "nn/memory_model.hpp"
#include "nn/model.hpp"

namespace bigbatch::data_parallel {

/// What the ranks keep a shard of (DeepSpeed's ZeRO stages), the rest being replicated.
enum class ZeroStage {
  replicated = 0,       ///< stage 0: every rank holds every parameter's optimizer state
  optimizer_state = 1,  ///< stage 1: each rank the state of its shard of every parameter
  gradients = 2,        ///< stage 2: and the gradient of that shard, summed over ranks after
                        ///< every micro-batch; the model's gradients live only in a backward
};
/// "0", "1" or "2": the stage's setting text.
std::string setting_text(ZeroStage stage);

/// Rank `rank`'s shard of a tensor's elements, collectives::share_of(numel, ranks, rank), as a
/// one-dimensional view (it shares the tensor's storage; 0 elements when numel < ranks
/// leaves this rank none).
Tensor shard_view(const Tensor& tensor, int ranks, int rank);
/// The same shard of every parameter: its value, gradient and working copy as views. An
/// optimizer made over these steps, and allocates state for, the shard alone.
std::vector<nn::NamedParameter> parameter_shards(const std::vector<nn::NamedParameter>& parameters,
                                                 int ranks, int rank);
/// What rank `rank` of R holds of the state of `model` (any model's ledger;
/// nn::HeldElements): everything at stage 0; at stages 1 and 2 its shard of every trainable
/// tensor's optimizer state and of every f32 master (mixed precision: the 16-bit working
/// copies stay whole); at stage 2 also its shard of every gradient, held through the step.
/// At stage 2 with bucket_bytes > 0 the gradients are summed in buckets of at least that
/// many bytes, overlapping the backward (HeldElements::gradient_bucket_bytes).
nn::HeldElements held_elements(const nn::NetworkLedger& model, int ranks, int rank,
                               ZeroStage zero, std::size_t bucket_bytes = 0);
/// The memory of rank `rank`'s step of a batch of `batch` under MPI (CommunicatorRanks), by
/// category: nn::predict_step of its share (its micro-batches, its staging buffer), holding
/// held_elements: at stage 2 the model's gradients are released after each group's sum
/// (with bucket_bytes > 0, after its bucket's).
/// A rank with fewer micro-batches than rank 0 joins the sums it lacks with zeros of one
/// group at a time after its backward: less than its backward held. The collectives'
/// buffers are host memory of the engine's and of collectives/ (not counted by the
/// allocator, as a GPU run's would not be either).
nn::StepPrediction predict_rank_step(nn::NetworkLedger& model, std::int64_t batch,
                                     std::int64_t micro_batch,
                                     const nn::Optimizer::Options& optimizer, int ranks,
                                     int rank, ZeroStage zero,
                                     nn::BlockLedgerRunner* runner = nullptr,
                                     std::size_t held_workspace = 0,
                                     std::size_t bucket_bytes = 0);

/// The device of a rank that is local rank `local_rank` of `local_ranks` ranks on a machine
/// with `devices` GPUs, asked for `requested` (every rank is started with the same
/// --device): the CPU, or the requested GPU when the rank is alone on its machine (or the
/// machine has no GPU: the device check names that); with several ranks on a machine, GPU
/// cuda:local_rank, one each, since NCCL holds one rank per GPU. Throws
/// std::invalid_argument when several ranks on a machine ask for a GPU other than cuda:0
/// by name (they cannot all have it), or outnumber its GPUs.
Device device_of_rank(Device requested, int local_rank, int local_ranks, int devices);

/// The gradient statistics of disjoint parts measured apart, as one: an overflow in any
/// part, the parts' squared norms added in the given (rank) order, one square root.
loss_scaling::GradientStats combine_in_rank_order(std::span<const loss_scaling::GradientStats> parts);

/// The ranks of a data-parallel step: how the trainer's one step (train::GradientSync) gets
/// its batch's gradient when each rank computes its share. Summing whole gradients once per
/// step (stage 0, no overlap) asks only what every nn::Network has: its parameters and
/// their gradients, so the GPT's ranks are the MLP's. Overlap and ZeRO also need the model
/// to tell when a group of gradients is final during the backward and to release
/// gradients and masters (nn::Network::releases_state): the MLP has those.
class RankGroup : public train::GradientSync {
 public:
  /// R, the ranks the batch is split over.
  virtual int ranks() const = 0;
  /// The ranks whose shares this process computes, in rank order: its own under MPI,
  /// all R in a simulation.
  virtual std::vector<int> local_ranks() const = 0;
  /// What the ranks shard.
  virtual ZeroStage zero() const = 0;
  /// Whether the sum starts during the last micro-batch's backward (overlap): the step
  /// then has accumulate_gradients tell gradients_ready, and reduce() finishes the sum.
  virtual bool overlaps() const { return false; }
  /// Whether the ranks sum after every micro-batch (stage 2): the step then has
  /// accumulate_gradients tell gradients_ready in every backward, not only the last.
  bool sums_every_micro_batch() const { return zero() == ZeroStage::gradients; }

  /// Refuses ranks that outnumber the samples of the run's smallest batch (every rank needs
  /// a sample of every batch), and ZeRO or overlap for a model that does not release its
  /// state (nn::Network::releases_state).
  void check_run(const nn::Network& model, std::int64_t smallest_batch) const final;
  /// The shares of local_ranks() (collectives::share_of: the first samples mod R ranks take one
  /// sample more).
  std::vector<train::BatchPart> parts(std::int64_t samples) const final;
  /// At stage 2: rank 0's share, the largest, runs ceil(share / micro_batch) micro-batches,
  /// and every rank takes part in as many sums (start_rounds).
  void start_step(nn::Network& model, std::int64_t samples, std::int64_t micro_batch) final;
  /// With overlap or at stage 2: group_ready, in the last backward of a share or in every one.
  nn::GradientsReady gradients_ready(nn::Network& model) final;
  nn::TellGradients tell() const final;
  /// share_done(part.rank, model).
  void part_done(const train::BatchPart& part, nn::Network& model) final;

  /// The model the trainer trains with this group, once, before its optimizer is made
  /// from stepped_parameters: at stages 1 and 2 under MPI the group takes over its f32
  /// masters (mixed precision) and at stage 2 its gradients
  /// (CommunicatorRanks::take_model); nothing to do otherwise.
  virtual void take_model(nn::Network& /*model*/) {}
  /// Between steps: the model's whole f32 masters again, for whoever reads them (a save, a
  /// snapshot, a comparison). Under MPI at stages 1 and 2 in fp16 or bf16 each rank holds
  /// only its shard of every master, and this gathers them (a collective: every rank calls
  /// it, at the same step); the next step's start shards them again. Nothing otherwise.
  virtual void gather_master_weights(nn::Network& /*model*/) {}
  /// The same masters gathered into host memory instead (MemoryCategory::host_data: not on
  /// the device, whose room the steps fill), by name, for nn::Model::save; empty when the
  /// model holds its masters. A collective like gather_master_weights.
  virtual std::map<std::string, Tensor> gathered_masters(const nn::Network& /*model*/) {
    return {};
  }

 protected:
  /// After rank r's share has been accumulated into the model's gradients, which were zero
  /// before it.
  virtual void share_done(int rank, nn::Network& model) = 0;
  /// Before a step's shares, at stage 2: every rank takes part in `micro_batches` sums (a
  /// rank with fewer adds zeros in the sums it lacks). Releases the model's gradients (the
  /// first step finds them allocated) and, where the group shards them, its masters (once
  /// it holds its shards of them), before the step's memory is measured.
  virtual void start_rounds(nn::Network& /*model*/, std::int64_t /*micro_batches*/) {}
  /// During the last micro-batch's backward of this rank's share (every micro-batch's at
  /// stage 2): model.parameters()[first, end) hold their final gradients for the step
  /// (for the micro-batch at stage 2; nn::GradientsReady).
  virtual void group_ready(nn::Network& /*model*/, std::size_t /*first*/, std::size_t /*end*/) {}
};

/// R ranks in one process: share r's gradient is kept in buffer r, and the buffers are
/// added in rank order. Costs R gradient copies (MemoryCategory::gradients).
///
/// At stage 2 the ranks sum after every micro-batch: round m's sum is the ranks' gradients
/// of their micro-batch m added in rank order (zeros for a rank with fewer micro-batches),
/// and the step's gradient is round 0's sum plus round 1's, and so on (kernels' axpy), as
/// each rank under MPI accumulates its shard: one buffer per round, and the total.
class SimulatedRanks final : public RankGroup {
 public:
  /// R >= 1 simulated ranks of `model` (whose gradients it copies, on the model's device:
  /// the CPU, where collectives::add_next_rank runs). At stage 1 the one optimizer steps every
  /// shard (the optimizer acts element by element: the R ranks' steps together), and the
  /// boundary measures the R shards as the R ranks do.
  SimulatedRanks(int ranks, const nn::Network& model,
                 ZeroStage zero = ZeroStage::replicated);
  int ranks() const override { return ranks_; }
  std::vector<int> local_ranks() const override;
  float reduce(nn::Network& model, std::span<const float> losses) override;
  ZeroStage zero() const override { return zero_; }
  loss_scaling::GradientPieces boundary_pieces(const nn::Network& model) override;
  std::vector<nn::NamedParameter> stepped_parameters(const nn::Network& model) const override;

 private:
  void share_done(int rank, nn::Network& model) override;
  /// Stage 2: adds the micro-batch's gradients to the round's sum and releases them.
  void group_ready(nn::Network& model, std::size_t first, std::size_t end) override;

  int ranks_;
  std::vector<std::vector<Tensor>> buffers_;  // [rank][parameter], stages 0 and 1
  ZeroStage zero_;
  // Stage 2.
  std::vector<std::vector<Tensor>> round_sums_;  // [micro-batch][parameter]
  std::vector<Tensor> totals_;                   // [parameter]: the step's gradients
  int rank_ = 0;                 // the rank whose share runs now
  std::size_t round_ = 0;        // its micro-batches done
  std::size_t rounds_ = 0;       // rank 0's, this step's
};

/// This process as one rank of a run under MPI: reduces with the communicator, host
/// gradients on MPI and CUDA gradients on NCCL (collectives::DeviceCommunicator, made at the
/// first sum of device memory: a collective every rank reaches at the same step, after the
/// ranks have agreed on their settings).
///
/// With bucket_bytes > 0 the sum overlaps the last micro-batch's backward: the gradients
/// are gathered, in the order the backward finishes them (the head, the last block, ...,
/// the stem), into buckets of at least bucket_bytes (the last one what remains), and each
/// bucket's sum starts as soon as it is full (collectives::BucketedSum on MPI; for CUDA
/// gradients, NCCL's side stream, DeviceCommunicator::start_beside); reduce() waits for the
/// rest (on the GPU, has the default stream wait). At stage 2 every backward's groups go
/// into buckets the same way, and a bucket's reduce-scatters move while the backward
/// computes the next one: when that one is full (or the backward ends) the bucket in flight
/// is waited for, its sums added to the shards and its gradients released, so a rank holds
/// at most two buckets of the model's gradients besides the group being computed. Under the
/// deterministic reduction every element is the same rank-order sum as without buckets, so
/// the bits are those of bucket_bytes = 0 (one sum per tensor after the backward) and of
/// the simulation.
class CommunicatorRanks final : public RankGroup {
 public:
  /// With bucket_bytes > 0, the first step's backward makes the buckets' communicators
  /// (collectives::BucketedSum for host gradients, NCCL's for CUDA ones: collectives), after the
  /// ranks have compared their settings.
  CommunicatorRanks(collectives::Communicator& communicator, collectives::Reduction reduction,
                    ZeroStage zero = ZeroStage::replicated, std::size_t bucket_bytes = 0);
  /// Stages 1 and 2 in fp16 or bf16: allocates this rank's shard of every f32 master
  /// (MemoryCategory::master_weights), which the optimizer steps, copies the model's
  /// masters into them and releases the model's; each step's start does so again when the
  /// model holds its masters (after a resume or gather_master_weights, which a resume
  /// needs first: loading writes whole masters). The model keeps its 16-bit working copies
  /// whole: after the step, those are what is gathered.
  /// Stage 2: releases `model`'s gradients, then allocates this rank's shard of each
  /// (MemoryCategory::gradients, on its device), where the sums accumulate: the whole
  /// gradients and the shards are never live together.
  void take_model(nn::Network& model) override;
  int ranks() const override { return communicator_.size(); }
  std::vector<int> local_ranks() const override { return {communicator_.rank()}; }
  /// Stage 0: an all-reduce of every gradient; stage 1: a reduce-scatter. With buckets,
  /// the last bucket's sum starts here and every bucket's is waited for.
  float reduce(nn::Network& model, std::span<const float> losses) override;
  bool overlaps() const override { return bucket_bytes_ > 0; }
  double take_seconds_in_backward() override;
  ZeroStage zero() const override { return zero_; }
  /// Stage 1: this rank's shards, combined over the ranks (an all-gather of each rank's
  /// found-inf and squared norm, added in rank order).
  loss_scaling::GradientPieces boundary_pieces(const nn::Network& model) override;
  std::vector<nn::NamedParameter> stepped_parameters(const nn::Network& model) const override;
  /// Every rank's shard of each f32 value to every rank, but of a sharded master only of
  /// its 16-bit working copy: 2 bytes an element where the master has 4.
  void after_step(nn::Network& model) override;
  void gather_master_weights(nn::Network& model) override;
  std::map<std::string, Tensor> gathered_masters(const nn::Network& model) override;
  /// Stage 1, for a snapshot: `whole`, an optimizer over every parameter with `mine`'s
  /// options, takes every rank's shard of `mine`'s state (a collective: every rank calls
  /// it, at the same step), so that the snapshot holds stage 0's tensors.
  void gather_optimizer_state(const nn::Optimizer& mine, nn::Optimizer& whole);
  /// And back, resuming: `mine` takes this rank's shard of `whole`'s state.
  void take_optimizer_shard(const nn::Optimizer& whole, nn::Optimizer& mine) const;

 private:
  void share_done(int, nn::Network&) override {}
  /// Adds the gradients to the open bucket, starts its sum when it holds bucket_bytes,
  /// and lets the engine move the started sums on. Stage 2: reduce-scatters them at once,
  /// adds this rank's shard of the sum to its own (round 0 copies it) and releases them;
  /// with buckets, in buckets (above).
  void group_ready(nn::Network& model, std::size_t first, std::size_t end) override;
  void start_rounds(nn::Network& model, std::int64_t micro_batches) override;
  /// Starts the open bucket's sum and empties it.
  void start_open_bucket(Device device);
  /// Starts the sums of a bucket of buffers on `device`'s engine: collectives::BucketedSum for
  /// host memory (made on the first call, a collective), NCCL's side stream for CUDA.
  void start_bucket(std::span<const std::span<float>> buffers, Device device);
  /// Waits for every bucket started (on the GPU, has the default stream wait).
  void wait_for_buckets();
  /// The collectives of t's memory: the communicator for host tensors, NCCL's for CUDA
  /// tensors (made on the first call).
  collectives::Collectives& collectives_of(const Tensor& t);
  /// NCCL's communicator, made on the first call (a collective).
  collectives::DeviceCommunicator& device_communicator();
  /// Master i whole in `whole` (the model's, or a host copy): this rank's shard written
  /// in, every rank's gathered.
  void gather_master(std::size_t i, const Tensor& whole);
  /// The sum over ranks of a gradient: all of it (stage 0) or this rank's shard (stage 1).
  void sum_gradient(const Tensor& gradient);
  /// Every rank's shard of t (f32, or a 16-bit working copy) to every rank, in place.
  void gather_shares(const Tensor& t);
  /// Stage 2: reduce-scatters gradients[first, end) (parameters()' order) and adds this
  /// rank's shard of each sum to its own.
  void sum_round(const std::vector<Tensor>& gradients, std::size_t first, std::size_t end);
  /// Stages 1 and 2 in 16 bits, when the model holds its masters: copies this rank's shard
  /// of each into master_shards_ and releases the model's.
  void take_master_shards(nn::Network& model);
  /// Stage 2: adds the summed gradient `summed` of parameter i (this rank's shard of it
  /// holds the sum) to the shard held; the step's first round copies it.
  void add_to_shard(std::size_t i, const Tensor& summed);
  /// Stage 2 with buckets: adds gradients[first, end) to the open bucket; when it holds
  /// bucket_bytes, or the group is the backward's last (the stem's), waits for the bucket
  /// in flight (adding its sums to the shards, releasing its gradients) and starts the open
  /// one's reduce-scatters; after the last group, waits for that one too.
  void add_to_round_bucket(const std::vector<Tensor>& gradients, std::size_t first,
                           std::size_t end);
  /// Stage 2 with buckets: waits for the bucket in flight and adds its sums to the shards.
  void finish_round_bucket();

  collectives::Communicator& communicator_;
  collectives::Reduction reduction_;
  ZeroStage zero_;
  std::size_t bucket_bytes_ = 0;
  std::unique_ptr<collectives::DeviceCommunicator> on_device_;  // made at the first CUDA sum
  std::unique_ptr<collectives::BucketedSum> buckets_;  // host gradients: made in the first
                                                // overlapped backward
  std::vector<std::span<float>> open_bucket_;   // final gradients not yet sent
  std::size_t open_bytes_ = 0;
  std::size_t gradients_sent_ = 0;  // this step's, to check that every one was
  double seconds_in_backward_ = 0;
  // Stages 1 and 2 under mixed precision: this rank's shard of every parameter's master
  // (undefined for a parameter without one); empty when the masters are not sharded.
  std::vector<Tensor> master_shards_;
  // Stage 2.
  std::vector<Tensor> shard_gradients_;  // this rank's shard of every gradient
  std::vector<std::pair<std::size_t, std::size_t>> groups_;  // as a backward tells them
  // Stage 2 with buckets: the gradients (parameter index, tensor) of the bucket filling and
  // of the one whose sums are in flight, held here after the model releases them.
  struct RoundBucket {
    std::vector<std::pair<std::size_t, Tensor>> gradients;
    std::size_t bytes = 0;
  };
  RoundBucket open_round_, summing_round_;
  std::int64_t rounds_ = 0, rounds_done_ = 0;                // this step's
};

/// The sum of per-rank losses in rank order, as both groups report it.
float sum_in_rank_order(std::span<const float> losses);

}  // namespace bigbatch::data_parallel

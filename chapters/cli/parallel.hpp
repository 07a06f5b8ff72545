// parallel.hpp: the ranks of a `bigbatch train` run (chapter 07): --data-parallel under an
// MPI launcher, or --simulate-ranks R in one process; off, one process on whole batches.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/06_planner/planner.hpp"
#include "chapters/07_data_parallel/data_parallel.hpp"
#include "chapters/cli/options.hpp"
#include "chapters/train/run_settings.hpp"
#include "collectives/communicator.hpp"
#include "nn/model.hpp"

namespace bigbatch::cli {

class RunRanks {
 public:
  /// Refuses the flags that do not go with the ranks (UsageError: --plan with
  /// --simulate-ranks, --reduction or --bucket-size without --data-parallel, --zero without
  /// ranks) and, with --data-parallel, joins the MPI job. Rank 0 alone prints and writes
  /// files (snapshots included).
  explicit RunRanks(const TrainOptions& options);

  bool enabled() const { return count_ > 1 || options_.data_parallel || options_.simulate_ranks > 0; }
  /// R, the ranks each batch is split over (1 when off).
  int count() const { return count_; }
  /// This process's rank (0 when it is the only process).
  int rank() const { return communicator_ ? communicator_->rank() : 0; }
  /// Whether this process prints, saves and logs: rank 0.
  bool writes() const { return rank() == 0; }
  /// On every rank but 0: stdout silenced, and no --save, --log or --eval-every, so that
  /// rank 0 alone prints and writes.
  void quiet_other_ranks(TrainOptions& options) const;

  /// Refuses a run the ranks cannot split: a batch (the epoch's short last one included)
  /// with fewer samples than ranks, a CUDA device the ranks cannot sum on (the simulation
  /// adds on the CPU; a bigbatch without NCCL).
  void check_run(const TrainOptions& options, std::int64_t samples) const;
  /// The same for the MLP, and BatchNorm (each rank would normalise and update its running
  /// statistics by its share alone).
  void check_run(const TrainOptions& options, const nn::ModelConfig& model,
                 std::int64_t samples) const;
  /// The run's settings with the ranks' own when they are on: "ranks" (R: the rank-order
  /// sum's bits depend on it, so a snapshot resumes only with the same R), "reduction" and,
  /// under ZeRO, "zero".
  train::RunConfig with_settings(train::RunConfig settings) const;
  /// Under MPI: every rank must have the same settings and start from the same state (the
  /// parameters, the optimizer's state and the steps done, fresh or resumed); otherwise
  /// every rank throws UsageError naming the first rank that differs.
  void check_agreement(const train::RunConfig& settings, const nn::Network& model,
                       const nn::Optimizer& optimizer, std::int64_t steps_done) const;
  /// Under MPI, after training: every rank's parameters are still rank 0's (they see the
  /// same summed gradients, so only a bug parts them): those the model holds, so under
  /// ZeRO in 16 bits the working copies and not the masters' shards, unless gathered;
  /// otherwise every rank throws std::runtime_error.
  void check_parameters_agree(const nn::Network& model) const;
  /// Whether `mine` holds on any rank (a collective under MPI, so that the ranks stop after
  /// the same step when a signal reaches them at different moments); `mine` when alone.
  bool any(bool mine) const;
  /// The trainer's ranks (null when off), made on the first call (under --zero 1 and 2 and
  /// MPI the ranks take over the model's masters and gradients: RankGroup::take_model).
  data_parallel::RankGroup* group(nn::Network& model);
  /// Between steps, before the model's f32 masters are read (a snapshot, a save, the
  /// check that the ranks agree): the ranks' shards of them gathered into the model
  /// (RankGroup::gather_master_weights, a collective under --zero 1 and 2 in fp16 or bf16).
  void gather_master_weights(nn::Network& model);
  /// The same into host memory, by name, for nn::Model::save (RankGroup::gathered_masters;
  /// empty when the model holds its masters). A collective.
  std::map<std::string, Tensor> gathered_masters(nn::Network& model);

  /// The parameters this process's optimizer steps: the model's, or under --zero 1 and 2
  /// and MPI this rank's shard of each (at stage 2 with the gradient shards it holds).
  std::vector<nn::NamedParameter> stepped_parameters(nn::Network& model);
  /// Under --zero 1 or 2 and MPI, an optimizer over every parameter with `optimizer`'s options
  /// (what a snapshot holds); null otherwise (`optimizer` holds the whole state). With
  /// `gather`, it takes every rank's shard of `optimizer`'s state: a collective, every rank
  /// calls it at the same step.
  std::unique_ptr<nn::Optimizer> whole_optimizer(nn::Network& model,
                                                 const nn::Optimizer& optimizer, bool gather);
  /// Resumed into whole_optimizer(..., false): `optimizer` takes this rank's shard.
  void take_shard(const nn::Optimizer& whole, nn::Optimizer& optimizer) const;
  /// This rank's device, asked for `requested` (data_parallel::device_of_rank: under MPI
  /// with several ranks on a machine, the GPU of its place on it). Throws UsageError for
  /// what device_of_rank refuses.
  Device device_of_this_rank(Device requested) const;
  /// The step each rank's memory must hold under MPI: rank 0's (the largest share, and at
  /// ZeRO stage 1 the largest shard of the optimizer state), of `whole`, the batch's step.
  /// Unchanged in one process: the simulation holds every rank's gradients besides.
  checkpointing::StepShape rank_step(checkpointing::StepShape whole) const;
  /// The samples of a batch of `batch` that each rank's memory must hold under MPI: rank
  /// 0's share, the largest; `batch` in one process.
  std::int64_t rank_batch(std::int64_t batch) const;
  /// The ranks `bigbatch train --plan auto` plans rank 0's share of (nullopt when off).
  std::optional<int> planned_ranks() const;
  /// The plan every rank trains with: `plan`'s on rank 0, sent to the others (which wait
  /// for it without spinning: rank 0 may be measuring the cost model), so that ranks whose
  /// own measurements would differ cannot choose apart. Alone, `plan`'s.
  planning::Plan agreed_plan(const std::function<planning::Plan()>& plan) const;
  /// "data parallel: 2 ranks under MPI, shares of 32 samples ..." for the run's header.
  std::string describe(std::int64_t batch, std::int64_t micro_batch,
                       nn::Precision precision) const;

 private:

  const ParallelOptions& options_;
  collectives::Communicator* communicator_ = nullptr;
  int count_ = 1;
  std::unique_ptr<data_parallel::RankGroup> group_;
  data_parallel::CommunicatorRanks* sharded_ = nullptr;  // group_ under --zero 1, 2 and MPI
};

}  // namespace bigbatch::cli

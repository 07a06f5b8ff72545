// parallel.cpp: --data-parallel and --simulate-ranks, from flags to the trainer's ranks.
#include "chapters/cli/parallel.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "chapters/cli/setup.hpp"
#include "common/cuda_runtime.hpp"
#include "common/format.hpp"
#include "common/integer_math.hpp"

namespace bigbatch::cli {
namespace {

/// The CRC of a tensor's bytes (a CUDA tensor's copied to the host), continuing from
/// `crc`; an undefined tensor adds nothing.
std::uint32_t add_fingerprint(const Tensor& t, std::uint32_t crc) {
  if (!t.defined()) return crc;
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  return collectives::fingerprint(
      {static_cast<const std::byte*>(host.raw_data()), host.nbytes()}, crc);
}

/// The CRC of every parameter's bytes (the f32 values and any 16-bit working copy).
std::uint32_t parameters_fingerprint(const nn::Network& model) {
  std::uint32_t crc = 0;
  for (const nn::NamedParameter& p : model.parameters()) {
    crc = add_fingerprint(p.half, add_fingerprint(p.value, crc));
  }
  return crc;
}

/// The first rank whose fingerprint is not rank 0's, or -1.
int first_different(const std::vector<std::uint64_t>& fingerprints) {
  for (std::size_t r = 1; r < fingerprints.size(); ++r) {
    if (fingerprints[r] != fingerprints[0]) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace

RunRanks::RunRanks(const TrainOptions& options) : options_(options.parallel) {
  const bool on = options_.data_parallel || options_.simulate_ranks > 0;
  if (!options_.data_parallel && options.was_given("--reduction")) {
    throw UsageError("--reduction sums the ranks of --data-parallel: give --data-parallel "
                     "(--simulate-ranks always adds in rank order)");
  }
  if (!options_.data_parallel && options.was_given("--bucket-size")) {
    throw UsageError("--bucket-size overlaps the ranks' sum under --data-parallel: give "
                     "--data-parallel (--simulate-ranks has no sum to overlap; its bits are "
                     "those of every bucket size)");
  }
  if (!on && options.was_given("--zero")) {
    throw UsageError("--zero shards the ranks' state: give --data-parallel or --simulate-ranks");
  }
  if (!on) return;
  if (!options_.data_parallel && options.was_given("--plan")) {
    throw UsageError("--simulate-ranks does not take --plan: the simulation holds every "
                     "rank's gradients on one device, and the planner plans one rank's step "
                     "(plan it under --data-parallel)");
  }
  if (options_.data_parallel) {
    try {
      communicator_ = &collectives::Communicator::world();
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--data-parallel: ") + e.what());
    }
    count_ = communicator_->size();
  } else {
    if (options_.simulate_ranks > std::min<std::int64_t>(options.train.batch,
                                                          std::numeric_limits<int>::max())) {
      throw UsageError("--simulate-ranks " + std::to_string(options_.simulate_ranks) +
                       ": more ranks than --batch " + std::to_string(options.train.batch) +
                       " has samples, each rank needs one");
    }
    count_ = static_cast<int>(options_.simulate_ranks);
  }
}

void RunRanks::quiet_other_ranks(TrainOptions& options) const {
  if (writes()) return;
  if (!std::freopen("/dev/null", "w", stdout)) {
    throw std::runtime_error("rank " + std::to_string(rank()) + ": cannot silence stdout");
  }
  options.output.save.clear();
  options.output.log.clear();
  options.output.eval_every = 0;
}

void RunRanks::check_run(const TrainOptions& options, const nn::ModelConfig& model,
                         std::int64_t samples) const {
  if (enabled() && model.norm == nn::Norm::batch) {
    throw UsageError("--norm batch with " + std::to_string(count_) +
                     (count_ == 1 ? " rank" : " ranks") + ": each rank would normalise its "
                     "share with its own statistics and keep its own running statistics, so "
                     "the ranks' models would part; use --norm layer");
  }
  check_run(options, samples);
}

void RunRanks::check_run(const TrainOptions& options, std::int64_t samples) const {
  if (!enabled()) return;
  const std::string ranks = std::to_string(count_) + (count_ == 1 ? " rank" : " ranks");
  if (!options.source.device.is_cpu()) {
    const std::string device = "--device " + options.source.device.name();
    if (!communicator_) {
      throw UsageError(device + " with --simulate-ranks: the simulation adds its ranks' "
                       "gradients on the CPU; use --device cpu, or --data-parallel (NCCL)");
    }
    if (!collectives::DeviceCommunicator::compiled()) {
      throw UsageError(device + " with " + ranks + ": the ranks sum CUDA gradients on NCCL, "
                       "and this bigbatch was built without it (nccl.h and libnccl beside the "
                       "CUDA toolkit); use --device cpu");
    }
  }
  const std::int64_t batch = options.train.batch;
  const std::int64_t last = options.train.drop_last || samples % batch == 0 ? batch
                                                                              : samples % batch;
  if (std::min(batch, samples) < count_ || last < count_) {
    throw UsageError(ranks + " need a sample each in every batch: " +
                     (last < batch ? "each epoch's last batch has " + std::to_string(last) +
                                         " (--drop-last drops it)"
                                   : "--batch is " + std::to_string(batch)));
  }
}

train::RunConfig RunRanks::with_settings(train::RunConfig settings) const {
  if (!enabled()) return settings;
  settings["ranks"] = std::to_string(count_);
  // The simulation adds in rank order: the deterministic reduction's bits.
  settings["reduction"] = collectives::reduction_name(
      communicator_ ? options_.reduction : collectives::Reduction::deterministic);
  // Recorded when on, so that the settings of the runs before stage 1 existed read as before.
  if (options_.zero != data_parallel::ZeroStage::replicated) {
    settings["zero"] = data_parallel::setting_text(options_.zero);
  }
  return settings;
}

void RunRanks::check_agreement(const train::RunConfig& settings, const nn::Network& model,
                               const nn::Optimizer& optimizer, std::int64_t steps_done) const {
  if (!communicator_ || count_ == 1) return;
  std::string text;
  for (const auto& [name, value] : settings) text += name + "=" + value + "\n";
  // Not a trajectory setting (the deterministic sum's bits are every bucket size's), but
  // the ranks' buckets must be the same messages.
  text += "bucket-size=" + std::to_string(options_.bucket_bytes) + "\n";
  const int setting = first_different(communicator_->all_gather(
      static_cast<std::uint64_t>(collectives::fingerprint(text))));
  if (setting >= 0) {
    throw UsageError("rank " + std::to_string(setting) + " has other settings than rank 0 "
                     "(every rank must be started with the same flags and data)");
  }
  std::uint32_t state = parameters_fingerprint(model);
  // Under ZeRO each rank holds another shard of the state: the parameters and the steps
  // done are compared (a resumed run's ranks read one snapshot file).
  if (options_.zero == data_parallel::ZeroStage::replicated) {
    for (const auto& [name, tensor] : optimizer.state()) state = add_fingerprint(tensor, state);
  }
  state = collectives::fingerprint(std::to_string(steps_done), state);
  const int apart = first_different(communicator_->all_gather(static_cast<std::uint64_t>(state)));
  if (apart >= 0) {
    throw UsageError("rank " + std::to_string(apart) + " starts from another state than rank "
                     "0 (its parameters, optimizer state or steps done: is its --init file, or "
                     "the snapshot it resumed, another one?)");
  }
}

void RunRanks::check_parameters_agree(const nn::Network& model) const {
  if (!communicator_ || count_ == 1) return;
  const int parted = first_different(communicator_->all_gather(
      static_cast<std::uint64_t>(parameters_fingerprint(model))));
  if (parted >= 0) {
    throw std::runtime_error("rank " + std::to_string(parted) + "'s parameters parted from "
                             "rank 0's during training: the ranks did not step on the same "
                             "gradients");
  }
}

bool RunRanks::any(bool mine) const {
  if (!communicator_ || count_ == 1) return mine;
  for (const std::uint64_t flag : communicator_->all_gather(std::uint64_t{mine})) {
    if (flag != 0) return true;
  }
  return false;
}

data_parallel::RankGroup* RunRanks::group(nn::Network& model) {
  if (!enabled() || group_) return group_.get();
  if (communicator_) {
    auto ranks = std::make_unique<data_parallel::CommunicatorRanks>(
        *communicator_, options_.reduction, options_.zero, options_.bucket_bytes);
    if (options_.zero != data_parallel::ZeroStage::replicated) sharded_ = ranks.get();
    group_ = std::move(ranks);
  } else {
    // The simulation copies the model's gradients' shapes.
    group_ = std::make_unique<data_parallel::SimulatedRanks>(count_, model, options_.zero);
  }
  group_->take_model(model);
  return group_.get();
}

void RunRanks::gather_master_weights(nn::Network& model) {
  if (data_parallel::RankGroup* const ranks = group(model)) ranks->gather_master_weights(model);
}

std::map<std::string, Tensor> RunRanks::gathered_masters(nn::Network& model) {
  data_parallel::RankGroup* const ranks = group(model);
  return ranks ? ranks->gathered_masters(model) : std::map<std::string, Tensor>{};
}

std::vector<nn::NamedParameter> RunRanks::stepped_parameters(nn::Network& model) {
  data_parallel::RankGroup* const ranks = group(model);
  return ranks ? ranks->stepped_parameters(model) : model.parameters();
}

std::unique_ptr<nn::Optimizer> RunRanks::whole_optimizer(nn::Network& model,
                                                         const nn::Optimizer& optimizer,
                                                         bool gather) {
  group(model);
  if (!sharded_) return nullptr;
  auto whole = std::make_unique<nn::Optimizer>(model.parameters(), optimizer.options());
  if (gather) sharded_->gather_optimizer_state(optimizer, *whole);
  return whole;
}

void RunRanks::take_shard(const nn::Optimizer& whole, nn::Optimizer& optimizer) const {
  BIGBATCH_CHECK(sharded_ != nullptr, "take_shard: this run's ranks hold no shards");
  sharded_->take_optimizer_shard(whole, optimizer);
}

Device RunRanks::device_of_this_rank(Device requested) const {
  if (!communicator_) return requested;
  try {
    return data_parallel::device_of_rank(requested, communicator_->local_rank(),
                                         communicator_->local_size(), cuda_rt::devices());
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

checkpointing::StepShape RunRanks::rank_step(checkpointing::StepShape whole) const {
  if (!communicator_) return whole;
  whole.held =
      data_parallel::held_elements(*whole.model, count_, 0, options_.zero, options_.bucket_bytes);
  whole.batch = rank_batch(whole.batch);
  whole.micro_batch = std::min(whole.micro_batch, whole.batch);
  return whole;
}

std::int64_t RunRanks::rank_batch(std::int64_t batch) const {
  return communicator_ ? collectives::share_of(batch, count_, 0).size : batch;
}

std::optional<int> RunRanks::planned_ranks() const {
  return enabled() ? std::optional<int>(count_) : std::nullopt;
}

planning::Plan RunRanks::agreed_plan(const std::function<planning::Plan()>& plan) const {
  if (!communicator_ || count_ == 1) return plan();
  // Rank 0's choice as text: "MICRO_BATCH PRECISION CHECKPOINT", and the GPT's attention
  // kernel after them.
  planning::Plan chosen;
  std::string text;
  if (communicator_->rank() == 0) {
    chosen = plan();
    text = std::to_string(chosen.micro_batch) + " " + nn::precision_name(chosen.precision) +
           " " + chosen.checkpoint.text();
    if (chosen.attention) text += " " + nn::attention_kernel_name(*chosen.attention);
  }
  text = communicator_->broadcast(text);
  if (communicator_->rank() == 0) return chosen;
  std::istringstream fields(text);
  std::string precision, checkpoint, kernel;
  fields >> chosen.micro_batch >> precision >> checkpoint;
  const std::optional<nn::Precision> named = precision_named(precision);
  bool read = named && chosen.micro_batch > 0;
  if (fields >> kernel) {
    const std::optional<nn::AttentionKernel> attention = attention_kernel_named(kernel);
    read = read && attention;
    if (attention) chosen.attention = *attention;
  }
  BIGBATCH_CHECK(read, "rank ", communicator_->rank(), ": rank 0's plan '", text,
                 "' does not read as a plan");
  chosen.precision = *named;
  chosen.checkpoint = checkpointing::Policy::parse(checkpoint);
  return chosen;
}

std::string RunRanks::describe(std::int64_t batch, std::int64_t micro_batch,
                               nn::Precision precision) const {
  std::ostringstream out;
  const collectives::Share first = collectives::share_of(batch, count_, 0);
  const collectives::Share last = collectives::share_of(batch, count_, count_ - 1);
  out << "data parallel: " << count_ << (count_ == 1 ? " rank" : " ranks")
      << (!communicator_                   ? " simulated in one process"
          : collectives::Communicator::available() ? " under MPI"
                                            : " alone (this bigbatch has no MPI)")
      << ", shares of "
      << last.size;
  if (first.size != last.size) out << " to " << first.size;
  const std::int64_t micro_batches = ceil_div(first.size, micro_batch);
  out << " samples of each batch of " << batch << " (" << micro_batches
      << (micro_batches == 1 ? " micro-batch" : " micro-batches")
      << " per rank), gradients summed "
      << (options_.zero == data_parallel::ZeroStage::gradients ? "after every micro-batch ("
                                                                : "once per optimizer step (")
      << (communicator_ ? collectives::reduction_name(options_.reduction) : "rank order") << ")";
  if (communicator_ && options_.bucket_bytes > 0) {
    out << (options_.zero == data_parallel::ZeroStage::gradients
                ? ", overlapping every backward in buckets of "
                : ", overlapping the last backward in buckets of ")
        << format_bytes(options_.bucket_bytes);
  }
  if (options_.zero == data_parallel::ZeroStage::optimizer_state) {
    out << "; ZeRO stage 1: each rank holds the optimizer state of its shard of every "
           "parameter, reduce-scatters the gradients and all-gathers the parameters";
  } else if (options_.zero == data_parallel::ZeroStage::gradients) {
    out << "; ZeRO stage 2: each rank holds the optimizer state and the gradient of its "
           "shard of every parameter, reduce-scatters each micro-batch's gradients as its "
           "backward finishes them, then releases them, and all-gathers the parameters";
  }
  if (options_.zero != data_parallel::ZeroStage::replicated && nn::is_mixed(precision)) {
    out << (communicator_ ? " (in " + nn::precision_name(precision) +
                                ", its shard of the f32 masters too, and the working copies "
                                "are what it gathers)"
                          : " (the simulation keeps the f32 masters whole: one process "
                            "holds every rank)");
  }
  return out.str();
}

}  // namespace bigbatch::cli

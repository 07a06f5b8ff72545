// data_parallel.cpp: the simulated ranks and the ranks under MPI.
#include "chapters/07_data_parallel/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/check.hpp"
#include "common/integer_math.hpp"
#include "kernels/elementwise.hpp"

namespace bigbatch::data_parallel {
namespace {

std::span<float> elements(const Tensor& t) {
  return {t.data<float>(), static_cast<std::size_t>(t.numel())};
}

/// Every gradient as one part, combined as measured: the boundary's single-process pass.
loss_scaling::GradientPieces whole_gradients(const nn::Network& model) {
  return {{loss_scaling::gradient_tensors(model)}, combine_in_rank_order};
}

/// Rank r's shard of every gradient.
std::vector<Tensor> gradient_shards(const std::vector<Tensor>& gradients, int ranks, int rank) {
  std::vector<Tensor> shards;
  for (const Tensor& gradient : gradients) shards.push_back(shard_view(gradient, ranks, rank));
  return shards;
}

}  // namespace

std::string setting_text(ZeroStage stage) {
  return std::to_string(static_cast<int>(stage));
}

Tensor shard_view(const Tensor& tensor, int ranks, int rank) {
  const collectives::Share share = collectives::share_of(tensor.numel(), ranks, rank);
  return tensor.reshaped({tensor.numel()}).rows(share.begin, share.begin + share.size);
}

std::vector<nn::NamedParameter> parameter_shards(const std::vector<nn::NamedParameter>& parameters,
                                                 int ranks, int rank) {
  std::vector<nn::NamedParameter> shards;
  for (const nn::NamedParameter& p : parameters) {
    // A released gradient or master (ZeRO holds its own shards) stays undefined.
    shards.push_back({p.name, p.value.defined() ? shard_view(p.value, ranks, rank) : Tensor(),
                      p.grad.defined() ? shard_view(p.grad, ranks, rank) : Tensor(),
                      p.half.defined() ? shard_view(p.half, ranks, rank) : Tensor()});
  }
  return shards;
}

nn::HeldElements held_elements(const nn::NetworkLedger& model, int ranks, int rank,
                               ZeroStage zero, std::size_t bucket_bytes) {
  if (zero == ZeroStage::replicated) return {};
  const auto shards = [&](const std::vector<std::int64_t>& sizes) {
    std::int64_t elements = 0;
    for (const std::int64_t n : sizes) elements += collectives::share_of(n, ranks, rank).size;
    return elements;
  };
  nn::HeldElements held;
  held.optimizer_state = shards(model.trainable_sizes());
  held.master_weights = shards(model.master_weight_sizes());
  if (zero == ZeroStage::gradients) {
    held.gradients = held.optimizer_state;
    held.gradient_bucket_bytes = bucket_bytes;
  }
  return held;
}

nn::StepPrediction predict_rank_step(nn::NetworkLedger& model, std::int64_t batch,
                                     std::int64_t micro_batch,
                                     const nn::Optimizer::Options& optimizer, int ranks,
                                     int rank, ZeroStage zero, nn::BlockLedgerRunner* runner,
                                     std::size_t held_workspace, std::size_t bucket_bytes) {
  return nn::predict_step(model, collectives::share_of(batch, ranks, rank).size, micro_batch,
                          optimizer, runner, held_workspace,
                          held_elements(model, ranks, rank, zero, bucket_bytes));
}

Device device_of_rank(Device requested, int local_rank, int local_ranks, int devices) {
  BIGBATCH_CHECK(local_ranks >= 1 && local_rank >= 0 && local_rank < local_ranks &&
                     devices >= 0,
                 "device_of_rank: local rank ", local_rank, " of ", local_ranks, ", ", devices,
                 " devices");
  if (requested.is_cpu() || local_ranks == 1 || devices == 0) return requested;
  const std::string ranks = std::to_string(local_ranks) + " ranks on this machine";
  BIGBATCH_CHECK(requested.index == 0, "--device ", requested.name(), " with ", ranks,
                 ": each rank takes the GPU of its place on the machine (cuda:0 to cuda:",
                 local_ranks - 1, "); give --device cuda");
  BIGBATCH_CHECK(local_ranks <= devices, ranks, " and ", devices, " GPU(s): NCCL needs a GPU ",
                 "for each rank (one GPU holds one NCCL rank); start at most ", devices,
                 " rank(s) per machine");
  return Device::cuda(local_rank);
}

loss_scaling::GradientStats combine_in_rank_order(
    std::span<const loss_scaling::GradientStats> parts) {
  BIGBATCH_CHECK(!parts.empty(), "combine_in_rank_order: no part measured");
  bool overflow = parts[0].overflow;
  double squared_norm = parts[0].squared_norm;
  for (std::size_t r = 1; r < parts.size(); ++r) {
    overflow = overflow || parts[r].overflow;
    squared_norm = squared_norm + parts[r].squared_norm;
  }
  return loss_scaling::stats_from(overflow, squared_norm);
}

float sum_in_rank_order(std::span<const float> losses) {
  BIGBATCH_CHECK(!losses.empty(), "sum_in_rank_order: no rank's loss");
  float total = losses[0];
  for (std::size_t r = 1; r < losses.size(); ++r) total = total + losses[r];
  return total;
}

void RankGroup::check_run(const nn::Network& model, std::int64_t smallest_batch) const {
  BIGBATCH_CHECK(model.releases_state() || (zero() == ZeroStage::replicated && !overlaps()),
                 "data parallel: ZeRO and sums overlapping the backward need a model that tells "
                 "its final gradients group by group and releases them (the residual MLP: "
                 "nn::Network::releases_state); this model's ranks sum whole gradients once "
                 "per step");
  BIGBATCH_CHECK(ranks() <= smallest_batch, "data parallel: ", ranks(),
                 " ranks need a sample each in every batch, and the run's smallest batch has ",
                 smallest_batch);
}

// snippet: rank-parts
std::vector<train::BatchPart> RankGroup::parts(std::int64_t samples) const {
  std::vector<train::BatchPart> shares;
  for (const int r : local_ranks()) {
    const collectives::Share share = collectives::share_of(samples, ranks(), r);
    shares.push_back({r, share.begin, share.size});
  }
  return shares;
}
// snippet end: rank-parts

void RankGroup::start_step(nn::Network& model, std::int64_t samples, std::int64_t micro_batch) {
  if (zero() == ZeroStage::replicated) return;
  // ZeRO: the masters' shards taken; at stage 2, how many sums the ranks take, and the
  // model's gradients go.
  const std::int64_t largest = collectives::share_of(samples, ranks(), 0).size;
  start_rounds(model, ceil_div(largest, micro_batch));
}

nn::GradientsReady RankGroup::gradients_ready(nn::Network& model) {
  // With overlap, the sum of each group of gradients starts as the share's last backward
  // finishes it; at ZeRO stage 2, as every backward finishes it.
  if (!overlaps() && !sums_every_micro_batch()) return {};
  return [this, &model](std::size_t first, std::size_t end) { group_ready(model, first, end); };
}

nn::TellGradients RankGroup::tell() const {
  return sums_every_micro_batch() ? nn::TellGradients::every_micro_batch
                                  : nn::TellGradients::last_micro_batch;
}

void RankGroup::part_done(const train::BatchPart& part, nn::Network& model) {
  share_done(part.rank, model);
}

SimulatedRanks::SimulatedRanks(int ranks, const nn::Network& model, ZeroStage zero)
    : ranks_(ranks), zero_(zero) {
  BIGBATCH_CHECK(ranks >= 1, "SimulatedRanks: ranks must be >= 1, got ", ranks);
  BIGBATCH_CHECK(model.device().is_cpu(),
                 "SimulatedRanks: the ranks are simulated on the CPU, the model is on ",
                 model.device().name());
  const auto gradient_buffer = [&model](const nn::NamedParameter& p) {
    return Tensor(p.value.shape(), DType::f32, model.device(), MemoryCategory::gradients);
  };
  if (zero_ == ZeroStage::gradients) {
    for (const nn::NamedParameter& p : model.parameters()) totals_.push_back(gradient_buffer(p));
    return;
  }
  buffers_.resize(static_cast<std::size_t>(ranks));
  for (auto& buffer : buffers_) {
    for (const nn::NamedParameter& p : model.parameters()) buffer.push_back(gradient_buffer(p));
  }
}

std::vector<int> SimulatedRanks::local_ranks() const {
  std::vector<int> all(static_cast<std::size_t>(ranks_));
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return all;
}

void SimulatedRanks::group_ready(nn::Network& model, std::size_t first, std::size_t end) {
  if (zero_ != ZeroStage::gradients) return;
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  BIGBATCH_CHECK(first <= end && end <= parameters.size(), "SimulatedRanks: gradients [",
                 first, ", ", end, ") of ", parameters.size());
  if (rank_ == 0 && round_ == round_sums_.size()) round_sums_.emplace_back(parameters.size());
  BIGBATCH_CHECK(round_ < round_sums_.size() && (rank_ == 0 || round_ < rounds_),
                 "SimulatedRanks: rank ", rank_, " runs more micro-batches than rank 0");
  std::vector<Tensor>& sums = round_sums_[round_];
  for (std::size_t i = first; i < end; ++i) {
    if (rank_ == 0) {  // the round's sum starts with rank 0's gradient
      if (!sums[i].defined()) {
        sums[i] = Tensor(parameters[i].grad.shape(), DType::f32, model.device(),
                         MemoryCategory::gradients);
      }
      sums[i].copy_from(parameters[i].grad);
    } else {
      collectives::add_next_rank(elements(sums[i]), elements(parameters[i].grad));
    }
  }
  model.release_gradients(first, end);  // the next micro-batch starts them from zero
  if (first == 0) ++round_;  // the stem's gradients are the last a backward tells
}

void SimulatedRanks::share_done(int rank, nn::Network& model) {
  BIGBATCH_CHECK(rank >= 0 && rank < ranks(), "SimulatedRanks: no rank ", rank);
  if (zero_ == ZeroStage::gradients) {
    BIGBATCH_CHECK(rank == rank_ && round_ > 0, "SimulatedRanks: rank ", rank,
                   "'s share done after ", round_, " micro-batches, rank ", rank_, " expected");
    if (rank == 0) rounds_ = round_;
    // The rounds this rank has no micro-batch for: it adds zeros, as under MPI.
    for (; round_ < rounds_; ++round_) {
      for (Tensor& sum : round_sums_[round_]) {
        const Tensor zeros = Tensor::zeros(sum.shape(), DType::f32, sum.device(),
                                           MemoryCategory::gradients);
        collectives::add_next_rank(elements(sum), elements(zeros));
      }
    }
    ++rank_;
    round_ = 0;
    return;
  }
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    buffers_[rank][p].copy_from(parameters[p].grad);
  }
  model.zero_grad();  // the next rank's share starts its own sum, as on its own process
}

// snippet: rank-order-sum
float SimulatedRanks::reduce(nn::Network& model, std::span<const float> losses) {
  BIGBATCH_CHECK(static_cast<int>(losses.size()) == ranks(), "SimulatedRanks: ",
                 losses.size(), " losses for ", ranks(), " ranks");
  if (zero_ == ZeroStage::gradients) {
    BIGBATCH_CHECK(rank_ == ranks(), "SimulatedRanks: ", rank_, " of ", ranks(),
                   " shares done before the sum");
    for (std::size_t p = 0; p < totals_.size(); ++p) {
      totals_[p].copy_from(round_sums_[0][p]);
      for (std::size_t m = 1; m < rounds_; ++m) axpy(1.0f, round_sums_[m][p], totals_[p]);
    }
    rank_ = 0;
    return sum_in_rank_order(losses);
  }
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    Tensor total = parameters[p].grad;  // shares the gradient's storage
    total.copy_from(buffers_[0][p]);
    for (int r = 1; r < ranks(); ++r) {
      collectives::add_next_rank(elements(total), elements(buffers_[r][p]));
    }
  }
  return sum_in_rank_order(losses);
}
// snippet end: rank-order-sum

std::vector<nn::NamedParameter> SimulatedRanks::stepped_parameters(const nn::Network& model) const {
  std::vector<nn::NamedParameter> parameters = model.parameters();
  if (zero_ == ZeroStage::gradients) {
    for (std::size_t p = 0; p < parameters.size(); ++p) parameters[p].grad = totals_[p];
  }
  return parameters;
}

loss_scaling::GradientPieces SimulatedRanks::boundary_pieces(const nn::Network& model) {
  if (zero_ == ZeroStage::replicated) return whole_gradients(model);
  loss_scaling::GradientPieces pieces{{}, combine_in_rank_order};
  // The step's gradients: the model's at stage 1, the rounds' total at stage 2.
  const std::vector<Tensor> gradients =
      zero_ == ZeroStage::gradients ? totals_ : loss_scaling::gradient_tensors(model);
  for (int r = 0; r < ranks(); ++r) pieces.parts.push_back(gradient_shards(gradients, ranks(), r));
  return pieces;
}

CommunicatorRanks::CommunicatorRanks(collectives::Communicator& communicator,
                                     collectives::Reduction reduction, ZeroStage zero,
                                     std::size_t bucket_bytes)
    : communicator_(communicator), reduction_(reduction), zero_(zero),
      bucket_bytes_(bucket_bytes) {}

void CommunicatorRanks::take_model(nn::Network& model) {
  BIGBATCH_CHECK(shard_gradients_.empty() && master_shards_.empty(),
                 "CommunicatorRanks: takes one model");
  if (zero_ == ZeroStage::replicated) return;
  // Stage 2: the model's gradients go first, so that they are never live beside the
  // masters' shards or the gradients' own (and before `parameters` holds them).
  if (zero_ == ZeroStage::gradients) model.release_gradients(0, model.parameters().size());
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  const bool mixed = std::any_of(parameters.begin(), parameters.end(),
                                 [](const nn::NamedParameter& p) { return p.half.defined(); });
  if (mixed) {
    // This rank's shard of every master, taken now, and again at a step's start whenever
    // the model holds its masters (a resume, gather_master_weights). The model's go at
    // once: before the optimizer's state is allocated, so that a device that fits the
    // step (its prediction holds the shards) does not also have to fit the whole masters.
    master_shards_.resize(parameters.size());
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (!parameters[i].half.defined()) continue;  // not a Linear weight: no master
      master_shards_[i] = Tensor(
          {collectives::share_of(parameters[i].half.numel(), ranks(), communicator_.rank()).size},
          DType::f32, model.device(), MemoryCategory::master_weights);
    }
    take_master_shards(model);
  }
  if (zero_ != ZeroStage::gradients) return;
  for (const nn::NamedParameter& p : parameters) {
    shard_gradients_.push_back(Tensor::zeros(
        {collectives::share_of(shape_numel(p.shape()), ranks(), communicator_.rank()).size},
        DType::f32, model.device(), MemoryCategory::gradients));
  }
}

void CommunicatorRanks::take_master_shards(nn::Network& model) {
  if (master_shards_.empty() || !model.holds_master_weights()) return;
  // The model's masters are the truth (just built or loaded, or gathered): this rank keeps
  // its shard of each, and the model none.
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (master_shards_[i].defined()) {
      master_shards_[i].copy_from(shard_view(parameters[i].value, ranks(), communicator_.rank()));
    }
  }
  model.release_master_weights();
}

void CommunicatorRanks::start_rounds(nn::Network& model, std::int64_t micro_batches) {
  take_master_shards(model);  // after a resume or gather_master_weights
  if (zero_ != ZeroStage::gradients) return;
  BIGBATCH_CHECK(micro_batches >= 1, "CommunicatorRanks: ", micro_batches, " micro-batches");
  model.release_gradients(0, model.parameters().size());
  rounds_ = micro_batches;
  rounds_done_ = 0;
  groups_.clear();
}

void CommunicatorRanks::gather_master_weights(nn::Network& model) {
  if (master_shards_.empty() || model.holds_master_weights()) return;
  model.allocate_master_weights();
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (master_shards_[i].defined()) gather_master(i, parameters[i].value);
  }
}

void CommunicatorRanks::gather_master(std::size_t i, const Tensor& whole) {
  shard_view(whole, ranks(), communicator_.rank()).copy_from(master_shards_[i]);
  gather_shares(whole);
}

void CommunicatorRanks::add_to_shard(std::size_t i, const Tensor& summed) {
  const Tensor sum = shard_view(summed, ranks(), communicator_.rank());
  if (rounds_done_ == 0) {
    shard_gradients_[i].copy_from(sum);
  } else {
    axpy(1.0f, sum, shard_gradients_[i]);
  }
}

std::map<std::string, Tensor> CommunicatorRanks::gathered_masters(const nn::Network& model) {
  std::map<std::string, Tensor> whole;
  if (master_shards_.empty() || model.holds_master_weights()) return whole;
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (!master_shards_[i].defined()) continue;
    // On the host whatever the device: the engine's all-gather of host memory (MPI).
    Tensor master(parameters[i].shape(), DType::f32, Device::cpu(), MemoryCategory::host_data);
    gather_master(i, master);
    whole.emplace(parameters[i].name, std::move(master));
  }
  return whole;
}

// snippet: sum-round
void CommunicatorRanks::sum_round(const std::vector<Tensor>& gradients, std::size_t first,
                                  std::size_t end) {
  BIGBATCH_CHECK(first <= end && end <= gradients.size() &&
                     gradients.size() == shard_gradients_.size(),
                 "CommunicatorRanks: gradients [", first, ", ", end, ") of ", gradients.size(),
                 ", ", shard_gradients_.size(), " shards held (take_model)");
  if (bucket_bytes_ > 0) {
    add_to_round_bucket(gradients, first, end);
    return;
  }
  for (std::size_t i = first; i < end; ++i) {
    sum_gradient(gradients[i]);  // a reduce-scatter: this rank's shard holds the sum
    add_to_shard(i, gradients[i]);
  }
}
// snippet end: sum-round

void CommunicatorRanks::add_to_round_bucket(const std::vector<Tensor>& gradients,
                                            std::size_t first, std::size_t end) {
  for (std::size_t i = first; i < end; ++i) {
    open_round_.gradients.emplace_back(i, gradients[i]);
    open_round_.bytes += gradients[i].nbytes();
  }
  const bool last = first == 0;  // the stem's group: a backward's last
  if (open_round_.bytes >= bucket_bytes_ || last) {
    finish_round_bucket();  // the bucket in flight: its sums were moving meanwhile
    std::vector<std::span<float>> buffers;
    for (const auto& [i, gradient] : open_round_.gradients) buffers.push_back(elements(gradient));
    start_bucket(buffers, open_round_.gradients.front().second.device());
    summing_round_ = std::exchange(open_round_, {});
  }
  if (last) finish_round_bucket();
}

void CommunicatorRanks::finish_round_bucket() {
  if (summing_round_.gradients.empty()) return;
  wait_for_buckets();
  for (const auto& [i, gradient] : summing_round_.gradients) add_to_shard(i, gradient);
  summing_round_ = {};  // the gradients' bytes go
}

void CommunicatorRanks::start_bucket(std::span<const std::span<float>> buffers, Device device) {
  if (device.is_cpu()) {
    // Made in the first step, a collective every rank reaches only once the ranks have
    // agreed on their settings (a rank with another bucket size is refused before it).
    if (!buckets_) {
      buckets_ = std::make_unique<collectives::BucketedSum>(
          communicator_, reduction_,
          zero_ == ZeroStage::replicated ? collectives::BucketedSum::Result::every_rank
                                         : collectives::BucketedSum::Result::own_shards);
    }
    buckets_->start(buffers);
  } else {
    device_communicator().start_beside(buffers, reduction_, zero_ != ZeroStage::replicated);
  }
}

void CommunicatorRanks::wait_for_buckets() {
  if (buckets_) buckets_->finish();
  if (on_device_) on_device_->join_beside();  // the kernels queued next read the sums
}

float CommunicatorRanks::reduce(nn::Network& model, std::span<const float> losses) {
  BIGBATCH_CHECK(losses.size() == 1, "CommunicatorRanks: one loss per process, got ",
                 losses.size());
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  if (zero_ == ZeroStage::gradients) {
    // This rank ran fewer micro-batches than rank 0: it joins the sums it lacks with
    // zeros, a group at a time, in the order its backwards told them.
    BIGBATCH_CHECK(rounds_done_ >= 1 && rounds_done_ <= rounds_, "CommunicatorRanks: ",
                   rounds_done_, " micro-batches summed of ", rounds_);
    for (; rounds_done_ < rounds_; ++rounds_done_) {
      for (const auto& [first, end] : groups_) {
        std::vector<Tensor> zeros(parameters.size());
        for (std::size_t i = first; i < end; ++i) {
          zeros[i] = Tensor::zeros(parameters[i].shape(), DType::f32, model.device(),
                                   MemoryCategory::gradients);
        }
        sum_round(zeros, first, end);
      }
    }
  } else if (overlaps()) {  // the backward started every bucket but the open one
    BIGBATCH_CHECK(gradients_sent_ + open_bucket_.size() == parameters.size(),
                   "CommunicatorRanks: the backward finished ",
                   gradients_sent_ + open_bucket_.size(), " of ", parameters.size(),
                   " gradients");
    if (!open_bucket_.empty()) start_open_bucket(model.device());
    wait_for_buckets();
    gradients_sent_ = 0;
  } else {
    for (const nn::NamedParameter& p : parameters) sum_gradient(p.grad);
  }
  const std::vector<float> all = communicator_.all_gather(losses[0]);
  return sum_in_rank_order(all);
}

void CommunicatorRanks::group_ready(nn::Network& model, std::size_t first, std::size_t end) {
  if (!overlaps() && zero_ != ZeroStage::gradients) return;
  const auto start = std::chrono::steady_clock::now();
  if (zero_ == ZeroStage::gradients) {
    std::vector<Tensor> gradients;
    for (const nn::NamedParameter& p : model.parameters()) gradients.push_back(p.grad);
    sum_round(gradients, first, end);
    gradients.clear();
    // Their bytes go: the shard holds the sum (with buckets, once the bucket's sum is in).
    model.release_gradients(first, end);
    if (buckets_) buckets_->progress();
    if (rounds_done_ == 0) groups_.emplace_back(first, end);
    if (first == 0) ++rounds_done_;  // the stem's gradients are the last a backward tells
    seconds_in_backward_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  BIGBATCH_CHECK(first <= end && end <= parameters.size(), "CommunicatorRanks: gradients [",
                 first, ", ", end, ") of ", parameters.size());
  for (std::size_t i = first; i < end; ++i) {
    open_bucket_.push_back(elements(parameters[i].grad));
    open_bytes_ += parameters[i].grad.nbytes();
  }
  if (open_bytes_ >= bucket_bytes_) start_open_bucket(model.device());
  if (buckets_) buckets_->progress();  // NCCL moves its sums on its own
  seconds_in_backward_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double CommunicatorRanks::take_seconds_in_backward() {
  return std::exchange(seconds_in_backward_, 0.0);
}

collectives::Collectives& CommunicatorRanks::collectives_of(const Tensor& t) {
  if (t.device().is_cpu()) return communicator_;
  return device_communicator();
}

collectives::DeviceCommunicator& CommunicatorRanks::device_communicator() {
  if (!on_device_) on_device_ = std::make_unique<collectives::DeviceCommunicator>(communicator_);
  return *on_device_;
}

void CommunicatorRanks::sum_gradient(const Tensor& gradient) {
  if (zero_ == ZeroStage::replicated) {
    collectives_of(gradient).all_reduce_sum(elements(gradient), reduction_);
  } else {
    collectives_of(gradient).reduce_scatter_sum(elements(gradient), reduction_);
  }
}

void CommunicatorRanks::gather_shares(const Tensor& t) {
  if (t.dtype() == DType::f32) {
    collectives_of(t).all_gather_shares(elements(t));
    return;
  }
  BIGBATCH_CHECK(dtype_size(t.dtype()) == sizeof(std::uint16_t), "CommunicatorRanks: gathers ",
                 "f32 or 16-bit tensors, not ", dtype_name(t.dtype()));
  collectives_of(t).all_gather_shares(std::span<std::uint16_t>(
      static_cast<std::uint16_t*>(t.raw_data()), static_cast<std::size_t>(t.numel())));
}

void CommunicatorRanks::start_open_bucket(Device device) {
  start_bucket(open_bucket_, device);
  gradients_sent_ += open_bucket_.size();
  open_bucket_.clear();
  open_bytes_ = 0;
}

loss_scaling::GradientPieces CommunicatorRanks::boundary_pieces(const nn::Network& model) {
  if (zero_ == ZeroStage::replicated) return whole_gradients(model);
  const auto combine = [this](std::span<const loss_scaling::GradientStats> mine) {
    BIGBATCH_CHECK(mine.size() == 1, "CommunicatorRanks: one part per process, got ",
                   mine.size());
    const std::vector<std::uint64_t> overflows =
        communicator_.all_gather(std::uint64_t{mine[0].overflow});
    const std::vector<double> squared_norms = communicator_.all_gather(mine[0].squared_norm);
    std::vector<loss_scaling::GradientStats> parts(overflows.size());
    for (std::size_t r = 0; r < parts.size(); ++r) {
      parts[r].overflow = overflows[r] != 0;
      parts[r].squared_norm = squared_norms[r];
    }
    return combine_in_rank_order(parts);
  };
  if (zero_ == ZeroStage::gradients) return {{shard_gradients_}, combine};
  return {{gradient_shards(loss_scaling::gradient_tensors(model), ranks(), communicator_.rank())},
          combine};
}

std::vector<nn::NamedParameter> CommunicatorRanks::stepped_parameters(
    const nn::Network& model) const {
  if (zero_ == ZeroStage::replicated) return model.parameters();
  std::vector<nn::NamedParameter> shards =
      parameter_shards(model.parameters(), ranks(), communicator_.rank());
  BIGBATCH_CHECK(zero_ != ZeroStage::gradients || shard_gradients_.size() == shards.size(),
                 "CommunicatorRanks: stage 2 steps the gradient shards it holds: call "
                 "take_model first");
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (zero_ == ZeroStage::gradients) shards[i].grad = shard_gradients_[i];
    if (!master_shards_.empty() && master_shards_[i].defined()) shards[i].value = master_shards_[i];
  }
  return shards;
}

void CommunicatorRanks::after_step(nn::Network& model) {
  if (zero_ == ZeroStage::replicated) return;
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    // A sharded master stays with its rank: the forward reads the working copy alone.
    const bool master_sharded = !master_shards_.empty() && master_shards_[i].defined();
    if (!master_sharded) gather_shares(parameters[i].value);
    if (parameters[i].half.defined()) gather_shares(parameters[i].half);
  }
}

namespace {

/// The state tensors of a shard's optimizer beside a whole optimizer's, name by name.
std::vector<std::pair<Tensor, Tensor>> paired_state(const nn::Optimizer& shard,
                                                    const nn::Optimizer& whole) {
  const auto mine = shard.state(), all = whole.state();
  BIGBATCH_CHECK(mine.size() == all.size(), "ZeRO: a shard's optimizer has ", mine.size(),
                 " state tensors, the whole one ", all.size());
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    BIGBATCH_CHECK(mine[i].first == all[i].first, "ZeRO: state ", mine[i].first, " beside ",
                   all[i].first);
    pairs.emplace_back(mine[i].second, all[i].second);
  }
  return pairs;
}

}  // namespace

void CommunicatorRanks::gather_optimizer_state(const nn::Optimizer& mine, nn::Optimizer& whole) {
  whole.set_steps_taken(mine.steps_taken());
  for (const auto& [shard, tensor] : paired_state(mine, whole)) {
    shard_view(tensor, ranks(), communicator_.rank()).copy_from(shard);
    gather_shares(tensor);
  }
}

void CommunicatorRanks::take_optimizer_shard(const nn::Optimizer& whole,
                                             nn::Optimizer& mine) const {
  for (const auto& [shard, tensor] : paired_state(mine, whole)) {
    Tensor(shard).copy_from(shard_view(tensor, ranks(), communicator_.rank()));
  }
}

}  // namespace bigbatch::data_parallel

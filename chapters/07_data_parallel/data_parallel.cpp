// data_parallel.cpp: the simulated ranks and the ranks under MPI.
#include "chapters/07_data_parallel/data_parallel.hpp"

#include "common/check.hpp"

namespace bigbatch::data_parallel {
namespace {

std::span<float> elements(const Tensor& t) {
  return {t.data<float>(), static_cast<std::size_t>(t.numel())};
}

}  // namespace

float sum_in_rank_order(std::span<const float> losses) {
  BIGBATCH_CHECK(!losses.empty(), "sum_in_rank_order: no rank's loss");
  float total = losses[0];
  for (std::size_t r = 1; r < losses.size(); ++r) total = total + losses[r];
  return total;
}

SimulatedRanks::SimulatedRanks(int ranks, const nn::Model& model) {
  BIGBATCH_CHECK(ranks >= 1, "SimulatedRanks: ranks must be >= 1, got ", ranks);
  BIGBATCH_CHECK(model.device().is_cpu(),
                 "SimulatedRanks: the ranks are simulated on the CPU, the model is on ",
                 model.device().name());
  buffers_.resize(static_cast<std::size_t>(ranks));
  for (auto& buffer : buffers_) {
    for (const nn::NamedParameter& p : model.parameters()) {
      buffer.emplace_back(p.grad.shape(), DType::f32, model.device(),
                          MemoryCategory::gradients);
    }
  }
}

std::vector<int> SimulatedRanks::local_ranks() const {
  std::vector<int> all(buffers_.size());
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return all;
}

void SimulatedRanks::share_done(int rank, nn::Model& model) {
  BIGBATCH_CHECK(rank >= 0 && rank < ranks(), "SimulatedRanks: no rank ", rank);
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    buffers_[rank][p].copy_from(parameters[p].grad);
  }
  model.zero_grad();  // the next rank's share starts its own sum, as on its own process
}

float SimulatedRanks::reduce(nn::Model& model, std::span<const float> losses) {
  BIGBATCH_CHECK(static_cast<int>(losses.size()) == ranks(), "SimulatedRanks: ",
                 losses.size(), " losses for ", ranks(), " ranks");
  const std::vector<nn::NamedParameter> parameters = model.parameters();
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    Tensor total = parameters[p].grad;  // shares the gradient's storage
    total.copy_from(buffers_[0][p]);
    for (int r = 1; r < ranks(); ++r) dist::add_next_rank(elements(total), elements(buffers_[r][p]));
  }
  return sum_in_rank_order(losses);
}

float CommunicatorRanks::reduce(nn::Model& model, std::span<const float> losses) {
  BIGBATCH_CHECK(losses.size() == 1, "CommunicatorRanks: one loss per process, got ",
                 losses.size());
  for (const nn::NamedParameter& p : model.parameters()) {
    BIGBATCH_CHECK(p.grad.device().is_cpu(), "data parallel: MPI sums host gradients; ",
                   p.name, " is on ", p.grad.device().name());
    communicator_.all_reduce_sum(elements(p.grad), reduction_);
  }
  const std::vector<float> all = communicator_.all_gather(losses[0]);
  return sum_in_rank_order(all);
}

}  // namespace bigbatch::data_parallel

// network.cpp: the defaults of a model that releases nothing (network.hpp).
#include "nn/network.hpp"

#include <stdexcept>
#include <string>

namespace bigbatch::nn {
namespace {

[[noreturn]] void refuse(const std::string& member) {
  throw std::logic_error("Network::" + member +
                         ": this model neither tells its gradients group by group nor "
                         "releases its gradients or masters (releases_state() is false)");
}

}  // namespace

void Network::set_gradients_ready(GradientsReady ready) {
  if (ready) refuse("set_gradients_ready");  // telling nobody is what it does already
}
void Network::release_gradients(std::size_t, std::size_t) { refuse("release_gradients"); }
void Network::release_master_weights() { refuse("release_master_weights"); }
void Network::allocate_master_weights() { refuse("allocate_master_weights"); }

}  // namespace bigbatch::nn

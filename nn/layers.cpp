// layers.cpp: the layers and the state_dict machinery every model of nn/ shares (layers.hpp).
#include "nn/layers.hpp"

#include <stdexcept>

#include "kernels/bias.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/fill.hpp"
#include "kernels/gemm.hpp"

namespace bigbatch::nn {

Tensor parameter_tensor(Shape shape, Device device, DType dtype) {
  return Tensor(std::move(shape), dtype, device, MemoryCategory::parameters);
}

/// Under mixed precision the f32 weight is the optimizer's master copy and the forward reads
/// a 16-bit working copy (written by refresh_half_copies and by every optimizer step).
Linear make_linear(std::int64_t in, std::int64_t out, Device device, Precision precision,
                   DType dtype) {
  const bool mixed = is_mixed(precision);
  BIGBATCH_CHECK(dtype == DType::f32 || (dtype == DType::f64 && !mixed && device.is_cpu()),
                 "make_linear: parameters are f32, or f64 on the CPU without mixed precision");
  Linear layer{Tensor({out, in}, dtype, device,
                      mixed ? MemoryCategory::master_weights : MemoryCategory::parameters),
               parameter_tensor({out}, device, dtype),
               Tensor::zeros({out, in}, dtype, device, MemoryCategory::gradients),
               Tensor::zeros({out}, dtype, device, MemoryCategory::gradients),
               {}};
  if (mixed) {
    layer.weight_half =
        Tensor({out, in}, working_dtype(precision), device, MemoryCategory::parameters);
  }
  return layer;
}

const Tensor& working_weight(const Linear& layer) {
  return layer.weight_half.defined() ? layer.weight_half : layer.weight;
}

NormLayer make_norm(Norm kind, std::int64_t features, Device device, DType dtype) {
  NormLayer layer{parameter_tensor({features}, device, dtype),
                  parameter_tensor({features}, device, dtype),
                  Tensor::zeros({features}, dtype, device, MemoryCategory::gradients),
                  Tensor::zeros({features}, dtype, device, MemoryCategory::gradients),
                  {}, {}};
  fill(layer.weight, 1.0);
  fill(layer.bias, 0.0);
  if (kind == Norm::batch) {
    layer.running_mean = parameter_tensor({features}, device, dtype);
    layer.running_var = parameter_tensor({features}, device, dtype);
    fill(layer.running_mean, 0.0);
    fill(layer.running_var, 1.0);
  }
  return layer;
}

// y = x W^T + b.   x: [b, in], y: [b, out] (a 16-bit x: a y of its dtype or f32)
void linear_forward(const Linear& layer, const Tensor& x, const Tensor& y) {
  gemm(x, false, working_weight(layer), true, y);
  add_bias(y, layer.bias);
}

// dW += dy^T x (f32, whatever x's and dy's dtype) and db += sum of dy's rows.
//   x: [b, in], dy: [b, out]
void linear_backward_parameters(const Linear& layer, const Tensor& x, const Tensor& dy) {
  gemm(dy, true, x, false, layer.weight_grad, 1.0f, 1.0f);
  bias_backward(dy, layer.bias_grad);
}

// dx = dy W.   dy: [b, out], dx: [b, in]
void linear_backward_input(const Linear& layer, const Tensor& dy, const Tensor& dx) {
  gemm(dy, false, working_weight(layer), false, dx);
}

void linear_backward(const Linear& layer, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  linear_backward_parameters(layer, x, dy);
  if (dx.defined()) linear_backward_input(layer, dy, dx);
}

void append_linear(std::vector<StateEntry>& entries, const std::string& prefix, Linear& layer) {
  entries.push_back({prefix + "weight", &layer.weight, &layer.weight_grad, &layer.weight_half});
  entries.push_back({prefix + "bias", &layer.bias, &layer.bias_grad});
}

void append_norm(std::vector<StateEntry>& entries, const std::string& prefix, NormLayer& layer) {
  entries.push_back({prefix + "weight", &layer.weight, &layer.weight_grad});
  entries.push_back({prefix + "bias", &layer.bias, &layer.bias_grad});
  if (layer.running_mean.defined()) {
    entries.push_back({prefix + "running_mean", &layer.running_mean, nullptr});
    entries.push_back({prefix + "running_var", &layer.running_var, nullptr});
  }
}

std::vector<NamedParameter> named_parameters(const std::vector<StateEntry>& entries) {
  std::vector<NamedParameter> result;
  for (const StateEntry& entry : entries) {
    if (entry.grad != nullptr) {
      result.push_back({entry.name, *entry.value, *entry.grad,
                        entry.half != nullptr ? *entry.half : Tensor()});
    }
  }
  return result;
}

std::vector<std::pair<std::string, Tensor>> state_tensors(const std::vector<StateEntry>& entries) {
  std::vector<std::pair<std::string, Tensor>> result;
  for (const StateEntry& entry : entries) result.emplace_back(entry.name, *entry.value);
  return result;
}

std::int64_t count_parameters(const std::vector<NamedParameter>& parameters) {
  std::int64_t count = 0;
  for (const NamedParameter& p : parameters) {
    count += p.value.defined() ? p.value.numel() : p.half.numel();  // a released master's copy
  }
  return count;
}

void zero_gradients(const std::vector<NamedParameter>& parameters) {
  for (const NamedParameter& p : parameters) {
    if (p.grad.defined()) fill(p.grad, 0.0);
  }
}

void refresh_half_copies(const std::vector<NamedParameter>& parameters) {
  for (const NamedParameter& p : parameters) {
    if (p.half.defined()) cast(p.value, p.half);
  }
}

void load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                const std::map<std::string, Tensor>& loaded, const std::string& source) {
  // Check every tensor before changing any, so a bad set leaves the model as it was.
  for (const auto& [name, tensor] : state) {
    const auto found = loaded.find(name);
    if (found == loaded.end()) throw std::runtime_error(source + ": no tensor named " + name);
    if (found->second.dtype() != tensor.dtype() || !found->second.same_shape(tensor)) {
      throw std::runtime_error(source + ": " + name + " is " + found->second.describe() +
                               ", the model needs " + std::string(dtype_name(tensor.dtype())) +
                               shape_string(tensor.shape()));
    }
  }
  if (loaded.size() != state.size()) {
    for (const auto& [name, tensor] : loaded) {
      bool known = false;
      for (const auto& entry : state) known = known || entry.first == name;
      if (!known) throw std::runtime_error(source + ": tensor " + name + " is not part of this model");
    }
  }
  for (auto [name, tensor] : state) tensor.copy_from(loaded.at(name));
}

}  // namespace bigbatch::nn

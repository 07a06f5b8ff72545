// layers.hpp: what every model of nn/ is made of, written once: the Linear and norm layers
// built on the kernels (their tensors, their forward and backward), and the state_dict
// machinery over a model's list of named tensors (parameters(), state_dict(), zero_grad,
// the 16-bit working copies, loading). The residual MLP (model.hpp) and the GPT (gpt.hpp)
// both list their tensors as StateEntry values and call these; neither repeats them.
//
// Dtypes: parameters are f32 (the masters under mixed precision, beside 16-bit working
// copies of the Linear weights), or f64 throughout for a float64 reference model on the CPU
// (what the tests take finite differences of). Gradients have the parameters' dtype (f32 or
// f64) and are accumulated (+=).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/model.hpp"

namespace bigbatch::nn {

/// One entry of a state_dict: a parameter (with its gradient and, under mixed precision, its
/// 16-bit working copy) or a buffer (grad null). The pointers point into the model.
struct StateEntry {
  std::string name;      ///< the state_dict name
  Tensor* value;         ///< the parameter or buffer
  Tensor* grad;          ///< its gradient; null for a buffer
  Tensor* half = nullptr;  ///< its 16-bit working copy (a Linear weight when mixed), or null
};

/// A parameter tensor of `dtype` (f32, or f64 for a float64 reference), counted under
/// MemoryCategory::parameters.
Tensor parameter_tensor(Shape shape, Device device, DType dtype = DType::f32);

/// nn.Linear(in, out) with uninitialised weight and bias and zero gradients. Under mixed
/// precision the weight is the master (MemoryCategory::master_weights) and weight_half its
/// working copy; `dtype` f64 (CPU, precision fp32 only) makes every tensor f64.
Linear make_linear(std::int64_t in, std::int64_t out, Device device, Precision precision,
                   DType dtype = DType::f32);
/// LayerNorm (or BatchNorm1d with its running statistics) over `features`: weight 1, bias 0.
NormLayer make_norm(Norm kind, std::int64_t features, Device device, DType dtype = DType::f32);

/// The weight a Linear's forward and backward multiply by: the working copy when mixed.
const Tensor& working_weight(const Linear& layer);

/// y = x W^T + b (=). x: [b, in], y: [b, out].
void linear_forward(const Linear& layer, const Tensor& x, const Tensor& y);
/// dW += dy^T x and db += the sum of dy's rows (+=). x: [b, in], dy: [b, out].
void linear_backward_parameters(const Linear& layer, const Tensor& x, const Tensor& dy);
/// dx = dy W (=). dy: [b, out], dx: [b, in].
void linear_backward_input(const Linear& layer, const Tensor& dy, const Tensor& dx);
/// Both, and dx only when it is defined.
void linear_backward(const Linear& layer, const Tensor& x, const Tensor& dy, const Tensor& dx);

/// Appends a Linear's weight and bias under `prefix` ("blocks.0.fc1.").
void append_linear(std::vector<StateEntry>& entries, const std::string& prefix, Linear& layer);
/// Appends a norm's weight and bias (and BatchNorm's running statistics) under `prefix`.
void append_norm(std::vector<StateEntry>& entries, const std::string& prefix, NormLayer& layer);

/// The trainable entries (buffers left out), as NamedParameter handles.
std::vector<NamedParameter> named_parameters(const std::vector<StateEntry>& entries);
/// Every entry's value by name, in order (state_dict()).
std::vector<std::pair<std::string, Tensor>> state_tensors(const std::vector<StateEntry>& entries);
/// The number of trainable elements (a released master counts its working copy).
std::int64_t count_parameters(const std::vector<NamedParameter>& parameters);
/// Sets every defined gradient to 0.
void zero_gradients(const std::vector<NamedParameter>& parameters);
/// Writes every 16-bit working copy from its master (nothing under fp32 or f64).
void refresh_half_copies(const std::vector<NamedParameter>& parameters);
/// Copies `loaded` (name to tensor, any device) into `state`, checking every tensor first
/// (present, of the state's dtype and shape, none extra), so a bad set changes nothing;
/// `source` names where they came from in the errors (std::runtime_error).
void load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                const std::map<std::string, Tensor>& loaded, const std::string& source);

}  // namespace bigbatch::nn

// network.hpp: what a training loop needs from a model, whichever it is: the residual MLP of
// chapters 00-07 (nn::Model) or chapter 08's transformer (nn::Gpt).
//
//   model.zero_grad();
//   for each micro-batch:                         nn::accumulate_gradients (training.hpp)
//     logits = model.forward(inputs, context);    [rows, classes]
//     loss  += cross_entropy(logits, targets) / the step's target count
//     model.backward(d_logits);                   adds (+=) into every parameter gradient
//   model.complete_gradients();                   once, after the step's last backward
//   optimizer step over model.parameters()
//
// The logits have one row per target, in the targets' order, and a loss counts the targets
// that are not ignored.
// Why and how: docs/internals.md#nnnetworkhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/device.hpp"
#include "common/tensor.hpp"
#include "kernels/dropout.hpp"

namespace bigbatch::nn {

/// A trainable tensor, named as in PyTorch's state_dict, and its gradient buffer.
struct NamedParameter {
  /// The state_dict name, e.g. "blocks.0.fc1.weight".
  std::string name;
  Tensor value;  ///< f32: MemoryCategory::parameters, or master_weights when mixed
  Tensor grad;   ///< the same shape, f32, MemoryCategory::gradients, accumulated (+=)
  Tensor half;   ///< the 16-bit working copy the forward reads (mixed Linear weights), or none
  /// The parameter's shape: its value's, or its working copy's while the model's master is
  /// released (Model::release_master_weights).
  const Shape& shape() const { return value.defined() ? value.shape() : half.shape(); }
};

/// Told during a backward that the gradients of parameters()[first, end) are final: no
/// later part of that backward adds to them (each model says its groups' order). A
/// data-parallel run starts summing them over ranks while the rest of the backward runs
/// (chapter 07).
using GradientsReady = std::function<void(std::size_t first, std::size_t end)>;

/// What one forward pass needs to know besides its input.
struct ForwardContext {
  bool training = true;            ///< dropout on, BatchNorm with batch statistics
  std::uint64_t dropout_seed = 0;  ///< the seed of every dropout mask (vary it per step)
  /// The global index of the input's sample 0 in the run (a row for the MLP, a sequence for
  /// the GPT): dropout masks are keyed by it, so a sample draws the same ones in any batch.
  std::int64_t first_row = 0;
  /// A recomputation of blocks already run in this step (activation checkpointing):
  /// everything is computed as before (dropout masks come from the counter RNG, so they
  /// are the same), but BatchNorm does not update its running statistics a second time.
  bool recompute = false;
  /// When set, every dropout of the pass appends the DropoutSpec it draws its mask from
  /// (forward, backward and recomputation alike, in the order drawn): tests read it to check
  /// that no two dropout sites of a step share a stream, which would draw one mask twice.
  std::vector<DropoutSpec>* drawn_dropouts = nullptr;
};

/// How a model's forward() and backward() run its chain of blocks (the MLP's residual
/// blocks, the GPT's transformer blocks): without one, forward() keeps every block's
/// activations for backward(); activation checkpointing (chapter 05) supplies a runner that
/// keeps fewer and recomputes the rest, through Net::block_forward and Net::block_backward.
template <class Net>
class BlockRunnerFor {
 public:
  virtual ~BlockRunnerFor() = default;
  /// Runs blocks 0..n-1 from h0 (the first block's input) and returns h_n, keeping what its
  /// backward needs (in training; an evaluation keeps nothing); forgets whatever an earlier
  /// forward kept. h0 is handed over (by value): the model keeps no other reference, so the
  /// runner decides how long it lives.
  virtual Tensor forward(Net& model, Tensor h0, const ForwardContext& context) = 0;
  /// Given dh_n, the gradient of the last block's output (handed over likewise), adds
  /// (+=) every block's parameter gradients and returns dh_0; releases what forward kept.
  virtual Tensor backward(Net& model, Tensor dh_n, const ForwardContext& context) = 0;

 protected:
  /// For the runners' constructors.
  BlockRunnerFor() = default;
  /// Runners are shared (std::shared_ptr), not copied.
  BlockRunnerFor(const BlockRunnerFor&) = delete;
  /// Runners are shared, not assigned.
  BlockRunnerFor& operator=(const BlockRunnerFor&) = delete;
};

/// A model a training loop can run: forward, backward (+=), its parameters.
class Network {
 public:
  virtual ~Network() = default;

  /// The device that holds every tensor of the model.
  virtual Device device() const = 0;
  /// The trainable tensors in PyTorch's named_parameters() order.
  virtual std::vector<NamedParameter> parameters() const = 0;
  /// The number of trainable elements: the sum of numel() over parameters().
  virtual std::int64_t parameter_count() const = 0;
  /// Every tensor a run's future depends on, by name, in PyTorch's state_dict() order: the
  /// parameters (their f32 values, the masters when mixed) and buffers. A snapshot holds
  /// these (chapters/train/snapshot.hpp).
  virtual std::vector<std::pair<std::string, Tensor>> state_dict() const = 0;
  /// Copies tensors named as state_dict() names them (any device) into the model, and its
  /// 16-bit working copies from them; `source` names where they came from in the errors.
  /// Throws std::runtime_error when a name is missing or extra, or a shape or dtype differs,
  /// before it changes anything.
  virtual void load_state_dict(const std::map<std::string, Tensor>& tensors,
                               const std::string& source) = 0;
  /// Sets every parameter gradient to 0 (once per optimizer step, before its first
  /// micro-batch).
  virtual void zero_grad() = 0;

  /// The logits, f32 [rows, classes] with one row per target of `inputs` (above); in
  /// training it saves what backward() needs.
  virtual Tensor forward(const Tensor& inputs, const ForwardContext& context) = 0;
  /// Adds (+=) the gradients of the loss with respect to every parameter, given d_logits
  /// of the last forward(), and releases what that forward saved.
  virtual void backward(const Tensor& d_logits) = 0;
  /// Makes the gradients final for the optimizer step: once, after its last backward().
  /// A model whose backward() writes every gradient where it belongs does nothing (the
  /// MLP); the GPT adds its tied head's share into the embedding's gradient here.
  virtual void complete_gradients() {}

  // What chapter 07's overlapped sums and ZeRO ask of a model besides its gradients: to be
  // told during a backward as each group of gradients is final, and to give back the bytes
  // of gradients and f32 masters that the ranks hold shards of. The MLP has them; a model
  // without them (these defaults) has its whole gradients summed once per step.
  /// Whether the model has the members below; when false, they refuse (std::logic_error).
  virtual bool releases_state() const { return false; }
  /// Tells `ready` about every group of final gradients in every later backward() (an
  /// empty function: nobody is told, the default).
  virtual void set_gradients_ready(GradientsReady ready);
  /// Releases the gradient buffers of parameters()[first, end) until a backward() needs
  /// them: it allocates them again, as zeros, just before it adds into them.
  virtual void release_gradients(std::size_t first, std::size_t end);
  /// Releases the f32 masters of the 16-bit working copies (mixed precision), until
  /// allocate_master_weights(); forward() and backward() read only the working copies.
  virtual void release_master_weights();
  /// Allocates every released master again, its values unset: the caller writes them.
  virtual void allocate_master_weights();
  /// Whether the model holds its f32 masters (always, for a model that releases none).
  virtual bool holds_master_weights() const { return true; }

  /// Throws std::invalid_argument, naming the data set, unless its samples fit this model
  /// (the MLP: f32 [N, inputs] and labels [N]; the GPT: i32 tokens [N, T] with T <= its
  /// context and targets [N, T]), and its classes fit the model's outputs.
  virtual void check_data(const Dataset& data) const = 0;

 protected:
  // Only a model is built, copied or moved (the float64 twin is returned by value), never a
  // Network alone: a copy through the interface would slice.
  /// For the models' constructors.
  Network() = default;
  /// For the models' copies.
  Network(const Network&) = default;
  /// For the models' moves.
  Network(Network&&) = default;
  /// For the models' copy assignments.
  Network& operator=(const Network&) = default;
  /// For the models' move assignments.
  Network& operator=(Network&&) = default;
};

}  // namespace bigbatch::nn

// dropout.hpp: inverted dropout with masks that depend on the element, not on the call.
//
//   dropout_forward(x, y, spec)     x, y: same shape, f32/f16/bf16    y  = mask * x / (1 - p)
//   dropout_backward(dy, dx, spec)  dy, dx: same shape, f32/f16/bf16  dx = mask * dy / (1 - p)
//
// Both outputs are overwritten (=). An output may be its input (in place). f64 tensors
// are accepted on the CPU only, where the tests use them for finite differences.
//
// Rows run along the first dimension (one row per sample); a row holds N = numel / rows
// elements. Element (i, j) of the tensor is the element of global index
//   g = (spec.first_row + i) * N + j
// and it is kept iff random_uniform(spec.seed, spec.stream, g) >= p (common/rng.hpp).
// first_row is the global index of the tensor's row 0 in the whole batch, so a
// micro-batch of rows [64, 128) with first_row = 64 draws exactly the mask of rows
// 64..127 of the full batch, and a recomputation (checkpointing) draws it again.
// dropout_backward recomputes the mask from the same spec: nothing is stored.
// The RNG gives the four global indices 4q .. 4q + 3 from one Philox evaluation, and
// both backends draw each such group once; a group may straddle two rows, or the
// tensor's first or last element, and every element still gets its own index's value.
//
// Arithmetic, as PyTorch: the kept scale is s = 1/(1 - p) rounded to float, and every
// element is multiplied in float by s (kept) or 0 (dropped), then rounded once to the
// dtype. So p = 0 is the identity, p = 1 gives all zeros (no division by zero), and, as
// in PyTorch, a dropped inf or NaN gives NaN and a dropped negative value gives -0.
// Both backends draw the same mask (the same integer RNG) and compute the same bits
// (NaN payloads aside).
//
// The model's blocks run y = dropout(act(x)). Their backward, fused into one pass:
//
//   activation_dropout_backward(act, x, dy, dx, spec, y)
//     dx = act'(x) * (mask * dy / (1 - p))     dropout_backward, then act's backward
//     y  = mask * act(x) / (1 - p)             act's forward, then dropout_forward: the
//                                              forward's output again, when y is defined
//
// with the roundings of the unfused calls (each result rounded to the dtype where the
// unfused call stores it), so the bits are those of the two or four calls it replaces;
// the mask is drawn once for both, and GELU's value and derivative share one exponential.
// x, dy, dx, y: one shape and dtype (f32, f16 or bf16; f64 on the CPU). Each element is
// read before it is written, so an output may be an input (in place), but dx and y are not
// one. Selective recomputation (chapter 05) needs y, the activation after dropout, to form
// fc2's weight gradient: it then costs one pass where it cost four (act's forward,
// dropout's forward, dropout's and act's backward).
#pragma once

#include <cstdint>

#include "common/tensor.hpp"

namespace bigbatch {

/// Which mask a dropout call draws: the drop probability, the RNG's seed and stream, and
/// the global index of the tensor's row 0.
struct DropoutSpec {
  float p = 0.0f;              ///< probability of dropping an element, in [0, 1]
  std::uint64_t seed = 0;      ///< the run's seed
  std::uint64_t stream = 0;    ///< one stream per dropout layer (and per epoch, if wanted)
  std::int64_t first_row = 0;  ///< global index of row 0 of this tensor in the batch
};

/// The activation before the dropout in activation_dropout_backward (kernels/activation.hpp).
enum class PointwiseActivation { gelu, relu };

/// y = mask * x / (1 - p) (=); x, y: one shape, f32, f16 or bf16 (f64 on the CPU); y may be x.
void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec);
/// dx = mask * dy / (1 - p) (=), the mask drawn again from `spec`; dx may be dy.
void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec);
/// dx = act'(x) * (mask * dy / (1 - p)) (=) and, when y is defined, y = mask * act(x) /
/// (1 - p) (=), in one pass with the roundings of the separate calls.
void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec,
                                 const Tensor& y = Tensor());

namespace cpu {
/// The CPU reference of bigbatch::dropout_forward.
void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec);
/// The CPU reference of bigbatch::dropout_backward.
void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec);
/// The CPU reference of bigbatch::activation_dropout_backward.
void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec, const Tensor& y);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::dropout_forward.
void dropout_forward(const Tensor& x, const Tensor& y, const DropoutSpec& spec);
/// The CUDA implementation of bigbatch::dropout_backward.
void dropout_backward(const Tensor& dy, const Tensor& dx, const DropoutSpec& spec);
/// The CUDA implementation of bigbatch::activation_dropout_backward.
void activation_dropout_backward(PointwiseActivation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, const DropoutSpec& spec, const Tensor& y);
}  // namespace cuda

namespace detail {
/// The factor of a kept element: 1/(1 - p) in float, or 0 when p = 1 (nothing is kept).
inline float dropout_keep_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }
/// The global index of the tensor's element 0: first_row * (numel / rows).
std::uint64_t dropout_first_index(const Tensor& t, const DropoutSpec& spec);
}  // namespace detail

}  // namespace bigbatch

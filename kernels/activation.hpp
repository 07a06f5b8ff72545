// activation.hpp: GELU (tanh approximation) and ReLU, forward and backward.
//
//   gelu_forward(x, y)          x, y: same shape, f32/f16/bf16          y  = gelu(x)
//   gelu_backward(x, dy, dx)    x, dy, dx: same shape and dtype         dx = dy * gelu'(x)
//   relu_forward(x, y)          as gelu_forward                         y  = max(x, 0)
//   relu_backward(x, dy, dx)    as gelu_backward                        dx = dy * [x > 0]
//
// Every output is overwritten (=): these are activation gradients, not parameter
// gradients. An output may be its input (in place). f64 tensors are accepted on the CPU
// only, where the tests use them for finite differences.
//
// gelu is PyTorch's nn.GELU(approximate='tanh'),
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
// evaluated as x * sigmoid(2u) (the same function, see activation_math.hpp) in float and
// rounded once to the dtype; gelu_backward multiplies dy by gelu'(x) in float. Both
// backends run the same formulas with one rounding per operation, so CUDA matches the
// CPU bit for bit (NaN payloads aside). At the infinities, gelu(inf) = inf and
// gelu(-inf) = NaN (as PyTorch: -inf * 0); gelu_backward returns the limits, dy and 0.
// relu'(0) = 0, and NaN passes through ReLU, as in PyTorch.
#pragma once

#include "common/tensor.hpp"

namespace bigbatch {

/// y = gelu(x) (=); x, y: one shape, f32, f16 or bf16 (f64 on the CPU); y may be x.
void gelu_forward(const Tensor& x, const Tensor& y);
/// dx = dy * gelu'(x) (=); x, dy, dx: one shape and dtype; dx may be x or dy.
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
/// y = max(x, 0) (=); tensors as for gelu_forward.
void relu_forward(const Tensor& x, const Tensor& y);
/// dx = dy * [x > 0] (=); tensors as for gelu_backward.
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

namespace cpu {
/// The CPU reference of bigbatch::gelu_forward.
void gelu_forward(const Tensor& x, const Tensor& y);
/// The CPU reference of bigbatch::gelu_backward.
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
/// The CPU reference of bigbatch::relu_forward.
void relu_forward(const Tensor& x, const Tensor& y);
/// The CPU reference of bigbatch::relu_backward.
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::gelu_forward.
void gelu_forward(const Tensor& x, const Tensor& y);
/// The CUDA implementation of bigbatch::gelu_backward.
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
/// The CUDA implementation of bigbatch::relu_forward.
void relu_forward(const Tensor& x, const Tensor& y);
/// The CUDA implementation of bigbatch::relu_backward.
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
}  // namespace cuda

}  // namespace bigbatch

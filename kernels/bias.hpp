// bias.hpp: the bias of a linear layer, forward and backward.
//
//   add_bias(y, bias)          y: [M, N] f32/f16/bf16; bias: [N] f32  y[i][j] = y[i][j] + bias[j]
//                                                                     (in place: =)
//   bias_backward(dy, dbias)   dy: [M, N] f32/f16/bf16; dbias: [N] f32
//                                                                     dbias[j] += sum_i dy[i][j]
//                                                                     (ACCUMULATES: +=)
//
// add_bias computes the sum in float and rounds once to y's dtype.
//
// bias_backward is a parameter gradient, so it accumulates (+=), and its summation
// order is part of the contract.
// - CPU: dbias[j] starts from its current value and adds dy[0][j], then dy[1][j], ... one
//   float addition per row, in row (sample) order. Accumulating micro-batches (rows
//   0..63, then rows 64..127) is then the very same sequence of additions as one batch of
//   128, so gradient accumulation reproduces the large-batch gradient bit for bit, for
//   any split. The work is split across columns, never across rows.
// - CUDA: reduction_order.hpp's order 1: the rows in tiles of 32, each tile summed in row
//   order by its own thread (many blocks), then dbias[j] += the tile sums in tile order.
//   Deterministic (two runs give the same bits) and the same for micro-batches whose rows
//   are multiples of 32; it differs from the CPU's row order by rounding only (each
//   order's error is within gamma(rows) * sum_i |dy[i][j]| of the exact sum).
//
// On the CPU the tests also use f64 (y, bias, dy, dbias all f64) for finite differences.
#pragma once

#include "common/tensor.hpp"

namespace bigbatch {

/// y[i][j] = y[i][j] + bias[j], in place; y: [M, N] f32, f16 or bf16, bias: [N] f32.
void add_bias(const Tensor& y, const Tensor& bias);
/// dbias[j] += sum_i dy[i][j] (accumulates), in the order stated above; dy: [M, N] f32,
/// f16 or bf16, dbias: [N] f32.
void bias_backward(const Tensor& dy, const Tensor& dbias);

namespace cpu {
/// The CPU reference of bigbatch::add_bias.
void add_bias(const Tensor& y, const Tensor& bias);
/// The CPU reference of bigbatch::bias_backward.
void bias_backward(const Tensor& dy, const Tensor& dbias);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::add_bias.
void add_bias(const Tensor& y, const Tensor& bias);
/// The CUDA implementation of bigbatch::bias_backward.
void bias_backward(const Tensor& dy, const Tensor& dbias);
}  // namespace cuda

}  // namespace bigbatch

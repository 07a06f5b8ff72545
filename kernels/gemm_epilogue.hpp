// gemm_epilogue.hpp: a linear layer's GEMM together with the GELU that follows it, forward
// and (the input-gradient GEMM of the next layer) backward, optionally fused into the GEMM's
// epilogue by cuBLASLt.
//
//   linear_bias_gelu_forward(x, w, bias, pre, y)
//     x: [M, K], w: [N, K] (one dtype, f32, f16 or bf16), bias: [N] f32,
//     pre: [M, N] x's dtype      pre = x w^T + bias          (=)  kept for the backward
//     y:   [M, N] x's dtype      y = gelu(pre)               (=)
//   gemm_gelu_backward(dy, w, pre, dh)
//     dy: [M, N2], w: [N2, N], pre: [M, N], dh: [M, N], one dtype (f32, f16 or bf16)
//                                dh = (dy w) * gelu'(pre)     (=)
//
// The unfused path is the reference, on every backend and by default: exactly gemm, then
// add_bias, then gelu_forward (forward); gemm, then gelu_backward (backward), so its bits are
// those ops' bits. The bias gradient is not fused: bias_backward(dh, ...) stays the
// deterministic reduction of bias.hpp.
//
// The fused path (CUDA, f16 operands only: bf16 ones take the unfused path;
// set_fused_epilogues(true), or the environment variable BIGBATCH_FUSED_EPILOGUES=1 at
// start-up) is one cublasLtMatmul each:
//   forward   CUBLASLT_EPILOGUE_GELU_AUX_BIAS: fp32 accumulation, + bias, pre stored (aux),
//             GELU applied, y stored; the bias goes in as an f16 copy (cuBLASLt takes the
//             bias in the output's type), so it is rounded once more than on the unfused path
//   backward  CUBLASLT_EPILOGUE_DGELU: fp32 accumulation, times gelu'(pre) before the one
//             rounding to f16 (the unfused path rounds dy w to f16 first)
// Why not CUBLASLT_EPILOGUE_DGELU_BGRAD: cuBLASLt writes the bias gradient in the output's
// type, f16, where a loss-scaled sum over a batch can overflow to inf (a skipped step that
// fp32 would not have skipped), its summation order is not ours, and it overwrites where
// the contract accumulates (+=).
// GELU: this project's is the tanh approximation (activation.hpp, PyTorch's
// approximate='tanh'), and so is cuBLASLt's; the two evaluate it differently (ours through
// x * sigmoid(2u) with our own exp), so the paths differ by rounding only, never by
// formula. tests/test_gemm_epilogue.cpp derives the bound.
// Where cuBLASLt cannot run a call (f32, a leading dimension that is not a multiple of 8, an
// address not 16-byte aligned, no algorithm returned) the unfused path runs instead;
// fused_epilogue_calls() counts the calls that did fuse.
#pragma once

#include <cstdint>

#include "common/tensor.hpp"

namespace bigbatch {

/// pre = x w^T + bias (=) and y = gelu(pre) (=); shapes and dtypes above.
void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                              const Tensor& pre, const Tensor& y);
/// dh = (dy w) * gelu'(pre) (=); shapes and dtypes above. dh may not share memory with
/// the others.
void gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dh);

/// Chooses the fused cuBLASLt epilogues (true) or the unfused reference (false) for the
/// calls that follow, process-wide.
void set_fused_epilogues(bool enabled);
/// Whether the fused epilogues are chosen; at start-up, whether BIGBATCH_FUSED_EPILOGUES=1.
bool fused_epilogues_enabled();
/// The number of calls that ran fused (cuBLASLt epilogue) since the process started.
std::int64_t fused_epilogue_calls();

namespace cuda {
/// The forward fused by cuBLASLt; false (nothing written) where it cannot run this call.
bool fused_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& pre, const Tensor& y);
/// The backward fused by cuBLASLt; false (nothing written) where it cannot run this call.
bool fused_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dh);
}  // namespace cuda

}  // namespace bigbatch

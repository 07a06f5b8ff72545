// elementwise.hpp: casts and the simple in-place updates of mixed-precision training.
//
//   cast(src, dst)          src, dst: same shape; each f32, f16 or bf16   dst = src
//   scale(x, s)             x: any shape, f32, f16 or bf16                x = x * s
//   axpy(alpha, x, y)       y: f32, x f32, f16 or bf16; or y, x both      y += alpha * x
//                           f16 or both bf16 (both f64 on the CPU)
//   unscale_and_check_finite(tensors, inv_scale, found_inf)
//                           tensors: f32, any shapes, one device          g = g * inv_scale
//                           found_inf: f32 [1], the same device           found_inf = 1 if any g
//                                                                         was inf or NaN, else
//                                                                         left as it was
//   unscale_and_check_finite(tensors, inv_scale, found_inf, squared_norm)
//                           as above, and in the same pass:
//                           squared_norm: f64 [1], the same device        squared_norm = the
//                                                                         sum of every new g^2
//   squared_norm_chunks(tensors)                                          the f64 workspace
//                                                                         elements it allocates
//
// Arithmetic, identical on both backends:
// - cast f32->f16 rounds to nearest even; values at or above 65520 in magnitude become
//   inf, subnormal halves are kept, magnitudes at or below 2^-25 become (signed) zero;
//   f16->f32 is exact. NaN stays NaN (the payload is not specified across backends).
//   cast f32->bf16 rounds to nearest even (common/bfloat16.hpp: fp32's range, so only
//   values past the largest bf16 become inf, and subnormals round like any value);
//   bf16->f32 is exact. Between f16 and bf16 a cast goes through float (exact, then one
//   rounding).
// - scale computes x * s in float and rounds once to x's dtype.
// - axpy computes y + (alpha * x) with two roundings in float: the product, then the
//   sum (never a fused multiply-add). With alpha == 1 the product is exact, so the
//   result is exactly the float sum y + x. A 16-bit x is first converted to float (exact).
//   A 16-bit y (with an x of its dtype: the residual stream under mixed precision) is
//   widened exactly, and the float result is rounded once more, to y's dtype, on store.
// - unscale_and_check_finite is PyTorch's _amp_foreach_non_finite_check_and_unscale_
//   with a float scale: every element becomes g * inv_scale (one rounding), and found_inf
//   becomes exactly 1.0f if any element was inf or NaN before scaling; otherwise it is
//   left as it was (the caller zeroes it), so one found_inf can collect several calls.
//   One pass over each tensor (on CUDA: one launch for up to 48 tensors). The tensors must
//   not share memory with each other or with found_inf (a tensor listed twice would be
//   unscaled twice, and on CUDA written by two blocks at once): such a list is refused.
//
// - The squared norm (gradient clipping's, kernels' callers take the square root) is summed
//   in float64 in one fixed order, the same on both backends, so CPU and CUDA agree to the
//   bit and a run gives the same norm at every thread count. Each tensor is cut into
//   chunks of kNormChunk = 4096 elements (the last one short); in a chunk, lane l of 256
//   adds the squares of elements l, l + 256, l + 512, ... in that order (a square of a
//   float is exact in float64); the 256 lanes are summed as CUDA's warp shuffles do: in
//   each group of 32, lane i takes lane i + d for d = 16, 8, 4, 2, 1, then the 8 group sums
//   the same way (padded to 32 with zeros). The chunks' sums (numbered in order, tensor by
//   tensor) are then combined the same way as a chunk's elements: lane l adds chunk sums l,
//   l + 256, l + 512, ... in that order, and the lanes meet in the same trees (on CUDA one
//   block of 256 threads, instead of one thread walking every chunk). The chunk sums live in
//   one f64 workspace tensor of squared_norm_chunks(tensors) elements, allocated for the call.
// - found_inf on CUDA: every thread that saw an inf or NaN stores the same 1.0f, so the
//   result does not depend on which store lands last (no reduction, no atomics needed).
//
// The CPU building blocks of these loops (run_vectorized, the binary16 conversions,
// check_same_or_disjoint) are not part of this API: they live in cpu_vector.hpp, which
// the files that use them include directly.
#pragma once

#include <cstdint>
#include <vector>

#include "common/tensor.hpp"

namespace bigbatch {

/// dst = src in dst's dtype (=); same shape; src and dst each f32, f16 or bf16.
void cast(const Tensor& src, const Tensor& dst);
/// x = x * s in place; x: f32, f16 or bf16.
void scale(const Tensor& x, float s);
/// y += alpha * x; y f32 with x f32, f16 or bf16, or both f16, or both bf16 (or both f64 on
/// the CPU, for float64 reference models).
void axpy(float alpha, const Tensor& x, const Tensor& y);
/// g = g * inv_scale for every element of every tensor (f32); found_inf (f32 [1]) = 1
/// if any g was inf or NaN, else left as it was.
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf);
/// As above and, in the same pass, squared_norm (f64 [1]) = the sum of every unscaled g^2
/// (=), in the fixed order described above.
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf, const Tensor& squared_norm);
/// The number of kNormChunk-element chunks of `tensors`: the length of the f64 workspace
/// the squared norm is summed in.
std::int64_t squared_norm_chunks(const std::vector<Tensor>& tensors);

inline constexpr std::int64_t kNormChunk = 4096;  ///< elements per chunk of the squared norm
inline constexpr int kNormLanes = 256;            ///< lanes per chunk (CUDA: threads per block)

namespace cpu {
/// The CPU reference of bigbatch::cast.
void cast(const Tensor& src, const Tensor& dst);
/// The CPU reference of bigbatch::scale.
void scale(const Tensor& x, float s);
/// The CPU reference of bigbatch::axpy.
void axpy(float alpha, const Tensor& x, const Tensor& y);
/// The CPU reference of bigbatch::unscale_and_check_finite.
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf);
/// chunk_sums: f64 [squared_norm_chunks(tensors)], the workspace
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf, const Tensor& squared_norm,
                              const Tensor& chunk_sums);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::cast.
void cast(const Tensor& src, const Tensor& dst);
/// The CUDA implementation of bigbatch::scale.
void scale(const Tensor& x, float s);
/// The CUDA implementation of bigbatch::axpy.
void axpy(float alpha, const Tensor& x, const Tensor& y);
/// The CUDA implementation of bigbatch::unscale_and_check_finite.
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf);
/// chunk_sums: f64 [squared_norm_chunks(tensors)], the workspace
void unscale_and_check_finite(const std::vector<Tensor>& tensors, float inv_scale,
                              const Tensor& found_inf, const Tensor& squared_norm,
                              const Tensor& chunk_sums);
}  // namespace cuda

}  // namespace bigbatch

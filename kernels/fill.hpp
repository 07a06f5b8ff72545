// fill.hpp: set every element of a tensor to one value.
//
//   fill(out, value)    out: any shape, any dtype          out  = value  (overwrite)
//
// The value is rounded to float, then to the tensor's dtype (to nearest even; i32
// truncates toward zero), the same two steps on both backends. Used to zero gradient buffers and, in the tests,
// to poison outputs so that an element an op forgot to write shows up as NaN.
#pragma once

#include "common/tensor.hpp"

namespace bigbatch {

/// Sets every element of `out` to `value`, rounded as above (overwrite); any shape and dtype.
void fill(const Tensor& out, double value);

namespace cpu {
/// The CPU reference of bigbatch::fill.
void fill(const Tensor& out, double value);
}
namespace cuda {
/// The CUDA implementation of bigbatch::fill.
void fill(const Tensor& out, double value);
}

}  // namespace bigbatch

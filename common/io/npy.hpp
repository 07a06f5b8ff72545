// npy.hpp: NumPy's .npy array files, the format user data sets arrive in.
//
// A .npy file is the magic "\x93NUMPY", a major and minor version byte, the header
// length (2 bytes little-endian in version 1.0, 4 bytes in 2.0 and 3.0), an ASCII
// (3.0: UTF-8) Python dict literal such as
//
//   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 784), }
//
// padded with spaces and ended by '\n', then the elements in C (row-major) order.
// Reading accepts versions 1.0, 2.0 and 3.0 and any simple little-endian dtype
// ('<f4', '<i8', '|u1', ...); it refuses, with a message naming the file, Fortran
// order, big-endian data, structured and object dtypes, and files shorter than their
// header says. Bytes after the array are ignored, as numpy.load ignores them.
// Writing produces version 1.0 with the header padded so that the data starts at a
// multiple of 64 bytes, as NumPy does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/memory.hpp"
#include "common/tensor.hpp"

namespace bigbatch {

/// One array as it sits in a .npy file: the dtype exactly as NumPy spells it, the
/// shape, and the elements' raw little-endian bytes in row-major order.
struct NpyArray {
  std::string dtype;                ///< e.g. "<f4", "<i8", "|u1"
  std::vector<std::int64_t> shape;  ///< empty for a 0-d array (a scalar)
  bool fortran_order = false;       ///< always false for arrays read or written here
  std::vector<unsigned char> data;  ///< numel() * itemsize() bytes

  /// The number of elements, the product of `shape` (1 for a 0-d array).
  std::int64_t numel() const;
  /// 'f' floating, 'i' signed integer, 'u' unsigned integer, 'b' bool, 'c' complex.
  char kind() const;
  /// Bytes per element, the number in the dtype ("<f4" -> 4).
  std::size_t itemsize() const;
};

/// One element of an integer array, of any width and signedness, as sign and magnitude
/// (so that every int64 and uint64 value is exact).
struct NpyInteger {
  bool negative = false;        ///< below zero (only a signed dtype's elements are)
  std::uint64_t magnitude = 0;  ///< the absolute value
};

/// Every element (row-major) of an array of kind 'i' or 'u' and at most 8 bytes an element;
/// other dtypes throw std::invalid_argument (callers check the dtype first, to say more).
std::vector<NpyInteger> integer_elements(const NpyArray& array);

/// Reads a .npy file. Throws std::runtime_error naming the file and the problem.
NpyArray read_npy(const std::string& path);

/// Writes `array` as a version 1.0 .npy file (dtype, shape and byte count are checked).
void write_npy(const std::string& path, const NpyArray& array);

/// Writes a tensor (any device; copied to the host first): f32 -> "<f4", f64 -> "<f8",
/// i32 -> "<i4", f16 -> "<f2".
void write_npy(const std::string& path, const Tensor& tensor);

/// The tensor's bytes as an NpyArray (copied to the host when on CUDA).
NpyArray tensor_to_npy(const Tensor& tensor);

/// A CPU tensor with the array's shape and elements, for the dtypes a Tensor holds
/// ("<f4", "<f8", "<i4", "<f2"); other dtypes throw, naming `source` (e.g. the path).
Tensor npy_to_tensor(const NpyArray& array, MemoryCategory category = MemoryCategory::workspace,
                     const std::string& source = "npy array");

}  // namespace bigbatch

// tensor.hpp: a dense, row-major, contiguous array on one device.
//
// A Tensor is a shape, a dtype, a device and a reference to storage obtained from
// that device's TrackingAllocator under one MemoryCategory. Copies of a Tensor share
// storage (like a shared_ptr); clone() and to() make deep copies. rows() and
// reshaped() are views: they share storage, which is how a micro-batch is carved out
// of a batch without copying it.
//
// There are no strides: every tensor is contiguous. Ops that need a transpose (GEMM)
// take it as a flag.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/device.hpp"
#include "common/dtype.hpp"
#include "common/memory.hpp"

namespace bigbatch {

/// The size of each dimension, outermost first; empty for a scalar.
using Shape = std::vector<std::int64_t>;

std::string shape_string(const Shape& shape);  ///< "[64, 784]"
/// The product of the dimensions (1 for an empty shape); throws on a negative dimension
/// or an overflowing product.
std::int64_t shape_numel(const Shape& shape);

/// A dense, row-major, contiguous array of one dtype on one device. Copies share
/// storage; clone() and to() copy the elements.
class Tensor {
 public:
  Tensor() = default;
  /// Allocates an uninitialised tensor.
  Tensor(Shape shape, DType dtype, Device device = Device::cpu(),
         MemoryCategory category = MemoryCategory::workspace);

  /// Allocates a tensor and sets every element to zero.
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu(),
                      MemoryCategory category = MemoryCategory::workspace);

  /// A CPU tensor holding `values` (numel must match the shape), copied to `device`.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape,
                            Device device = Device::cpu(),
                            MemoryCategory category = MemoryCategory::workspace);

  /// False for a default-constructed tensor, which has no storage.
  bool defined() const { return storage_ != nullptr; }
  /// The size of each dimension.
  const Shape& shape() const { return shape_; }
  /// The number of dimensions.
  int rank() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension i; negative i counts from the end.
  std::int64_t dim(int i) const;
  /// The number of elements.
  std::int64_t numel() const { return numel_; }
  /// The size of the elements in bytes: numel() * dtype_size(dtype()).
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  /// The element type.
  DType dtype() const { return dtype_; }
  /// Where the storage lives.
  Device device() const { return device_; }
  /// The category the storage is counted under.
  MemoryCategory category() const { return category_; }

  /// The address of the first element (a device pointer on CUDA); nullptr when there is
  /// no storage.
  void* raw_data() const;
  /// Typed pointer; throws if T does not match the dtype.
  template <class T>
  T* data() const {
    BIGBATCH_CHECK(DTypeOf<T>::value == dtype_, "tensor holds ", dtype_name(dtype_),
                   ", not ", dtype_name(DTypeOf<T>::value), ": ", describe());
    return static_cast<T*>(raw_data());
  }

  /// A view of rows [begin, end) along the first dimension.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  /// A view with another shape of the same numel.
  Tensor reshaped(Shape shape) const;

  /// A deep copy on `device` (and in `category`, default: this tensor's).
  Tensor to(Device device, std::optional<MemoryCategory> category = std::nullopt) const;
  /// A deep copy on the same device and in the same category.
  Tensor clone() const { return to(device_); }
  /// Copies `source` (same shape and dtype, any device) into this tensor.
  void copy_from(const Tensor& source);
  /// The elements, copied to the host.
  template <class T>
  std::vector<T> to_vector() const;

  /// True when both tensors have the same shape (dtype and device are not compared).
  bool same_shape(const Tensor& other) const { return shape_ == other.shape_; }
  /// "f32[64, 784] on cpu (activations)"
  std::string describe() const;

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  std::size_t offset_bytes_ = 0;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  MemoryCategory category_ = MemoryCategory::workspace;
};

// ---- templates --------------------------------------------------------------------

namespace detail {
/// Copies `bytes` bytes between any two devices (overlapping host ranges are allowed).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t bytes);
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape, Device device,
                           MemoryCategory category) {
  BIGBATCH_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape),
                 "from_vector: ", values.size(), " values for shape ", shape_string(shape));
  Tensor t(std::move(shape), DTypeOf<T>::value, device, category);
  detail::copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  BIGBATCH_CHECK(DTypeOf<T>::value == dtype_, "to_vector: tensor holds ",
                 dtype_name(dtype_), ": ", describe());
  std::vector<T> values(static_cast<std::size_t>(numel_));
  detail::copy_bytes(values.data(), Device::cpu(), raw_data(), device_, nbytes());
  return values;
}

}  // namespace bigbatch

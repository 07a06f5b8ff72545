#include "common/tensor.hpp"

#include <cstring>
#include <limits>
#include <sstream>

#include "common/cuda_runtime.hpp"

namespace bigbatch {

struct Tensor::Storage {
  Storage(std::size_t bytes, Device device, MemoryCategory category)
      : pointer(allocator_for(device).allocate(bytes, category)),
        bytes(bytes),
        device(device),
        category(category) {}
  ~Storage() { allocator_for(device).deallocate(pointer, bytes, category); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* pointer;
  std::size_t bytes;
  Device device;
  MemoryCategory category;
};

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) {
    BIGBATCH_CHECK(d >= 0, "negative dimension in shape ", shape_string(shape));
    BIGBATCH_CHECK(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / d, "shape ",
                   shape_string(shape), " has too many elements");
    n *= d;
  }
  return n;
}

Tensor::Tensor(Shape shape, DType dtype, Device device, MemoryCategory category)
    : shape_(std::move(shape)), dtype_(dtype), device_(device), category_(category) {
  numel_ = shape_numel(shape_);
  BIGBATCH_CHECK(device.is_cpu() || dtype != DType::f64,
                 "f64 tensors exist only on the CPU (they are test oracles)");
  if (device.is_cuda()) {
    std::string why;
    BIGBATCH_CHECK(cuda_rt::available(&why), "cannot create a tensor on ", device.name(),
                   ": ", why);
    // The CUDA runtime calls in common/cuda_runtime.cpp work on the current device, which
    // is device 0: until they select the tensor's device, other ordinals are refused
    // rather than silently placed on device 0.
    BIGBATCH_CHECK(device.index == 0, "cannot create a tensor on ", device.name(),
                   ": this version of bigbatch uses one GPU, cuda:0");
  }
  storage_ = std::make_shared<Storage>(nbytes(), device, category);
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device, MemoryCategory category) {
  Tensor t(std::move(shape), dtype, device, category);
  if (t.nbytes() == 0) return t;
  if (device.is_cpu()) {
    std::memset(t.raw_data(), 0, t.nbytes());
  } else {
    cuda_rt::memset_zero(t.raw_data(), t.nbytes());
  }
  return t;
}

std::int64_t Tensor::dim(int i) const {
  const int r = rank();
  const int k = i < 0 ? i + r : i;
  BIGBATCH_CHECK(k >= 0 && k < r, "dimension ", i, " out of range for ", describe());
  return shape_[static_cast<std::size_t>(k)];
}

void* Tensor::raw_data() const {
  if (storage_ == nullptr || storage_->pointer == nullptr) return nullptr;
  return static_cast<char*>(storage_->pointer) + offset_bytes_;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  BIGBATCH_CHECK(rank() >= 1, "rows() needs at least one dimension: ", describe());
  BIGBATCH_CHECK(0 <= begin && begin <= end && end <= shape_[0], "rows [", begin, ", ", end,
                 ") out of range for ", describe());
  Tensor view = *this;
  const std::int64_t row_elements = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  view.offset_bytes_ +=
      static_cast<std::size_t>(begin * row_elements) * dtype_size(dtype_);
  view.shape_[0] = end - begin;
  view.numel_ = (end - begin) * row_elements;
  return view;
}

Tensor Tensor::reshaped(Shape shape) const {
  BIGBATCH_CHECK(shape_numel(shape) == numel_, "cannot reshape ", describe(), " to ",
                 shape_string(shape));
  Tensor view = *this;
  view.shape_ = std::move(shape);
  return view;
}

Tensor Tensor::to(Device device, std::optional<MemoryCategory> category) const {
  Tensor copy(shape_, dtype_, device, category.value_or(category_));
  copy.copy_from(*this);
  return copy;
}

void Tensor::copy_from(const Tensor& source) {
  BIGBATCH_CHECK(source.shape_ == shape_ && source.dtype_ == dtype_, "copy_from: ",
                 source.describe(), " does not fit ", describe());
  detail::copy_bytes(raw_data(), device_, source.raw_data(), source.device_, nbytes());
}

std::string Tensor::describe() const {
  std::ostringstream out;
  out << dtype_name(dtype_) << shape_string(shape_) << " on " << device_.name() << " ("
      << category_name(category_) << ")";
  return out.str();
}

namespace detail {

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);  // views of one storage may overlap
    return;
  }
  const auto kind = dst_device.is_cpu()   ? cuda_rt::CopyKind::device_to_host
                    : src_device.is_cpu() ? cuda_rt::CopyKind::host_to_device
                                          : cuda_rt::CopyKind::device_to_device;
  cuda_rt::memcpy(dst, src, bytes, kind);
}

}  // namespace detail

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string number = text.substr(5);
    if (!number.empty() && number.size() <= 4 &&
        number.find_first_not_of("0123456789") == std::string::npos) {
      return Device::cuda(std::stoi(number));
    }
  }
  throw std::invalid_argument("unknown device '" + text + "': expected cpu, cuda or cuda:N");
}

}  // namespace bigbatch

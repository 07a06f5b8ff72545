// A user's data set as two .npy files: features (float) and labels (integers).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "common/data/dataset.hpp"
#include "common/io/npy.hpp"

namespace bigbatch {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// features f32 [N, D] from float32 or float64 elements of any rank >= 1.
Tensor features_from(const NpyArray& array, const std::string& path) {
  if (array.kind() != 'f' || (array.itemsize() != 4 && array.itemsize() != 8)) {
    fail(path, "features must be float32 ('<f4') or float64 ('<f8'), got '" + array.dtype + "'");
  }
  if (array.shape.empty()) fail(path, "features must be [N, D], got a 0-d array");
  const std::int64_t samples = array.shape[0];
  std::int64_t width = 1;
  for (std::size_t i = 1; i < array.shape.size(); ++i) width *= array.shape[i];
  if (samples == 0) fail(path, "holds no samples (shape " + shape_string(array.shape) + ")");
  if (width == 0) fail(path, "holds samples of no features (shape " + shape_string(array.shape) + ")");

  Tensor features({samples, width}, DType::f32, Device::cpu(), MemoryCategory::host_data);
  float* out = features.data<float>();
  const std::int64_t count = samples * width;
  if (array.itemsize() == 4) {
    if (count > 0) std::memcpy(out, array.data.data(), array.data.size());
  } else {
    for (std::int64_t i = 0; i < count; ++i) {
      double value;
      std::memcpy(&value, array.data.data() + i * 8, 8);
      out[i] = static_cast<float>(value);  // round to nearest
    }
  }
  // A NaN or inf would reach the loss and stop the run later, far from its cause.
  for (std::int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) {
      fail(path, "feature " + std::to_string(i % width) + " of sample " +
                     std::to_string(i / width) + " is " + (std::isnan(out[i]) ? "NaN" : "inf") +
                     (array.itemsize() == 8 && !std::isnan(out[i]) ? " in float32" : "") +
                     ": features must be finite");
    }
  }
  return features;
}

// labels i32 [N] from any integer dtype; returns num_classes = max label + 1.
Tensor labels_from(const NpyArray& array, const std::string& path, std::int64_t& num_classes) {
  const std::size_t size = array.itemsize();
  if ((array.kind() != 'i' && array.kind() != 'u') || size > 8) {
    fail(path, "labels must be integers (int8..int64, uint8..uint64), got '" + array.dtype + "'");
  }
  if (array.shape.size() != 1) {
    fail(path, "labels must be 1-D [N], got shape " + shape_string(array.shape));
  }
  const std::int64_t samples = array.shape[0];
  Tensor labels({samples}, DType::i32, Device::cpu(), MemoryCategory::host_data);
  std::int32_t* out = labels.data<std::int32_t>();
  // The largest label leaves room for num_classes = label + 1 in an int32.
  constexpr auto kLargest =
      static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max() - 1);
  std::int64_t largest = -1;
  const std::vector<NpyInteger> elements = integer_elements(array);
  for (std::int64_t i = 0; i < samples; ++i) {
    const NpyInteger label = elements[static_cast<std::size_t>(i)];
    if (label.negative) {
      fail(path, "label -" + std::to_string(label.magnitude) + " of sample " + std::to_string(i) +
                     " is negative; classes are numbered from 0");
    }
    if (label.magnitude > kLargest) {
      fail(path, "label " + std::to_string(label.magnitude) + " of sample " + std::to_string(i) +
                     " is too large for an int32 class index");
    }
    out[i] = static_cast<std::int32_t>(label.magnitude);
    largest = std::max<std::int64_t>(largest, out[i]);
  }
  num_classes = largest + 1;
  return labels;
}

}  // namespace

Dataset load_npy_dataset(const std::string& features_path, const std::string& labels_path) {
  Dataset dataset;
  dataset.features = features_from(read_npy(features_path), features_path);
  dataset.labels = labels_from(read_npy(labels_path), labels_path, dataset.num_classes);
  if (dataset.labels.dim(0) != dataset.features.dim(0)) {
    fail(labels_path, "holds " + std::to_string(dataset.labels.dim(0)) + " labels, but " +
                          features_path + " holds " + std::to_string(dataset.features.dim(0)) +
                          " samples");
  }
  dataset.name = features_path;
  return dataset;
}

}  // namespace bigbatch

#include "common/data/dataset.hpp"

#include <algorithm>
#include <cstddef>
#include <numeric>

namespace bigbatch {

Dataset slice(const Dataset& dataset, std::int64_t begin, std::int64_t end) {
  return {dataset.features.rows(begin, end), dataset.labels.rows(begin, end), dataset.num_classes,
          dataset.name};
}

void check_labels(const Tensor& labels, std::int64_t num_classes, const std::string& what,
                  IgnoredLabels ignored) {
  BIGBATCH_CHECK(labels.dtype() == DType::i32, what, ": labels must be i32, got ",
                 labels.describe());
  const Tensor host = labels.device().is_cpu() ? labels : labels.to(Device::cpu());
  const std::int32_t* values = host.data<std::int32_t>();
  for (std::int64_t i = 0; i < host.numel(); ++i) {
    const bool skipped = ignored == IgnoredLabels::allowed && values[i] == kIgnoredLabel;
    BIGBATCH_CHECK(skipped || (0 <= values[i] && values[i] < num_classes), what, ": label ",
                   values[i], " of row ", i, " is outside [0, ", num_classes, ")",
                   ignored == IgnoredLabels::allowed ? " and is not the ignored label -100" : "");
  }
}

std::int64_t count_targets(const Dataset& dataset, const std::vector<std::int64_t>& indices) {
  if (!dataset.holds_tokens()) return static_cast<std::int64_t>(indices.size());
  const std::int64_t width = dataset.targets_per_sample();
  const std::int32_t* labels = dataset.labels.data<std::int32_t>();
  std::int64_t count = 0;
  for (const std::int64_t row : indices) {
    BIGBATCH_CHECK(0 <= row && row < dataset.size(), "count_targets: index ", row,
                   " out of range for ", dataset.name, " with ", dataset.size(), " samples");
    count += std::count_if(labels + row * width, labels + (row + 1) * width,
                           [](std::int32_t label) { return label != kIgnoredLabel; });
  }
  return count;
}

std::int64_t count_targets(const Dataset& dataset) {
  std::vector<std::int64_t> every(static_cast<std::size_t>(dataset.size()));
  std::iota(every.begin(), every.end(), std::int64_t{0});
  return count_targets(dataset, every);
}

void gather_rows(const Dataset& dataset, const std::vector<std::int64_t>& indices,
                 const Tensor& features_out, const Tensor& labels_out) {
  BIGBATCH_CHECK(dataset.features.device().is_cpu() && dataset.labels.device().is_cpu(),
                 "gather_rows: the data set must be on the host, got ",
                 dataset.features.describe());
  BIGBATCH_CHECK(dataset.labels.dim(0) == dataset.size(), "gather_rows: ", dataset.name, " has ",
                 dataset.size(), " samples but ", dataset.labels.dim(0), " labels");
  const auto batch = static_cast<std::int64_t>(indices.size());
  const std::int64_t width = dataset.feature_dim(), targets = dataset.targets_per_sample();
  const DType dtype = dataset.features.dtype();
  const Shape features_shape = {batch, width};
  const Shape labels_shape = dataset.holds_tokens() ? Shape{batch, targets} : Shape{batch};
  BIGBATCH_CHECK(features_out.dtype() == dtype && features_out.shape() == features_shape,
                 "gather_rows: features_out must be ", dtype_name(dtype),
                 shape_string(features_shape), ", got ", features_out.describe());
  BIGBATCH_CHECK(labels_out.dtype() == DType::i32 && labels_out.shape() == labels_shape,
                 "gather_rows: labels_out must be i32", shape_string(labels_shape), ", got ",
                 labels_out.describe());
  const bool on_host = features_out.device().is_cpu() && labels_out.device().is_cpu();
  const Tensor features = on_host ? features_out : Tensor(features_shape, dtype);
  const Tensor labels = on_host ? labels_out : Tensor(labels_shape, DType::i32);
  // A row is copied as bytes: f32 features and i32 tokens alike.
  const std::size_t row_bytes = static_cast<std::size_t>(width) * dtype_size(dtype);
  const auto* source_features = static_cast<const std::byte*>(dataset.features.raw_data());
  const std::int32_t* source_labels = dataset.labels.data<std::int32_t>();
  auto* gathered_features = static_cast<std::byte*>(features.raw_data());
  std::int32_t* gathered_labels = labels.data<std::int32_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t row = indices[static_cast<std::size_t>(b)];
    BIGBATCH_CHECK(0 <= row && row < dataset.size(), "gather_rows: index ", row,
                   " out of range for ", dataset.name, " with ", dataset.size(), " samples");
    std::copy_n(source_features + static_cast<std::size_t>(row) * row_bytes, row_bytes,
                gathered_features + static_cast<std::size_t>(b) * row_bytes);
    std::copy_n(source_labels + row * targets, targets, gathered_labels + b * targets);
  }
  if (!on_host) {  // a Tensor copy shares storage: copying into it writes the output
    check_labels(labels, dataset.num_classes, "gather_rows (" + dataset.name + ")",
                 dataset.holds_tokens() ? IgnoredLabels::allowed : IgnoredLabels::refused);
    Tensor(features_out).copy_from(features);
    Tensor(labels_out).copy_from(labels);
  }
}

}  // namespace bigbatch

#include "common/data/dataset.hpp"

#include <algorithm>

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

void gather_rows(const Dataset& dataset, const std::vector<std::int64_t>& indices,
                 const Tensor& features_out, const Tensor& labels_out) {
  BIGBATCH_CHECK(dataset.features.device().is_cpu() && dataset.labels.device().is_cpu(),
                 "gather_rows: the data set must be on the host, got ",
                 dataset.features.describe());
  BIGBATCH_CHECK(dataset.labels.dim(0) == dataset.size(), "gather_rows: ", dataset.name, " has ",
                 dataset.size(), " samples but ", dataset.labels.dim(0), " labels");
  const auto batch = static_cast<std::int64_t>(indices.size());
  const std::int64_t width = dataset.feature_dim();
  const Shape features_shape = {batch, width}, labels_shape = {batch};
  BIGBATCH_CHECK(features_out.dtype() == DType::f32 && features_out.shape() == features_shape,
                 "gather_rows: features_out must be f32", shape_string(features_shape), ", got ",
                 features_out.describe());
  BIGBATCH_CHECK(labels_out.dtype() == DType::i32 && labels_out.shape() == labels_shape,
                 "gather_rows: labels_out must be i32", shape_string(labels_shape), ", got ",
                 labels_out.describe());
  const bool on_host = features_out.device().is_cpu() && labels_out.device().is_cpu();
  const Tensor features = on_host ? features_out : Tensor(features_shape, DType::f32);
  const Tensor labels = on_host ? labels_out : Tensor(labels_shape, DType::i32);
  const float* source_features = dataset.features.data<float>();
  const std::int32_t* source_labels = dataset.labels.data<std::int32_t>();
  float* gathered_features = features.data<float>();
  std::int32_t* gathered_labels = labels.data<std::int32_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t row = indices[static_cast<std::size_t>(b)];
    BIGBATCH_CHECK(0 <= row && row < dataset.size(), "gather_rows: index ", row,
                   " out of range for ", dataset.name, " with ", dataset.size(), " samples");
    std::copy_n(source_features + row * width, width, gathered_features + b * width);
    gathered_labels[b] = source_labels[row];
  }
  if (!on_host) {  // a Tensor copy shares storage: copying into it writes the output
    check_labels(labels, dataset.num_classes, "gather_rows (" + dataset.name + ")");
    Tensor(features_out).copy_from(features);
    Tensor(labels_out).copy_from(labels);
  }
}

}  // namespace bigbatch

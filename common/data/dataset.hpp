// dataset.hpp: the data sources every chapter trains on.
//
// A Dataset is N samples held on the host, in MemoryCategory::host_data (outside the device
// totals: common/memory.hpp), of one of two kinds:
//
//   classification   features f32 [N, D], labels i32 [N] in 0..num_classes-1
//   tokens           features i32 [N, T] (token ids), labels i32 [N, T]: the target of each
//                    position (the next token), or kIgnoredLabel where there is none
//
// Sources: load_fashion_mnist, load_npy_dataset and make_synthetic (classification), and
// text_corpus.hpp's make_token_dataset (tokens). slice() gives a view of consecutive samples
// (no copy); gather_rows() copies samples picked by index into preallocated tensors on the
// CPU or a GPU.
// Why and how: docs/internals.md#commondatadatasethpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor.hpp"

namespace bigbatch {

/// A data set on the host (the two kinds above): its samples and the number of classes.
struct Dataset {
  Tensor features;  ///< f32 [N, D], or i32 tokens [N, T]; CPU, MemoryCategory::host_data
  Tensor labels;    ///< i32 [N], or [N, T] for tokens; CPU, MemoryCategory::host_data
  std::int64_t num_classes = 0;  ///< labels lie in [0, num_classes) (tokens: or are ignored)
  std::string name;              ///< e.g. "fashion-mnist/train"

  std::int64_t size() const { return features.dim(0); }         ///< N
  std::int64_t feature_dim() const { return features.dim(1); }  ///< D, or T for tokens
  /// Whether the samples are token sequences (labels [N, T]) rather than classified rows.
  bool holds_tokens() const { return labels.rank() == 2; }
  /// The labels of one sample: 1, or T for tokens.
  std::int64_t targets_per_sample() const { return holds_tokens() ? labels.dim(1) : 1; }
};

// ---- Fashion-MNIST --------------------------------------------------------------------

/// Which Fashion-MNIST files to read: train (60000 samples) or t10k (10000).
enum class FashionMnistSplit { train, test };

/// Where the idx files are looked for: the environment variable
/// BIGBATCH_FASHION_MNIST_DIR when set and not empty, else the folder configured at
/// build time (CMake's BIGBATCH_FASHION_MNIST_DIR, /usr/share/datasets/fashion-mnist).
std::string default_fashion_mnist_directory();

/// True when all four idx files (train and t10k, images and labels) exist in `directory`.
bool fashion_mnist_available(const std::string& directory = default_fashion_mnist_directory());

/// Reads train-{images-idx3,labels-idx1}-ubyte.gz (60000 samples) or
/// t10k-{images-idx3,labels-idx1}-ubyte.gz (10000) from `directory`: features
/// [N, 784] with pixel byte b stored as static_cast<float>(b) / 255.0f, labels 0..9.
/// Throws std::runtime_error naming the file when it is missing (and the package that
/// provides it), truncated, corrupt, or not an idx file of the expected kind.
Dataset load_fashion_mnist(FashionMnistSplit split,
                           const std::string& directory = default_fashion_mnist_directory());

// ---- .npy -----------------------------------------------------------------------------

/// A data set from two .npy files. Features: float32 or float64 (converted to f32),
/// shape [N, D], or [N, d1, d2, ...] flattened to [N, d1*d2*...], or [N] read as
/// [N, 1]. Labels: any integer dtype, shape [N], values >= 0 and within int32;
/// num_classes = max label + 1. Throws std::runtime_error naming the file at fault.
Dataset load_npy_dataset(const std::string& features_path, const std::string& labels_path);

// ---- synthetic ------------------------------------------------------------------------

/// The sizes and seed of make_synthetic()'s data set.
struct SyntheticOptions {
  /// N, the number of samples.
  std::int64_t samples = 60000;
  /// D, the number of features per sample.
  std::int64_t features = 784;
  /// C, the number of classes (the teacher's outputs).
  std::int64_t classes = 10;
  std::int64_t teacher_hidden = 64;  ///< width of the teacher's hidden layer
  /// The RNG seed every feature and teacher weight is drawn under.
  std::uint64_t seed = 1234;
};

/// A data set labelled by a fixed random teacher network (see synthetic.cpp):
/// x uniform on [-1, 1) per feature, label = argmax of a one-hidden-layer tanh MLP.
/// Every value is a function of (seed, sample index, feature index) through the
/// counter-based RNG, so sample i is the same whatever `samples` is, and the same
/// options give the same bytes on every machine.
Dataset make_synthetic(const SyntheticOptions& options = {});

// ---- batches --------------------------------------------------------------------------

/// Samples [begin, end) as views of `dataset` (no copy).
Dataset slice(const Dataset& dataset, std::int64_t begin, std::int64_t end);

/// The label of a row that has no target: PyTorch's default ignore_index. Token data marks
/// its padding with it; softmax cross-entropy gives such a row no loss and no gradient.
inline constexpr std::int32_t kIgnoredLabel = -100;

/// Whether check_labels lets kIgnoredLabel through: classification data sets have a class for
/// every sample (refused); token targets mark padding with it (allowed).
enum class IgnoredLabels { refused, allowed };

/// Throws std::invalid_argument, naming `what`, the row and the label, unless every label of
/// `labels` (i32 [N], any device) lies in [0, num_classes), or is kIgnoredLabel where `ignored`
/// allows it. A CUDA tensor is copied to the
/// host first, which waits for the device: check labels once, where they are placed on the
/// device (gather_rows does), not in every step.
void check_labels(const Tensor& labels, std::int64_t num_classes, const std::string& what,
                  IgnoredLabels ignored = IgnoredLabels::refused);

/// The labels of the samples at `indices` that are not kIgnoredLabel: the targets a loss
/// over them divides by (for classification data, indices.size()).
std::int64_t count_targets(const Dataset& dataset, const std::vector<std::int64_t>& indices);
/// The same over every sample of `dataset`.
std::int64_t count_targets(const Dataset& dataset);

/// Copies the samples at `indices` (in that order, repeats allowed) into
/// features_out [B, D] (the data set's dtype) and labels_out i32 [B] ([B, T] for tokens),
/// B = indices.size(), on any device:
///   features_out[b, :] = dataset.features[indices[b], :]     (overwrite)
///   labels_out[b]      = dataset.labels[indices[b]]          (overwrite, a row for tokens)
/// On CUDA the rows are gathered on the host and copied over in one transfer each, and the
/// labels are checked (check_labels) on the host before they go: the CUDA cross-entropy
/// does not check them again.
void gather_rows(const Dataset& dataset, const std::vector<std::int64_t>& indices,
                 const Tensor& features_out, const Tensor& labels_out);

}  // namespace bigbatch

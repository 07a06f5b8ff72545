// Data sources: Fashion-MNIST from its idx.gz files, .npy data sets, the synthetic
// teacher data set, and batches (slices and gathered rows).
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/data/dataset.hpp"
#include "common/io/npy.hpp"
#include "tests/harness.hpp"
#include "tests/temp_files.hpp"

namespace bigbatch {
namespace {

// ---- helpers --------------------------------------------------------------------------

using testing::error_of;
using testing::mentions;
using testing::read_file;
using testing::TemporaryDirectory;
using testing::write_file;

// FNV-1a over a tensor's bytes: a fingerprint to pin generated data across machines.
std::uint64_t fingerprint(const Tensor& tensor) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  const auto* bytes = static_cast<const unsigned char*>(tensor.raw_data());
  for (std::size_t i = 0; i < tensor.nbytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

std::vector<std::int64_t> class_histogram(const Dataset& dataset) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(dataset.num_classes));
  for (const std::int32_t label : dataset.labels.to_vector<std::int32_t>()) {
    ++counts.at(static_cast<std::size_t>(label));
  }
  return counts;
}

// ---- Fashion-MNIST: the real files ----------------------------------------------------

// Checks one split against facts computed independently from the files (Python's gzip
// and numpy): sample count, first labels, the sum of all pixel bytes, 1/10 per class.
void check_split(FashionMnistSplit split, std::int64_t samples, std::uint64_t pixel_byte_sum,
                 const std::vector<std::int32_t>& first_labels) {
  const Dataset data = load_fashion_mnist(split);
  EXPECT_EQ(data.size(), samples);
  EXPECT_EQ(data.feature_dim(), 784);
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_EQ(data.features.dtype(), DType::f32);
  EXPECT_EQ(data.labels.shape(), (Shape{samples}));
  EXPECT_TRUE(data.features.device().is_cpu());
  EXPECT_EQ(data.features.category(), MemoryCategory::host_data);
  EXPECT_EQ(data.labels.category(), MemoryCategory::host_data);

  // Every pixel is exactly static_cast<float>(b) / 255.0f for a byte b.
  const float* pixels = data.features.data<float>();
  std::uint64_t byte_sum = 0;
  std::int64_t not_a_byte_over_255 = 0;
  float lowest = 1, highest = 0;
  for (std::int64_t i = 0; i < data.features.numel(); ++i) {
    const auto byte = static_cast<int>(std::lround(pixels[i] * 255.0f));
    if (byte < 0 || byte > 255 || static_cast<float>(byte) / 255.0f != pixels[i])
      ++not_a_byte_over_255;
    byte_sum += static_cast<std::uint64_t>(byte);
    lowest = std::min(lowest, pixels[i]);
    highest = std::max(highest, pixels[i]);
  }
  EXPECT_EQ(not_a_byte_over_255, 0);
  EXPECT_EQ(byte_sum, pixel_byte_sum);
  EXPECT_EQ(lowest, 0.0f);
  EXPECT_EQ(highest, 1.0f);

  const auto labels = data.labels.to_vector<std::int32_t>();
  EXPECT_EQ(std::vector<std::int32_t>(labels.begin(), labels.begin() + 10), first_labels);
  EXPECT_EQ(class_histogram(data), std::vector<std::int64_t>(10, samples / 10));
}

TEST(FashionMnist, LoadsBothSplits) {
  if (!fashion_mnist_available()) {
    GTEST_SKIP() << "Fashion-MNIST idx files not found in " << default_fashion_mnist_directory()
                 << ": install the Debian package dataset-fashion-mnist";
  }
  check_split(FashionMnistSplit::train, 60000, 3431114169ull, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  check_split(FashionMnistSplit::test, 10000, 573469082ull, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
}

TEST(FashionMnist, EnvironmentVariableOverridesTheDirectory) {
  TemporaryDirectory empty;
  const char* previous = std::getenv("BIGBATCH_FASHION_MNIST_DIR");
  const std::optional<std::string> saved =
      previous ? std::optional<std::string>(previous) : std::nullopt;
  ::setenv("BIGBATCH_FASHION_MNIST_DIR", empty.str().c_str(), 1);
  EXPECT_EQ(default_fashion_mnist_directory(), empty.str());
  EXPECT_FALSE(fashion_mnist_available());
  ::unsetenv("BIGBATCH_FASHION_MNIST_DIR");
  EXPECT_NE(default_fashion_mnist_directory(), empty.str());
  EXPECT_FALSE(default_fashion_mnist_directory().empty());
  if (saved) ::setenv("BIGBATCH_FASHION_MNIST_DIR", saved->c_str(), 1);
}

// ---- Fashion-MNIST: small idx.gz files written here -----------------------------------

std::string big_endian(std::uint32_t value) {
  return {static_cast<char>(value >> 24), static_cast<char>(value >> 16),
          static_cast<char>(value >> 8), static_cast<char>(value)};
}

std::string idx_images(std::uint32_t magic, std::uint32_t count, std::uint32_t rows,
                       std::uint32_t columns, const std::string& pixels) {
  return big_endian(magic) + big_endian(count) + big_endian(rows) + big_endian(columns) + pixels;
}

std::string idx_labels(std::uint32_t magic, std::uint32_t count, const std::string& labels) {
  return big_endian(magic) + big_endian(count) + labels;
}

// Pixel bytes from the RNG: incompressible, so that half a gzip file is half the data.
std::string random_pixels(std::size_t count) {
  std::string pixels(count, '\0');
  for (std::size_t i = 0; i < count; ++i) pixels[i] = static_cast<char>(random_bits(5, 0, i));
  return pixels;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

constexpr std::uint32_t kImages = 2051, kLabels = 2049;

// Writes a three-sample "train" split (and a valid "t10k" one) into `folder`.
void write_small_split(const TemporaryDirectory& folder, const std::string& images,
                       const std::string& labels) {
  write_gzip(folder.file("train-images-idx3-ubyte.gz"), images);
  write_gzip(folder.file("train-labels-idx1-ubyte.gz"), labels);
  write_gzip(folder.file("t10k-images-idx3-ubyte.gz"), idx_images(kImages, 0, 28, 28, ""));
  write_gzip(folder.file("t10k-labels-idx1-ubyte.gz"), idx_labels(kLabels, 0, ""));
}

TEST(FashionMnist, ReadsSmallIdxFilesExactly) {
  TemporaryDirectory folder;
  const std::string pixels = random_pixels(3 * 784);
  write_small_split(folder, idx_images(kImages, 3, 28, 28, pixels),
                    idx_labels(kLabels, 3, std::string("\x00\x09\x04", 3)));
  EXPECT_TRUE(fashion_mnist_available(folder.str()));
  const Dataset data = load_fashion_mnist(FashionMnistSplit::train, folder.str());
  ASSERT_EQ(data.features.shape(), (Shape{3, 784}));
  EXPECT_EQ(data.labels.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 9, 4}));
  const auto features = data.features.to_vector<float>();
  for (std::size_t i = 0; i < features.size(); ++i) {
    ASSERT_EQ(features[i], static_cast<float>(static_cast<unsigned char>(pixels[i])) / 255.0f) << i;
  }
  EXPECT_EQ(load_fashion_mnist(FashionMnistSplit::test, folder.str()).size(), 0);
}

TEST(FashionMnist, RefusesBrokenFilesNamingTheFile) {
  TemporaryDirectory folder;
  const std::string images_path = folder.file("train-images-idx3-ubyte.gz");
  const std::string labels_path = folder.file("train-labels-idx1-ubyte.gz");
  const std::string pixels = random_pixels(3 * 784);
  const std::string good_images = idx_images(kImages, 3, 28, 28, pixels);
  const std::string good_labels = idx_labels(kLabels, 3, std::string("\x01\x02\x03", 3));
  const auto error_loading = [&](const std::string& images, const std::string& labels) {
    write_small_split(folder, images, labels);
    return error_of([&] { load_fashion_mnist(FashionMnistSplit::train, folder.str()); });
  };

  EXPECT_TRUE(mentions(error_loading(idx_images(kLabels, 3, 28, 28, pixels), good_labels),
                       {images_path, "bad magic number 0x00000801", "0x00000803"}));
  EXPECT_TRUE(mentions(error_loading(good_images, idx_labels(kImages, 3, "\x01\x02\x03")),
                       {labels_path, "bad magic number 0x00000803", "0x00000801"}));
  EXPECT_TRUE(mentions(
      error_loading(idx_images(kImages, 3, 28, 28, pixels.substr(0, 2 * 784)), good_labels),
      {images_path, "truncated", "3 images", "2352 bytes", "1568"}));
  EXPECT_TRUE(mentions(error_loading(good_images.substr(0, 10), good_labels),
                       {images_path, "truncated", "header"}));
  EXPECT_TRUE(mentions(error_loading(idx_images(kImages, 3, 27, 28, pixels), good_labels),
                       {images_path, "27x28"}));
  EXPECT_TRUE(mentions(error_loading(good_images + "x", good_labels),
                       {images_path, "unexpected data after"}));
  EXPECT_TRUE(mentions(error_loading(good_images, idx_labels(kLabels, 2, "\x01\x02")),
                       {labels_path, "2 labels", "3 images"}));
  EXPECT_TRUE(mentions(error_loading(good_images, idx_labels(kLabels, 3, "\x01\x0a\x03")),
                       {labels_path, "label 10 of sample 1"}));

  // The gzip stream itself cut short, or damaged in the middle (the CRC catches it).
  write_small_split(folder, good_images, good_labels);
  const std::string compressed = read_file(images_path);
  write_file(images_path, compressed.substr(0, compressed.size() / 2));
  EXPECT_TRUE(
      mentions(error_of([&] { load_fashion_mnist(FashionMnistSplit::train, folder.str()); }),
               {images_path, "truncated gzip"}));
  std::string damaged = compressed;
  damaged[damaged.size() / 2] = static_cast<char>(damaged[damaged.size() / 2] ^ 0x5A);
  write_file(images_path, damaged);
  EXPECT_TRUE(
      mentions(error_of([&] { load_fashion_mnist(FashionMnistSplit::train, folder.str()); }),
               {images_path, "corrupt gzip"}));

  std::filesystem::remove(images_path);
  EXPECT_FALSE(fashion_mnist_available(folder.str()));
  EXPECT_TRUE(
      mentions(error_of([&] { load_fashion_mnist(FashionMnistSplit::train, folder.str()); }),
               {images_path, "not found", "install the Debian package dataset-fashion-mnist"}));
}

// ---- .npy data sets -------------------------------------------------------------------

template <class T>
NpyArray npy_of(const std::string& dtype, std::vector<std::int64_t> shape,
                const std::vector<T>& values) {
  NpyArray array{dtype, std::move(shape), false, {}};
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  array.data.assign(bytes, bytes + values.size() * sizeof(T));
  return array;
}

TEST(NpyDataset, FlattensFeaturesAndAcceptsAnyIntegerLabels) {
  TemporaryDirectory folder;
  const std::string features_path = folder.file("x.npy"), labels_path = folder.file("y.npy");
  std::vector<float> values(5 * 2 * 3);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 3.0f;
  write_npy(features_path, npy_of("<f4", {5, 2, 3}, values));

  const auto check_labels = [&](const NpyArray& labels) {
    write_npy(labels_path, labels);
    const Dataset data = load_npy_dataset(features_path, labels_path);
    EXPECT_EQ(data.features.shape(), (Shape{5, 6}));
    EXPECT_EQ(data.features.to_vector<float>(), values);
    EXPECT_EQ(data.labels.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 3, 1, 3, 2}));
    EXPECT_EQ(data.num_classes, 4);
    EXPECT_EQ(data.features.category(), MemoryCategory::host_data);
  };
  check_labels(npy_of<std::int64_t>("<i8", {5}, {0, 3, 1, 3, 2}));
  check_labels(npy_of<std::int32_t>("<i4", {5}, {0, 3, 1, 3, 2}));
  check_labels(npy_of<std::int16_t>("<i2", {5}, {0, 3, 1, 3, 2}));
  check_labels(npy_of<std::int8_t>("|i1", {5}, {0, 3, 1, 3, 2}));
  check_labels(npy_of<std::uint8_t>("|u1", {5}, {0, 3, 1, 3, 2}));
  check_labels(npy_of<std::uint64_t>("<u8", {5}, {0, 3, 1, 3, 2}));
}

TEST(NpyDataset, ConvertsFloat64FeaturesByRoundingToNearest) {
  TemporaryDirectory folder;
  const std::string features_path = folder.file("x.npy"), labels_path = folder.file("y.npy");
  const std::vector<double> values = {0.1, 1.0 + 0x1p-30, -1e-50, 3.0};  // [4] read as [4, 1]
  write_npy(features_path, npy_of("<f8", {4}, values));
  write_npy(labels_path, npy_of<std::int32_t>("<i4", {4}, {1, 1, 0, 1}));
  const Dataset data = load_npy_dataset(features_path, labels_path);
  EXPECT_EQ(data.features.shape(), (Shape{4, 1}));
  EXPECT_EQ(data.features.to_vector<float>(), (std::vector<float>{0.1f, 1.0f, -0.0f, 3.0f}));
  EXPECT_EQ(data.num_classes, 2);
}

TEST(NpyDataset, RefusesBadInputsNamingTheFile) {
  TemporaryDirectory folder;
  const std::string features_path = folder.file("x.npy"), labels_path = folder.file("y.npy");
  const auto good_features = npy_of<float>("<f4", {3, 2}, {1, 2, 3, 4, 5, 6});
  const auto good_labels = npy_of<std::int64_t>("<i8", {3}, {0, 1, 2});
  const auto error_loading = [&](const NpyArray& features, const NpyArray& labels) {
    write_npy(features_path, features);
    write_npy(labels_path, labels);
    return error_of([&] { load_npy_dataset(features_path, labels_path); });
  };
  EXPECT_TRUE(mentions(error_loading(good_features, npy_of<std::int8_t>("|i1", {3}, {0, -1, 2})),
                       {labels_path, "label -1 of sample 1", "negative"}));
  EXPECT_TRUE(mentions(error_loading(good_features, npy_of<std::int64_t>("<i8", {4}, {0, 1, 2, 1})),
                       {labels_path, "4 labels", features_path, "3 samples"}));
  EXPECT_TRUE(
      mentions(error_loading(npy_of<std::int32_t>("<i4", {3, 2}, {1, 2, 3, 4, 5, 6}), good_labels),
               {features_path, "float32", "<i4"}));
  EXPECT_TRUE(mentions(error_loading(good_features, npy_of<float>("<f4", {3}, {0, 1, 2})),
                       {labels_path, "integers", "<f4"}));
  EXPECT_TRUE(mentions(error_loading(good_features, npy_of<std::int64_t>("<i8", {3, 1}, {0, 1, 2})),
                       {labels_path, "1-D"}));
  EXPECT_TRUE(
      mentions(error_loading(npy_of<float>("<f4", {}, {1}), good_labels), {features_path, "0-d"}));
  EXPECT_TRUE(
      mentions(error_loading(good_features, npy_of<std::uint64_t>("<u8", {3}, {0, 1, 1ull << 40})),
               {labels_path, "too large"}));
  EXPECT_TRUE(
      mentions(error_of([&] { load_npy_dataset(features_path, folder.file("missing.npy")); }),
               {folder.file("missing.npy"), "cannot open"}));
  // Features that are not finite, and data sets without samples or features.
  EXPECT_TRUE(mentions(error_loading(npy_of<float>("<f4", {3, 2}, {1, 2, 3, NAN, 5, 6}),
                                     good_labels),
                       {features_path, "feature 1 of sample 1 is NaN"}));
  EXPECT_TRUE(mentions(error_loading(npy_of<double>("<f8", {3, 2}, {1, 2, 3, 4, 1e300, 6}),
                                     good_labels),
                       {features_path, "feature 0 of sample 2 is inf in float32"}));
  EXPECT_TRUE(mentions(error_loading(npy_of<float>("<f4", {0, 2}, {}),
                                     npy_of<std::int64_t>("<i8", {0}, {})),
                       {features_path, "no samples"}));
  EXPECT_TRUE(mentions(error_loading(npy_of<float>("<f4", {3, 0}, {}), good_labels),
                       {features_path, "no features"}));
}

// ---- synthetic ------------------------------------------------------------------------

// The teacher exactly as synthetic.cpp documents it, written again here as the oracle.
std::vector<std::int32_t> teacher_labels_oracle(const SyntheticOptions& o, const Dataset& data) {
  const auto uniform = [&](std::uint64_t stream, std::int64_t index, std::int64_t fan_in) {
    return (2.0 * random_uniform(o.seed, stream, static_cast<std::uint64_t>(index)) - 1.0) *
           std::sqrt(3.0 / static_cast<double>(fan_in));
  };
  const auto x = data.features.to_vector<float>();
  std::vector<std::int32_t> labels;
  for (std::int64_t i = 0; i < o.samples; ++i) {
    std::vector<double> hidden(static_cast<std::size_t>(o.teacher_hidden));
    for (std::int64_t h = 0; h < o.teacher_hidden; ++h) {
      double sum = uniform(2, h, o.features);
      for (std::int64_t j = 0; j < o.features; ++j) {
        sum += uniform(1, h * o.features + j, o.features) *
               x[static_cast<std::size_t>(i * o.features + j)];
      }
      hidden[static_cast<std::size_t>(h)] = std::tanh(sum);
    }
    std::int32_t best = 0;
    double best_logit = -INFINITY;
    for (std::int64_t c = 0; c < o.classes; ++c) {
      double logit = 0;
      for (std::int64_t h = 0; h < o.teacher_hidden; ++h) {
        logit += uniform(3, c * o.teacher_hidden + h, o.teacher_hidden) *
                 hidden[static_cast<std::size_t>(h)];
      }
      if (logit > best_logit) {
        best_logit = logit;
        best = static_cast<std::int32_t>(c);
      }
    }
    labels.push_back(best);
  }
  return labels;
}

TEST(Synthetic, MatchesItsDocumentedDefinition) {
  const SyntheticOptions options{
      .samples = 300, .features = 13, .classes = 4, .teacher_hidden = 5, .seed = 77};
  const Dataset data = make_synthetic(options);
  ASSERT_EQ(data.features.shape(), (Shape{300, 13}));
  EXPECT_EQ(data.num_classes, 4);
  EXPECT_EQ(data.features.category(), MemoryCategory::host_data);
  const auto x = data.features.to_vector<float>();
  for (std::size_t k = 0; k < x.size(); ++k) {
    ASSERT_EQ(x[k], 2.0f * random_uniform(77, 0, k) - 1.0f) << k;
  }
  EXPECT_EQ(data.labels.to_vector<std::int32_t>(), teacher_labels_oracle(options, data));
}

TEST(Synthetic, IsDeterministicAndSampleIDoesNotDependOnTheCount) {
  const SyntheticOptions small{
      .samples = 100, .features = 50, .classes = 5, .teacher_hidden = 16, .seed = 9};
  SyntheticOptions large = small;
  large.samples = 1000;
  const Dataset a = make_synthetic(large), b = make_synthetic(large),
                prefix = make_synthetic(small);
  EXPECT_TRUE(testing::bitwise_equal(a.features, b.features));
  EXPECT_TRUE(testing::bitwise_equal(a.labels, b.labels));
  EXPECT_TRUE(testing::bitwise_equal(a.features.rows(0, 100), prefix.features));
  EXPECT_TRUE(testing::bitwise_equal(a.labels.rows(0, 100), prefix.labels));

  SyntheticOptions other_seed = large;
  other_seed.seed = 10;
  EXPECT_NE(fingerprint(make_synthetic(other_seed).features), fingerprint(a.features));
}

TEST(Synthetic, DefaultDataSetIsBalancedAndTheSameBytesEverywhere) {
  const Dataset data = make_synthetic();
  ASSERT_EQ(data.features.shape(), (Shape{60000, 784}));
  const auto histogram = class_histogram(data);
  std::cout << "class histogram of the default synthetic data set:";
  for (const std::int64_t count : histogram) std::cout << " " << count;
  std::cout << "\n";
  for (std::size_t c = 0; c < histogram.size(); ++c) {
    // At least 2% of the samples in every class (uniform would be 10%).
    EXPECT_GE(histogram[c], 60000 * 2 / 100) << "class " << c;
  }
  // Pinned fingerprints: a change here means other machines' data sets differ from
  // this one's (features are exact float arithmetic; labels also use libm's tanh).
  EXPECT_EQ(fingerprint(data.features), 0xef25f2361a311cbcull);
  EXPECT_EQ(fingerprint(data.labels), 0xb01424e72594920bull);
}

TEST(Synthetic, RefusesEmptySizes) {
  EXPECT_THROW(make_synthetic({.samples = 10, .features = 0}), std::invalid_argument);
  EXPECT_THROW(make_synthetic({.samples = -1}), std::invalid_argument);
  EXPECT_EQ(make_synthetic({.samples = 0, .features = 3}).size(), 0);
}

// ---- batches --------------------------------------------------------------------------

Dataset counting_dataset(std::int64_t samples, std::int64_t width) {
  std::vector<float> features(static_cast<std::size_t>(samples * width));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(samples));
  for (std::int64_t i = 0; i < samples; ++i) {
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 3);
    for (std::int64_t j = 0; j < width; ++j) {
      features[static_cast<std::size_t>(i * width + j)] = static_cast<float>(100 * i + j);
    }
  }
  return {Tensor::from_vector(features, {samples, width}, Device::cpu(), MemoryCategory::data),
          Tensor::from_vector(labels, {samples}, Device::cpu(), MemoryCategory::data), 3,
          "counting"};
}

TEST(Batches, SliceIsAViewOfConsecutiveSamples) {
  const Dataset data = counting_dataset(10, 7);
  const Dataset part = slice(data, 3, 8);
  EXPECT_EQ(part.size(), 5);
  EXPECT_EQ(part.feature_dim(), 7);
  EXPECT_EQ(part.num_classes, 3);
  EXPECT_EQ(part.features.raw_data(), data.features.data<float>() + 3 * 7);
  EXPECT_EQ(part.labels.raw_data(), data.labels.data<std::int32_t>() + 3);
  EXPECT_EQ(part.features.to_vector<float>()[0], 300.0f);
  EXPECT_EQ(slice(data, 10, 10).size(), 0);
  EXPECT_THROW(slice(data, 4, 11), std::invalid_argument);
}

void check_gathered(const Dataset& data, const std::vector<std::int64_t>& indices, Device device) {
  const auto batch = static_cast<std::int64_t>(indices.size());
  Tensor features({batch, data.feature_dim()}, DType::f32, device, MemoryCategory::data);
  Tensor labels({batch}, DType::i32, device, MemoryCategory::data);
  testing::poison(features);
  testing::poison(labels);
  gather_rows(data, indices, features, labels);
  const auto got_features = features.to_vector<float>();
  const auto got_labels = labels.to_vector<std::int32_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t row = indices[static_cast<std::size_t>(b)];
    EXPECT_EQ(got_labels[static_cast<std::size_t>(b)], row % 3);
    for (std::int64_t j = 0; j < data.feature_dim(); ++j) {
      ASSERT_EQ(got_features[static_cast<std::size_t>(b * data.feature_dim() + j)],
                static_cast<float>(100 * row + j))
          << "row " << b << ", column " << j;
    }
  }
}

TEST(Batches, GatherRowsCopiesTheChosenSamplesInOrder) {
  const Dataset data = counting_dataset(10, 7);
  check_gathered(data, {9, 0, 4, 4, 2}, Device::cpu());
  check_gathered(data, {5}, Device::cpu());
  check_gathered(data, {}, Device::cpu());

  Tensor features({2, 7}, DType::f32), labels({2}, DType::i32);
  EXPECT_TRUE(mentions(error_of([&] {
                         gather_rows(data, {1, 10}, features, labels);
                       }),
                       {"index 10 out of range", "counting"}));
  EXPECT_THROW(gather_rows(data, {1, 2, 3}, features, labels), std::invalid_argument);
  EXPECT_THROW(gather_rows(data, {1, 2}, Tensor({2, 6}, DType::f32), labels),
               std::invalid_argument);
  EXPECT_THROW(gather_rows(data, {1, 2}, features, Tensor({2}, DType::f32)), std::invalid_argument);
}

TEST(Batches, GatherRowsFillsCudaTensors) {
  BIGBATCH_SKIP_WITHOUT_DEVICE(Device::cuda());
  check_gathered(counting_dataset(1025, 13), {1024, 0, 17, 17, 512, 3}, Device::cuda());
}

}  // namespace
}  // namespace bigbatch

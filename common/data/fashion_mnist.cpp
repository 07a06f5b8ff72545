// Fashion-MNIST from the gzip-compressed idx files of the Debian package
// dataset-fashion-mnist.
//
// An idx file is a big-endian header, then the elements as unsigned bytes:
//   images (idx3): magic 2051 = 0x00000803 (bytes, 3 dimensions), count, rows, columns
//   labels (idx1): magic 2049 = 0x00000801 (bytes, 1 dimension), count
// http://yann.lecun.com/exdb/mnist/ describes the format; Fashion-MNIST uses it as is.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "common/data/dataset.hpp"

#ifndef BIGBATCH_FASHION_MNIST_DIR
#define BIGBATCH_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#endif

namespace bigbatch {
namespace {

constexpr std::uint32_t kImagesMagic = 2051;
constexpr std::uint32_t kLabelsMagic = 2049;
constexpr std::uint32_t kSide = 28;
constexpr std::int64_t kClasses = 10;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// A gzip file opened for reading, closed on destruction.
class GzipReader {
 public:
  explicit GzipReader(const std::string& path) : path_(path) {
    if (!std::filesystem::exists(path)) {
      fail(path,
           "file not found; install the Debian package dataset-fashion-mnist "
           "(apt-get install dataset-fashion-mnist), or point the environment variable "
           "BIGBATCH_FASHION_MNIST_DIR at a folder holding the Fashion-MNIST idx files");
    }
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) fail(path, std::string("cannot open: ") + std::strerror(errno));
  }
  ~GzipReader() { gzclose(file_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  /// Reads exactly `count` decompressed bytes; `what` names them in the error message.
  /// Memory grows with the bytes actually there, so a corrupt count in a header
  /// cannot make the reader allocate terabytes before it finds the file too short.
  std::vector<unsigned char> read_exactly(std::size_t count, const std::string& what) {
    constexpr std::size_t kChunk = std::size_t{1} << 20;
    std::vector<unsigned char> bytes;
    while (bytes.size() < count) {
      const std::size_t before = bytes.size();
      bytes.resize(before + std::min(kChunk, count - before));
      const std::size_t got = read_some(bytes.data() + before, bytes.size() - before);
      if (before + got < bytes.size()) {
        fail(path_, "truncated file: " + what + " needs " + std::to_string(count) +
                        " bytes, the file ends after " + std::to_string(before + got));
      }
    }
    return bytes;
  }

  /// Fails unless the decompressed data ends here.
  void expect_end(const std::string& after) {
    unsigned char extra;
    if (read_some(&extra, 1) != 0) fail(path_, "unexpected data after " + after);
  }

 private:
  // Reads up to `count` bytes; fewer only at the true end of a complete gzip stream.
  std::size_t read_some(void* out, std::size_t count) {
    auto* cursor = static_cast<unsigned char*>(out);
    std::size_t total = 0;
    while (total < count) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(count - total, INT_MAX));
      const int got = gzread(file_, cursor + total, chunk);
      if (got < 0) fail(path_, "corrupt gzip data: " + zlib_message());
      if (got == 0) break;
      total += static_cast<std::size_t>(got);
    }
    // zlib reports a gzip stream cut short as a short read with Z_BUF_ERROR set.
    int code = Z_OK;
    gzerror(file_, &code);
    if (code == Z_BUF_ERROR) {
      fail(path_, "truncated gzip file (the compressed stream ends early): " + zlib_message());
    }
    if (code != Z_OK) fail(path_, "corrupt gzip data: " + zlib_message());
    return total;
  }

  std::string zlib_message() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    return code == Z_ERRNO ? std::strerror(errno) : message;
  }

  std::string path_;
  gzFile file_ = nullptr;
};

std::uint32_t big_endian_u32(const unsigned char* bytes) {
  return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
         (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
}

void check_magic(std::uint32_t magic, std::uint32_t expected, const std::string& path) {
  if (magic == expected) return;
  const std::string kind = expected == kImagesMagic ? "an images (idx3" : "a labels (idx1";
  char numbers[64];  // in hex: an arbitrary file's first four bytes read as a number
  std::snprintf(numbers, sizeof numbers, "0x%08x (expected 0x%08x", magic, expected);
  fail(path, "bad magic number " + std::string(numbers) + ": " + kind +
                 ") file of unsigned bytes); not a Fashion-MNIST " +
                 (expected == kImagesMagic ? "images" : "labels") + " file");
}

// features f32 [count, 784]: each pixel byte b becomes b / 255.
Tensor read_images(const std::string& path) {
  GzipReader file(path);
  const auto header = file.read_exactly(16, "the idx3 header");
  check_magic(big_endian_u32(&header[0]), kImagesMagic, path);
  const std::int64_t count = big_endian_u32(&header[4]);
  const std::uint32_t rows = big_endian_u32(&header[8]), columns = big_endian_u32(&header[12]);
  if (rows != kSide || columns != kSide) {
    fail(path, "images are " + std::to_string(rows) + "x" + std::to_string(columns) +
                   ", Fashion-MNIST's are 28x28");
  }
  const std::int64_t pixels_per_image = kSide * kSide;
  const auto pixels = file.read_exactly(static_cast<std::size_t>(count * pixels_per_image),
                                        std::to_string(count) + " images");
  file.expect_end("the " + std::to_string(count) + " images");

  Tensor features({count, pixels_per_image}, DType::f32, Device::cpu(), MemoryCategory::host_data);
  float* out = features.data<float>();
  for (std::size_t i = 0; i < pixels.size(); ++i) out[i] = static_cast<float>(pixels[i]) / 255.0f;
  return features;
}

// labels i32 [count] in 0..9.
Tensor read_labels(const std::string& path) {
  GzipReader file(path);
  const auto header = file.read_exactly(8, "the idx1 header");
  check_magic(big_endian_u32(&header[0]), kLabelsMagic, path);
  const std::int64_t count = big_endian_u32(&header[4]);
  const auto bytes =
      file.read_exactly(static_cast<std::size_t>(count), std::to_string(count) + " labels");
  file.expect_end("the " + std::to_string(count) + " labels");

  Tensor labels({count}, DType::i32, Device::cpu(), MemoryCategory::host_data);
  std::int32_t* out = labels.data<std::int32_t>();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] >= kClasses) {
      fail(path, "label " + std::to_string(bytes[i]) + " of sample " + std::to_string(i) +
                     " is not a class 0..9");
    }
    out[i] = bytes[i];
  }
  return labels;
}

struct SplitFiles {
  const char* images;
  const char* labels;
};

SplitFiles files_of(FashionMnistSplit split) {
  return split == FashionMnistSplit::train
             ? SplitFiles{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}
             : SplitFiles{"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
}

}  // namespace

std::string default_fashion_mnist_directory() {
  const char* from_environment = std::getenv("BIGBATCH_FASHION_MNIST_DIR");
  if (from_environment != nullptr && *from_environment != '\0') return from_environment;
  return BIGBATCH_FASHION_MNIST_DIR;
}

bool fashion_mnist_available(const std::string& directory) {
  for (const auto split : {FashionMnistSplit::train, FashionMnistSplit::test}) {
    const SplitFiles files = files_of(split);
    for (const char* name : {files.images, files.labels}) {
      std::error_code error;
      if (!std::filesystem::is_regular_file(std::filesystem::path(directory) / name, error)) {
        return false;
      }
    }
  }
  return true;
}

Dataset load_fashion_mnist(FashionMnistSplit split, const std::string& directory) {
  const SplitFiles files = files_of(split);
  const std::string images_path = (std::filesystem::path(directory) / files.images).string();
  const std::string labels_path = (std::filesystem::path(directory) / files.labels).string();
  Dataset dataset;
  dataset.features = read_images(images_path);
  dataset.labels = read_labels(labels_path);
  if (dataset.features.dim(0) != dataset.labels.dim(0)) {
    fail(labels_path, "holds " + std::to_string(dataset.labels.dim(0)) + " labels but " +
                          images_path + " holds " + std::to_string(dataset.features.dim(0)) +
                          " images");
  }
  dataset.num_classes = kClasses;
  dataset.name = split == FashionMnistSplit::train ? "fashion-mnist/train" : "fashion-mnist/test";
  return dataset;
}

}  // namespace bigbatch

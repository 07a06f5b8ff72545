// fuzz_idx: load_fashion_mnist (common/data/dataset.hpp) on arbitrary bytes. The input's
// first byte chooses the file it becomes (even: the images, odd: the labels) and the rest
// is its content (gzip-compressed or not: zlib reads both); the other file of the split
// is a small valid one, so the pair's consistency checks run too.
#include "common/data/dataset.hpp"
#include "fuzz/fuzz_input.hpp"

namespace {

/// The idx bytes of 2 images of 28 x 28 (magic 2051) or 2 labels (magic 2049).
std::string idx_file(bool images) {
  std::string bytes = images ? std::string("\x00\x00\x08\x03", 4) : std::string("\x00\x00\x08\x01", 4);
  bytes += std::string("\x00\x00\x00\x02", 4);
  if (images) {
    bytes += std::string("\x00\x00\x00\x1c\x00\x00\x00\x1c", 8);
    bytes += std::string(2 * 28 * 28, '\x7f');
  } else {
    bytes += std::string("\x03\x07", 2);
  }
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bigbatch;
  if (size == 0) return 0;
  const bool fuzz_images = data[0] % 2 == 0;
  const std::string images_name = "train-images-idx3-ubyte.gz";
  const std::string labels_name = "train-labels-idx1-ubyte.gz";
  const std::string fixed = idx_file(/*images=*/!fuzz_images);
  fuzz::write_input(fuzz_images ? labels_name : images_name,
                    reinterpret_cast<const std::uint8_t*>(fixed.data()), fixed.size());
  fuzz::write_input(fuzz_images ? images_name : labels_name, data + 1, size - 1);
  fuzz::expect_load_or_refusal(
      [&] { load_fashion_mnist(FashionMnistSplit::train, fuzz::scratch()); });
  return 0;
}

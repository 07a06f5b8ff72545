// fuzz_npy: read_npy (common/io/npy.hpp) and load_npy_dataset on arbitrary bytes, as the
// features file and as the labels file of a data set.
#include "common/data/dataset.hpp"
#include "common/io/npy.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bigbatch;
  const std::string path = fuzz::write_input("input.npy", data, size);
  fuzz::expect_load_or_refusal([&] { read_npy(path); });
  fuzz::expect_load_or_refusal([&] { load_npy_dataset(path, path); });
  return 0;
}

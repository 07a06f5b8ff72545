// fuzz_safetensors: load_safetensors_metadata and load_safetensors
// (common/io/safetensors.hpp) on arbitrary bytes.
#include "common/io/safetensors.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bigbatch;
  const std::string path = fuzz::write_input("input.safetensors", data, size);
  fuzz::expect_load_or_refusal([&] { load_safetensors_metadata(path); });
  fuzz::expect_load_or_refusal([&] { load_safetensors(path); });
  return 0;
}

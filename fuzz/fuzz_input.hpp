// fuzz_input.hpp: what the loaders' fuzz targets share. The loaders read files, so each
// input is written to a file in a private scratch folder and the loader is run on it. A
// loader may refuse the input (std::runtime_error or std::invalid_argument: the clear
// error bad input gets); anything else (a crash, a sanitizer report, another exception,
// a hang) is a bug, which libFuzzer reports with the input that caused it.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

namespace bigbatch::fuzz {

/// A scratch folder of this process, made once.
inline const std::string& scratch() {
  static const std::string folder = [] {
    std::string pattern = "/tmp/bigbatch-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return folder;
}

/// Writes `size` bytes to `name` in the scratch folder; returns its path.
inline std::string write_input(const std::string& name, const std::uint8_t* data,
                               std::size_t size) {
  const std::string path = scratch() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();
  return path;
}

/// Runs load(); a refusal with the errors bad input gets is a pass.
template <class Load>
void expect_load_or_refusal(const Load& load) {
  try {
    load();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace bigbatch::fuzz

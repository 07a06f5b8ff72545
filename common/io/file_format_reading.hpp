// file_format_reading.hpp: what the readers of our file formats (npy.cpp, safetensors.cpp)
// share: errors that name the file, and opening it.
#pragma once

#include <fstream>
#include <string>

namespace bigbatch::io_detail {

/// Throws std::runtime_error("<path>: <what>").
[[noreturn]] void fail(const std::string& path, const std::string& what);

/// The file opened for binary reading; fails with "cannot open <kind>: <reason>".
std::ifstream open_for_reading(const std::string& path, const std::string& kind);

}  // namespace bigbatch::io_detail

// file_format_reading.hpp: what the readers of our file formats (npy.cpp, safetensors.cpp)
// share: errors that name the file, opening it, and scanning their text headers (a
// Python dict literal in .npy, JSON in safetensors), which agree on what whitespace is
// and on how a decimal integer is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace bigbatch::io_detail {

/// Throws std::runtime_error("<path>: <what>").
[[noreturn]] void fail(const std::string& path, const std::string& what);

/// The file opened for binary reading; fails with "cannot open <kind>: <reason>".
std::ifstream open_for_reading(const std::string& path, const std::string& kind);

/// The first position at or after `pos` that is not a space, tab, line feed or carriage
/// return.
std::size_t skip_whitespace(std::string_view text, std::size_t pos);

/// Reads an optional '-' and decimal digits at text[pos] into `value`, moving `pos` past
/// them. Returns nullptr, or what is wrong ("expected digits", "integer too large") with
/// `pos` at the character where reading stopped. text[pos] must exist.
const char* scan_integer(std::string_view text, std::size_t& pos, std::int64_t& value);

}  // namespace bigbatch::io_detail

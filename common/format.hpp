// format.hpp: byte sizes for people ("1.50 GiB") and from people ("2GiB").
#pragma once

#include <cstddef>
#include <string>

namespace bigbatch {

/// "0 B", "512 B", "1.50 KiB", "2.00 GiB": binary units, two decimals above bytes.
std::string format_bytes(std::size_t bytes);

/// A request's size in full: "7.27 TiB (7997440526336 bytes)"; SIZE_MAX, the value of a
/// count that saturated, is "more bytes than 64 bits count".
std::string format_bytes_asked(std::size_t bytes);

/// Parses "1024", "64KiB", "2GiB", "1.5 GB", "300MB" (KB/MB/GB are decimal, KiB/MiB/GiB
/// binary; a bare number is bytes). Throws std::invalid_argument with the offending text.
std::size_t parse_bytes(const std::string& text);

}  // namespace bigbatch

// format.hpp: byte sizes for people ("1.50 GiB") and from people ("2GiB").
#pragma once

#include <cstddef>
#include <string>

namespace bigbatch {

/// "0 B", "512 B", "1.50 KiB", "2.00 GiB": binary units, two decimals above bytes.
std::string format_bytes(std::size_t bytes);

/// Parses "1024", "64KiB", "2GiB", "1.5 GB", "300MB" (KB/MB/GB are decimal, KiB/MiB/GiB
/// binary; a bare number is bytes). Throws std::invalid_argument with the offending text.
std::size_t parse_bytes(const std::string& text);

}  // namespace bigbatch

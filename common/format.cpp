#include "common/format.hpp"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string_view>

namespace bigbatch {

std::string format_bytes(std::size_t bytes) {
  static constexpr std::array<const char*, 5> units = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", value, units[unit]);
  return text;
}

std::string format_bytes_asked(std::size_t bytes) {
  if (bytes == std::numeric_limits<std::size_t>::max()) return "more bytes than 64 bits count";
  return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

std::size_t parse_bytes(const std::string& text) {
  const auto bad = [&text] {
    return std::invalid_argument("cannot read '" + text +
                                 "' as a size: expected a number with an optional unit "
                                 "(B, KB, MB, GB, KiB, MiB, GiB), e.g. 2GiB");
  };
  std::size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw bad();
  }
  if (!(number >= 0) || std::isinf(number)) throw bad();
  std::string unit;
  for (std::size_t i = pos; i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::tolower(text[i]));
  }
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  else if (unit == "kib") scale = 0x1p10;
  else if (unit == "mib") scale = 0x1p20;
  else if (unit == "gib") scale = 0x1p30;
  else if (unit == "tib") scale = 0x1p40;
  else throw bad();
  const double bytes = number * scale;
  if (bytes != std::floor(bytes) || bytes > 0x1p63) throw bad();
  return static_cast<std::size_t>(bytes);
}

}  // namespace bigbatch

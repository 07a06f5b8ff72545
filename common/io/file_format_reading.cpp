#include "common/io/file_format_reading.hpp"

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace bigbatch::io_detail {

void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::ifstream open_for_reading(const std::string& path, const std::string& kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int reason = errno;  // before the message's allocations can touch errno
    fail(path, "cannot open " + kind + ": " + std::strerror(reason));
  }
  return in;
}

std::size_t skip_whitespace(std::string_view text, std::size_t pos) {
  while (pos < text.size() &&
         (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) {
    ++pos;
  }
  return pos;
}

const char* scan_integer(std::string_view text, std::size_t& pos, std::int64_t& value) {
  const bool negative = text[pos] == '-';
  if (negative) ++pos;
  const std::size_t first_digit = pos;
  std::int64_t magnitude = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    const int digit = text[pos] - '0';
    if (magnitude > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
      return "integer too large";
    }
    magnitude = magnitude * 10 + digit;
    ++pos;
  }
  if (pos == first_digit) return "expected digits";
  value = negative ? -magnitude : magnitude;
  return nullptr;
}

}  // namespace bigbatch::io_detail

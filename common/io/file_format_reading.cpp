#include "common/io/file_format_reading.hpp"

#include <cerrno>
#include <cstring>
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

}  // namespace bigbatch::io_detail

// check.hpp: argument checks that fail with a readable message.
//
//   BIGBATCH_CHECK(a.rank() == 2, "gemm: A must be a matrix, got ", a.describe());
//
// throws std::invalid_argument("gemm: A must be a matrix, got f32[3] on cpu (...)")
// so that a user who passes the wrong tensor learns which one and why.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace bigbatch::detail {

/// The parts written one after another to a std::ostringstream.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

/// Throws std::invalid_argument(message); what BIGBATCH_CHECK calls on failure.
[[noreturn]] inline void fail_check(const std::string& message) {
  throw std::invalid_argument(message);
}

}  // namespace bigbatch::detail

/// Throws std::invalid_argument with the remaining arguments concatenated as the message
/// when `condition` is false.
#define BIGBATCH_CHECK(condition, ...)                                          \
  do {                                                                          \
    if (!(condition)) ::bigbatch::detail::fail_check(::bigbatch::detail::concat( \
        __VA_ARGS__));                                                          \
  } while (false)

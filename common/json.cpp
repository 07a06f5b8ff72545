#include "common/json.hpp"

#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace bigbatch {

Json json_float(float value) {
  if (!std::isfinite(value)) return nullptr;
  // to_chars without a precision writes the shortest digits that round-trip the float;
  // read back as a double, those digits are also that double's shortest form, which is
  // what the library writes.
  char digits[32];
  const auto written = std::to_chars(digits, digits + sizeof digits, value);
  double widened = 0;
  std::from_chars(digits, written.ptr, widened);
  return widened;
}

namespace {

/// "[json.exception.parse_error.101] parse error at line 1, column 6: ..." without the
/// library's bracketed identifier.
std::string library_message(const std::exception& error) {
  std::string message = error.what();
  if (const auto end = message.find("] "); message.starts_with("[json.") && end != message.npos) {
    message.erase(0, end + 2);
  }
  return message;
}

}  // namespace

Json parse_json_limited(std::string_view text, int max_depth, const std::string& what) {
  // The callback sees every object start and end and every key: a stack of the keys seen
  // in each open object finds a repeat; the depth it is given bounds the nesting.
  std::vector<std::set<std::string>> open_objects;
  std::string problem;
  const auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= max_depth) {
          problem = "nesting deeper than " + std::to_string(max_depth) + " levels";
          throw std::runtime_error(problem);
        }
        if (event == Json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end: open_objects.pop_back(); break;
      case Json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second) {
          problem = "duplicate key \"" + parsed.get<std::string>() + "\"";
          throw std::runtime_error(problem);
        }
        break;
      default: break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check);
  } catch (const Json::parse_error& error) {
    throw std::runtime_error(what + ": " + library_message(error));
  } catch (const Json::out_of_range& error) {
    // A number beyond a double (1e400): the library's out_of_range is no runtime_error,
    // but to the reader it is one more malformed text.
    throw std::runtime_error(what + ": " + library_message(error));
  } catch (const std::runtime_error&) {
    if (problem.empty()) throw;
    throw std::runtime_error(what + ": " + problem);
  }
}

}  // namespace bigbatch

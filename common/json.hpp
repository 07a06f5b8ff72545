// json.hpp: every JSON the project reads or writes goes through nlohmann-json (Debian
// package nlohmann-json3-dev). This header adds the two rules the project keeps on top:
//
//   Json line;                                    // members stay in the order written
//   line["loss"] = json_float(record.loss);       // 0.1f is written 0.1, not 0.100000001
//   line["lr"] = 1e-3;                            // a double: its shortest exact digits
//   out << line.dump() << '\n';                   // NaN and infinities are written null
//
// and, for reading a file's JSON, parse_json_limited(): a depth limit and refusal of
// duplicate keys, which the library leaves to its user (it keeps the last value).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "common/json_fwd.hpp"

namespace bigbatch {

/// `value` as a JSON number with the fewest decimal digits that read back as the same
/// float (0.1f becomes 0.1); NaN and infinities become null.
Json json_float(float value);

/// Parses `text` as one JSON value. Throws std::runtime_error("<what>: <problem>") when it
/// is not JSON, nests arrays and objects deeper than `max_depth`, or repeats a key within
/// one object.
Json parse_json_limited(std::string_view text, int max_depth, const std::string& what);

}  // namespace bigbatch

// json_fwd.hpp: the name Json (common/json.hpp) without the library's definitions, for a
// header that only declares functions taking or returning one. Parsing nlohmann-json costs
// a translation unit about a second; a file that builds, reads or writes a Json includes
// common/json.hpp.
#pragma once

#include <nlohmann/json_fwd.hpp>

namespace bigbatch {

/// A JSON value whose objects keep their members in insertion (or file) order.
using Json = nlohmann::ordered_json;

}  // namespace bigbatch

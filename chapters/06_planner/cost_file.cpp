// cost_file.cpp: the calibration file, cost models as JSON (planner.hpp). Apart from
// planner.cpp so that the planner's own code compiles without the JSON library.
#include "chapters/06_planner/planner.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/json.hpp"

namespace bigbatch::planning {
namespace {

Json linear_json(const LinearCost& c) { return {{"fixed_s", c.fixed}, {"per_row_s", c.per_row}}; }
LinearCost linear_from(const Json& j) {
  return {j.at("fixed_s").get<double>(), j.at("per_row_s").get<double>()};
}
Json precision_json(const PrecisionCost& c) {
  return {{"micro_batch", linear_json(c.micro_batch)},
          {"forward", linear_json(c.forward)},
          {"optimizer_s", c.optimizer},
          {"probabilities", linear_json(c.probabilities)}};
}
/// An entry written before the probabilities were priced has none: it reads as zero (the
/// MLP's, whose blocks rebuild none; a GPT's entries written then have another key).
PrecisionCost precision_from(const Json& j) {
  return {linear_from(j.at("micro_batch")), linear_from(j.at("forward")),
          j.at("optimizer_s").get<double>(),
          j.contains("probabilities") ? linear_from(j.at("probabilities")) : LinearCost{}};
}

}  // namespace

Json CostModel::to_json() const {
  return {{"key", key},
          {"fp32", precision_json(fp32)},
          {"fp16", precision_json(fp16)},
          {"bf16", precision_json(bf16)}};
}

CostModel CostModel::from_json(const Json& json) {
  try {
    return {json.at("key").get<std::string>(), precision_from(json.at("fp32")),
            precision_from(json.at("fp16")), precision_from(json.at("bf16"))};
  } catch (const Json::exception& e) {
    throw std::runtime_error(std::string("not a cost model: ") + e.what());
  }
}

CostModel cached_cost_model(const std::string& path, const std::string& key, bool fresh,
                            bool* measured, const std::function<CostModel()>& calibrate) {
  Json file = Json::object();
  if (std::ifstream in(path); in) {
    std::stringstream text;
    text << in.rdbuf();
    file = parse_json_limited(text.str(), 16, path);
    if (!file.is_object()) throw std::runtime_error(path + ": not a JSON object");
  }
  // An entry written before bf16 was a precision lacks its costs: measured again.
  if (!fresh && file.contains(key) && file[key].contains("bf16")) {
    if (measured != nullptr) *measured = false;
    return CostModel::from_json(file[key]);
  }
  const CostModel cost = calibrate();
  file[key] = cost.to_json();
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << file.dump(2) << "\n";
    if (!out) throw std::runtime_error(temporary + ": cannot write the calibration");
  }
  std::filesystem::rename(temporary, path);
  if (measured != nullptr) *measured = true;
  return cost;
}

}  // namespace bigbatch::planning

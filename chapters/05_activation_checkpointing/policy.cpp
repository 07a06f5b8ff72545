// policy.cpp: reading and printing checkpoint policies (policy.hpp).
#include "chapters/05_activation_checkpointing/policy.hpp"

#include <charconv>
#include <stdexcept>
#include <utility>

#include "common/check.hpp"
#include "common/format.hpp"

namespace bigbatch::checkpointing {
namespace {

/// The selective keeps by name: "selective" and "attention", alone or after "+".
constexpr std::pair<std::string_view, nn::BlockKeep> kKeeps[] = {
    {"selective", nn::BlockKeep::gemm_outputs},
    {"attention", nn::BlockKeep::all_but_probabilities}};
constexpr std::string_view kBudgetPrefix = "budget:";

/// A schedule family's name and its argument, from "none", "every:K", "sqrt" or
/// "optimal:SLOTS"; `quoted` names the whole text in errors.
void read_schedule(std::string_view text, const std::string& quoted, Policy& policy) {
  const std::string expected = "expected none, every:K, sqrt, optimal:SLOTS, selective, "
                               "POLICY+selective, attention, POLICY+attention or budget:BYTES";
  const std::size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const bool has_argument = colon != std::string_view::npos;
  const std::string_view argument = has_argument ? text.substr(colon + 1) : std::string_view();
  if (name == "none" || name == "sqrt") {
    BIGBATCH_CHECK(!has_argument, quoted, ": ", name, " takes no argument; ", expected);
    policy.schedule = name == "none" ? ScheduleKind::none : ScheduleKind::sqrt;
    return;
  }
  BIGBATCH_CHECK(name == "every" || name == "optimal", quoted, ": unknown policy; ", expected);
  const bool every = name == "every";
  const char* what = every ? "the segment length K" : "the number of slots SLOTS";
  BIGBATCH_CHECK(!argument.empty(), quoted, ": ", what, " is missing (",
                 every ? "every:K" : "optimal:SLOTS", ")");
  std::int64_t value = 0;
  const char* last = argument.data() + argument.size();
  const std::from_chars_result parsed = std::from_chars(argument.data(), last, value);
  BIGBATCH_CHECK(parsed.ec == std::errc() && parsed.ptr == last, quoted, ": ", what,
                 " must be a whole number, got \"", argument, "\"");
  BIGBATCH_CHECK(value >= 1, quoted, ": ", what, " must be >= 1, got ", value);
  policy.schedule = every ? ScheduleKind::every : ScheduleKind::optimal;
  policy.argument = value;
}

/// BYTES in the largest binary unit that holds them exactly ("96MiB", "1000").
std::string exact_bytes(std::size_t bytes) {
  constexpr std::pair<std::size_t, const char*> kUnits[] = {
      {std::size_t{1} << 30, "GiB"}, {std::size_t{1} << 20, "MiB"}, {std::size_t{1} << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

}  // namespace

Policy Policy::parse(std::string_view text) {
  const std::string quoted = "checkpoint policy \"" + std::string(text) + "\"";
  Policy policy;
  if (text.rfind(kBudgetPrefix, 0) == 0) {
    const std::string bytes(text.substr(kBudgetPrefix.size()));
    try {
      policy.budget = parse_bytes(bytes);
    } catch (const std::exception& e) {
      throw std::invalid_argument(quoted + ": BYTES must be a size such as 96MiB (" + e.what() +
                                  ")");
    }
    return policy;
  }
  std::string_view schedule = text;
  for (const auto& [name, keep] : kKeeps) {
    if (text == name) {
      policy.keep = keep;
      return policy;
    }
    if (text.size() > name.size() + 1 && text.ends_with(name) &&
        text[text.size() - name.size() - 1] == '+') {
      policy.keep = keep;
      schedule = text.substr(0, text.size() - name.size() - 1);
    }
  }
  read_schedule(schedule, quoted, policy);
  return policy;
}

std::string Policy::text() const {
  if (budget) return std::string(kBudgetPrefix) + exact_bytes(*budget);
  std::string_view keep_name;
  for (const auto& [name, named] : kKeeps) {
    if (named == keep) keep_name = name;
  }
  std::string schedule_text;
  switch (schedule) {
    case ScheduleKind::none: return keep_name.empty() ? "none" : std::string(keep_name);
    case ScheduleKind::every: schedule_text = "every:" + std::to_string(argument); break;
    case ScheduleKind::sqrt: schedule_text = "sqrt"; break;
    case ScheduleKind::optimal: schedule_text = "optimal:" + std::to_string(argument); break;
  }
  return keep_name.empty() ? schedule_text : schedule_text + "+" + std::string(keep_name);
}

Schedule Policy::schedule_for(std::int64_t depth) const {
  BIGBATCH_CHECK(!budget, "checkpoint policy \"", text(), "\" depends on the step: resolve it "
                 "with resolve_policy (memory_plan.hpp) first");
  switch (schedule) {
    case ScheduleKind::none: return store_all(depth);
    case ScheduleKind::every: return every(depth, argument);
    case ScheduleKind::sqrt: return sqrt_schedule(depth);
    case ScheduleKind::optimal: return optimal(depth, argument);
  }
  return store_all(depth);
}

}  // namespace bigbatch::checkpointing

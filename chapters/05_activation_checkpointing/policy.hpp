// policy.hpp: a checkpoint policy as a value. `bigbatch train --checkpoint` reads one from
// text once, at the edge (Policy::parse); every component below takes the value; text()
// prints it back, and parse(p.text()) == p:
//
//   text               schedule         argument  keep          budget
//   none               none             0         all           -
//   every:K            every            K         all           -
//   sqrt               sqrt             0         all           -
//   optimal:SLOTS      optimal          SLOTS     all           -
//   selective          none             0         gemm_outputs  -
//   POLICY+selective   POLICY's         POLICY's  gemm_outputs  -
//   attention          none             0         all_but_probabilities  -
//   POLICY+attention   POLICY's         POLICY's  all_but_probabilities  -
//   budget:BYTES       (resolved by memory_plan.hpp's resolve_policy)  BYTES
// Why and how: docs/internals.md#chapters05_activation_checkpointingpolicyhpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "nn/model.hpp"

namespace bigbatch::checkpointing {

/// The schedule families of schedule.hpp.
enum class ScheduleKind { none, every, sqrt, optimal };

struct Policy {
  ScheduleKind schedule = ScheduleKind::none;
  std::int64_t argument = 0;                ///< K of every:K, SLOTS of optimal:SLOTS; else 0
  /// gemm_outputs: selective recomputation (the MLP); all_but_probabilities: selective
  /// attention recomputation (the GPT).
  nn::BlockKeep keep = nn::BlockKeep::all;
  std::optional<std::size_t> budget;        ///< budget:BYTES (then the fields above are unused)

  /// Reads a policy as --checkpoint takes it. Throws std::invalid_argument naming the text
  /// and what is wrong (an unknown name, a missing, non-numeric or non-positive K or SLOTS,
  /// an argument given to none or sqrt, a budget that is not a size).
  static Policy parse(std::string_view text);
  /// The text parse reads back as this policy.
  std::string text() const;

  /// budget:BYTES, which a step's shape must resolve first (memory_plan.hpp).
  bool is_budget() const { return budget.has_value(); }
  /// True unless the model runs its blocks in its own order (none, no budget).
  bool needs_runner() const {
    return is_budget() || schedule != ScheduleKind::none || keep != nn::BlockKeep::all;
  }
  /// The schedule for `depth` blocks (none: store_all). Throws std::invalid_argument for a
  /// budget, and as the builders do for a depth below 1.
  Schedule schedule_for(std::int64_t depth) const;

  friend bool operator==(const Policy&, const Policy&) = default;
};

}  // namespace bigbatch::checkpointing

// schedule.cpp: the schedules, their counts, and the driver's rules simulated.
#include "chapters/05_activation_checkpointing/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <system_error>

#include "common/check.hpp"

namespace bigbatch::checkpointing {
namespace {

constexpr std::int64_t kMaxBinomialDepth = 4096;

std::int64_t checked_multiply(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t product = 0;
  BIGBATCH_CHECK(!__builtin_mul_overflow(a, b, &product), what, ": ", a, " * ", b,
                 " overflows 64 bits");
  return product;
}

/// binomial_advances without the argument checks: 1 <= n <= 4096, s >= 1.
std::int64_t closed_form(std::int64_t n, std::int64_t s) {
  s = std::min(s, n);
  // beta(s, r) = C(s + r, r), from beta(s, 0) = 1 by beta(s, r) = beta(s, r-1) (s + r) / r
  // (exact: C(s+r, r) r = C(s+r-1, r-1) (s+r)). The loop stops at the first beta >= n, so
  // every product is below n (s + r) <= 4096 * 8192.
  std::int64_t r = 0, beta = 1;
  while (beta < n) {
    ++r;
    beta = checked_multiply(beta, s + r, "binomial_advances") / r;
  }
  // C(s + r, s + 1) = C(s + r, r - 1) = C(s + r, r) r / (s + 1), exact as above; 0 for r = 0.
  const std::int64_t c = checked_multiply(beta, r, "binomial_advances") / (s + 1);
  return checked_multiply(r, n, "binomial_advances") - c;
}

void check_depth(const char* who, std::int64_t depth) {
  BIGBATCH_CHECK(depth >= 1, who, ": the depth (number of blocks) must be >= 1, got ", depth);
}

void emit(std::vector<Action>& out, Op op, std::int64_t block) { out.push_back({op, block}); }

/// reverse(lo, hi, s) of optimal(), with h_lo stored in one of the s slots.
// snippet: reverse
void reverse(std::vector<Action>& out, std::int64_t lo, std::int64_t hi, std::int64_t s) {
  if (hi - lo == 1) {
    emit(out, Op::restore, lo);
    emit(out, Op::tape, lo);
    emit(out, Op::backward, lo);
    return;
  }
  if (s == 1) {
    for (std::int64_t k = hi - 1; k >= lo; --k) {
      emit(out, Op::restore, lo);
      for (std::int64_t j = lo; j < k; ++j) emit(out, Op::advance, j);
      emit(out, Op::tape, k);
      emit(out, Op::backward, k);
    }
    return;
  }
  // The split: i advances to reach h_m, the right part [m, hi) with the s - 1 slots left
  // (h_m in one of them), then the left part [lo, m) with all s again. Ties: the largest i.
  std::int64_t best_i = 1;
  std::int64_t best_cost = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t i = 1; i < hi - lo; ++i) {
    const std::int64_t cost = i + closed_form(hi - lo - i, s - 1) + closed_form(i, s);
    if (cost <= best_cost) {
      best_cost = cost;
      best_i = i;
    }
  }
  const std::int64_t m = lo + best_i;
  emit(out, Op::restore, lo);
  for (std::int64_t j = lo; j < m; ++j) emit(out, Op::advance, j);
  emit(out, Op::store, m);
  reverse(out, m, hi, s - 1);
  emit(out, Op::drop, m);
  reverse(out, lo, m, s);
}
// snippet end: reverse

std::int64_t count(const Schedule& schedule, Op op) {
  return static_cast<std::int64_t>(
      std::count_if(schedule.actions.begin(), schedule.actions.end(),
                    [op](const Action& a) { return a.op == op; }));
}

std::string name_of(const Schedule& schedule) {
  std::ostringstream out;
  out << "checkpoint schedule ";
  if (!schedule.policy.empty()) out << '"' << schedule.policy << "\" ";
  out << "over " << schedule.depth << " block" << (schedule.depth == 1 ? "" : "s");
  return out.str();
}

/// The driver, simulated: throws at the first broken rule, returns the peaks and counts.
ScheduleStats run_driver(const Schedule& schedule) {
  const std::int64_t n = schedule.depth;
  BIGBATCH_CHECK(n >= 1, name_of(schedule), ": the depth must be >= 1");
  const auto index = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  std::vector<char> stored(index(n), 0), taped(index(n), 0), backwarded(index(n), 0);
  std::int64_t current = 0, next_backward = n - 1, checkpoints = 0, taped_now = 0;
  bool head_ran = false;
  ScheduleStats stats;
  for (std::size_t j = 0; j < schedule.actions.size(); ++j) {
    const Action& a = schedule.actions[j];
    const std::int64_t i = a.block;
    const auto fail = [&](const std::string& rule) {
      detail::fail_check(detail::concat(name_of(schedule), ": action ", j, ", ",
                                        to_string(a), ": ", rule));
    };
    if (i < 0 || i >= n) fail(detail::concat("the block is outside [0, ", n, ")"));
    const auto require_current = [&] {
      if (current != i) fail(detail::concat("the current state is h", current, ", not h", i));
    };
    switch (a.op) {
      case Op::store:
        require_current();
        if (stored[index(i)]) fail(detail::concat("checkpoint h", i, " is already stored"));
        stored[index(i)] = 1;
        stats.max_checkpoints = std::max(stats.max_checkpoints, ++checkpoints);
        break;
      case Op::advance:
        require_current();
        ++stats.advances;
        current = i + 1;
        break;
      case Op::tape:
        require_current();
        if (backwarded[index(i)]) fail(detail::concat("block ", i, " was already backwarded"));
        if (taped[index(i)]) fail(detail::concat("block ", i, " is already taped"));
        taped[index(i)] = 1;
        stats.max_taped = std::max(stats.max_taped, ++taped_now);
        ++stats.tapes;
        current = i + 1;
        break;
      case Op::backward:
        if (!head_ran) fail("the head has not run yet (no action has produced h_n)");
        if (i != next_backward) {
          fail(next_backward < 0
                   ? std::string("every block is already backwarded")
                   : detail::concat("backwards run n-1 down to 0: expected backward(",
                                    next_backward, ")"));
        }
        if (!taped[index(i)]) fail(detail::concat("block ", i, " is not taped"));
        taped[index(i)] = 0;
        --taped_now;
        backwarded[index(i)] = 1;
        --next_backward;
        break;
      case Op::restore:
        if (!stored[index(i)]) fail(detail::concat("checkpoint h", i, " is not stored"));
        current = i;
        break;
      case Op::drop:
        if (!stored[index(i)]) fail(detail::concat("checkpoint h", i, " is not stored"));
        stored[index(i)] = 0;
        --checkpoints;
        break;
      default:
        fail("unknown operation");
    }
    if (current == n) head_ran = true;  // the first time: the head runs here
  }
  const std::string end = detail::concat(name_of(schedule), ": at the end (after ",
                                         schedule.actions.size(), " actions): ");
  BIGBATCH_CHECK(head_ran, end, "the head never ran (no action produced h", n, ")");
  BIGBATCH_CHECK(next_backward < 0, end, "block ", next_backward,
                 " was never backwarded (missing backward(", next_backward, "))");
  for (std::int64_t i = 0; i < n; ++i) {
    BIGBATCH_CHECK(!stored[index(i)], end, "checkpoint h", i, " is still stored (missing drop(",
                   i, "))");
  }
  return stats;
}

std::string plural(std::int64_t k, const char* noun) {
  return detail::concat(k, ' ', noun, k == 1 ? "" : "s");
}

}  // namespace

std::string to_string(Op op) {
  switch (op) {
    case Op::store: return "store";
    case Op::advance: return "advance";
    case Op::tape: return "tape";
    case Op::backward: return "backward";
    case Op::restore: return "restore";
    case Op::drop: return "drop";
  }
  return detail::concat("op#", static_cast<int>(op));
}

std::string to_string(const Action& action) {
  return detail::concat(to_string(action.op), '(', action.block, ')');
}

// ---- the schedules ----------------------------------------------------------------------

Schedule store_all(std::int64_t depth) {
  check_depth("store_all", depth);
  Schedule s{"none", depth, {}};
  for (std::int64_t i = 0; i < depth; ++i) emit(s.actions, Op::tape, i);
  for (std::int64_t i = depth - 1; i >= 0; --i) emit(s.actions, Op::backward, i);
  return s;
}

Schedule every(std::int64_t depth, std::int64_t k) {
  check_depth("every", depth);
  BIGBATCH_CHECK(k >= 1, "every: the segment length must be >= 1, got ", k);
  Schedule s{detail::concat("every:", k), depth, {}};
  const std::int64_t last = (depth - 1) / k * k;  // the last segment's start
  for (std::int64_t a = 0; a < depth; a += k) {
    emit(s.actions, Op::store, a);
    const std::int64_t b = std::min(depth - a, k) + a;  // no overflow for k near the maximum
    for (std::int64_t i = a; i < b; ++i) emit(s.actions, a == last ? Op::tape : Op::advance, i);
    if (a == last) break;  // a + k could overflow for k near the maximum
  }
  for (std::int64_t i = depth - 1; i >= last; --i) emit(s.actions, Op::backward, i);
  emit(s.actions, Op::drop, last);
  for (std::int64_t a = last - k; a >= 0; a -= k) {
    emit(s.actions, Op::restore, a);
    for (std::int64_t i = a; i < a + k; ++i) emit(s.actions, Op::tape, i);
    for (std::int64_t i = a + k - 1; i >= a; --i) emit(s.actions, Op::backward, i);
    emit(s.actions, Op::drop, a);
  }
  return s;
}

Schedule sqrt_schedule(std::int64_t depth) {
  check_depth("sqrt_schedule", depth);
  // ceil(sqrt(depth)), exactly: the double's estimate, corrected both ways.
  auto k = static_cast<std::int64_t>(std::sqrt(static_cast<double>(depth)));
  while (k * k < depth) ++k;
  while (k > 1 && (k - 1) * (k - 1) >= depth) --k;
  Schedule s = every(depth, k);
  s.policy = "sqrt";
  return s;
}

Schedule optimal(std::int64_t depth, std::int64_t slots) {
  check_depth("optimal", depth);
  BIGBATCH_CHECK(depth <= kMaxBinomialDepth, "optimal: the depth must be <= ",
                 kMaxBinomialDepth, ", got ", depth);
  BIGBATCH_CHECK(slots >= 1, "optimal: the number of checkpoint slots must be >= 1 (the one "
                             "holding h0 counts), got ", slots);
  Schedule s{detail::concat("optimal:", slots), depth, {}};
  emit(s.actions, Op::store, 0);
  reverse(s.actions, 0, depth, std::min(slots, depth));
  emit(s.actions, Op::drop, 0);
  return s;
}

// ---- counts -----------------------------------------------------------------------------

std::int64_t advances(const Schedule& schedule) { return count(schedule, Op::advance); }
std::int64_t tapes(const Schedule& schedule) { return count(schedule, Op::tape); }
std::int64_t block_forward_evaluations(const Schedule& schedule) {
  return advances(schedule) + tapes(schedule);
}

std::int64_t binomial_advances(std::int64_t n, std::int64_t s) {
  BIGBATCH_CHECK(n >= 1 && n <= kMaxBinomialDepth, "binomial_advances: n must lie in [1, ",
                 kMaxBinomialDepth, "], got ", n);
  BIGBATCH_CHECK(s >= 1, "binomial_advances: s must be >= 1, got ", s);
  return closed_form(n, s);
}

std::int64_t brute_force_advances(std::int64_t n, std::int64_t s) {
  BIGBATCH_CHECK(n >= 1 && n <= kMaxBinomialDepth, "brute_force_advances: n must lie in [1, ",
                 kMaxBinomialDepth, "], got ", n);
  BIGBATCH_CHECK(s >= 1 && s <= kMaxBinomialDepth, "brute_force_advances: s must lie in [1, ",
                 kMaxBinomialDepth, "], got ", s);
  const auto index = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  // previous[k] = p(k, j - 1), current[k] = p(k, j); index 0 unused. Every
  // value is at most p(k, 1) = k (k - 1) / 2 < 2^23.
  std::vector<std::int64_t> previous(index(n + 1), 0), current(index(n + 1), 0);
  for (std::int64_t k = 1; k <= n; ++k) current[index(k)] = k * (k - 1) / 2;
  for (std::int64_t j = 2; j <= s; ++j) {
    previous.swap(current);
    current[1] = 0;
    for (std::int64_t k = 2; k <= n; ++k) {
      std::int64_t best = std::numeric_limits<std::int64_t>::max();
      for (std::int64_t i = 1; i < k; ++i) {
        best = std::min(best, i + current[index(i)] + previous[index(k - i)]);
      }
      current[index(k)] = best;
    }
  }
  return current[index(n)];
}

// ---- checking and describing ----------------------------------------------------------------

void validate(const Schedule& schedule) { run_driver(schedule); }

ScheduleStats simulate(const Schedule& schedule) { return run_driver(schedule); }

std::string explain(const Schedule& schedule) {
  const std::int64_t n = schedule.depth;
  std::ostringstream out;
  out << (schedule.policy.empty() ? std::string("schedule") : schedule.policy) << ", "
      << plural(n, "block") << ": " << plural(advances(schedule), "advance") << " + "
      << plural(tapes(schedule), "tape") << " = "
      << plural(block_forward_evaluations(schedule), "block forward");
  try {
    const ScheduleStats stats = simulate(schedule);
    out << "; peak " << plural(stats.max_checkpoints, "checkpoint") << ", "
        << plural(stats.max_taped, "taped block");
  } catch (const std::invalid_argument& error) {
    out << "; INVALID: " << error.what();
  }

  // The head runs at the first advance or tape of block n-1 (in a valid schedule).
  const auto head = std::find_if(schedule.actions.begin(), schedule.actions.end(),
                                 [n](const Action& a) {
                                   return (a.op == Op::advance || a.op == Op::tape) &&
                                          a.block == n - 1;
                                 });
  const std::size_t head_index =
      static_cast<std::size_t>(head - schedule.actions.begin());  // == size(): never

  // One line: a prefix and items; an item is a range of one op over neighbouring blocks
  // (advance, tape, backward) or a single store, drop or "head".
  struct Item {
    std::string word;
    std::int64_t first = 0, last = 0;
    bool range = false;
  };
  std::string prefix = "forward:";
  std::vector<Item> items;
  const auto flush = [&] {
    if (items.empty()) return;
    out << '\n' << prefix;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const Item& item = items[k];
      out << (k == 0 ? " " : ", ") << item.word;
      if (item.range) {
        out << ' ' << item.first;
        if (item.last != item.first) out << '-' << item.last;
      }
    }
    items.clear();
  };
  for (std::size_t j = 0; j < schedule.actions.size(); ++j) {
    const Action& a = schedule.actions[j];
    if (a.op == Op::restore) {
      if (j > 0 && schedule.actions[j - 1] == Action{Op::store, a.block}) continue;  // free
      flush();
      prefix = detail::concat("from h", a.block, ":");
      continue;
    }
    if (a.op == Op::store || a.op == Op::drop) {
      items.push_back({detail::concat(to_string(a.op), " h", a.block), 0, 0, false});
    } else {
      const std::int64_t step = a.op == Op::backward ? -1 : 1;
      Item* previous = items.empty() ? nullptr : &items.back();
      if (previous != nullptr && previous->range && previous->word == to_string(a.op) &&
          previous->last + step == a.block) {
        previous->last = a.block;
      } else {
        items.push_back({to_string(a.op), a.block, a.block, true});
      }
    }
    if (j == head_index) items.push_back({"head", 0, 0, false});
  }
  flush();
  return out.str();
}

}  // namespace bigbatch::checkpointing

// schedule.hpp: chapter 05's checkpoint schedules, as pure functions: which hidden states
// to keep, which blocks to recompute, in which order. No model and no tensors: a schedule
// is a list of actions on the chain h_0 -> h_1 -> ... -> h_n (block i maps h_i to h_{i+1};
// h_n feeds the head) that a driver runs in order, holding one current state, h_0 at first:
//   store(i)     keep a copy of the current state, which must be h_i, as checkpoint i
//   advance(i)   current must be h_i; compute h_{i+1} without saving activations
//   tape(i)      current must be h_i; compute h_{i+1}, keep block i's activations
//   backward(i)  in the order n-1, ..., 0, each exactly once; frees block i's activations
//   restore(i)   checkpoint i must be stored; current becomes h_i
//   drop(i)      frees checkpoint i, which must be stored
// The head runs once, at the first action that produces h_n; validate() states the full
// rules. The schedules: none, every:K, sqrt and optimal:SLOTS (Revolve's binomial one).
//
// Why and how: docs/internals.md#chapters05_activation_checkpointingschedulehpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::checkpointing {

enum class Op { store, advance, tape, backward, restore, drop };

struct Action {
  Op op = Op::store;
  std::int64_t block = 0;  ///< the block (advance, tape, backward) or the state h_block
                           ///< (store, restore, drop); in [0, depth)
  friend bool operator==(const Action&, const Action&) = default;
};

struct Schedule {
  std::string policy;      ///< a label for reports: "none", "every:4", "sqrt", "optimal:3"
  std::int64_t depth = 0;  ///< n, the number of blocks
  std::vector<Action> actions;
};

/// "store", "advance", ...
std::string to_string(Op op);
/// "restore(4)".
std::string to_string(const Action& action);

// ---- the schedules ----------------------------------------------------------------------
// Every builder requires depth >= 1 and throws std::invalid_argument otherwise.

/// No checkpointing (policy "none"): tape(0), ..., tape(n-1), backward(n-1), ..., backward(0).
/// 0 advances, n tapes, no checkpoint, all n blocks taped at the peak.
Schedule store_all(std::int64_t depth);

/// Segments of k blocks (policy "every:k", k >= 1): [0, k), [k, 2k), ..., the last one
/// [a, n) holding the n - a <= k remaining blocks. Exactly:
///   forward sweep: for each segment, store(start); then advance its blocks, except the
///                  last segment's, which are taped (left un-checkpointed, as in
///                  checkpoint_sequential); the head runs after tape(n-1)
///   last segment:  backward(n-1) ... backward(a), drop(a)
///   each earlier segment [a, b), right to left: restore(a), tape(a) ... tape(b-1),
///                  backward(b-1) ... backward(a), drop(a)
/// The last segment's start is stored and dropped without being restored (the rule "store
/// every h_i with i % k == 0" kept uniform; PyTorch holds it too, as the input its autograd
/// graph saves). With S = ceil(n / k) segments: advances n - (n - k (S-1)), that is every
/// block outside the last segment once; S checkpoints at the peak (the end of the forward
/// sweep); taped at the peak min(k, n) blocks. k >= n gives one segment: store_all with a
/// store(0) before it and a drop(0) after it.
Schedule every(std::int64_t depth, std::int64_t k);

/// every(depth, ceil(sqrt(depth))), with policy "sqrt".
Schedule sqrt_schedule(std::int64_t depth);

/// The binomial schedule (policy "optimal:slots"), for 1 <= depth <= 4096 and slots >= 1
/// checkpoint slots, counting the one that holds h_0; slots above depth are treated as
/// depth (more slots than blocks never helps). Built by the recursion reverse(lo, hi, s),
/// called with h_lo stored in one of the s slots:
///   hi - lo == 1:  restore(lo), tape(lo), backward(lo)
///   s == 1:        for k = hi-1 down to lo: restore(lo), advance(lo) ... advance(k-1),
///                  tape(k), backward(k)
///   otherwise:     split at m = lo + i, the i in [1, hi-lo) that minimises
///                  i + p(hi - m, s - 1) + p(i, s) (p = binomial_advances; ties: the largest
///                  i), then restore(lo), advance(lo) ... advance(m-1), store(m),
///                  reverse(m, hi, s-1), drop(m), reverse(lo, m, s)
/// The schedule is store(0), reverse(0, n, s), drop(0). Its advances equal
/// binomial_advances(depth, min(slots, depth)); at most `slots` checkpoints are held and
/// one block is taped at a time (each tape(k) is followed by backward(k)).
Schedule optimal(std::int64_t depth, std::int64_t slots);


// ---- counts -----------------------------------------------------------------------------
// Block forward evaluations only, never backward ones (every schedule runs each block's
// backward exactly once). advances() counts the recomputation: forwards that keep nothing.
// tapes() counts the forwards that keep activations for the backward; a valid schedule
// tapes each block exactly once, so tapes() == depth. The no-checkpointing baseline,
// store_all, has 0 advances and n tapes: n block forwards, as plain training.

std::int64_t advances(const Schedule& schedule);
std::int64_t tapes(const Schedule& schedule);
/// advances + tapes: the block forwards of one training step (n without checkpointing).
std::int64_t block_forward_evaluations(const Schedule& schedule);

/// The fewest advances that reverse a chain of n blocks with s checkpoint slots (counting
/// the one that holds h_0) when blocks are taped one at a time, each right before its
/// backward. Advances only: the n taping forwards come on top (so the step runs
/// binomial_advances(n, s) + n block forwards, against n for store_all). Closed form
/// (Griewank and Walther, "Algorithm 799: Revolve", 2000): with beta(s, r) = C(s + r, s)
/// and r the repetition number, the smallest r >= 0 with n <= beta(s, r),
///   binomial_advances(n, s) = r n - C(s + r, s + 1).
/// 1 <= n <= 4096 and s >= 1 (s above n is treated as n: the same count, n - 1 for n >= 2);
/// anything else throws std::invalid_argument. 64-bit throughout, every product checked.
std::int64_t binomial_advances(std::int64_t n, std::int64_t s);

/// The same number by dynamic programming over the recursion optimal() follows:
///   p(1, s) = 0, p(n, 1) = n (n - 1) / 2 (the one slot holds h_0: block k is reached by k
///   advances, for k = n-1 down to 0), p(n, s) = min over 1 <= i < n of
///   i + p(i, s) + p(n - i, s - 1).
/// O(n^2 s) time, O(n) memory: for checking the closed form on small n and s.
/// 1 <= n <= 4096 and 1 <= s <= 4096, or std::invalid_argument.
std::int64_t brute_force_advances(std::int64_t n, std::int64_t s);

// ---- checking and describing a schedule ----------------------------------------------------

/// Runs the schedule's actions against the rules above and throws std::invalid_argument at
/// the first one broken, with a message naming the schedule, the action (its index, from
/// 0, and e.g. "tape(3)") and the rule. The rules: depth >= 1; every block index in
/// [0, depth); store(i): current is h_i and checkpoint i is not already stored;
/// advance(i), tape(i): current is h_i; tape(i): block i is neither taped nor backwarded;
/// backward(i): the head has run, i is the next block in the order n-1, ..., 0, and block
/// i is taped; restore(i), drop(i): checkpoint i is stored. At the end: the head ran,
/// every block is backwarded (then nothing is left taped), and no checkpoint is left
/// stored.
void validate(const Schedule& schedule);

struct ScheduleStats {
  std::int64_t max_checkpoints = 0;  ///< the most checkpoints stored at once
  std::int64_t max_taped = 0;        ///< the most blocks holding activations at once
  std::int64_t advances = 0;
  std::int64_t tapes = 0;
};

/// validate(), and the peaks. store_all: 0 checkpoints, n taped; optimal(n, s): at most s
/// checkpoints, 1 taped.
ScheduleStats simulate(const Schedule& schedule);

/// A short rendering: a header line with the counts and peaks (or why the schedule is
/// invalid), then one line per sweep. The first line is the forward sweep; each later
/// line starts at a restore ("from h4:") and runs to the next one. Consecutive advances,
/// tapes and backwards of neighbouring blocks are written as ranges in execution order
/// ("advance 0-3", "backward 9-8"), "head" marks where the head runs, and a restore right
/// after the store of the same state (free in the driver) is left out. optimal(10, 3):
///   optimal:3, 10 blocks: 15 advances + 10 tapes = 25 block forwards; peak 3 checkpoints, 1 taped block
///   forward: store h0, advance 0-3, store h4, advance 4-6, store h7, advance 7-8, tape 9, head, backward 9
///   from h7: advance 7, tape 8, backward 8
///   ...
std::string explain(const Schedule& schedule);

}  // namespace bigbatch::checkpointing

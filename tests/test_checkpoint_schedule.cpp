// test_checkpoint_schedule.cpp: chapter 05's checkpoint schedules as pure functions
// (chapters/05_activation_checkpointing/schedule.hpp):
// - the binomial closed form equals the dynamic program over every split, for all chains
//   of up to 64 blocks and up to 10 slots, and a few values worked by hand;
// - optimal(n, s) obeys the driver's rules, reaches exactly the closed form's advances and
//   holds at most s checkpoints and one taped block;
// - every(n, K), sqrt and store_all obey the rules with the counts and peaks their
//   definitions give;
// - validate() names the action and the rule for each kind of broken schedule;
// - Policy::parse() reads every form and refuses the rest with a reason, and text() prints
//   each policy back as it reads;
// - the worked example: optimal(10, 3), printed, and its rendering pinned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "chapters/05_activation_checkpointing/memory_plan.hpp"
#include "chapters/05_activation_checkpointing/policy.hpp"
#include "chapters/05_activation_checkpointing/schedule.hpp"
#include "tests/harness.hpp"

namespace bigbatch {
namespace {

using checkpointing::Action;
using checkpointing::Op;
using checkpointing::Schedule;

/// The actions as "tape(3)" strings: a failed comparison prints readably.
std::vector<std::string> rendered(const Schedule& schedule) {
  std::vector<std::string> out;
  for (const Action& a : schedule.actions) out.push_back(checkpointing::to_string(a));
  return out;
}

/// The message validate() throws, or "" when it accepts the schedule.
std::string rejection(const Schedule& schedule) {
  try {
    checkpointing::validate(schedule);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

/// The message Policy::parse (or its schedule for 10 blocks) throws for this text, or ""
/// when it accepts it.
std::string policy_rejection(const std::string& text) {
  try {
    checkpointing::Policy::parse(text).schedule_for(10);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

const std::vector<std::int64_t> kDepths = {1, 2, 7, 10, 16, 33, 64};
const std::vector<std::int64_t> kSlots = {1, 2, 3, 4, 8};

// ---- the closed form ------------------------------------------------------------------------

TEST(BinomialAdvances, EqualsTheDynamicProgramForEverySmallChain) {
  // The closed form and the recursion over every split are independent statements of the
  // same minimum; s runs past n (up to 10 for n = 1) to check that capping s at n is exact.
  for (std::int64_t n = 1; n <= 64; ++n) {
    for (std::int64_t s = 1; s <= 10; ++s) {
      ASSERT_EQ(checkpointing::binomial_advances(n, s), checkpointing::brute_force_advances(n, s))
          << "n " << n << ", s " << s;
    }
  }
}

TEST(BinomialAdvances, OneSlotIsTheTriangleNumber) {
  // One slot holds h_0 for good: block k is reached by k advances from h_0, for k = n-1
  // down to 0: 0 + 1 + ... + (n-1) = n (n-1) / 2. Up to the largest n accepted.
  for (std::int64_t n = 1; n <= 4096; ++n) {
    ASSERT_EQ(checkpointing::binomial_advances(n, 1), n * (n - 1) / 2) << "n " << n;
  }
  EXPECT_EQ(checkpointing::brute_force_advances(100, 1), 4950);
}

TEST(BinomialAdvances, ValuesWorkedByHand) {
  // n = 10, s = 3. beta(3, r) = C(3 + r, 3) = 1, 4, 10, 20 for r = 0..3: 4 < 10 <= 10, so
  // r = 2 and the count is 2 * 10 - C(5, 4) = 20 - 5 = 15.
  // The same by the recursion, with p(k, 2) = 0, 1, 2, 4, 6, 8, 11, 14, 17 (k = 1..9) and
  // p(k, 3) = 0, 1, 2, 3 (k = 1..4): i + p(i, 3) + p(10 - i, 2) for i = 1..5 is
  // 1+0+17 = 18, 2+1+14 = 17, 3+2+11 = 16, 4+3+8 = 15, 5+5+6 = 16: the minimum is 15,
  // at i = 4 (the split optimal() takes: h4 is stored first).
  EXPECT_EQ(checkpointing::binomial_advances(10, 3), 15);
  // s = 2: beta(2, r) = 1, 3, 6, 10: r = 3, 3 * 10 - C(5, 3) = 30 - 10 = 20.
  EXPECT_EQ(checkpointing::binomial_advances(10, 2), 20);
  // s = 1: 45 = 10 * 9 / 2. s >= 9: r = 1, 10 - C(s + 1, s + 1) = 9, one advance for
  // each block but the last; more slots than that do not help.
  EXPECT_EQ(checkpointing::binomial_advances(10, 1), 45);
  EXPECT_EQ(checkpointing::binomial_advances(10, 9), 9);
  EXPECT_EQ(checkpointing::binomial_advances(10, 1000000), 9);
  // One block: restore, tape, backward: nothing to recompute, whatever s.
  EXPECT_EQ(checkpointing::binomial_advances(1, 1), 0);
  EXPECT_EQ(checkpointing::binomial_advances(1, 5), 0);
}

TEST(BinomialAdvances, RefusesArgumentsOutOfRange) {
  EXPECT_THROW(checkpointing::binomial_advances(0, 3), std::invalid_argument);
  EXPECT_THROW(checkpointing::binomial_advances(4097, 3), std::invalid_argument);
  EXPECT_THROW(checkpointing::binomial_advances(10, 0), std::invalid_argument);
  EXPECT_THROW(checkpointing::brute_force_advances(10, 0), std::invalid_argument);
  EXPECT_THROW(checkpointing::brute_force_advances(0, 1), std::invalid_argument);
  // The largest chain, every slot count that matters: no overflow, and the count falls
  // as slots are added, down to n - 1.
  std::int64_t previous = checkpointing::binomial_advances(4096, 1);
  for (std::int64_t s = 2; s <= 4096; s *= 2) {
    const std::int64_t count = checkpointing::binomial_advances(4096, s);
    EXPECT_LT(count, previous) << "s " << s;
    previous = count;
  }
  EXPECT_EQ(checkpointing::binomial_advances(4096, 4096), 4095);
}

// ---- optimal ----------------------------------------------------------------------------------

TEST(OptimalSchedule, ObeysTheRulesAndMeetsTheClosedForm) {
  for (const std::int64_t n : kDepths) {
    for (const std::int64_t s : kSlots) {
      const Schedule schedule = checkpointing::optimal(n, s);
      ASSERT_EQ(rejection(schedule), "") << "n " << n << ", s " << s;
      const checkpointing::ScheduleStats stats = checkpointing::simulate(schedule);
      // The recursion picks each split by the closed form's cost; the count of advances
      // actually emitted must be that cost, so the closed form is met, not just claimed.
      EXPECT_EQ(checkpointing::advances(schedule),
                checkpointing::binomial_advances(n, std::min(s, n)))
          << "n " << n << ", s " << s;
      EXPECT_EQ(stats.advances, checkpointing::advances(schedule));
      EXPECT_EQ(checkpointing::tapes(schedule), n);
      EXPECT_EQ(checkpointing::block_forward_evaluations(schedule),
                checkpointing::advances(schedule) + n);
      // Each level of the recursion holds h_lo and at most s - 1 more below it; every
      // tape(k) is followed at once by backward(k).
      EXPECT_LE(stats.max_checkpoints, s) << "n " << n << ", s " << s;
      EXPECT_EQ(stats.max_taped, 1) << "n " << n << ", s " << s;
      EXPECT_EQ(schedule.policy, "optimal:" + std::to_string(s));
    }
  }
}

TEST(OptimalSchedule, UsesEverySlotItIsGivenWhenTheyHelp) {
  // Up to n - 1 slots every added slot saves advances, so a schedule that held fewer than
  // its s checkpoints would be leaving savings on the table.
  for (std::int64_t s = 1; s <= 9; ++s) {
    EXPECT_EQ(checkpointing::simulate(checkpointing::optimal(10, s)).max_checkpoints, s)
        << "s " << s;
  }
  // s = n: h0..h(n-1) all stored in one sweep of n - 1 advances, the cap changes nothing.
  EXPECT_EQ(rendered(checkpointing::optimal(10, 50)), rendered(checkpointing::optimal(10, 10)));
}

TEST(OptimalSchedule, TheLargestChainIsExactToo) {
  const Schedule schedule = checkpointing::optimal(4096, 8);
  EXPECT_EQ(checkpointing::advances(schedule), checkpointing::binomial_advances(4096, 8));
  EXPECT_LE(checkpointing::simulate(schedule).max_checkpoints, 8);
  EXPECT_THROW(checkpointing::optimal(4097, 8), std::invalid_argument);
  EXPECT_THROW(checkpointing::optimal(10, 0), std::invalid_argument);
  EXPECT_THROW(checkpointing::optimal(0, 3), std::invalid_argument);
}

TEST(OptimalSchedule, TheWorkedExampleOfTenBlocksAndThreeSlots) {
  const Schedule schedule = checkpointing::optimal(10, 3);
  const std::string text = checkpointing::explain(schedule);
  std::printf("%s\n", text.c_str());
  // 15 advances (ValuesWorkedByHand): the first split stores h4 (i = 4), the part [4, 10)
  // with 2 slots splits at h7 (3 + p(3, 2) + p(3, 1) = 3 + 2 + 3 = 8), [7, 10) with one slot
  // replays from h7 (2 + 1 + 0 = 3 advances), [4, 7) splits at h5, and [0, 4) stores h1
  // then h2. Against 10 block forwards without checkpointing: 25, for 3 stored states
  // and one taped block instead of 10 taped blocks.
  EXPECT_EQ(checkpointing::advances(schedule), 15);
  EXPECT_EQ(checkpointing::advances(schedule), checkpointing::binomial_advances(10, 3));
  EXPECT_EQ(text,
            "optimal:3, 10 blocks: 15 advances + 10 tapes = 25 block forwards; "
            "peak 3 checkpoints, 1 taped block\n"
            "forward: store h0, advance 0-3, store h4, advance 4-6, store h7, advance 7-8, "
            "tape 9, head, backward 9\n"
            "from h7: advance 7, tape 8, backward 8\n"
            "from h7: tape 7, backward 7, drop h7\n"
            "from h4: advance 4, store h5, advance 5, tape 6, backward 6\n"
            "from h5: tape 5, backward 5, drop h5\n"
            "from h4: tape 4, backward 4, drop h4\n"
            "from h0: advance 0, store h1, advance 1, store h2, advance 2, tape 3, backward 3\n"
            "from h2: tape 2, backward 2, drop h2\n"
            "from h1: tape 1, backward 1, drop h1\n"
            "from h0: tape 0, backward 0, drop h0");
}

// ---- every, sqrt, store_all -----------------------------------------------------------------

/// The counts every(n, k) must give, from its definition: S = ceil(n / k) segments, the
/// last one of L = n - k (S - 1) blocks. Every block outside the last segment is advanced
/// once in the forward sweep and taped once in its replay; the last segment's blocks are
/// taped in the sweep and never advanced: n - L advances, n tapes. All S segment starts
/// (h_0 and the last segment's included) are stored by the end of the sweep and dropped
/// one per segment afterwards: S at the peak. Taped at once: the last segment's L during
/// the sweep, then k for each replayed segment, so k when S >= 2 and L = n when S = 1.
void expect_every_counts(const Schedule& schedule, std::int64_t n, std::int64_t k) {
  const std::int64_t segments = (n + k - 1) / k;
  const std::int64_t last = n - k * (segments - 1);
  ASSERT_EQ(rejection(schedule), "") << schedule.policy << ", n " << n;
  const checkpointing::ScheduleStats stats = checkpointing::simulate(schedule);
  EXPECT_EQ(checkpointing::tapes(schedule), n) << schedule.policy << ", n " << n;
  EXPECT_EQ(checkpointing::advances(schedule), n - last) << schedule.policy << ", n " << n;
  EXPECT_EQ(stats.max_checkpoints, segments) << schedule.policy << ", n " << n;
  EXPECT_EQ(stats.max_taped, segments >= 2 ? k : n) << schedule.policy << ", n " << n;
}

TEST(EverySchedule, CountsFollowFromTheSegments) {
  for (const std::int64_t n : kDepths) {
    for (const std::int64_t k : kSlots) {
      const Schedule schedule = checkpointing::every(n, k);
      EXPECT_EQ(schedule.policy, "every:" + std::to_string(k));
      expect_every_counts(schedule, n, k);
    }
  }
}

TEST(EverySchedule, SqrtIsEveryCeilSqrt) {
  for (const std::int64_t n : kDepths) {
    std::int64_t k = 1;
    while (k * k < n) ++k;  // ceil(sqrt(n)): 1, 2, 3, 4, 4, 6, 8
    const Schedule schedule = checkpointing::sqrt_schedule(n);
    EXPECT_EQ(schedule.policy, "sqrt");
    EXPECT_EQ(rendered(schedule), rendered(checkpointing::every(n, k))) << "n " << n;
    expect_every_counts(schedule, n, k);
  }
  // 10 blocks: k = 4, segments [0, 4), [4, 8), [8, 10): 8 advances, 3 checkpoints, 4 taped.
  EXPECT_EQ(checkpointing::explain(checkpointing::sqrt_schedule(10)),
            "sqrt, 10 blocks: 8 advances + 10 tapes = 18 block forwards; "
            "peak 3 checkpoints, 4 taped blocks\n"
            "forward: store h0, advance 0-3, store h4, advance 4-7, store h8, tape 8-9, head, "
            "backward 9-8, drop h8\n"
            "from h4: tape 4-7, backward 7-4, drop h4\n"
            "from h0: tape 0-3, backward 3-0, drop h0");
}

TEST(EverySchedule, OneSegmentIsStoreAllWithHZeroStoredAndDropped) {
  for (const std::int64_t n : kDepths) {
    for (const std::int64_t k : {n, n + 1, std::int64_t{1} << 62}) {
      const Schedule all = checkpointing::store_all(n);
      std::vector<std::string> expected = {"store(0)"};
      for (const std::string& a : rendered(all)) expected.push_back(a);
      expected.push_back("drop(0)");
      EXPECT_EQ(rendered(checkpointing::every(n, k)), expected) << "n " << n << ", k " << k;
      EXPECT_EQ(checkpointing::block_forward_evaluations(checkpointing::every(n, k)),
                checkpointing::block_forward_evaluations(all));
    }
  }
  EXPECT_THROW(checkpointing::every(10, 0), std::invalid_argument);
  EXPECT_THROW(checkpointing::every(0, 2), std::invalid_argument);
  EXPECT_THROW(checkpointing::sqrt_schedule(0), std::invalid_argument);
}

TEST(StoreAll, TapesEveryBlockAndRecomputesNothing) {
  for (const std::int64_t n : kDepths) {
    const Schedule schedule = checkpointing::store_all(n);
    ASSERT_EQ(rejection(schedule), "") << "n " << n;
    const checkpointing::ScheduleStats stats = checkpointing::simulate(schedule);
    EXPECT_EQ(checkpointing::advances(schedule), 0);
    EXPECT_EQ(checkpointing::tapes(schedule), n);
    EXPECT_EQ(stats.max_taped, n);
    EXPECT_EQ(stats.max_checkpoints, 0);
    EXPECT_EQ(schedule.policy, "none");
  }
  EXPECT_EQ(checkpointing::explain(checkpointing::store_all(3)),
            "none, 3 blocks: 0 advances + 3 tapes = 3 block forwards; "
            "peak 0 checkpoints, 3 taped blocks\n"
            "forward: tape 0-2, head, backward 2-0");
  EXPECT_THROW(checkpointing::store_all(0), std::invalid_argument);
}

// ---- validate ---------------------------------------------------------------------------------

Schedule hand_made(std::vector<Action> actions) {
  return Schedule{"", 3, std::move(actions)};
}

TEST(Validate, NamesTheActionAndTheRuleBroken) {
  // A correct one to start from: 3 blocks, h1 kept, block 0 replayed from h0.
  const Schedule good = hand_made({{Op::store, 0}, {Op::advance, 0}, {Op::store, 1},
                                   {Op::tape, 1}, {Op::tape, 2}, {Op::backward, 2},
                                   {Op::backward, 1}, {Op::drop, 1}, {Op::restore, 0},
                                   {Op::tape, 0}, {Op::backward, 0}, {Op::drop, 0}});
  ASSERT_EQ(rejection(good), "");
  EXPECT_EQ(checkpointing::simulate(good).max_checkpoints, 2);
  EXPECT_EQ(checkpointing::simulate(good).max_taped, 2);

  // Backward out of order: block 2's gradient is needed before block 1's.
  EXPECT_TRUE(testing::mentions(
      rejection(hand_made({{Op::tape, 0}, {Op::tape, 1}, {Op::tape, 2}, {Op::backward, 1}})),
      {"action 3", "backward(1)", "expected backward(2)"}));
  // Tape from the wrong state: the driver holds h0, block 1 needs h1.
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::tape, 1}})),
                                {"action 0", "tape(1)", "current state is h0, not h1"}));
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::advance, 0}, {Op::store, 0}})),
                                {"action 1", "store(0)", "current state is h1, not h0"}));
  // Restore of a checkpoint never stored, and drop of one already dropped.
  EXPECT_TRUE(testing::mentions(
      rejection(hand_made({{Op::store, 0}, {Op::advance, 0}, {Op::restore, 1}})),
      {"action 2", "restore(1)", "checkpoint h1 is not stored"}));
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::store, 0}, {Op::drop, 0}, {Op::drop, 0}})),
                                {"action 2", "drop(0)", "not stored"}));
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::store, 0}, {Op::store, 0}})),
                                {"action 1", "store(0)", "already stored"}));
  // A missing backward is found at the end, after the last action.
  EXPECT_TRUE(testing::mentions(
      rejection(hand_made({{Op::tape, 0}, {Op::tape, 1}, {Op::tape, 2}, {Op::backward, 2},
                           {Op::backward, 1}})),
      {"after 5 actions", "missing backward(0)"}));
  // A backward before the head: block 0's gradient needs the loss, which needs h3.
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::tape, 0}, {Op::backward, 0}})),
                                {"action 1", "backward(0)", "head has not run"}));
  EXPECT_TRUE(testing::mentions(rejection(hand_made({})), {"head never ran"}));
  // A backward without the tape: block 2 was only advanced.
  EXPECT_TRUE(testing::mentions(
      rejection(hand_made({{Op::tape, 0}, {Op::tape, 1}, {Op::advance, 2}, {Op::backward, 2}})),
      {"action 3", "backward(2)", "block 2 is not taped"}));
  // Taping a block twice, or again after its backward (its activations would never be
  // freed), and a second backward.
  EXPECT_TRUE(testing::mentions(
      rejection(hand_made({{Op::store, 0}, {Op::tape, 0}, {Op::restore, 0}, {Op::tape, 0}})),
      {"action 3", "tape(0)", "already taped"}));
  EXPECT_TRUE(testing::mentions(
      rejection(hand_made({{Op::tape, 0}, {Op::tape, 1}, {Op::store, 2}, {Op::tape, 2},
                           {Op::backward, 2}, {Op::restore, 2}, {Op::tape, 2}})),
      {"action 6", "tape(2)", "already backwarded"}));
  // A checkpoint left stored at the end.
  std::vector<Action> leaking = checkpointing::store_all(3).actions;
  leaking.insert(leaking.begin(), Action{Op::store, 0});
  EXPECT_TRUE(testing::mentions(rejection(hand_made(leaking)), {"h0 is still stored"}));
  // Blocks outside the chain, and a chain of no blocks.
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::advance, 3}})),
                                {"action 0", "advance(3)", "outside [0, 3)"}));
  EXPECT_TRUE(testing::mentions(rejection(hand_made({{Op::restore, -1}})),
                                {"action 0", "restore(-1)", "outside"}));
  EXPECT_TRUE(testing::mentions(rejection(Schedule{"", 0, {}}), {"depth must be >= 1"}));
  // The policy names the schedule in the message.
  Schedule named = checkpointing::every(3, 2);
  std::swap(named.actions[1], named.actions[2]);
  EXPECT_TRUE(testing::mentions(rejection(named), {"\"every:2\"", "over 3 blocks", "action 1"}));
  // explain() still renders what it is given, saying why it is invalid.
  EXPECT_TRUE(testing::mentions(checkpointing::explain(hand_made({{Op::tape, 1}})),
                                {"INVALID", "tape(1)", "forward: tape 1"}));
}

TEST(Validate, ReRunningTheLastBlockAfterTheHeadIsAllowedButRunsNoSecondHead) {
  // advance(2) produces h3: the head runs there. Block 2 is then taped from a stored h2:
  // h3 is produced again without a second head, and the backward proceeds.
  const Schedule schedule = hand_made({{Op::tape, 0}, {Op::tape, 1}, {Op::store, 2},
                                       {Op::advance, 2}, {Op::restore, 2}, {Op::tape, 2},
                                       {Op::backward, 2}, {Op::drop, 2}, {Op::backward, 1},
                                       {Op::backward, 0}});
  EXPECT_EQ(rejection(schedule), "");
  EXPECT_TRUE(testing::mentions(checkpointing::explain(schedule),
                                {"advance 2, head\nfrom h2: tape 2, backward 2"}));
}

// ---- policies as values ---------------------------------------------------------------------

TEST(ParsePolicy, ReadsTheFourForms) {
  EXPECT_EQ(rendered(checkpointing::Policy::parse("none").schedule_for(10)),
            rendered(checkpointing::store_all(10)));
  EXPECT_EQ(rendered(checkpointing::Policy::parse("every:4").schedule_for(10)),
            rendered(checkpointing::every(10, 4)));
  EXPECT_EQ(rendered(checkpointing::Policy::parse("sqrt").schedule_for(10)),
            rendered(checkpointing::sqrt_schedule(10)));
  EXPECT_EQ(rendered(checkpointing::Policy::parse("optimal:3").schedule_for(10)),
            rendered(checkpointing::optimal(10, 3)));
  for (const std::string text : {"none", "every:4", "sqrt", "optimal:3"}) {
    const Schedule schedule = checkpointing::Policy::parse(text).schedule_for(10);
    EXPECT_EQ(schedule.policy, text) << "the policy reads back as written";
    EXPECT_EQ(schedule.depth, 10);
  }
}

TEST(ParsePolicy, EveryPolicyPrintsBackAsItReads) {
  using checkpointing::Policy;
  std::vector<std::string> texts = {"selective", "sqrt+selective", "budget:96MiB",
                                    "budget:1000", "budget:1GiB", "budget:1536KiB",
                                    "attention", "sqrt+attention", "every:3+attention"};
  for (const Policy& candidate : checkpointing::checkpoint_candidates(8)) {
    texts.push_back(candidate.text());
  }
  EXPECT_EQ(texts.size(), 9u + 2u + 2u * 2u * 8u);  // the budget search's 34 candidates
  for (const std::string& text : texts) {
    const Policy policy = Policy::parse(text);
    EXPECT_EQ(policy.text(), text);
    EXPECT_EQ(Policy::parse(policy.text()), policy) << text;
  }
  // The fields each form sets, and the forms that read as another's value.
  EXPECT_EQ(Policy::parse("every:4"),
            (Policy{.schedule = checkpointing::ScheduleKind::every, .argument = 4,
                    .keep = nn::BlockKeep::all, .budget = {}}));
  EXPECT_EQ(Policy::parse("optimal:3+selective"),
            (Policy{.schedule = checkpointing::ScheduleKind::optimal, .argument = 3,
                    .keep = nn::BlockKeep::gemm_outputs, .budget = {}}));
  EXPECT_EQ(Policy::parse("none+selective"), Policy::parse("selective"));
  EXPECT_EQ(Policy::parse("optimal:2+attention"),
            (Policy{.schedule = checkpointing::ScheduleKind::optimal, .argument = 2,
                    .keep = nn::BlockKeep::all_but_probabilities, .budget = {}}));
  EXPECT_EQ(Policy::parse("none+attention"), Policy::parse("attention"));
  EXPECT_TRUE(Policy::parse("attention").needs_runner());
  EXPECT_TRUE(testing::mentions(policy_rejection("+attention"), {"unknown policy"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("sqrt+selective+attention"),
                                {"unknown policy"}));
  EXPECT_EQ(Policy::parse("budget:1.5GiB").text(), "budget:1536MiB");
  EXPECT_EQ(*Policy::parse("budget:1.5GiB").budget, std::size_t{3} << 29);
  EXPECT_EQ(Policy::parse("budget:123457").text(), "budget:123457");
  EXPECT_FALSE(Policy::parse("none").needs_runner());
  EXPECT_TRUE(Policy::parse("selective").needs_runner());
  EXPECT_TRUE(Policy::parse("budget:1MiB").is_budget());
  EXPECT_TRUE(testing::mentions(policy_rejection("budget:1MiB"), {"depends on the step"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("budget:lots"),
                                {"\"budget:lots\"", "BYTES must be a size"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("every:0+selective"), {"must be >= 1, got 0"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("+selective"), {"unknown policy"}));
}

TEST(ParsePolicy, RefusesAnythingElseWithAReason) {
  for (const std::string text : {"", "foo", "Every:4", " every:4", "every4", "checkpoint"}) {
    EXPECT_TRUE(testing::mentions(policy_rejection(text),
                                  {"\"" + text + "\"", "unknown policy", "every:K"}))
        << text;
  }
  EXPECT_TRUE(testing::mentions(policy_rejection("every"), {"\"every\"", "K is missing"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("every:"), {"K is missing"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("optimal"), {"SLOTS is missing"}));
  for (const std::string text : {"every:x", "every:4x", "every: 4", "every:+4", "every:4.0",
                                 "every:99999999999999999999", "optimal:three"}) {
    EXPECT_TRUE(testing::mentions(policy_rejection(text), {"must be a whole number"})) << text;
  }
  EXPECT_TRUE(testing::mentions(policy_rejection("every:0"), {"K", "must be >= 1, got 0"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("every:-2"), {"must be >= 1, got -2"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("optimal:0"), {"SLOTS", "must be >= 1"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("none:2"), {"none takes no argument"}));
  EXPECT_TRUE(testing::mentions(policy_rejection("sqrt:"), {"sqrt takes no argument"}));
  EXPECT_THROW(checkpointing::Policy::parse("sqrt").schedule_for(0), std::invalid_argument);
}

}  // namespace
}  // namespace bigbatch

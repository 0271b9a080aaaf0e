// The collective precondition agreement: a violation on one rank only makes every rank throw the
// same ctxpar::Error naming that rank, with no hang; agreement on plan fingerprints.
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::test::world;

BOOST_AUTO_TEST_CASE(violation_on_each_single_rank_reaches_every_rank) {
  const auto& group = world();
  for (int bad = 0; bad < group.size(); ++bad) {
    auto call = [&] {
      ctxpar::Preconditions checks(group, "ctxpar::test::op");
      checks.require(group.rank() != bad, "the head count must be even", 4, 3);
      checks.agree();
    };
    CTXPAR_TEST_ALL(group, ctxpar::test::throws_everywhere(
                               group, call,
                               "ctxpar::test::op: on rank " + std::to_string(bad) +
                                   ": the head count must be even (expected 4, got 3)",
                               bad));
  }
}

BOOST_AUTO_TEST_CASE(lowest_failing_rank_wins) {
  const auto& group = world();
  auto call = [&] {
    ctxpar::Preconditions checks(group, "ctxpar::test::op");
    checks.require(group.rank() == 0, "rank-specific", "x", group.rank());
    checks.agree();
  };
  const int expected = group.size() > 1 ? 1 : -1;
  if (group.size() > 1) {
    CTXPAR_TEST_ALL(group, ctxpar::test::throws_everywhere(group, call, "got 1", expected));
  } else {
    bool threw = false;
    try {
      call();
    } catch (const ctxpar::Error&) {
      threw = true;
    }
    CTXPAR_TEST_ALL(group, !threw);
  }
}

BOOST_AUTO_TEST_CASE(disagreeing_fingerprint_is_detected) {
  const auto& group = world();
  const int odd_one = group.size() - 1;
  auto call = [&] {
    ctxpar::Preconditions checks(group, "ctxpar::test::op");
    checks.require_same("the window", group.rank() == odd_one && group.size() > 1 ? 7 : 8);
    checks.agree();
  };
  if (group.size() > 1) {
    CTXPAR_TEST_ALL(group, ctxpar::test::throws_everywhere(
                               group, call, "every rank must agree on the window", odd_one));
  } else {
    bool threw = false;
    try {
      call();
    } catch (const ctxpar::Error&) {
      threw = true;
    }
    CTXPAR_TEST_ALL(group, !threw);
  }
}

BOOST_AUTO_TEST_CASE(fingerprint_is_order_sensitive) {
  CTXPAR_TEST_ALL(world(), ctxpar::fingerprint({1, 2}) != ctxpar::fingerprint({2, 1}));
}

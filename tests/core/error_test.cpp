// ctxpar::Error (message format and fields), require_local, fingerprint: pure host logic.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/fingerprint.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::test::world;

BOOST_AUTO_TEST_SUITE(core_error)

BOOST_AUTO_TEST_CASE(message_names_op_rank_condition_expected_actual) {
  const ctxpar::Error e("ctxpar::swa::forward", 2, "the window must be positive", "W >= 1",
                        "W = 0");
  bool ok =
      std::string(e.what()) ==
      "ctxpar::swa::forward: on rank 2: the window must be positive (expected W >= 1, got W = 0)";
  ok = ok && e.op() == "ctxpar::swa::forward" && e.rank() == 2 &&
       e.condition() == "the window must be positive" && e.expected() == "W >= 1" &&
       e.actual() == "W = 0";
  // Without a communicator the rank is -1 and the message leaves it out.
  const ctxpar::Error local("ctxpar::op", -1, "c", "e", "a");
  ok = ok && std::string(local.what()) == "ctxpar::op: c (expected e, got a)" && local.rank() == -1;
  // Rank 0 is a real rank and is printed.
  ok = ok && std::string(ctxpar::Error("op", 0, "c", "e", "a").what()).find("on rank 0: ") !=
                 std::string::npos;
  // It is a std::runtime_error, so generic handlers see the same message.
  const std::runtime_error& base = e;
  ok = ok && std::string(base.what()) == e.what();
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(require_local_prints_values_and_passes_when_ok) {
  bool ok = true;
  try {
    ctxpar::require_local(true, "ctxpar::op", "never shown", 1, 2);
  } catch (...) {
    ok = false;
  }
  try {
    ctxpar::require_local(false, "ctxpar::chunkwise::forward", "the chunk size must divide 64", 64,
                          2.5);
    ok = false;
  } catch (const ctxpar::Error& e) {
    ok = ok && e.rank() == -1 && e.expected() == "64" && e.actual() == "2.5" &&
         std::string(e.what()) ==
             "ctxpar::chunkwise::forward: the chunk size must divide 64 (expected 64, got 2.5)";
  }
  try {
    ctxpar::require_local(false, "op", "strings print as is", std::string("abc"), "def");
    ok = false;
  } catch (const ctxpar::Error& e) {
    ok = ok && e.expected() == "abc" && e.actual() == "def";
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(fingerprint_separates_small_inputs) {
  // Every triple in [-6, 6]^3 and every pair and single gets its own fingerprint; order and sign
  // matter; equal inputs agree; lists of different lengths differ.
  std::set<std::int64_t> seen;
  std::size_t n = 0;
  for (int a = -6; a <= 6; ++a) {
    seen.insert(ctxpar::fingerprint({a}));
    ++n;
    for (int b = -6; b <= 6; ++b) {
      seen.insert(ctxpar::fingerprint({a, b}));
      ++n;
      for (int c = -6; c <= 6; ++c) {
        seen.insert(ctxpar::fingerprint({a, b, c}));
        ++n;
      }
    }
  }
  seen.insert(ctxpar::fingerprint({}));
  ++n;
  bool ok = seen.size() == n;
  ok = ok && ctxpar::fingerprint({1, 2, 3}) == ctxpar::fingerprint({1, 2, 3});
  ok = ok && ctxpar::fingerprint({1, 2}) != ctxpar::fingerprint({2, 1});
  ok = ok && ctxpar::fingerprint({std::int64_t{1} << 40}) != ctxpar::fingerprint({0});
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(fingerprint_of_a_vector) {
  // A vector hashes by value, whatever its integer type; its length is part of the hash, so a
  // trailing zero or a split between two vectors changes it; order matters.
  const std::vector<std::int32_t> ids{0, 0, 1, 1, 1, 2};
  const std::vector<std::int64_t> wide(ids.begin(), ids.end());
  bool ok = ctxpar::fingerprint(ids) == ctxpar::fingerprint(wide);
  ok = ok && ctxpar::fingerprint(std::vector<int>{1, 2}) !=
                 ctxpar::fingerprint(std::vector<int>{1, 2, 0});
  ok = ok &&
       ctxpar::fingerprint(std::vector<int>{1, 2}) != ctxpar::fingerprint(std::vector<int>{2, 1});
  ok = ok && ctxpar::fingerprint(std::vector<int>{}) != ctxpar::fingerprint(std::vector<int>{0});
  ok = ok && ctxpar::fingerprint({ctxpar::fingerprint(std::vector<int>{1}),
                                  ctxpar::fingerprint(std::vector<int>{2, 3})}) !=
                 ctxpar::fingerprint({ctxpar::fingerprint(std::vector<int>{1, 2}),
                                      ctxpar::fingerprint(std::vector<int>{3})});
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()

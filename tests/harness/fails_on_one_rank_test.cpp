// Harness self-test: the check fails on the last rank only. Registered WILL_FAIL, so ctest passes
// only if the all-reduced verdict reports that single rank's failure.
#include "ctxpar_test/harness.hpp"

BOOST_AUTO_TEST_CASE(fails_on_last_rank_only) {
  const auto& group = ctxpar::test::world();
  const bool local_ok = group.rank() != group.size() - 1;
  CTXPAR_TEST_ALL(group, local_ok);
}

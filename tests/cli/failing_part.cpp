// A demo part that fails on the last rank only: `ctxpar demo` built with it must report FAIL and
// exit non-zero (registered WILL_FAIL), proving that a part's failure on a rank other than 0 is
// not lost.
#include <ostream>

#include "command.hpp"

namespace {
bool fails_on_last_rank(const ctxpar::Group& group, std::ostream& report) {
  report << "  this part fails on rank " << group.size() - 1 << " on purpose\n";
  return group.rank() != group.size() - 1;
}
}  // namespace

CTXPAR_CLI_DEMO_PART("zz-fails-on-last-rank", fails_on_last_rank);

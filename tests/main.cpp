// The one test main of ctxpar: MPI first (funneled threading), then Kokkos (which strips its
// --kokkos-* flags from argv), then the Boost.Test runner. Ranks other than 0 write their Boost.Test
// log to their own file so the console shows one report; verdicts are all-reduced by the tests.
#include <Kokkos_Core.hpp>

#include <boost/mpi/environment.hpp>
#include <boost/test/results_reporter.hpp>
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <string>

namespace {
std::ofstream quiet_log;

bool init_unit_test() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    quiet_log.open("ctxpar-test-rank" + std::to_string(rank) + ".log");
    boost::unit_test::unit_test_log.set_stream(quiet_log);
    boost::unit_test::results_reporter::set_stream(quiet_log);
  }
  return true;
}
}  // namespace

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::funneled);
  Kokkos::ScopeGuard kokkos(argc, argv);
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}

// The one test main of ctxpar: MPI first (funneled threading), then Kokkos (which strips its
// --kokkos-* flags from argv), then the Boost.Test runner. Ranks other than 0 write their
// Boost.Test log to their own file so the console shows one report; verdicts are all-reduced by the
// tests.
#include <Kokkos_Core.hpp>

#include <boost/mpi/environment.hpp>
#include <boost/test/results_reporter.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/team_size.hpp"

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
  // A run that asks for multi-thread teams (the `portable` and `tsan` presets) but gives the host
  // backend fewer threads would silently test one-thread teams again: refuse it on every rank.
  const int threads = Kokkos::DefaultHostExecutionSpace().concurrency();
  if (ctxpar::host_team_size() > threads) {
    std::cerr << "ctxpar tests: CTXPAR_HOST_TEAM_SIZE asks for teams of "
              << ctxpar::host_team_size() << " threads but "
              << Kokkos::DefaultHostExecutionSpace::name() << " runs " << threads
              << " (set OMP_NUM_THREADS / KOKKOS_NUM_THREADS)\n";
    return 1;
  }
  // An instruction-set twin (ctxpar_add_isa_twins) whose forced set this CPU cannot run has
  // nothing to test here; one that forces the detected set repeats the plain entry. Exit 77 is
  // ctest's "skipped" for them; the same verdict on every rank, as every rank reads the same CPU
  // flags and environment.
  if (std::getenv("CTXPAR_TEST_ISA_TWIN") != nullptr) {
    const ctxpar::HostIsaRequest request = ctxpar::requested_host_isa();
    if (request.forced && request.valid && !ctxpar::host_isa_runs_here(request.isa)) {
      std::cout << "ctxpar tests: skipped, this CPU does not run " << request.source << "\n";
      return 77;
    }
    if (request.forced && request.valid && request.isa == ctxpar::detected_host_isa()) {
      std::cout << "ctxpar tests: skipped, " << request.source
                << " is the detected set, which the plain entries test\n";
      return 77;
    }
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}

// The `ctxpar` command-line tool: MPI first, then Kokkos, then the subcommand named on the
// command line (see command.hpp for how subcommands register themselves).
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <boost/mpi/environment.hpp>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "command.hpp"
#include "ctxpar/comm/group.hpp"

namespace {

// A failure inside a subcommand may have happened on one rank only, while the others wait in a
// collective: abort the whole job rather than hang.
[[noreturn]] void abort_run(const ctxpar::Group& group, const std::string& what) {
  // One write, so that messages of ranks failing at the same moment do not interleave.
  std::cerr << ("ctxpar: error on rank " + std::to_string(group.rank()) + ": " + what + "\n")
            << std::flush;
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

int run_tool(const std::vector<std::string>& tokens, const ctxpar::Group& world) {
  ctxpar::cli::Invocation inv;
  try {
    inv = ctxpar::cli::parse_invocation(tokens);
  } catch (const ctxpar::Error& e) {
    // argv is the same on every rank, so every rank reaches this point and none is left waiting.
    if (world.rank() == 0) std::cerr << e.what() << "\n(see ctxpar --help)" << std::endl;
    return 2;
  }
  if (inv.help) {
    if (world.rank() == 0) {
      if (inv.command != nullptr) {
        ctxpar::cli::print_usage(std::cout, *inv.command);
      } else {
        ctxpar::cli::print_help(std::cout);
      }
    }
    return tokens.empty() ? 2 : 0;
  }
  try {
    return inv.command->fn(*inv.args, world);
  } catch (const ctxpar::cli::UsageError& e) {
    // Options are read on every rank before any collective (the contract in command.hpp), so
    // every rank throws this same error and none is left waiting.
    if (world.rank() == 0)
      std::cerr << e.what() << "\n(see ctxpar " << inv.command->name << " --help)" << std::endl;
    return 2;
  } catch (const std::exception& e) {
    abort_run(world, e.what());
  } catch (...) {
    abort_run(world, "unknown exception");
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::funneled);
  // Kokkos sees only the --kokkos-* options: Kokkos 3.4 also acts on unprefixed ones such as
  // --help and --threads, which belong to ctxpar here.
  std::vector<char*> kokkos_argv{argv[0]};
  std::vector<std::string> tokens;
  for (int i = 1; i < argc; ++i) {
    const std::string token = argv[i];
    if (token.rfind("--kokkos-", 0) == 0) {
      kokkos_argv.push_back(argv[i]);
    } else {
      tokens.push_back(token);
    }
  }
  int kokkos_argc = static_cast<int>(kokkos_argv.size());
  kokkos_argv.push_back(nullptr);
  Kokkos::ScopeGuard kokkos(kokkos_argc, kokkos_argv.data());
  int status = 0;
  {
    const ctxpar::Group world(MPI_COMM_WORLD);
    status = run_tool(tokens, world);
  }
  // Every rank has printed its verdict before any rank exits: mpirun kills the remaining ranks as
  // soon as one exits non-zero, which could cut another rank's agreed error message short.
  std::cout.flush();
  std::cerr.flush();
  MPI_Barrier(MPI_COMM_WORLD);
  return status;
}

// The `ctxpar` command-line tool: MPI first, then Kokkos, then the subcommand named on the
// command line (see command.hpp for how subcommands register themselves).
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <boost/mpi/environment.hpp>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "command.hpp"
#include "ctxpar/comm/group.hpp"

namespace {

// A communicator used only to find out whether every rank failed: the ranks that did not fail may
// be inside a collective on MPI_COMM_WORLD, so the failing ones must not touch that one.
MPI_Comm error_comm = MPI_COMM_NULL;

// A failure inside a subcommand may have happened on one rank only, while the others wait in a
// collective: abort the whole job rather than hang.
[[noreturn]] void abort_run(const ctxpar::Group& group, const std::string& what) {
  // One write, so that messages of ranks failing at the same moment do not interleave.
  std::cerr << ("ctxpar: error on rank " + std::to_string(group.rank()) + ": " + what + "\n")
            << std::flush;
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// An exception escaped a subcommand on this rank. When every rank of the job throws within a few
// seconds (a bad input every rank read, an agreed ctxpar::Error of the library), the error is
// reported once — rank 0's message, and another rank's only where it differs — and the ranks return
// status 2 together instead of aborting the job; otherwise the job is aborted as before.
int report_failure(const ctxpar::Group& group, const std::string& op, const std::string& what) {
  MPI_Request barrier;
  MPI_Ibarrier(error_comm, &barrier);
  int everyone = 0;
  const double deadline = MPI_Wtime() + 5.0;
  while (!everyone && MPI_Wtime() < deadline) {
    MPI_Test(&barrier, &everyone, MPI_STATUS_IGNORE);
    if (!everyone) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!everyone) abort_run(group, what);
  std::string first = what;
  int length = static_cast<int>(first.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, error_comm);
  first.resize(static_cast<std::size_t>(length));
  MPI_Bcast(first.data(), length, MPI_CHAR, 0, error_comm);
  if (group.rank() == 0 || what != first) {
    std::cerr << ((group.rank() == 0 ? "" : "rank " + std::to_string(group.rank()) + ": ") + what +
                  "\n(see " + op + " --help)\n")
              << std::flush;
  }
  return 2;
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
  const std::string op = "ctxpar " + inv.command->name;
  try {
    return inv.command->fn(*inv.args, world);
  } catch (const ctxpar::cli::UsageError& e) {
    // Options are read on every rank before any collective (the contract in command.hpp), so
    // every rank throws this same error and none is left waiting.
    if (world.rank() == 0) std::cerr << e.what() << "\n(see " << op << " --help)" << std::endl;
    return 2;
  } catch (const std::bad_alloc&) {
    return report_failure(world, op,
                          op + ": out of memory (the sizes given need more memory than there is)");
  } catch (const std::exception& e) {
    return report_failure(world, op, e.what());
  } catch (...) {
    abort_run(world, "unknown exception");
  }
}

// The --kokkos-* options Kokkos 3.4 knows, and whether each takes an integer (>= the minimum), a
// string, or nothing. Kokkos itself throws from its initialisation on a bad value, which ends in
// std::terminate and a backtrace; checked here first, a bad value is a usage error like any other.
struct KokkosOption {
  const char* name;
  enum { flag, integer, integer_pair, text } kind;
  long minimum;
};
constexpr KokkosOption kokkos_options[] = {
    {"--kokkos-threads", KokkosOption::integer, 1},
    {"--kokkos-numa", KokkosOption::integer, 1},
    {"--kokkos-device-id", KokkosOption::integer, 0},
    {"--kokkos-device", KokkosOption::integer, 0},
    {"--kokkos-num-devices", KokkosOption::integer_pair, 1},
    {"--kokkos-ndevices", KokkosOption::integer_pair, 1},
    {"--kokkos-disable-warnings", KokkosOption::flag, 0},
    {"--kokkos-tune-internals", KokkosOption::flag, 0},
    {"--kokkos-help", KokkosOption::flag, 0},
    {"--kokkos-tools-help", KokkosOption::flag, 0},
    {"--kokkos-tools-library", KokkosOption::text, 0},
    {"--kokkos-tools-args", KokkosOption::text, 0},
};

bool is_integer_at_least(const std::string& s, long minimum) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  return std::stol(s) >= minimum;
}

// Empty when `token` is a valid Kokkos option; otherwise what is wrong with it.
std::string check_kokkos_option(const std::string& token) {
  const auto eq = token.find('=');
  const std::string name = token.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : token.substr(eq + 1);
  for (const auto& o : kokkos_options) {
    if (name != o.name) continue;
    const std::string at_least = std::to_string(o.minimum);
    switch (o.kind) {
      case KokkosOption::flag:
        if (eq != std::string::npos) return name + " takes no value (expected " + name + ")";
        return "";
      case KokkosOption::integer:
        if (!is_integer_at_least(value, o.minimum))
          return name + " needs an integer >= " + at_least + " (expected " + name + "=N, got " +
                 token + ")";
        return "";
      case KokkosOption::integer_pair: {
        const auto comma = value.find(',');
        const bool ok = comma == std::string::npos
                            ? is_integer_at_least(value, o.minimum)
                            : is_integer_at_least(value.substr(0, comma), o.minimum) &&
                                  is_integer_at_least(value.substr(comma + 1), 0);
        if (!ok)
          return name + " needs an integer >= " + at_least + ", optionally \",M\" (expected " +
                 name + "=N[,M], got " + token + ")";
        return "";
      }
      case KokkosOption::text:
        if (eq == std::string::npos) return name + " needs a value (expected " + name + "=TEXT)";
        return "";
    }
  }
  std::string known;
  for (const auto& o : kokkos_options) known += (known.empty() ? "" : ", ") + std::string(o.name);
  return "unknown Kokkos option " + name + " (expected one of " + known + ")";
}

}  // namespace

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::funneled);
  // Kokkos sees only the --kokkos-* options: Kokkos 3.4 also acts on unprefixed ones such as
  // --help and --threads, which belong to ctxpar here.
  std::vector<char*> kokkos_argv{argv[0]};
  std::vector<std::string> tokens;
  std::string kokkos_error;
  for (int i = 1; i < argc; ++i) {
    const std::string token = argv[i];
    if (token.rfind("--kokkos-", 0) == 0) {
      kokkos_argv.push_back(argv[i]);
      if (kokkos_error.empty()) kokkos_error = check_kokkos_option(token);
    } else {
      tokens.push_back(token);
    }
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!kokkos_error.empty()) {
    // argv is the same on every rank: every rank stops here, rank 0 says why.
    if (rank == 0) std::cerr << "ctxpar: " << kokkos_error << std::endl;
    MPI_Barrier(MPI_COMM_WORLD);
    return 2;
  }
  // Kokkos's OpenMP backend warns when OMP_PROC_BIND is unset, on every rank of every run. Unset
  // (and without OMP_PLACES) the OpenMP runtime does not bind threads, which is what "false" says,
  // so setting it changes nothing but the warning. A user who sets either variable still gets
  // whatever Kokkos says about it.
  if (std::getenv("OMP_PROC_BIND") == nullptr && std::getenv("OMP_PLACES") == nullptr)
    ::setenv("OMP_PROC_BIND", "false", 0);
  int kokkos_argc = static_cast<int>(kokkos_argv.size());
  kokkos_argv.push_back(nullptr);
  try {
    Kokkos::initialize(kokkos_argc, kokkos_argv.data());
  } catch (const std::exception& e) {
    // From the environment (KOKKOS_NUM_THREADS=abc, ...): the same on every rank under mpirun.
    if (rank == 0) std::cerr << "ctxpar: cannot initialise Kokkos: " << e.what() << std::endl;
    MPI_Barrier(MPI_COMM_WORLD);
    return 2;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &error_comm);
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
  MPI_Comm_free(&error_comm);
  Kokkos::finalize();
  return status;
}

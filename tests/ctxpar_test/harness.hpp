// Shared helpers of the ctxpar test suites: the world group, verdicts agreed across ranks,
// deterministic inputs, comparisons that report the multi-index and the bound, and the
// (execution space × scalar) cases every typed test runs over.
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar_test/roundoff.hpp"

namespace ctxpar::test {

/// A group over MPI_COMM_WORLD, shared by every test of the executable.
inline const Group& world() {
  static const Group group(MPI_COMM_WORLD);
  return group;
}

/// Collective: true iff `local_ok` holds on every rank. Tests assert on this, never on a local
/// value, so one failing rank cannot leave the others waiting in a later collective.
inline bool all_ranks(const Group& group, bool local_ok) {
  int ok = local_ok ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, group.mpi_comm());
  return all != 0;
}

/// Collective: the lowest rank where `local_ok` is false, or -1.
inline int first_failing_rank(const Group& group, bool local_ok) {
  int mine = local_ok ? group.size() : group.rank(), lowest = 0;
  MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, group.mpi_comm());
  return lowest == group.size() ? -1 : lowest;
}

/// Runs `f` on every rank and checks that every rank throws a `ctxpar::Error` whose message
/// contains `needle` and that names `expected_rank` (pass -1 to skip the rank check). Collective.
template <class F>
bool throws_everywhere(const Group& group, F&& f, const std::string& needle, int expected_rank) {
  bool ok = false;
  std::string seen = "no exception";
  try {
    f();
  } catch (const ctxpar::Error& e) {
    seen = e.what();
    ok = seen.find(needle) != std::string::npos && (expected_rank < 0 || e.rank() == expected_rank);
  } catch (const std::exception& e) {
    seen = std::string("non-ctxpar exception: ") + e.what();
  }
  if (!ok) {
    std::cerr << "[rank " << group.rank() << "] expected ctxpar::Error containing '" << needle
              << "' from rank " << expected_rank << ", saw: " << seen << "\n";
  }
  return all_ranks(group, ok);
}

/// Deterministic pseudo-random value in [-1, 1) from (seed, global index), so each rank builds its
/// shard and the oracle builds the whole input without communication. Never all zeros.
inline double uniform(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

/// Compares `n` values; `bound(i)` is the allowed absolute error of element i (derived from an
/// error bound by the caller). Reports the first mismatch with the index text from `where(i)`.
template <class Actual, class Expected, class Bound, class Where>
bool all_close(const std::string& what, std::int64_t n, Actual actual, Expected expected,
               Bound bound, Where where) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = static_cast<double>(actual(i));
    const double e = static_cast<double>(expected(i));
    const double b = bound(i);
    if (!(std::fabs(a - e) <= b)) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::cerr << "[rank " << rank << "] " << what << " mismatch at " << where(i) << ": got " << a
                << ", expected " << e << ", |diff| " << std::fabs(a - e) << " > bound " << b
                << "\n";
      return false;
    }
  }
  return true;
}

/// One typed-test case: an execution space and a scalar type.
template <class ExecutionSpace, class Scalar>
struct Case {
  using execution_space = ExecutionSpace;
  using memory_space = typename ExecutionSpace::memory_space;
  using scalar_type = Scalar;
};

namespace impl {
template <class... Lists>
struct concat;
template <class... A>
struct concat<std::tuple<A...>> {
  using type = std::tuple<A...>;
};
template <class... A, class... B, class... Rest>
struct concat<std::tuple<A...>, std::tuple<B...>, Rest...> {
  using type = typename concat<std::tuple<A..., B...>, Rest...>::type;
};
template <class Exec>
using both_scalars = std::tuple<Case<Exec, float>, Case<Exec, double>>;
template <class Exec>
using narrow_scalars = std::tuple<Case<Exec, ctxpar::bfloat16>, Case<Exec, ctxpar::float16>>;

/// The device execution space of a CUDA/HIP/SYCL build as a one-element list; empty where the
/// default space is a host space.
template <template <class> class Wrap>
using device_space_list = std::conditional_t<
    std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>, std::tuple<>,
    Wrap<Kokkos::DefaultExecutionSpace>>;
template <class Exec>
using single_space = std::tuple<Exec>;
}  // namespace impl

/// Every enabled host backend × {float, double} (Threads is the backend of the `tsan` preset:
/// ThreadSanitizer understands its pthreads barriers, not libgomp's), and in a device build the
/// device space × {float, double}: the device kernels run every typed test there.
using cases = typename impl::concat<impl::device_space_list<impl::both_scalars>,
#ifdef KOKKOS_ENABLE_SERIAL
                                    impl::both_scalars<Kokkos::Serial>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
                                    impl::both_scalars<Kokkos::OpenMP>,
#endif
#ifdef KOKKOS_ENABLE_THREADS
                                    impl::both_scalars<Kokkos::Threads>,
#endif
                                    std::tuple<>>::type;

/// The 16-bit storage types (bfloat16, float16, computed in fp32) on the default execution space:
/// the device in a GPU build, the first host backend otherwise.
using narrow_cases = impl::narrow_scalars<Kokkos::DefaultExecutionSpace>;

/// Every enabled host backend and, in a device build, the device space (scalar fixed by the test).
using execution_spaces = typename impl::concat<impl::device_space_list<impl::single_space>,
#ifdef KOKKOS_ENABLE_SERIAL
                                               std::tuple<Kokkos::Serial>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
                                               std::tuple<Kokkos::OpenMP>,
#endif
#ifdef KOKKOS_ENABLE_THREADS
                                               std::tuple<Kokkos::Threads>,
#endif
                                               std::tuple<>>::type;

}  // namespace ctxpar::test

/// Asserts a verdict agreed across all ranks of `group`.
#define CTXPAR_TEST_ALL(group, condition) \
  BOOST_TEST(::ctxpar::test::all_ranks((group), (condition)))

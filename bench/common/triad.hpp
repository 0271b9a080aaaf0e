/// \file
/// The memory ceiling: a STREAM-triad-like kernel `a = b + s·c` over doubles, in GB/s, on a given
/// execution space (one thread per rank when OMP_NUM_THREADS=1).
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <stdexcept>

#include "common/timing.hpp"
#include "ctxpar/core/compat.hpp"

namespace ctxpar::bench {

/// Result of one triad measurement.
struct TriadCeiling {
  /// Elements per array.
  std::size_t n = 0;
  /// GB/s from the median repeat, counting 3·8·n bytes (STREAM's convention: no write-allocate).
  double gbps = 0;
  /// GB/s from the fastest repeat.
  double best_gbps = 0;
  /// The repeats.
  Timing timing;
};

namespace impl {
/// The triad as a named functor (one kernel, no captures of host objects).
template <class View>
struct Triad {
  View a, b, c;
  double scale;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const { a(i) = b(i) + scale * c(i); }
};
/// Fills b and c with non-zero data.
template <class View>
struct TriadFill {
  View b, c;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const {
    b(i) = 1.0 + 1e-9 * double(i % 1000);
    c(i) = 2.0 - 1e-9 * double(i % 777);
  }
};
}  // namespace impl

/// Measures the triad on `space` with arrays of `n` doubles (default 2^24, 128 MiB each, far past
/// any cache). Checks one element of the result once.
template <class ExecutionSpace>
TriadCeiling triad_ceiling(const ExecutionSpace& space, std::size_t n = std::size_t{1} << 24,
                           int repeats = 7) {
  using View = Kokkos::View<double*, typename ExecutionSpace::memory_space>;
  View a(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::bench::triad_a"), n);
  View b(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::bench::triad_b"), n);
  View c(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::bench::triad_c"), n);
  const Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>> policy(space, 0, n);
  Kokkos::parallel_for("ctxpar::bench::triad_fill", policy, impl::TriadFill<View>{b, c});
  const double scale = 3.0;
  TriadCeiling out;
  out.n = n;
  out.timing = time_it(
      [&] {
        Kokkos::parallel_for("ctxpar::bench::triad", policy, impl::Triad<View>{a, b, c, scale});
        compat::fence(space, "ctxpar::bench::triad");
      },
      2, repeats);
  const std::size_t probe = n / 2 + 17 < n ? n / 2 + 17 : 0;
  double got = 0;
  Kokkos::deep_copy(got, Kokkos::subview(a, probe));
  const double want =
      (1.0 + 1e-9 * double(probe % 1000)) + scale * (2.0 - 1e-9 * double(probe % 777));
  if (!(std::fabs(got - want) <= 1e-12 * std::fabs(want))) {
    throw std::runtime_error("ctxpar::bench::triad_ceiling: wrong result");
  }
  const double bytes = 3.0 * sizeof(double) * double(n);
  out.gbps = bytes / out.timing.median_s * 1e-9;
  out.best_gbps = bytes / out.timing.min_s * 1e-9;
  return out;
}

/// Same-run triad ceiling in GB/s on `space` (median of the repeats).
template <class ExecutionSpace>
double triad_gbps(const ExecutionSpace& space, std::size_t n = std::size_t{1} << 24) {
  return triad_ceiling(space, n).gbps;
}

}  // namespace ctxpar::bench

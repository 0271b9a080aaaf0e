/// \file
/// The few places where Kokkos 3.4 and Kokkos 4.x differ, isolated so that nothing else in ctxpar
/// has to know which one it is compiled against.
#pragma once

#include <Kokkos_Core.hpp>

#include <string>

/// 1 when compiled against Kokkos 4.x, 0 against Kokkos 3.x (the only version switch in ctxpar).
#if KOKKOS_VERSION >= 40000
#define CTXPAR_KOKKOS_4 1
#else
#define CTXPAR_KOKKOS_4 0
#endif

namespace ctxpar::compat {

// Math functions moved from Kokkos::Experimental (3.x) to Kokkos (4.x).
#if CTXPAR_KOKKOS_4
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::log1p;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::log1p;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
#endif

/// Fences `space`, with a label where the Kokkos version supports one (3.4 has no labelled fence).
template <class ExecutionSpace>
void fence(const ExecutionSpace& space, [[maybe_unused]] const std::string& label) {
#if CTXPAR_KOKKOS_4
  space.fence(label);
#else
  space.fence();
#endif
}

/// A profiling region open for the lifetime of the object (Kokkos 3.4 has no ScopedRegion).
class ScopedRegion {
 public:
  /// Opens the region `label` for Kokkos Tools.
  explicit ScopedRegion(const std::string& label) { Kokkos::Profiling::pushRegion(label); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

/// The rank of a view type as a plain integer (an enum in 3.4, a constant in 4.x).
template <class View>
inline constexpr int view_rank = static_cast<int>(View::rank);

}  // namespace ctxpar::compat

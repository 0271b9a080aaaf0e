/// \file
/// The steady-state allocation figure: what a plan's repeated forward + backward still allocates
/// once warm, counted through the Kokkos Tools allocate callbacks (`ctxpar::AllocationCounter`).
#pragma once

#include <cstdint>
#include <string>

#include "common/json.hpp"
#include "ctxpar/core/allocation_counter.hpp"

namespace ctxpar::bench {

/// Allocations counted over `calls` calls of a warm step.
struct SteadyStateAllocations {
  std::int64_t allocations = 0;  ///< every Kokkos allocation, any memory space
  std::int64_t bytes = 0;        ///< what they asked for
  int calls = 0;                 ///< forward + backward calls counted
  std::string labels;            ///< "label×count, ..." of what allocated (empty when none)
};

/// Counts what `calls` calls of `step` (one forward + backward on a plan that has already run
/// once on these shapes) allocate.
template <class F>
SteadyStateAllocations count_steady_state_allocations(F&& step, int calls = 3) {
  SteadyStateAllocations s;
  s.calls = calls;
  const AllocationCounter counter;
  for (int i = 0; i < calls; ++i) step();
  s.allocations = counter.allocations();
  s.bytes = counter.bytes();
  for (const auto& [label, n] : counter.labels())
    s.labels += (s.labels.empty() ? "" : ", ") + label + "x" + std::to_string(n);
  return s;
}

/// Writes `steady_state_allocations`, `_bytes`, `_calls` and `_labels` into `r`.
inline void set_steady_state(Record& r, const SteadyStateAllocations& s) {
  r.set("steady_state_allocations", s.allocations)
      .set("steady_state_allocation_bytes", s.bytes)
      .set("steady_state_calls", s.calls)
      .set("steady_state_allocation_labels", s.labels.substr(0, 200));
}

}  // namespace ctxpar::bench

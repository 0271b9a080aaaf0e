// Helpers shared by the expression-layer tests (and by tests elsewhere that count the kernels of
// an expression-layer operation): a kernel-launch counter on the Kokkos Tools callbacks, and the
// message of the ctxpar::Error an action throws.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

#include "ctxpar/core/error.hpp"

namespace ctxpar::test::expr {

namespace impl {
// Kernel launches seen by the Kokkos Tools callback while a counter is installed (one test runs
// at a time in a process, so one counter is enough).
inline int launches = 0;
inline void count_launch(const char*, std::uint32_t, std::uint64_t* id) {
  ++launches;
  *id = 0;
}
inline void ignore_end(std::uint64_t) {}
}  // namespace impl

// Counts the parallel_for launches made by `f` (fenced before the counter is removed).
template <class F>
int kernels_launched_by(F&& f) {
  impl::launches = 0;
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(impl::count_launch);
  Kokkos::Tools::Experimental::set_end_parallel_for_callback(impl::ignore_end);
  f();
  Kokkos::fence();
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  Kokkos::Tools::Experimental::set_end_parallel_for_callback(nullptr);
  return impl::launches;
}

// The message of the ctxpar::Error `f` throws, or "no ctxpar::Error".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ctxpar::Error& e) {
    return e.what();
  }
  return "no ctxpar::Error";
}

}  // namespace ctxpar::test::expr

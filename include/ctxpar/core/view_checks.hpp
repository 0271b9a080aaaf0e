/// \file
/// Compile-time and run-time checks on the views handed to ctxpar operators.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

#include "ctxpar/core/error.hpp"

namespace ctxpar {

/// True when a view of type `View` can be read and written from `ExecutionSpace`.
template <class ExecutionSpace, class View>
inline constexpr bool is_accessible_from_v =
    Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible;

/// True when `View`'s memory can be handed to MPI without staging through a host mirror.
template <class View>
inline constexpr bool is_host_accessible_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible;

/// Throws unless `view` is contiguous (no stride gaps), naming the operator and the argument.
template <class View>
void require_contiguous(const View& view, const std::string& op, const std::string& argument) {
  require_local(view.span_is_contiguous(), op, argument + " must be contiguous",
                "a contiguous view", "a strided view");
}

}  // namespace ctxpar

/// Static check at a public entry point: `view_type` is accessible from `exec_type`. The message
/// names the API so the compiler's diagnostic reads as an instruction.
#define CTXPAR_ASSERT_ACCESSIBLE(api, exec_type, view_type)               \
  static_assert(::ctxpar::is_accessible_from_v<exec_type, view_type>, api \
                ": the view must be accessible from the execution space " \
                "(allocate it in that space's memory space)")

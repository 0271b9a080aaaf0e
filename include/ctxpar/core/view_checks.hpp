/// \file
/// Compile-time and run-time checks on the views handed to ctxpar operators.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"

namespace ctxpar {

/// True when a view of type `View` can be read and written from `ExecutionSpace`.
template <class ExecutionSpace, class View>
inline constexpr bool is_accessible_from_v =
    Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible;

namespace impl {
/// `is_accessible_from_v` for every one of `Views` (what `CTXPAR_ASSERT_ACCESSIBLE` checks).
template <class ExecutionSpace, class... Views>
inline constexpr bool all_accessible_from_v = (is_accessible_from_v<ExecutionSpace, Views> && ...);
}  // namespace impl

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

namespace impl {

/// `[a, b, c]`: the one form a shape takes in an error message, expected and actual alike.
inline std::string shape_text(std::initializer_list<std::int64_t> extents) {
  std::string text = "[";
  for (const std::int64_t e : extents) text += (text.size() > 1 ? ", " : "") + std::to_string(e);
  return text + "]";
}

/// The extents of `view`, every dimension, in `shape_text`'s form.
template <class View>
std::string shape_text(const View& view) {
  std::string text = "[";
  for (int d = 0; d < compat::view_rank<View>; ++d)
    text += (d ? ", " : "") + std::to_string(view.extent(d));
  return text + "]";
}

/// True when `view` has exactly `extents`, one per dimension (a count that is not the view's rank
/// does not compile: it would compare only some dimensions).
template <class View, class... Extents>
bool has_extents(const View& view, Extents... extents) {
  static_assert(sizeof...(Extents) == static_cast<std::size_t>(compat::view_rank<View>),
                "has_extents takes one extent per dimension of the view");
  std::size_t d = 0;
  bool same = true;
  ((same = same && view.extent(d++) == static_cast<std::size_t>(extents)), ...);
  return same;
}

/// True when `a` and `b` have the same rank and the same extents.
template <class A, class B>
bool same_extents(const A& a, const B& b) {
  if (compat::view_rank<A> != compat::view_rank<B>) return false;
  for (int d = 0; d < compat::view_rank<A>; ++d)
    if (a.extent(d) != b.extent(d)) return false;
  return true;
}

}  // namespace impl

}  // namespace ctxpar

/// Static check at a public entry point: every view type after `exec_type` is accessible from it.
/// The message names the API so the compiler's diagnostic reads as an instruction.
#define CTXPAR_ASSERT_ACCESSIBLE(api, exec_type, ...)                              \
  static_assert(::ctxpar::impl::all_accessible_from_v<exec_type, __VA_ARGS__>, api \
                ": the view must be accessible from the execution space "          \
                "(allocate it in that space's memory space)")

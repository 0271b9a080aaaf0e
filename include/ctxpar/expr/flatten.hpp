/// \file
/// Flatten: the last two axes of an expression read as one, row-major
/// (`node(n, e) == child(n, e / J, e % J)`), so a tree computed on `[H, K, V]` matrices can be
/// written into a `[H, K·V]` slice of a packed record by the same `ctxpar::assign`.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar::expr {

/// `E` (rank 2 `[I, J]` or rank 3 `[N, I, J]`) read with its last two axes merged: `[I·J]` or
/// `[N, I·J]`, element `e` of the merged axis being `(e / J, e % J)`.
template <class E>
struct Flatten {
  static_assert(is_expression_v<E>, "ctxpar::expr::flatten: the operand must be an expression");
  static_assert(E::rank == 2 || E::rank == 3,
                "ctxpar::expr::flatten: the operand must have rank 2 or 3 (it merges the last two "
                "axes)");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// The operand's value type.
  using value_type = typename E::value_type;
  /// One less than the operand's rank.
  static constexpr int rank = E::rank - 1;

  /// The operand.
  E child;
  /// The operand's last extent `J` (the divisor of the merged index).
  std::int64_t cols;

  /// Element `e` of a flattened rank-2 operand.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I e) const {
    static_assert(rank == 1, "ctxpar::expr::flatten: indexed with the wrong number of indices");
    return child(e / static_cast<I>(cols), e % static_cast<I>(cols));
  }
  /// Element `(n, e)` of a flattened rank-3 operand.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I n, I e) const {
    static_assert(rank == 2, "ctxpar::expr::flatten: indexed with the wrong number of indices");
    return child(n, e / static_cast<I>(cols), e % static_cast<I>(cols));
  }
  /// The operand's shape with the last two extents multiplied.
  Shape shape() const {
    const Shape inner = child.shape();
    Shape s;
    s.rank = rank;
    for (int d = 0; d < rank - 1; ++d) s.extent[d] = inner.extent[d];
    s.extent[rank - 1] = inner.extent[rank - 1] * inner.extent[rank];
    return s;
  }
  /// Each merged index maps to exactly one operand element, so index-locality carries over once
  /// the destination is seen with the operand's two axes.
  bool alias_safe(const Footprint& dst, bool index_local) const {
    const Shape inner = child.shape();
    if (!index_local || dst.rank != rank || dst.extent[rank - 1] != inner.extent[rank - 1] * cols)
      return child.alias_safe(dst, false);
    return child.alias_safe(dst.unflatten_last(inner.extent[rank - 1], cols), true);
  }
  /// Accessible when the operand is.
  template <class Space>
  static constexpr bool accessible_from() {
    return E::template accessible_from<Space>();
  }
};

/// Merges the last two axes of `x` (a node or a view of rank 2 or 3), row-major. Costs one
/// integer division per element read.
template <class T, std::enable_if_t<is_expression_v<T> || is_view_v<T>, int> = 0>
auto flatten(T&& x) {
  using value = typename impl::operand_value<impl::remove_cvref_t<T>>::type;
  auto child = impl::as_expression<value>(std::forward<T>(x));
  using Child = decltype(child);
  static_assert(Child::rank == 2 || Child::rank == 3,
                "ctxpar::expr::flatten: the operand must have rank 2 or 3 (it merges the last two "
                "axes)");
  const std::int64_t cols = child.shape().extent[Child::rank - 1];
  return Flatten<Child>{std::move(child), cols};
}

}  // namespace ctxpar::expr

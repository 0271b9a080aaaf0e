/// \file
/// Broadcast: a lower-rank expression repeated along a new axis, e.g. a per-head bias `[H]` read
/// as `[T, H]`. It reads the same element at many indices, so it is not index-local: `assign`
/// refuses it when its operand reads the destination's memory.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "ctxpar/core/error.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar::expr {

/// `E` (rank r) read as rank r+1 with a new axis `Axis` of extent `extent`:
/// `node(i_0, ..., i_r) == child(i_0, ..., i_r without i_Axis)`.
template <int Axis, class E>
struct Broadcast {
  static_assert(is_expression_v<E>, "ctxpar::expr::broadcast: the operand must be an expression");
  static_assert(E::rank >= 1,
                "ctxpar::expr::broadcast: a scalar already broadcasts; use it directly");
  static_assert(E::rank + 1 <= max_rank, "ctxpar::expr::broadcast: the result would exceed rank 3");
  static_assert(Axis >= 0 && Axis <= E::rank,
                "ctxpar::expr::broadcast: the new axis must lie in [0, rank of the operand]");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// The operand's value type.
  using value_type = typename E::value_type;
  /// One more than the operand's rank.
  static constexpr int rank = E::rank + 1;

  /// The operand.
  E child;
  /// Extent of the new axis.
  std::int64_t extent;

  /// Element at a rank-2 index.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I i, I j) const {
    static_assert(rank == 2, "ctxpar::expr::broadcast: indexed with the wrong number of indices");
    if constexpr (Axis == 0) {
      return child(j);
    } else {
      return child(i);
    }
  }
  /// Element at a rank-3 index.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I i, I j, I k) const {
    static_assert(rank == 3, "ctxpar::expr::broadcast: indexed with the wrong number of indices");
    if constexpr (Axis == 0) {
      return child(j, k);
    } else if constexpr (Axis == 1) {
      return child(i, k);
    } else {
      return child(i, j);
    }
  }
  /// The operand's shape with the new axis inserted.
  Shape shape() const {
    const Shape inner = child.shape();
    Shape s;
    s.rank = rank;
    for (int d = 0, from = 0; d < rank; ++d)
      s.extent[d] = d == Axis ? extent : inner.extent[from++];
    return s;
  }
  /// Repeated reads make every read of `dst`'s memory unsafe, wherever it sits below.
  bool alias_safe(const Footprint& dst, bool) const { return child.alias_safe(dst, false); }
  /// Accessible when the operand is.
  template <class Space>
  static constexpr bool accessible_from() {
    return E::template accessible_from<Space>();
  }
};

/// Repeats `x` (a node or a view of rank 1 or 2) `extent` times along a new axis `Axis`.
template <int Axis, class T, std::enable_if_t<is_expression_v<T> || is_view_v<T>, int> = 0>
auto broadcast(T&& x, std::int64_t extent) {
  if (extent < 0) {
    throw Error("ctxpar::expr::broadcast", -1, "the new axis' extent must be non-negative", ">= 0",
                std::to_string(extent));
  }
  using value = typename impl::operand_value<impl::remove_cvref_t<T>>::type;
  auto child = impl::as_expression<value>(std::forward<T>(x));
  return Broadcast<Axis, decltype(child)>{std::move(child), extent};
}

}  // namespace ctxpar::expr

/// \file
/// `ctxpar::assign(space, dst, expr)`: evaluates an element-wise expression into a view in one
/// named-functor `parallel_for` (label `ctxpar::expr::assign`). Evaluation is explicit, so building
/// an expression never touches memory, and an unsafe read of `dst` is refused before the launch.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar {

namespace impl {
/// The kernel of `assign`: `dst(i...) = expr(i...)`. Holds both by value; small because nodes are.
template <class Dst, class E>
struct ExprAssign {
  Dst dst;
  E expr;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(i) = expr(i); }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    dst(i, j) = expr(i, j);
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j, std::int64_t k) const {
    dst(i, j, k) = expr(i, j, k);
  }
};

/// The iteration space of `assign` over a view of rank `Rank`: a flat range for rank 1, a
/// multi-dimensional range otherwise. Exposed so benchmarks and hand-written loops can use the
/// very same policy.
template <class ExecutionSpace, int Rank>
auto assign_policy(const ExecutionSpace& space, const expr::Shape& shape) {
  if constexpr (Rank == 1) {
    return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0,
                                                                                shape.extent[0]);
  } else {
    using Policy =
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<Rank>, Kokkos::IndexType<std::int64_t>>;
    typename Policy::point_type lower{}, upper{};
    for (int d = 0; d < Rank; ++d) {
      lower[d] = 0;
      upper[d] = shape.extent[d];
    }
    return Policy(space, lower, upper);
  }
}
}  // namespace impl

/// Evaluates `e` (an expression, a view, or a number) into `dst` element by element, in one
/// kernel on `space`; asynchronous like `Kokkos::parallel_for`.
///
/// Requirements: `dst` is a non-const view of rank 1..3 accessible from `space`; `e` has the same
/// value type, and the same rank and extents as `dst` (a scalar fills it). `e` may read `dst`'s
/// memory only index-locally through the same index map (`assign(s, a, 2 * a)` is fine); a
/// broadcast of, or a shifted or reshaped view onto, `dst`'s memory throws `ctxpar::Error`.
template <class ExecutionSpace, class Dst, class E>
void assign(const ExecutionSpace& space, const Dst& dst, E&& e) {
  static_assert(Kokkos::is_execution_space<ExecutionSpace>::value,
                "ctxpar::assign: the first argument must be a Kokkos execution space instance");
  static_assert(expr::is_view_v<Dst>, "ctxpar::assign: the destination must be a Kokkos::View");
  constexpr int rank = compat::view_rank<Dst>;
  static_assert(rank >= 1 && rank <= expr::max_rank,
                "ctxpar::assign: the destination must have rank 1, 2 or 3");
  static_assert(!std::is_const_v<typename Dst::value_type>,
                "ctxpar::assign: the destination must be a view of non-const values");
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::assign", ExecutionSpace, Dst);
  static_assert(expr::is_operand_v<E>,
                "ctxpar::assign: the source must be an expression, a Kokkos::View or a number");
  using value_type = typename Dst::non_const_value_type;
  using Node = decltype(expr::impl::as_expression<value_type>(std::forward<E>(e)));
  static_assert(std::is_same_v<typename Node::value_type, value_type>,
                "ctxpar::assign: the expression's value type must equal the destination's; "
                "convert explicitly with ctxpar::expr::cast<T>(...)");
  static_assert(Node::rank == 0 || Node::rank == rank,
                "ctxpar::assign: the expression's rank must equal the destination's (a scalar "
                "fills it); extend a lower-rank operand with ctxpar::expr::broadcast<axis>(...)");
  static_assert(Node::template accessible_from<ExecutionSpace>(),
                "ctxpar::assign: every view the expression reads must be accessible from the "
                "execution space");

  Node node = expr::impl::as_expression<value_type>(std::forward<E>(e));
  const expr::Shape dst_shape = expr::Shape::of_view(dst);
  const expr::Shape src_shape = node.shape();
  // Messages are built only on failure: assign sits in every step of a model's forward pass.
  if (!(src_shape.rank == 0 || src_shape == dst_shape)) {
    throw Error("ctxpar::assign", -1, "the expression's extents must equal the destination's",
                dst_shape.text(), src_shape.text());
  }
  if (!node.alias_safe(expr::Footprint::of_view(dst), true)) {
    throw Error("ctxpar::assign", -1,
                "the expression must read the destination's memory only at the element being "
                "written (no broadcast of it, no shifted or reshaped view of it); evaluate into a "
                "temporary first",
                "no such read", "an overlapping read");
  }
  for (int d = 0; d < rank; ++d)
    if (dst_shape.extent[d] == 0) return;

  compat::ScopedRegion region("ctxpar::assign");
  Kokkos::parallel_for("ctxpar::expr::assign",
                       impl::assign_policy<ExecutionSpace, rank>(space, dst_shape),
                       impl::ExprAssign<Dst, Node>{dst, std::move(node)});
}

}  // namespace ctxpar

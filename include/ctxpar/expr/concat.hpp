/// \file
/// Concatenation along the last axis: two expressions written side by side by one
/// `ctxpar::assign`, so a record made of parts of different shapes (a chunkwise summary
/// `[dS | M]`) is produced by one kernel instead of one per part.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ctxpar/core/error.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar::expr {

namespace impl {
/// The bytes of `other`'s span outside `mine`'s span, as (at most) two plain byte ranges. The
/// two parts of a record with several rows interleave, so their spans overlap although their
/// elements do not; a read that is exactly `mine` lies inside `mine`'s span, and any other read of
/// `other` must touch these ranges or `mine`'s span (which the part's own check refuses).
struct SpanRest {
  /// Below `mine`.
  Footprint before;
  /// Above `mine`.
  Footprint after;
};
/// `other`'s span less `mine`'s.
inline SpanRest span_outside(const Footprint& other, const Footprint& mine) {
  SpanRest rest;
  if (!(mine.begin < mine.end)) {
    rest.before.begin = other.begin;
    rest.before.end = other.end;
    return rest;
  }
  rest.before.begin = other.begin;
  rest.before.end = other.end < mine.begin ? other.end : mine.begin;
  rest.after.begin = other.begin > mine.end ? other.begin : mine.end;
  rest.after.end = other.end;
  if (!(rest.before.begin < rest.before.end)) rest.before.end = rest.before.begin;
  if (!(rest.after.begin < rest.after.end)) rest.after.end = rest.after.begin;
  return rest;
}
}  // namespace impl

/// `a` and `b` side by side along the last axis: `[..., A]` and `[..., B]` give `[..., A + B]`,
/// `node(..., j) == j < A ? a(..., j) : b(..., j − A)`. The leading extents must be equal.
template <class A, class B>
struct Concat {
  static_assert(is_expression_v<A> && is_expression_v<B>,
                "ctxpar::expr::concat: the operands must be expressions or views");
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type>,
                "ctxpar::expr::concat: the operands must have the same value type; convert one "
                "explicitly with ctxpar::expr::cast<T>(...)");
  static_assert(A::rank == B::rank && A::rank >= 1,
                "ctxpar::expr::concat: the operands must have the same rank (1 to 3; a scalar has "
                "no axis to concatenate along)");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// The operands' value type.
  using value_type = typename A::value_type;
  /// The operands' rank.
  static constexpr int rank = A::rank;

  /// The first part.
  A first;
  /// The second part.
  B second;
  /// Last extent of the first part (where the second begins).
  std::int64_t split;

  /// Element `j`.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I j) const {
    static_assert(rank == 1, "ctxpar::expr::concat: indexed with the wrong number of indices");
    const I s = static_cast<I>(split);
    return j < s ? first(j) : second(j - s);
  }
  /// Element `(i, j)`.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I i, I j) const {
    static_assert(rank == 2, "ctxpar::expr::concat: indexed with the wrong number of indices");
    const I s = static_cast<I>(split);
    return j < s ? first(i, j) : second(i, j - s);
  }
  /// Element `(n, i, j)`.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I n, I i, I j) const {
    static_assert(rank == 3, "ctxpar::expr::concat: indexed with the wrong number of indices");
    const I s = static_cast<I>(split);
    return j < s ? first(n, i, j) : second(n, i, j - s);
  }
  /// The common leading extents, and the sum of the last ones.
  Shape shape() const {
    Shape s = first.shape();
    s.extent[rank - 1] += second.shape().extent[rank - 1];
    return s;
  }
  /// Each part writes its own columns of the destination: a part may read the destination's
  /// memory index-locally in its own columns and nowhere else (never the other part's columns,
  /// which another thread writes).
  bool alias_safe(const Footprint& dst, bool index_local) const {
    const std::int64_t total = split + second.shape().extent[rank - 1];
    if (!index_local || dst.rank != rank || dst.extent[rank - 1] != total)
      return first.alias_safe(dst, false) && second.alias_safe(dst, false);
    const Footprint mine = dst.slice_last(0, split), theirs = dst.slice_last(split, total - split);
    const impl::SpanRest first_rest = impl::span_outside(theirs, mine),
                         second_rest = impl::span_outside(mine, theirs);
    return first.alias_safe(mine, true) && first.alias_safe(first_rest.before, false) &&
           first.alias_safe(first_rest.after, false) && second.alias_safe(theirs, true) &&
           second.alias_safe(second_rest.before, false) &&
           second.alias_safe(second_rest.after, false);
  }
  /// Accessible when both parts are.
  template <class Space>
  static constexpr bool accessible_from() {
    return A::template accessible_from<Space>() && B::template accessible_from<Space>();
  }
};

/// `a` followed by `b` along the last axis, as one expression (one kernel when assigned). The
/// operands are views or expressions of one value type and rank; throws `ctxpar::Error` when
/// their leading extents differ. Each element costs one comparison more than its part.
template <class A, class B,
          std::enable_if_t<
              (is_expression_v<A> || is_view_v<A>)&&(is_expression_v<B> || is_view_v<B>), int> = 0>
auto concat(A&& a, B&& b) {
  using value = typename impl::operand_value<impl::remove_cvref_t<A>>::type;
  auto left = impl::as_expression<value>(std::forward<A>(a));
  auto right = impl::as_expression<typename impl::operand_value<impl::remove_cvref_t<B>>::type>(
      std::forward<B>(b));
  using L = decltype(left);
  using R = decltype(right);
  static_assert(L::rank == R::rank && L::rank >= 1,
                "ctxpar::expr::concat: the operands must have the same rank (1 to 3; a scalar has "
                "no axis to concatenate along)");
  const Shape sa = left.shape(), sb = right.shape();
  bool leading_ok = true;
  for (int d = 0; d + 1 < L::rank; ++d) leading_ok = leading_ok && sa.extent[d] == sb.extent[d];
  if (!leading_ok) {
    throw Error("ctxpar::expr::concat", -1,
                "the operands must have the same extents except along the last axis", sa.text(),
                sb.text());
  }
  const std::int64_t split = sa.extent[L::rank - 1];
  return Concat<L, R>{std::move(left), std::move(right), split};
}

}  // namespace ctxpar::expr

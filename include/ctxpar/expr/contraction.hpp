/// \file
/// Contraction: a batched small matrix product read element by element,
/// `node(n, i, j) = init(n, i, j) + Σ_l a(n, i, l)·b(n, l, j)`, for the summary algebra of the
/// chunkwise mechanism (`M2·M1`, `M2·d1 + d2` with `K`, `V` of a few dozen). Each element is one
/// dot product of length `L`, accumulated in order `l = 0 … L−1` onto `init` (zero when there is
/// none), so a tree that contracts is still evaluated by `ctxpar::assign` in one kernel.
///
/// This is not a GEMM: no tiling, no reuse across elements. It pays off only where `L` is small
/// and the product is one step of a sequence of small launches; large products belong in a
/// transform (a separate, blocked kernel).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ctxpar/core/error.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar::expr {

/// `init(n, i, j) + Σ_l a(n, i, l)·b(n, l, j)` over a batch axis `n` (rank 3 operands), or
/// `init(i, j) + Σ_l a(i, l)·b(l, j)` (rank 2). `Init` is `ScalarLeaf<T>{0}` when absent.
template <class A, class B, class Init>
struct Contraction {
  static_assert(is_expression_v<A> && is_expression_v<B> && is_expression_v<Init>,
                "ctxpar::expr::contract: the operands must be expressions or views");
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type> &&
                    std::is_same_v<typename A::value_type, typename Init::value_type>,
                "ctxpar::expr::contract: the operands must have the same value type; convert one "
                "explicitly with ctxpar::expr::cast<T>(...)");
  static_assert(A::rank == B::rank && (A::rank == 2 || A::rank == 3),
                "ctxpar::expr::contract: both factors must have rank 2 ([I, L]·[L, J]) or rank 3 "
                "([N, I, L]·[N, L, J])");
  static_assert(Init::rank == 0 || Init::rank == A::rank,
                "ctxpar::expr::contract: the addend must have the rank of the product (or be a "
                "scalar)");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// The operands' value type (also the accumulator's).
  using value_type = typename A::value_type;
  /// The factors' rank.
  static constexpr int rank = A::rank;

  /// Left factor `[(N,) I, L]`.
  A left;
  /// Right factor `[(N,) L, J]`.
  B right;
  /// Addend `[(N,) I, J]` the products accumulate onto.
  Init init;
  /// Length of the contracted axis.
  std::int64_t length;

  /// Element `(i, j)` of a rank-2 contraction.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I i, I j) const {
    static_assert(rank == 2, "ctxpar::expr::contract: indexed with the wrong number of indices");
    value_type acc = init(i, j);
    for (I l = 0; l < static_cast<I>(length); ++l) acc += left(i, l) * right(l, j);
    return acc;
  }
  /// Element `(n, i, j)` of a batched contraction.
  template <class I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I n, I i, I j) const {
    static_assert(rank == 3, "ctxpar::expr::contract: indexed with the wrong number of indices");
    value_type acc = init(n, i, j);
    for (I l = 0; l < static_cast<I>(length); ++l) acc += left(n, i, l) * right(n, l, j);
    return acc;
  }
  /// `[(N,) I, J]`.
  Shape shape() const {
    Shape s = left.shape();
    s.extent[rank - 1] = right.shape().extent[rank - 1];
    return s;
  }
  /// Each factor element is read for a whole row or column of the result, so the factors may not
  /// touch the destination at all; the addend is read at the element written, like a sum.
  bool alias_safe(const Footprint& dst, bool index_local) const {
    return left.alias_safe(dst, false) && right.alias_safe(dst, false) &&
           init.alias_safe(dst, index_local);
  }
  /// Accessible when every operand is.
  template <class Space>
  static constexpr bool accessible_from() {
    return A::template accessible_from<Space>() && B::template accessible_from<Space>() &&
           Init::template accessible_from<Space>();
  }
};

namespace impl {
/// Checks the extents of `a·b (+ init)` and builds the node.
template <class A, class B, class Init>
Contraction<A, B, Init> make_contraction(A a, B b, Init init) {
  constexpr int r = A::rank;
  const Shape sa = a.shape(), sb = b.shape();
  // The batch axis and the contracted axis must match; messages are built only on failure.
  const bool batch_ok = r == 2 || sa.extent[0] == sb.extent[0];
  if (!batch_ok || sa.extent[r - 1] != sb.extent[r - 2]) {
    throw Error("ctxpar::expr::contract", -1,
                "the factors must be [(N,) I, L] and [(N,) L, J] with the same N and L", sa.text(),
                sb.text());
  }
  Contraction<A, B, Init> node{std::move(a), std::move(b), std::move(init), sa.extent[r - 1]};
  if constexpr (Init::rank != 0) {
    const Shape si = node.init.shape(), sp = node.shape();
    if (!(si == sp)) {
      throw Error("ctxpar::expr::contract", -1, "the addend must have the product's extents",
                  sp.text(), si.text());
    }
  }
  return node;
}

/// The common value type of the operands of `contract`.
template <class A, class B>
using contract_value_t =
    std::conditional_t<std::is_void_v<typename operand_value<remove_cvref_t<A>>::type>,
                       typename operand_value<remove_cvref_t<B>>::type,
                       typename operand_value<remove_cvref_t<A>>::type>;
}  // namespace impl

/// The batched matrix product `a·b` of two rank-3 operands `[N, I, L]`, `[N, L, J]` (or rank-2
/// `[I, L]`, `[L, J]`) as an expression `[(N,) I, J]`, each element a dot product of length `L`
/// summed in order from zero. Operands are views or expressions of one value type. Throws
/// `ctxpar::Error` when the batch or contracted extents differ.
template <class A, class B,
          std::enable_if_t<
              (is_expression_v<A> || is_view_v<A>)&&(is_expression_v<B> || is_view_v<B>), int> = 0>
auto contract(A&& a, B&& b) {
  using value = impl::contract_value_t<A, B>;
  return impl::make_contraction(impl::as_expression<value>(std::forward<A>(a)),
                                impl::as_expression<value>(std::forward<B>(b)),
                                ScalarLeaf<value>{value(0)});
}

/// `init + a·b` with the products accumulated onto `init` element by element, in order
/// `l = 0 … L−1` (one rounding per term, as a hand-written `acc = c; acc += a·b` loop). `init` is
/// a view, an expression or a number; it may be the destination of the assign (read only at the
/// element written), the factors may not.
template <class A, class B, class C,
          std::enable_if_t<(is_expression_v<A> || is_view_v<A>)&&(is_expression_v<B> ||
                                                                  is_view_v<B>)&&is_operand_v<C>,
                           int> = 0>
auto contract(A&& a, B&& b, C&& init) {
  using value = impl::contract_value_t<A, B>;
  return impl::make_contraction(impl::as_expression<value>(std::forward<A>(a)),
                                impl::as_expression<value>(std::forward<B>(b)),
                                impl::as_expression<value>(std::forward<C>(init)));
}

}  // namespace ctxpar::expr

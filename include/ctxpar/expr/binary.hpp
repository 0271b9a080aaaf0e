/// \file
/// Binary element-wise nodes: `+ - * /` between nodes, views and scalars. Operands must share a
/// value type (use `cast<T>()` to mix float and double) and, unless one is a scalar, a rank; their
/// extents are checked when the node is built.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>
#include <utility>

#include "ctxpar/core/error.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar::expr {

namespace op {
/// `a + b`.
struct Plus {
  /// The API name used in messages.
  static constexpr const char* name = "ctxpar::expr::operator+";
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T a, T b) {
    return a + b;
  }
};
/// `a - b`.
struct Minus {
  /// The API name used in messages.
  static constexpr const char* name = "ctxpar::expr::operator-";
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T a, T b) {
    return a - b;
  }
};
/// `a * b`.
struct Multiplies {
  /// The API name used in messages.
  static constexpr const char* name = "ctxpar::expr::operator*";
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T a, T b) {
    return a * b;
  }
};
/// `a / b`.
struct Divides {
  /// The API name used in messages.
  static constexpr const char* name = "ctxpar::expr::operator/";
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T a, T b) {
    return a / b;
  }
};
}  // namespace op

/// `Op` applied to `L` and `R` element by element (both stored by value). Index-local exactly
/// when both operands are.
template <class Op, class L, class R>
struct Binary {
  static_assert(is_expression_v<L> && is_expression_v<R>,
                "ctxpar::expr: the operands of a binary node must be expressions");
  static_assert(std::is_same_v<typename L::value_type, typename R::value_type>,
                "ctxpar::expr: the operands of + - * / must have the same value type; convert one "
                "explicitly with ctxpar::expr::cast<T>(...)");
  static_assert(L::rank == 0 || R::rank == 0 || L::rank == R::rank,
                "ctxpar::expr: the operands of + - * / must have the same rank (or one be a "
                "scalar); extend a lower-rank operand with ctxpar::expr::broadcast<axis>(...)");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// The operands' value type.
  using value_type = typename L::value_type;
  /// The larger of the two ranks (a scalar operand has rank 0).
  static constexpr int rank = L::rank > R::rank ? L::rank : R::rank;

  /// Left operand.
  L left;
  /// Right operand.
  R right;

  /// Element at the evaluation index.
  template <class... I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I... i) const {
    return Op::apply(left(i...), right(i...));
  }
  /// The non-scalar operand's shape.
  Shape shape() const { return L::rank == 0 ? right.shape() : left.shape(); }
  /// Safe when both operands are.
  bool alias_safe(const Footprint& dst, bool index_local) const {
    return left.alias_safe(dst, index_local) && right.alias_safe(dst, index_local);
  }
  /// Accessible when both operands are.
  template <class Space>
  static constexpr bool accessible_from() {
    return L::template accessible_from<Space>() && R::template accessible_from<Space>();
  }
};

namespace impl {
/// Enables the binary operators when at least one side is a node or a view and both sides can
/// stand in an expression; two bare numbers keep the built-in operators.
template <class A, class B>
using enable_if_binary_t = std::enable_if_t<(is_expression_v<A> || is_view_v<A> ||
                                             is_expression_v<B> || is_view_v<B>)&&is_operand_v<A> &&
                                                is_operand_v<B>,
                                            int>;

/// Builds `Binary<Op, ...>`, turning views into leaves and numbers into scalars of the other
/// operand's value type, and checks the extents.
template <class Op, class A, class B>
auto make_binary(A&& a, B&& b) {
  using va = typename operand_value<remove_cvref_t<A>>::type;
  using vb = typename operand_value<remove_cvref_t<B>>::type;
  using value = std::conditional_t<std::is_void_v<va>, vb, va>;
  auto left = as_expression<value>(std::forward<A>(a));
  auto right = as_expression<value>(std::forward<B>(b));
  using Node = Binary<Op, decltype(left), decltype(right)>;
  const Shape ls = left.shape(), rs = right.shape();
  // Messages are built only on failure: this runs every time an expression is written.
  if (!(ls.rank == 0 || rs.rank == 0 || ls == rs)) {
    throw Error(Op::name, -1, "operands must have the same extents (or one be a scalar)", ls.text(),
                rs.text());
  }
  return Node{std::move(left), std::move(right)};
}
}  // namespace impl

/// Element-wise sum.
template <class A, class B, impl::enable_if_binary_t<A, B> = 0>
auto operator+(A&& a, B&& b) {
  return impl::make_binary<op::Plus>(std::forward<A>(a), std::forward<B>(b));
}
/// Element-wise difference.
template <class A, class B, impl::enable_if_binary_t<A, B> = 0>
auto operator-(A&& a, B&& b) {
  return impl::make_binary<op::Minus>(std::forward<A>(a), std::forward<B>(b));
}
/// Element-wise product.
template <class A, class B, impl::enable_if_binary_t<A, B> = 0>
auto operator*(A&& a, B&& b) {
  return impl::make_binary<op::Multiplies>(std::forward<A>(a), std::forward<B>(b));
}
/// Element-wise quotient.
template <class A, class B, impl::enable_if_binary_t<A, B> = 0>
auto operator/(A&& a, B&& b) {
  return impl::make_binary<op::Divides>(std::forward<A>(a), std::forward<B>(b));
}

}  // namespace ctxpar::expr

/// \file
/// Unary element-wise nodes: negation, a type cast, and the functions the gated models need
/// (`exp`, `log1p`, `sigmoid`, `softplus`, `silu`, `rsqrt`). Each function is a small operation
/// struct applied by one generic node, so adding a function is adding one struct and one factory.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>
#include <utility>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/leaf.hpp"

namespace ctxpar::expr {

/// Operations of unary nodes. Each has `apply(x)` (device-callable, `ctxpar::compat` math only)
/// and `result<T>`, the value type it produces from `T`.
namespace op {
/// Base of the operations whose result has the operand's type.
struct SameType {
  /// Same type.
  template <class T>
  using result = T;
};
/// `-x`.
struct Negate : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return -x;
  }
};
/// `exp(x)`.
struct Exp : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return compat::exp(x);
  }
};
/// `log(1 + x)`, accurate near 0.
struct Log1p : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return compat::log1p(x);
  }
};
/// `1 / (1 + exp(-x))`.
struct Sigmoid : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return T(1) / (T(1) + compat::exp(-x));
  }
};
/// `log(1 + exp(x))`, evaluated as `x + log1p(exp(-x))` for positive x so it never overflows.
struct Softplus : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return x > T(0) ? x + compat::log1p(compat::exp(-x)) : compat::log1p(compat::exp(x));
  }
};
/// `x * sigmoid(x)`, evaluated as `x / (1 + exp(-x))`.
struct Silu : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return x / (T(1) + compat::exp(-x));
  }
};
/// `1 / sqrt(x)`.
struct Rsqrt : SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return T(1) / compat::sqrt(x);
  }
};
/// `static_cast<U>(x)`: the explicit way to mix float and double operands.
template <class U>
struct Cast {
  /// Produces `U`.
  template <class T>
  using result = U;
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static U apply(T x) {
    return static_cast<U>(x);
  }
};
}  // namespace op

/// `Op` applied to every element of `E` (stored by value). Index-local exactly when `E` is.
template <class Op, class E>
struct Unary {
  static_assert(is_expression_v<E>,
                "ctxpar::expr: the operand of a unary node must be an expression");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// Type the operation produces.
  using value_type = typename Op::template result<typename E::value_type>;
  /// The operand's rank.
  static constexpr int rank = E::rank;

  /// The operand.
  E child;

  /// Element at the evaluation index.
  template <class... I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I... i) const {
    return Op::apply(child(i...));
  }
  /// The operand's shape.
  Shape shape() const { return child.shape(); }
  /// Safe when the operand is.
  bool alias_safe(const Footprint& dst, bool index_local) const {
    return child.alias_safe(dst, index_local);
  }
  /// Accessible when the operand is.
  template <class Space>
  static constexpr bool accessible_from() {
    return E::template accessible_from<Space>();
  }
};

namespace impl {
/// Enables the unary factories for nodes and views only (never for plain numbers, so
/// `ctxpar::expr::exp(1.0)` does not silently build a node).
template <class T>
using enable_if_tensor_t = std::enable_if_t<is_expression_v<T> || is_view_v<T>, int>;

/// Builds `Unary<Op, ...>` from a node or a view.
template <class Op, class T>
auto make_unary(T&& x) {
  using value = typename operand_value<remove_cvref_t<T>>::type;
  auto child = as_expression<value>(std::forward<T>(x));
  return Unary<Op, decltype(child)>{std::move(child)};
}
}  // namespace impl

/// Element-wise negation.
template <class T, impl::enable_if_tensor_t<T> = 0>
auto operator-(T&& x) {
  return impl::make_unary<op::Negate>(std::forward<T>(x));
}
/// Element-wise `exp`.
template <class T, impl::enable_if_tensor_t<T> = 0>
auto exp(T&& x) {
  return impl::make_unary<op::Exp>(std::forward<T>(x));
}
/// Element-wise `log1p`.
template <class T, impl::enable_if_tensor_t<T> = 0>
auto log1p(T&& x) {
  return impl::make_unary<op::Log1p>(std::forward<T>(x));
}
/// Element-wise logistic sigmoid `1 / (1 + exp(-x))`.
template <class T, impl::enable_if_tensor_t<T> = 0>
auto sigmoid(T&& x) {
  return impl::make_unary<op::Sigmoid>(std::forward<T>(x));
}
/// Element-wise `softplus(x) = log(1 + exp(x))` (overflow-free form).
template <class T, impl::enable_if_tensor_t<T> = 0>
auto softplus(T&& x) {
  return impl::make_unary<op::Softplus>(std::forward<T>(x));
}
/// Element-wise SiLU `x * sigmoid(x)`.
template <class T, impl::enable_if_tensor_t<T> = 0>
auto silu(T&& x) {
  return impl::make_unary<op::Silu>(std::forward<T>(x));
}
/// Element-wise `1 / sqrt(x)`.
template <class T, impl::enable_if_tensor_t<T> = 0>
auto rsqrt(T&& x) {
  return impl::make_unary<op::Rsqrt>(std::forward<T>(x));
}
/// Element-wise conversion to `U` (operands of a binary node must share a value type).
template <class U, class T, impl::enable_if_tensor_t<T> = 0>
auto cast(T&& x) {
  static_assert(std::is_arithmetic_v<U>, "ctxpar::expr::cast: the target type must be arithmetic");
  return impl::make_unary<op::Cast<U>>(std::forward<T>(x));
}

}  // namespace ctxpar::expr

/// \file
/// Leaves of element-wise expressions: a Kokkos view read at the evaluation index, and a scalar
/// that broadcasts to every index. Both are stored by value.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>
#include <utility>

#include "ctxpar/expr/expression.hpp"

namespace ctxpar::expr {

/// A view read element-wise: `leaf(i, j, k) == view(i, j, k)`. Holds the view by value (a
/// reference-counted handle), so the leaf keeps its data alive for as long as the expression.
template <class View>
struct ViewLeaf {
  static_assert(is_view_v<View>, "ctxpar::expr::view: the argument must be a Kokkos::View");
  static_assert(View::rank >= 1 && View::rank <= max_rank,
                "ctxpar::expr::view: views of rank 1 to 3 are supported");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// Element type (const removed).
  using value_type = typename View::non_const_value_type;
  /// Number of indices.
  static constexpr int rank = static_cast<int>(View::rank);

  /// The view read by the leaf.
  View data;

  /// Element at the evaluation index.
  template <class... I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I... i) const {
    static_assert(sizeof...(I) == rank,
                  "ctxpar::expr::view: indexed with the wrong number of indices");
    return data(i...);
  }
  /// Extents of the view.
  Shape shape() const { return Shape::of_view(data); }
  /// Reading `dst`'s memory is safe only index-locally and through the very same index map.
  bool alias_safe(const Footprint& dst, bool index_local) const {
    const Footprint mine = Footprint::of_view(data);
    return !mine.overlaps(dst) || (index_local && mine.same_map(dst));
  }
  /// The view is accessible from `Space`.
  template <class Space>
  static constexpr bool accessible_from() {
    return Kokkos::SpaceAccessibility<Space, typename View::memory_space>::accessible;
  }
};

/// A scalar broadcast to every index (rank 0).
template <class T>
struct ScalarLeaf {
  static_assert(std::is_arithmetic_v<T>, "ctxpar::expr::scalar: the value must be arithmetic");
  /// Marks the type as an expression node.
  using expression_category = expression_tag;
  /// The scalar type.
  using value_type = T;
  /// Rank 0: broadcasts to any shape.
  static constexpr int rank = 0;

  /// The value.
  T value;

  /// The value, whatever the index.
  template <class... I>
  KOKKOS_INLINE_FUNCTION value_type operator()(I...) const {
    return value;
  }
  /// A rank-0 shape.
  Shape shape() const { return Shape{}; }
  /// Reads no memory.
  bool alias_safe(const Footprint&, bool) const { return true; }
  /// Reads no memory.
  template <class Space>
  static constexpr bool accessible_from() {
    return true;
  }
};

/// Wraps a view as an expression leaf.
template <class View, std::enable_if_t<is_view_v<View>, int> = 0>
ViewLeaf<View> view(const View& v) {
  return ViewLeaf<View>{v};
}

/// Wraps an arithmetic value as a scalar leaf.
template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
ScalarLeaf<T> scalar(T value) {
  return ScalarLeaf<T>{value};
}

/// True when `T` can stand in an expression: a node, a Kokkos view, or an arithmetic value.
template <class T>
inline constexpr bool is_operand_v =
    is_expression_v<T> || is_view_v<T> ||
    std::is_arithmetic_v<std::remove_cv_t<std::remove_reference_t<T>>>;

namespace impl {
/// Turns an operand into a node: nodes pass through, views become leaves, and an arithmetic value
/// becomes a scalar of `Scalar` (the other operand's type), so `x * 2.0` on floats stays float.
/// Temporaries are moved, not copied: a view copy costs an atomic reference-count update, and
/// expressions are typically written inline, once per call.
template <class Scalar, class T>
auto as_expression(T&& x) {
  using D = remove_cvref_t<T>;
  if constexpr (is_expression_v<D>) {
    return D(std::forward<T>(x));
  } else if constexpr (is_view_v<D>) {
    return ViewLeaf<D>{std::forward<T>(x)};
  } else {
    return ScalarLeaf<Scalar>{static_cast<Scalar>(x)};
  }
}

/// The value type an operand contributes, or void for a bare arithmetic value.
template <class T, class = void>
struct operand_value {
  using type = void;
};
/// \cond INTERNAL
template <class T>
struct operand_value<T, std::enable_if_t<is_expression_v<T>>> {
  using type = typename T::value_type;
};
template <class T>
struct operand_value<T, std::enable_if_t<is_view_v<T>>> {
  using type = typename T::non_const_value_type;
};
/// \endcond
}  // namespace impl

}  // namespace ctxpar::expr

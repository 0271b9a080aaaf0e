/// \file
/// The protocol every element-wise expression node follows, and the shape and memory-footprint
/// records that `ctxpar::assign` checks before it launches the one kernel that evaluates a tree.
///
/// A node is a small by-value struct (children and views stored by value, so a tree can be copied
/// into a device kernel) that provides:
/// - `using expression_category = ctxpar::expr::expression_tag;` and `using value_type = ...;`
/// - `static constexpr int rank` (0 for a scalar, which broadcasts to any shape);
/// - `KOKKOS_INLINE_FUNCTION value_type operator()(i...) const` for `rank` indices (a rank-0 node
///   accepts any number of indices);
/// - host-side `Shape shape() const` (extents; checked when the node is built);
/// - host-side `bool alias_safe(const Footprint& dst, bool index_local) const`: false when the node
///   reads `dst`'s memory anywhere except exactly the element being written;
/// - `template <class Space> static constexpr bool accessible_from()`: every view it reads is
///   accessible from `Space`.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>

#include "ctxpar/core/impl/detect.hpp"

namespace ctxpar::expr {

/// Tag a type carries (`using expression_category = expression_tag;`) to be an expression node.
struct expression_tag {};

namespace impl {
/// `T`'s declared expression category.
template <class T>
using expression_category_t = typename T::expression_category;
}  // namespace impl

/// True when `T` is an element-wise expression node: its `expression_category` is `expression_tag`.
template <class T>
struct is_expression
    : std::is_same<ctxpar::impl::detected_t<impl::expression_category_t, T>, expression_tag> {};

/// True when `T` (cv and references ignored) is an element-wise expression node.
template <class T>
inline constexpr bool is_expression_v =
    is_expression<std::remove_cv_t<std::remove_reference_t<T>>>::value;

/// True when `T` is a Kokkos::View.
template <class T>
inline constexpr bool is_view_v =
    Kokkos::is_view<std::remove_cv_t<std::remove_reference_t<T>>>::value;

namespace impl {
/// `T` without references and cv-qualifiers (std::remove_cvref_t is C++20).
template <class T>
using remove_cvref_t = std::remove_cv_t<std::remove_reference_t<T>>;
}  // namespace impl

/// The largest rank an expression may have (ctxpar tensors are at most `[tokens, heads, dim]`).
inline constexpr int max_rank = 3;

/// Extents of an expression; a rank-0 shape (a scalar) broadcasts to every shape.
struct Shape {
  /// Number of indices.
  int rank = 0;
  /// Extent along each of the first `rank` axes.
  std::int64_t extent[max_rank] = {0, 0, 0};

  /// Shape of a view.
  template <class View>
  static Shape of_view(const View& view) {
    Shape s;
    s.rank = static_cast<int>(View::rank);
    for (int d = 0; d < s.rank; ++d) s.extent[d] = static_cast<std::int64_t>(view.extent(d));
    return s;
  }
  /// Equal rank and extents.
  bool operator==(const Shape& other) const {
    if (rank != other.rank) return false;
    for (int d = 0; d < rank; ++d)
      if (extent[d] != other.extent[d]) return false;
    return true;
  }
  /// Printed as `[e0, e1, ...]` (`[]` for a scalar).
  std::string text() const {
    std::ostringstream out;
    out << '[';
    for (int d = 0; d < rank; ++d) out << (d ? ", " : "") << extent[d];
    out << ']';
    return out.str();
  }
};

/// Prints a shape as `[e0, e1, ...]`.
inline std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  return out << shape.text();
}

/// Where a view's elements live: the byte range its span covers, and its index map (data pointer,
/// extents, strides), so a reader can tell "same element" from "overlapping memory".
struct Footprint {
  /// First byte of the span.
  const char* begin = nullptr;
  /// One past the last byte of the span.
  const char* end = nullptr;
  /// Number of indices.
  int rank = 0;
  /// Extents.
  std::int64_t extent[max_rank] = {0, 0, 0};
  /// Strides in elements.
  std::int64_t stride[max_rank] = {0, 0, 0};
  /// Element size in bytes.
  std::size_t element_size = 0;

  /// Footprint of a view.
  template <class View>
  static Footprint of_view(const View& view) {
    Footprint f;
    f.begin = reinterpret_cast<const char*>(view.data());
    f.element_size = sizeof(typename View::value_type);
    f.rank = static_cast<int>(View::rank);
    for (int d = 0; d < f.rank; ++d) {
      f.extent[d] = static_cast<std::int64_t>(view.extent(d));
      f.stride[d] = static_cast<std::int64_t>(view.stride(d));
    }
    f.end_at_last_element();
    return f;
  }
  /// The columns `[first, first + count)` of the last axis, as a footprint of their own.
  Footprint slice_last(std::int64_t first, std::int64_t count) const {
    Footprint f = *this;
    f.begin = begin + first * stride[rank - 1] * static_cast<std::int64_t>(element_size);
    f.extent[rank - 1] = count;
    f.end_at_last_element();
    return f;
  }
  /// This footprint (last extent `rows·cols`) seen as rank + 1 `[..., rows, cols]`, so a child
  /// of a flatten can tell the element it is written to from any other (same start and span).
  Footprint unflatten_last(std::int64_t rows, std::int64_t cols) const {
    Footprint f = *this;
    const int last = rank - 1;
    f.rank = rank + 1;
    f.extent[last] = rows;
    f.extent[last + 1] = cols;
    f.stride[last] = cols * stride[last];
    f.stride[last + 1] = stride[last];
    return f;
  }
  /// Sets `end` one past the last element the extents and strides reach from `begin` (`begin`
  /// when empty): exact, where View::span() of a strided view may reach past it and so report a
  /// false overlap with memory that merely follows the view.
  void end_at_last_element() {
    std::int64_t last = 0;
    bool empty = false;
    for (int d = 0; d < rank; ++d) {
      if (extent[d] == 0) empty = true;
      last += (extent[d] - 1) * stride[d];
    }
    end = empty ? begin : begin + (last + 1) * static_cast<std::int64_t>(element_size);
  }
  /// True when the two spans share a byte (empty spans overlap nothing).
  bool overlaps(const Footprint& other) const {
    return begin < end && other.begin < other.end && begin < other.end && other.begin < end;
  }
  /// True when both map every index to the same element: same start, element size, extents and
  /// strides (strides of unit extents do not matter).
  bool same_map(const Footprint& other) const {
    if (begin != other.begin || rank != other.rank || element_size != other.element_size)
      return false;
    for (int d = 0; d < rank; ++d) {
      if (extent[d] != other.extent[d]) return false;
      if (extent[d] > 1 && stride[d] != other.stride[d]) return false;
    }
    return true;
  }
};

}  // namespace ctxpar::expr

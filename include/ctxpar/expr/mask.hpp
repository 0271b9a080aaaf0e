/// \file
/// Mask expressions for attention: small by-value predicates over a (query, key) token pair that
/// compose with `&&` and `||` into one type the attention kernel inlines. They are a compile-time
/// analogue of FlexAttention's `mask_mod`: the composed predicate costs what the hand-written
/// condition would, because each node is a plain struct whose `operator()` the compiler sees whole.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/core/impl/detect.hpp"

namespace ctxpar::mask {

/// The position of one token as a mask sees it: its global position in the (packed) stream and
/// the id of the sequence (document) it belongs to.
struct Token {
  /// Global token position.
  std::int64_t pos;
  /// Sequence (document) id of the token.
  std::int32_t seq;
};

/// Tag a type carries (`using mask_category = mask_tag;`) to be accepted as a mask expression.
/// User-defined masks opt in the same way.
struct mask_tag {};

namespace impl {
/// `T`'s declared mask category.
template <class T>
using mask_category_t = typename T::mask_category;
}  // namespace impl

/// True when `T` is a mask expression: it declares `mask_category` as `mask_tag`.
template <class T>
struct is_mask : std::is_same<ctxpar::impl::detected_t<impl::mask_category_t, T>, mask_tag> {};

/// True when `T` (cv and references ignored) is a mask expression.
template <class T>
inline constexpr bool is_mask_v = is_mask<std::remove_cv_t<std::remove_reference_t<T>>>::value;

/// Keys at or before the query: `k.pos <= q.pos`.
struct Causal {
  /// Marks the type as a mask expression.
  using mask_category = mask_tag;
  /// True when key `k` may be attended from query `q`.
  KOKKOS_INLINE_FUNCTION bool operator()(const Token& q, const Token& k) const {
    return k.pos <= q.pos;
  }
};

/// Keys strictly inside the last `window` positions: `q.pos - window < k.pos`. A window of 0
/// means unlimited (always true), matching the "no window" convention of the attention API.
struct SlidingWindow {
  /// Marks the type as a mask expression.
  using mask_category = mask_tag;
  /// Window length in tokens; 0 means unlimited.
  std::int64_t window;
  /// True when key `k` may be attended from query `q`.
  KOKKOS_INLINE_FUNCTION bool operator()(const Token& q, const Token& k) const {
    return window == 0 || q.pos - window < k.pos;
  }
};

/// Keys of the same packed sequence as the query: `q.seq == k.seq`.
struct SameSequence {
  /// Marks the type as a mask expression.
  using mask_category = mask_tag;
  /// True when key `k` may be attended from query `q`.
  KOKKOS_INLINE_FUNCTION bool operator()(const Token& q, const Token& k) const {
    return q.seq == k.seq;
  }
};

/// Every key (no masking).
struct All {
  /// Marks the type as a mask expression.
  using mask_category = mask_tag;
  /// Always true.
  KOKKOS_INLINE_FUNCTION bool operator()(const Token&, const Token&) const { return true; }
};

/// Two masks joined by the built-in `||` (`Any`) or `&&` (otherwise), both stored by value; it
/// short-circuits like that operator.
template <bool Any, class L, class R>
struct Join {
  /// Marks the type as a mask expression.
  using mask_category = mask_tag;
  /// Left operand.
  L left;
  /// Right operand.
  R right;
  /// True when either operand (`Any`) or both admit the pair.
  KOKKOS_INLINE_FUNCTION bool operator()(const Token& q, const Token& k) const {
    if constexpr (Any)
      return left(q, k) || right(q, k);
    else
      return left(q, k) && right(q, k);
  }
};

/// Conjunction of two masks (`a && b`).
template <class L, class R>
using And = Join<false, L, R>;

/// Disjunction of two masks (`a || b`).
template <class L, class R>
using Or = Join<true, L, R>;

/// Causal mask: `k.pos <= q.pos`.
KOKKOS_INLINE_FUNCTION constexpr Causal causal() {
  return Causal{};
}

/// Sliding-window mask: `q.pos - window < k.pos`; `window == 0` means unlimited.
KOKKOS_INLINE_FUNCTION constexpr SlidingWindow sliding_window(std::int64_t window) {
  return SlidingWindow{window};
}

/// Packed-sequence isolation: `q.seq == k.seq`.
KOKKOS_INLINE_FUNCTION constexpr SameSequence same_sequence() {
  return SameSequence{};
}

/// No masking.
KOKKOS_INLINE_FUNCTION constexpr All all() {
  return All{};
}

namespace impl {
/// Checks every mask type the combinators build, so a misuse is reported where it is written.
template <class L, class R>
KOKKOS_INLINE_FUNCTION constexpr bool check_operands() {
  static_assert(is_mask_v<L> && is_mask_v<R>,
                "ctxpar::mask: && and || combine two mask expressions (causal(), "
                "sliding_window(W), same_sequence(), all() or their compositions); one operand "
                "is not a mask");
  static_assert(std::is_trivially_copyable_v<L> && std::is_trivially_copyable_v<R>,
                "ctxpar::mask: a mask must be trivially copyable so it can be passed to a device "
                "kernel by value");
  return true;
}
/// Enables the combinators when at least one side is a mask; the other side is then checked with a
/// readable static_assert instead of silently dropping out of overload resolution.
template <class L, class R>
using enable_if_any_mask_t = std::enable_if_t<is_mask_v<L> || is_mask_v<R>, int>;
}  // namespace impl

/// Composes two masks into their conjunction.
template <class L, class R, impl::enable_if_any_mask_t<L, R> = 0>
KOKKOS_INLINE_FUNCTION constexpr And<L, R> operator&&(const L& left, const R& right) {
  static_assert(impl::check_operands<L, R>(), "");
  return And<L, R>{left, right};
}

/// Composes two masks into their disjunction.
template <class L, class R, impl::enable_if_any_mask_t<L, R> = 0>
KOKKOS_INLINE_FUNCTION constexpr Or<L, R> operator||(const L& left, const R& right) {
  static_assert(impl::check_operands<L, R>(), "");
  return Or<L, R>{left, right};
}

}  // namespace ctxpar::mask

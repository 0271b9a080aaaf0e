/// \file
/// Storage types and the arithmetic they are computed in. A tensor's element type is its
/// *storage* type (`float`, `double`, `ctxpar::bfloat16`, `ctxpar::float16`); kernels read it with
/// `widen`, compute and accumulate in `compute_t` (fp32 for the 16-bit types, the type itself
/// otherwise) and write back with `narrow<Storage>`, which rounds once, to nearest even. For
/// `float` and `double` both are the identity, so the fp32/fp64 paths are unchanged.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"

namespace ctxpar {

/// How a storage type is widened for arithmetic and narrowed back (`float` and `double`).
template <class Storage>
struct storage_traits {
  static_assert(std::is_floating_point_v<Storage>,
                "ctxpar: tensors hold float, double, ctxpar::bfloat16 or ctxpar::float16");
  /// The type kernels compute and accumulate in.
  using compute_type = Storage;
  /// Exact.
  KOKKOS_INLINE_FUNCTION static compute_type widen(Storage x) { return x; }
  /// The identity.
  KOKKOS_INLINE_FUNCTION static Storage narrow(compute_type x) { return x; }
};

/// bfloat16 storage computes in fp32.
template <>
struct storage_traits<bfloat16> {
  using compute_type = float;  ///< fp32 arithmetic
  KOKKOS_INLINE_FUNCTION static float widen(bfloat16 x) { return x.to_float(); }  ///< exact
  /// Rounded to nearest even.
  KOKKOS_INLINE_FUNCTION static bfloat16 narrow(float x) { return bfloat16::from_float(x); }
};

/// IEEE binary16 storage computes in fp32.
template <>
struct storage_traits<float16> {
  using compute_type = float;  ///< fp32 arithmetic
  KOKKOS_INLINE_FUNCTION static float widen(float16 x) { return x.to_float(); }  ///< exact
  /// Rounded to nearest even (overflow to ±inf).
  KOKKOS_INLINE_FUNCTION static float16 narrow(float x) { return float16::from_float(x); }
};

/// The arithmetic type of storage type `Storage` (const ignored).
template <class Storage>
using compute_t = typename storage_traits<std::remove_const_t<Storage>>::compute_type;

/// Whether `Storage` is a 16-bit type computed in fp32 (false for every other type, integers
/// included).
template <class Storage>
inline constexpr bool is_narrow_storage_v =
    std::is_same_v<std::remove_const_t<Storage>, bfloat16> ||
    std::is_same_v<std::remove_const_t<Storage>, float16>;

/// `x` as its compute type (exact).
template <class Storage>
KOKKOS_INLINE_FUNCTION compute_t<Storage> widen(const Storage& x) {
  return storage_traits<std::remove_const_t<Storage>>::widen(x);
}

/// `x` stored as `Storage`: a conversion to the compute type (the identity for `float` and
/// `double` values), then for the 16-bit types one round to nearest even. A `double` given for a
/// 16-bit type is rounded to fp32 first: two roundings, which may differ from one in the last bit,
/// but are the same bits wherever the same value is narrowed.
template <class Storage, class Value>
KOKKOS_INLINE_FUNCTION Storage narrow(const Value& x) {
  return storage_traits<Storage>::narrow(static_cast<compute_t<Storage>>(x));
}

namespace impl {
/// `to[i] = from[i]` in `to`'s storage type: exact when widening, one rounding when narrowing.
template <class From, class To>
struct ConvertStorage {
  const From* from;
  To* to;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    to[i] = narrow<To>(widen(from[i]));
  }
};
}  // namespace impl

/// Copies the contiguous view `src` into `dst` (same span, any rank) element by element, each
/// widened from `src`'s storage type and narrowed to `dst`'s (`widen`, `narrow`): exact from 16
/// bits to their compute type, one rounding the other way. Runs on `space`; both views must be
/// accessible from it and hold as many elements (not checked here: the callers size them).
template <class ExecutionSpace, class Src, class Dst>
void convert_storage(const ExecutionSpace& space, const Src& src, const Dst& dst) {
  using from = typename Src::const_value_type;
  using to = typename Dst::non_const_value_type;
  Kokkos::parallel_for(sizeof(to) > sizeof(from) ? "ctxpar::widen" : "ctxpar::narrow",
                       Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                           space, 0, static_cast<std::int64_t>(dst.span())),
                       impl::ConvertStorage<from, to>{src.data(), dst.data()});
}

}  // namespace ctxpar

/// \file
/// Scalar pieces shared by every sliding-window attention kernel (portable and host): the softmax
/// exponential (the library's `fast_exp`), which must give the same bits in each so that the
/// kernels agree, and binary searches over key/query positions. The tile products live in the
/// kernel toolbox (`core/impl/tile_product.hpp`, `core/impl/simd.hpp`).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/core/impl/fast_exp.hpp"

namespace ctxpar::swa::impl {

/// The softmax weights' exponential: the library's `fast_exp` (`core/impl/fast_exp.hpp`), whose
/// scalar and vector forms give the same bits, so that the portable and host kernels agree.
using ctxpar::impl::fast_exp;

/// First index in the strictly increasing `pos[0, n)` whose value lies past `value`: at least it
/// (`Inclusive`), or above it. The two bounds below are this one bisection.
template <bool Inclusive, class PosView>
KOKKOS_INLINE_FUNCTION std::int64_t first_past(const PosView& pos, std::int64_t n,
                                               std::int64_t value) {
  std::int64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    const bool past = Inclusive ? pos(mid) >= value : pos(mid) > value;
    if (past)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/// First index in the strictly increasing `pos[0, n)` whose value is at least `value`.
template <class PosView>
KOKKOS_INLINE_FUNCTION std::int64_t lower_bound(const PosView& pos, std::int64_t n,
                                                std::int64_t value) {
  return first_past<true>(pos, n, value);
}

/// First index in the strictly increasing `pos[0, n)` whose value exceeds `value`.
template <class PosView>
KOKKOS_INLINE_FUNCTION std::int64_t upper_bound(const PosView& pos, std::int64_t n,
                                                std::int64_t value) {
  return first_past<false>(pos, n, value);
}

}  // namespace ctxpar::swa::impl

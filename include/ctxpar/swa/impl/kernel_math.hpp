/// \file
/// Scalar pieces shared by every sliding-window attention kernel (portable and host): the softmax
/// exponential, which must give the same bits in each so that the kernels agree, and binary
/// searches over key/query positions. The tile products live in the kernel toolbox
/// (`core/impl/tile_product.hpp`, `core/impl/simd.hpp`).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/core/compat.hpp"

namespace ctxpar::swa::impl {

/// `exp(x)` for the softmax weights, written so that it vectorises: for `float`, Cody-Waite range
/// reduction `x = n ln2 + r` and a degree-7 Taylor polynomial of `exp(r)` on `|r| <= ln2/2`
/// (truncation below 5e-9 relative, i.e. within about two ulps after rounding); results below
/// `exp(-87)` flush to zero. `double` uses the library `exp`.
KOKKOS_INLINE_FUNCTION float softmax_exp(float x) {
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float scaled = xc * 1.44269504088896341f;
  const int n = static_cast<int>(scaled + (scaled >= 0.0f ? 0.5f : -0.5f));
  const float nf = static_cast<float>(n);
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union {
    std::int32_t i;
    float f;
  } two_n;
  two_n.i = (n + 127) << 23;
  return x < -87.0f ? 0.0f : p * two_n.f;
}

/// `exp(x)` in double precision.
KOKKOS_INLINE_FUNCTION double softmax_exp(double x) {
  return compat::exp(x);
}

/// First index in the strictly increasing `pos[0, n)` whose value is at least `value`.
template <class PosView>
KOKKOS_INLINE_FUNCTION std::int64_t lower_bound(const PosView& pos, std::int64_t n,
                                                std::int64_t value) {
  std::int64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (pos(mid) < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// First index in the strictly increasing `pos[0, n)` whose value exceeds `value`.
template <class PosView>
KOKKOS_INLINE_FUNCTION std::int64_t upper_bound(const PosView& pos, std::int64_t n,
                                                std::int64_t value) {
  std::int64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (pos(mid) <= value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace ctxpar::swa::impl

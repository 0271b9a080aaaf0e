/// \file
/// The library's own exponential, `fast_exp`, scalar and on whole vectors (`simd_exp`), with the
/// same bits in both: the portable kernels call the scalar one, the host fast paths the vector
/// one, and the two must agree wherever a result is compared across them (the softmax weights of
/// sliding-window attention, the SiLU and sigmoid of the GDP layer). The library `exp` is neither
/// vectorised by the compiler nor the same function on a device.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/simd.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::impl {

/// `exp(r)` on the reduced range `|r| <= ln2/2`: the degree-7 Taylor polynomial in Horner form.
/// `Real` is `float` or a host vector of floats, so the scalar and vector paths share the bits.
template <class Real>
KOKKOS_INLINE_FUNCTION Real exp_reduced(Real r) {
  Real p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

/// `exp(x)` for `float`: Cody-Waite range reduction `x = n ln2 + r` and a degree-7 Taylor
/// polynomial of `exp(r)` on `|r| <= ln2/2` (truncation below 5e-9 relative, i.e. within about
/// two ulps after rounding); results below `exp(-87)` flush to zero, arguments above 88 clamp.
KOKKOS_INLINE_FUNCTION float fast_exp(float x) {
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float scaled = xc * 1.44269504088896341f;
  // A NaN passes both clamps: n = 0 keeps the conversion and the shift below defined, and the
  // result is the NaN of the polynomial, as on the vector path.
  const int n = scaled == scaled ? static_cast<int>(scaled + (scaled >= 0.0f ? 0.5f : -0.5f)) : 0;
  const float nf = static_cast<float>(n);
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  const float p = exp_reduced(r);
  union {
    std::int32_t i;
    float f;
  } two_n;
  two_n.i = (n + 127) << 23;
  return x < -87.0f ? 0.0f : p * two_n.f;
}

/// `exp(x)` in double precision: the library `exp`.
KOKKOS_INLINE_FUNCTION double fast_exp(double x) {
  return compat::exp(x);
}

/// `fast_exp` on every lane of a vector of any width: for floats the same range reduction and
/// polynomial as the scalar one, so the same bits; for doubles the library `exp` lane by lane.
template <class V>
inline V simd_exp(V x) {
  using T = simd_lane_t<V>;
  constexpr int lanes = simd_lanes<V>;
#if CTXPAR_HOST_SIMD
  if constexpr (std::is_same_v<T, float>) {
    // Branch-free on whole vectors: a per-lane loop with the clamps as branches stays scalar (GCC
    // threads the two tests of x < -87 into separate paths and then cannot if-convert the loop).
    constexpr int bytes = static_cast<int>(sizeof(V));
    typedef std::int32_t ints __attribute__((vector_size(bytes)));
    const V lo = simd_broadcast<float, bytes>(-87.0f), hi = simd_broadcast<float, bytes>(88.0f);
    V xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    const V scaled = xc * 1.44269504088896341f;
    const V half = scaled >= simd_zero<float, bytes>() ? simd_broadcast<float, bytes>(0.5f)
                                                       : simd_broadcast<float, bytes>(-0.5f);
    const ints n = __builtin_convertvector(scaled + half, ints);
    const V nf = __builtin_convertvector(n, V);
    const V r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
    const V p = exp_reduced(r);
    const ints bits = (n + 127) << 23;
    V two_n;
    std::memcpy(&two_n, &bits, sizeof(two_n));
    return x < lo ? simd_zero<float, bytes>() : p * two_n;
  }
#endif
  T xs[lanes];
  simd_store(xs, x);
  for (int i = 0; i < lanes; ++i) xs[i] = fast_exp(xs[i]);
  V r;
  std::memcpy(&r, xs, sizeof(r));
  return r;
}

}  // namespace ctxpar::impl
CTXPAR_WIDE_VECTORS_END

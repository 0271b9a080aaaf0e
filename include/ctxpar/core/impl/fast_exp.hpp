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

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/simd.hpp"

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

/// The float `fast_exp` (same range reduction and polynomial, same bits) on every lane.
inline simd_t<float> simd_exp(simd_t<float> x) {
#if CTXPAR_HOST_SIMD
  // Branch-free on whole vectors: a per-lane loop with the clamps as branches stays scalar (GCC
  // threads the two tests of x < -87 into separate paths and then cannot if-convert the loop).
  typedef std::int32_t ints __attribute__((vector_size(CTXPAR_SIMD_BYTES)));
  using floats = simd_t<float>;
  const floats lo = simd_broadcast(-87.0f), hi = simd_broadcast(88.0f);
  floats xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const floats scaled = xc * 1.44269504088896341f;
  const floats half = scaled >= simd_zero<float>() ? simd_broadcast(0.5f) : simd_broadcast(-0.5f);
  const ints n = __builtin_convertvector(scaled + half, ints);
  const floats nf = __builtin_convertvector(n, floats);
  const floats r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  const floats p = exp_reduced(r);
  const ints bits = (n + 127) << 23;
  floats two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return x < lo ? simd_zero<float>() : p * two_n;
#else
  float xs[Simd<float>::lanes];
  simd_store(xs, x);
  for (int i = 0; i < Simd<float>::lanes; ++i) xs[i] = fast_exp(xs[i]);
  return simd_load(xs);
#endif
}
/// `exp` lane by lane in double precision.
inline simd_t<double> simd_exp(simd_t<double> x) {
  double xs[Simd<double>::lanes];
  simd_store(xs, x);
  for (int i = 0; i < Simd<double>::lanes; ++i) xs[i] = std::exp(xs[i]);
  return simd_load(xs);
}

}  // namespace ctxpar::impl

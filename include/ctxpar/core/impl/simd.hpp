/// \file
/// The one short-vector type of the host kernels (`Simd<T>`, `simd_t<T>` and the helpers that
/// load, store, combine and reduce it), shared by the sliding-window and the chunkwise kernels.
///
/// GCC and clang vector extensions give real SIMD registers, as wide as the target's widest (so
/// that no vector crosses a function boundary in a narrower ABI); GCC at -O2 keeps the register
/// tiles of a scalar loop in memory, which is why the host kernels spell the vectors out. nvcc's
/// host pass is not trusted with the extensions and device passes must not see them, so there a
/// plain array stands in with the same interface and the same arithmetic, lane by lane. A
/// `CTXPAR_PORTABLE_KERNELS` build takes the plain array on hosts too: its host spaces run the
/// portable kernels, which do not use this header's fast paths.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstring>

#include "ctxpar/core/team_size.hpp"

/// 1 when `simd_t` is a vector-extension type and the host micro-kernels take their explicitly
/// vectorised paths; 0 under nvcc, in device passes and in `CTXPAR_PORTABLE_KERNELS` builds.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && !CTXPAR_PORTABLE_KERNELS
#define CTXPAR_HOST_SIMD 1
#else
#define CTXPAR_HOST_SIMD 0
#endif

/// Bytes per vector: the widest registers of the target on hosts with vector extensions, 64 for
/// the plain-array stand-in.
#if CTXPAR_HOST_SIMD && defined(__AVX512F__)
#define CTXPAR_SIMD_BYTES 64
#elif CTXPAR_HOST_SIMD && defined(__AVX__)
#define CTXPAR_SIMD_BYTES 32
#elif CTXPAR_HOST_SIMD
#define CTXPAR_SIMD_BYTES 16
#else
#define CTXPAR_SIMD_BYTES 64
#endif

namespace ctxpar::impl {

#if CTXPAR_HOST_SIMD
/// `T`s in one vector (float and double only).
template <class T>
struct Simd;
/// Floats in one vector.
template <>
struct Simd<float> {
  /// The vector type.
  typedef float type __attribute__((vector_size(CTXPAR_SIMD_BYTES)));
  /// Lanes per vector.
  static constexpr int lanes = CTXPAR_SIMD_BYTES / sizeof(float);
};
/// Doubles in one vector.
template <>
struct Simd<double> {
  /// The vector type.
  typedef double type __attribute__((vector_size(CTXPAR_SIMD_BYTES)));
  /// Lanes per vector.
  static constexpr int lanes = CTXPAR_SIMD_BYTES / sizeof(double);
};
#else
/// `T`s in one vector: a plain array with the vector operators, lane by lane.
template <class T>
struct Simd {
  /// Lanes per vector.
  static constexpr int lanes = CTXPAR_SIMD_BYTES / sizeof(T);
  /// The vector type.
  struct type {
    T v[lanes];
    KOKKOS_INLINE_FUNCTION T& operator[](int i) { return v[i]; }
    KOKKOS_INLINE_FUNCTION T operator[](int i) const { return v[i]; }
#define CTXPAR_SIMD_OP(op)                                                \
  KOKKOS_INLINE_FUNCTION friend type operator op(type a, const type& b) { \
    for (int i = 0; i < lanes; ++i) a.v[i] = a.v[i] op b.v[i];            \
    return a;                                                             \
  }                                                                       \
  KOKKOS_INLINE_FUNCTION friend type operator op(type a, T b) {           \
    for (int i = 0; i < lanes; ++i) a.v[i] = a.v[i] op b;                 \
    return a;                                                             \
  }                                                                       \
  KOKKOS_INLINE_FUNCTION friend type operator op(T a, type b) {           \
    for (int i = 0; i < lanes; ++i) b.v[i] = a op b.v[i];                 \
    return b;                                                             \
  }                                                                       \
  KOKKOS_INLINE_FUNCTION type& operator op##=(const type& b) {            \
    return *this = *this op b;                                            \
  }
    CTXPAR_SIMD_OP(+)
    CTXPAR_SIMD_OP(-)
    CTXPAR_SIMD_OP(*)
#undef CTXPAR_SIMD_OP
  };
};
#endif

/// The vector type of `T`.
template <class T>
using simd_t = typename Simd<T>::type;

/// All lanes zero.
template <class T>
KOKKOS_INLINE_FUNCTION simd_t<T> simd_zero() {
#if CTXPAR_HOST_SIMD
  return simd_t<T>{} * T(0);
#else
  simd_t<T> r;
  for (int i = 0; i < Simd<T>::lanes; ++i) r.v[i] = T(0);
  return r;
#endif
}

/// All lanes `x`.
template <class T>
KOKKOS_INLINE_FUNCTION simd_t<T> simd_broadcast(T x) {
#if CTXPAR_HOST_SIMD
  return simd_t<T>{} + x;
#else
  simd_t<T> r;
  for (int i = 0; i < Simd<T>::lanes; ++i) r.v[i] = x;
  return r;
#endif
}

/// Lane-wise maximum.
template <class T>
KOKKOS_INLINE_FUNCTION simd_t<T> simd_max(simd_t<T> a, simd_t<T> b) {
#if CTXPAR_HOST_SIMD
  return a > b ? a : b;
#else
  for (int i = 0; i < Simd<T>::lanes; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  return a;
#endif
}

/// Lanes where `s == marker` become 0, the others `x`.
template <class T>
KOKKOS_INLINE_FUNCTION simd_t<T> simd_zero_where(simd_t<T> s, T marker, simd_t<T> x) {
#if CTXPAR_HOST_SIMD
  return s == marker ? simd_zero<T>() : x;
#else
  for (int i = 0; i < Simd<T>::lanes; ++i) x.v[i] = s.v[i] == marker ? T(0) : x.v[i];
  return x;
#endif
}

/// Lane `l` holds `l` (exact in every float type): with a broadcast offset, the column index of
/// each lane, for masks that compare lanes with a row or a length.
template <class T>
KOKKOS_INLINE_FUNCTION simd_t<T> simd_lane_index() {
  simd_t<T> r;
#if CTXPAR_HOST_SIMD
  for (int i = 0; i < Simd<T>::lanes; ++i) r[i] = static_cast<T>(i);
#else
  for (int i = 0; i < Simd<T>::lanes; ++i) r.v[i] = static_cast<T>(i);
#endif
  return r;
}

/// The vector at `p` (no alignment needed).
template <class T>
KOKKOS_INLINE_FUNCTION simd_t<T> simd_load(const T* p) {
  simd_t<T> r;
#if CTXPAR_HOST_SIMD
  std::memcpy(&r, p, sizeof(r));
#else
  for (int i = 0; i < Simd<T>::lanes; ++i) r.v[i] = p[i];
#endif
  return r;
}

/// Stores `v` at `p` (no alignment needed).
template <class T>
KOKKOS_INLINE_FUNCTION void simd_store(T* p, const simd_t<T>& v) {
#if CTXPAR_HOST_SIMD
  std::memcpy(p, &v, sizeof(v));
#else
  for (int i = 0; i < Simd<T>::lanes; ++i) p[i] = v.v[i];
#endif
}

#if CTXPAR_HOST_SIMD
/// Lane reductions in registers: the vector is halved (upper half onto lower half) until two lanes
/// are left. Through memory, GCC reloads the stored vector lane by lane (a store-forwarding stall
/// per lane), which cost the forward kernel about a tenth of its time in one reduction per row
/// and key tile.
template <class T, int Bytes>
struct HalvingReduce {
  typedef T vector __attribute__((vector_size(Bytes)));
  typedef T half __attribute__((vector_size(Bytes / 2)));
  KOKKOS_INLINE_FUNCTION static void split(const vector& v, half& lo, half& hi) {
    std::memcpy(&lo, &v, sizeof(half));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(half), sizeof(half));
  }
  KOKKOS_INLINE_FUNCTION static T sum(const vector& v) {
    half lo, hi;
    split(v, lo, hi);
    return HalvingReduce<T, Bytes / 2>::sum(lo + hi);
  }
  KOKKOS_INLINE_FUNCTION static T max(const vector& v) {
    half lo, hi;
    split(v, lo, hi);
    return HalvingReduce<T, Bytes / 2>::max(lo > hi ? lo : hi);
  }
};
template <class T>
struct HalvingReduce<T, 2 * sizeof(T)> {
  typedef T vector __attribute__((vector_size(2 * sizeof(T))));
  KOKKOS_INLINE_FUNCTION static T sum(const vector& v) { return v[0] + v[1]; }
  KOKKOS_INLINE_FUNCTION static T max(const vector& v) { return v[0] > v[1] ? v[0] : v[1]; }
};
#endif

/// Sum of the lanes, in a fixed pairwise order (halves added until one lane is left: lane `i`
/// of each step is lanes `i` and `i + w` of the one before), the same bits on every path.
template <class T>
KOKKOS_INLINE_FUNCTION T simd_sum(const simd_t<T>& v) {
#if CTXPAR_HOST_SIMD
  return HalvingReduce<T, sizeof(simd_t<T>)>::sum(v);
#else
  T x[Simd<T>::lanes];
  simd_store(x, v);
  for (int w = Simd<T>::lanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) x[i] += x[i + w];
  return x[0];
#endif
}

/// Largest lane (exact, so the order does not matter).
template <class T>
KOKKOS_INLINE_FUNCTION T simd_max_lane(const simd_t<T>& v) {
#if CTXPAR_HOST_SIMD
  return HalvingReduce<T, sizeof(simd_t<T>)>::max(v);
#else
  T m = v[0];
  for (int i = 1; i < Simd<T>::lanes; ++i) m = m > v[i] ? m : v[i];
  return m;
#endif
}

}  // namespace ctxpar::impl

/// \file
/// The one short-vector type of the host kernels (`Simd<T, Bytes>`, `simd_t<T, Bytes>` and the
/// helpers that load, store, combine and reduce it), shared by the sliding-window and the chunkwise
/// kernels.
///
/// GCC and clang vector extensions give real SIMD registers. The width is a template parameter:
/// the host kernels are instantiated once per instruction set a binary carries (16, 32 and 64
/// bytes: SSE2, AVX2 and AVX-512 on x86-64) and the run-time dispatch
/// (`core/impl/isa_dispatch.hpp`) compiles each instantiation for its own instruction set; the
/// default, `CTXPAR_SIMD_BYTES`, is the widest the translation unit's flags allow. GCC at -O2 keeps
/// the register tiles of a scalar loop in memory, which is why the host kernels spell the vectors
/// out. nvcc's host pass is not trusted with the extensions and device passes must not see them, so
/// there a plain array stands in with the same interface and the same arithmetic, lane by lane. A
/// `CTXPAR_PORTABLE_KERNELS` build takes the plain array on hosts too: its host spaces run the
/// portable kernels, which do not use this header's fast paths.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstring>
#include <type_traits>
#include <utility>

#include "ctxpar/core/team_size.hpp"

/// 1 when `simd_t` is a vector-extension type and the host micro-kernels take their explicitly
/// vectorised paths; 0 under nvcc, in device passes and in `CTXPAR_PORTABLE_KERNELS` builds.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && !CTXPAR_PORTABLE_KERNELS
#define CTXPAR_HOST_SIMD 1
#else
#define CTXPAR_HOST_SIMD 0
#endif

/// Bytes per vector by default: the widest registers the translation unit's flags allow on hosts
/// with vector extensions, 64 for the plain-array stand-in.
#if CTXPAR_HOST_SIMD && defined(__AVX512F__)
#define CTXPAR_SIMD_BYTES 64
#elif CTXPAR_HOST_SIMD && defined(__AVX__)
#define CTXPAR_SIMD_BYTES 32
#elif CTXPAR_HOST_SIMD
#define CTXPAR_SIMD_BYTES 16
#else
#define CTXPAR_SIMD_BYTES 64
#endif

// A vector wider than the translation unit's flags passes by value only between functions the
// run-time dispatch inlines into one function compiled for a wide enough instruction set
// (`core/impl/isa_dispatch.hpp`), so GCC's note that such a call would change the ABI is noise.
// Headers whose functions take or return vectors by value wrap their code in these.
#if CTXPAR_HOST_SIMD && defined(__GNUC__) && !defined(__clang__)
#define CTXPAR_WIDE_VECTORS_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define CTXPAR_WIDE_VECTORS_END _Pragma("GCC diagnostic pop")
#else
#define CTXPAR_WIDE_VECTORS_BEGIN
#define CTXPAR_WIDE_VECTORS_END
#endif

CTXPAR_WIDE_VECTORS_BEGIN

namespace ctxpar::impl {

#if CTXPAR_HOST_SIMD
/// `T`s in one vector of `Bytes` bytes (float and double only).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
struct Simd {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "ctxpar::impl::Simd: float or double lanes only");
  /// The vector type.
  typedef T type __attribute__((vector_size(Bytes)));
  /// Lanes per vector.
  static constexpr int lanes = Bytes / sizeof(T);
};
#else
/// `T`s in one vector: a plain array with the vector operators, lane by lane.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
struct Simd {
  /// Lanes per vector.
  static constexpr int lanes = Bytes / sizeof(T);
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

/// The vector type of `T`, `Bytes` wide.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
using simd_t = typename Simd<T, Bytes>::type;

/// The lane type of a vector type.
template <class V>
using simd_lane_t = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V&>()[0])>>;

/// Lanes of a vector type.
template <class V>
inline constexpr int simd_lanes = static_cast<int>(sizeof(V) / sizeof(simd_lane_t<V>));

/// All lanes zero.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION simd_t<T, Bytes> simd_zero() {
#if CTXPAR_HOST_SIMD
  return simd_t<T, Bytes>{} * T(0);
#else
  simd_t<T, Bytes> r;
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) r.v[i] = T(0);
  return r;
#endif
}

/// All lanes `x`.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION simd_t<T, Bytes> simd_broadcast(T x) {
#if CTXPAR_HOST_SIMD
  return simd_t<T, Bytes>{} + x;
#else
  simd_t<T, Bytes> r;
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) r.v[i] = x;
  return r;
#endif
}

/// Lane-wise maximum.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION simd_t<T, Bytes> simd_max(simd_t<T, Bytes> a, simd_t<T, Bytes> b) {
#if CTXPAR_HOST_SIMD
  return a > b ? a : b;
#else
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  return a;
#endif
}

/// Lanes where `s == marker` become 0, the others `x`.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION simd_t<T, Bytes> simd_zero_where(simd_t<T, Bytes> s, T marker,
                                                        simd_t<T, Bytes> x) {
#if CTXPAR_HOST_SIMD
  return s == marker ? simd_zero<T, Bytes>() : x;
#else
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) x.v[i] = s.v[i] == marker ? T(0) : x.v[i];
  return x;
#endif
}

/// Lane `l` holds `l` (exact in every float type): with a broadcast offset, the column index of
/// each lane, for masks that compare lanes with a row or a length.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION simd_t<T, Bytes> simd_lane_index() {
  simd_t<T, Bytes> r;
#if CTXPAR_HOST_SIMD
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) r[i] = static_cast<T>(i);
#else
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) r.v[i] = static_cast<T>(i);
#endif
  return r;
}

/// The vector at `p` (no alignment needed).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION simd_t<T, Bytes> simd_load(const T* p) {
  simd_t<T, Bytes> r;
#if CTXPAR_HOST_SIMD
  std::memcpy(&r, p, sizeof(r));
#else
  for (int i = 0; i < Simd<T, Bytes>::lanes; ++i) r.v[i] = p[i];
#endif
  return r;
}

/// Stores `v` at `p` (no alignment needed), any width.
template <class T, class V>
KOKKOS_INLINE_FUNCTION void simd_store(T* p, const V& v) {
  static_assert(std::is_same_v<simd_lane_t<V>, T>, "ctxpar::impl::simd_store: lane type mismatch");
#if CTXPAR_HOST_SIMD
  std::memcpy(p, &v, sizeof(v));
#else
  for (int i = 0; i < simd_lanes<V>; ++i) p[i] = v.v[i];
#endif
}

/// The two lane reductions: `op(a, b)` on two lanes or on two whole half-vectors (GCC's vector
/// extensions compare and add lane-wise).
struct LaneSum {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(const V& a, const V& b) const {
    return a + b;
  }
};
struct LaneMax {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(const V& a, const V& b) const {
    return a > b ? a : b;
  }
};

#if CTXPAR_HOST_SIMD
/// Lane reductions in registers: the vector is halved (`op` of the upper half and the lower half)
/// until two lanes are left. Through memory, GCC reloads the stored vector lane by lane (a
/// store-forwarding stall per lane), which cost the forward kernel about a tenth of its time in
/// one reduction per row and key tile.
template <class T, int Bytes>
struct HalvingReduce {
  typedef T vector __attribute__((vector_size(Bytes)));
  typedef T half __attribute__((vector_size(Bytes / 2)));
  template <class Op>
  KOKKOS_INLINE_FUNCTION static T reduce(const vector& v, const Op& op) {
    half lo, hi;
    std::memcpy(&lo, &v, sizeof(half));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(half), sizeof(half));
    return HalvingReduce<T, Bytes / 2>::reduce(op(lo, hi), op);
  }
};
template <class T>
struct HalvingReduce<T, 2 * sizeof(T)> {
  typedef T vector __attribute__((vector_size(2 * sizeof(T))));
  template <class Op>
  KOKKOS_INLINE_FUNCTION static T reduce(const vector& v, const Op& op) {
    return op(v[0], v[1]);
  }
};
#endif

/// `op` over the lanes in a fixed pairwise order (halves combined until one lane is left: lane `i`
/// of each step is lanes `i` and `i + w` of the one before), the same bits on every path.
template <class T, int Bytes = CTXPAR_SIMD_BYTES, class Op>
KOKKOS_INLINE_FUNCTION T simd_reduce(const simd_t<T, Bytes>& v, const Op& op) {
#if CTXPAR_HOST_SIMD
  return HalvingReduce<T, Bytes>::reduce(v, op);
#else
  T x[Simd<T, Bytes>::lanes];
  simd_store(x, v);
  for (int w = Simd<T, Bytes>::lanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) x[i] = op(x[i], x[i + w]);
  return x[0];
#endif
}

/// Sum of the lanes (pairwise, see `simd_reduce`).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION T simd_sum(const simd_t<T, Bytes>& v) {
  return simd_reduce<T, Bytes>(v, LaneSum{});
}

/// Largest lane (exact, so the order does not matter).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
KOKKOS_INLINE_FUNCTION T simd_max_lane(const simd_t<T, Bytes>& v) {
  return simd_reduce<T, Bytes>(v, LaneMax{});
}

}  // namespace ctxpar::impl

CTXPAR_WIDE_VECTORS_END

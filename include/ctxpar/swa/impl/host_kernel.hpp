/// \file
/// Host micro-kernels of the sliding-window attention kernels: a short SIMD vector type and
/// register-blocked tile products on packed tiles, for the host execution spaces only (selected by
/// `uses_host_kernels`). The portable kernels leave their register tiles to the compiler, which
/// keeps them in memory; these spell the vectors out so the accumulators stay in registers. Every
/// element is still accumulated in a fixed order that depends only on its own row and the
/// (globally anchored) key tile, which keeps the forward outputs independent of the rank count.
#pragma once

#include <Kokkos_Core.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ctxpar/core/team_size.hpp"
#include "ctxpar/swa/impl/tiles.hpp"

namespace ctxpar::swa::impl {

/// True for execution spaces that take the SIMD kernels of this header: host spaces, unless the
/// build runs the portable kernels everywhere (`CTXPAR_PORTABLE_KERNELS`).
template <class ExecutionSpace>
inline constexpr bool uses_host_kernels = ctxpar::impl::uses_host_fast_path_v<ExecutionSpace>;

/// Keys per packed tile (the same grid as the portable kernels' `key_tile`).
inline constexpr int host_key_tile = 32;

// GCC and clang vector extensions give real SIMD registers, as wide as the target's widest (so
// that no vector crosses a function boundary in a narrower ABI). nvcc's host pass is not trusted
// with them, so there a plain array stands in with the same interface and the same arithmetic.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#if defined(__AVX512F__)
#define CTXPAR_SWA_SIMD_BYTES 64
#elif defined(__AVX__)
#define CTXPAR_SWA_SIMD_BYTES 32
#else
#define CTXPAR_SWA_SIMD_BYTES 16
#endif
template <class T>
struct Simd;
/// Floats in one vector.
template <>
struct Simd<float> {
  /// The vector type.
  typedef float type __attribute__((vector_size(CTXPAR_SWA_SIMD_BYTES)));
  /// Lanes per vector.
  static constexpr int lanes = CTXPAR_SWA_SIMD_BYTES / sizeof(float);
};
/// Doubles in one vector.
template <>
struct Simd<double> {
  /// The vector type.
  typedef double type __attribute__((vector_size(CTXPAR_SWA_SIMD_BYTES)));
  /// Lanes per vector.
  static constexpr int lanes = CTXPAR_SWA_SIMD_BYTES / sizeof(double);
};
template <class T>
using simd_t = typename Simd<T>::type;
template <class T>
inline simd_t<T> simd_zero() {
  return simd_t<T>{} * T(0);
}
template <class T>
inline simd_t<T> simd_broadcast(T x) {
  return simd_t<T>{} + x;
}
template <class T>
inline simd_t<T> simd_max(simd_t<T> a, simd_t<T> b) {
  return a > b ? a : b;
}
/// Lanes where `s == marker` become 0, the others `x`.
template <class T>
inline simd_t<T> simd_zero_where(simd_t<T> s, T marker, simd_t<T> x) {
  return s == marker ? simd_zero<T>() : x;
}
#else
template <class T>
struct Simd {
  static constexpr int lanes = 64 / sizeof(T);
  struct type {
    T v[lanes];
    T& operator[](int i) { return v[i]; }
    T operator[](int i) const { return v[i]; }
#define CTXPAR_SWA_SIMD_OP(op)                                 \
  friend type operator op(type a, const type& b) {             \
    for (int i = 0; i < lanes; ++i) a.v[i] = a.v[i] op b.v[i]; \
    return a;                                                  \
  }                                                            \
  friend type operator op(type a, T b) {                       \
    for (int i = 0; i < lanes; ++i) a.v[i] = a.v[i] op b;      \
    return a;                                                  \
  }                                                            \
  friend type operator op(T a, type b) {                       \
    for (int i = 0; i < lanes; ++i) b.v[i] = a op b.v[i];      \
    return b;                                                  \
  }                                                            \
  type& operator op##=(const type& b) {                        \
    return *this = *this op b;                                 \
  }
    CTXPAR_SWA_SIMD_OP(+)
    CTXPAR_SWA_SIMD_OP(-)
    CTXPAR_SWA_SIMD_OP(*)
#undef CTXPAR_SWA_SIMD_OP
  };
};
template <class T>
using simd_t = typename Simd<T>::type;
template <class T>
inline simd_t<T> simd_zero() {
  simd_t<T> r;
  for (int i = 0; i < Simd<T>::lanes; ++i) r.v[i] = T(0);
  return r;
}
template <class T>
inline simd_t<T> simd_broadcast(T x) {
  simd_t<T> r;
  for (int i = 0; i < Simd<T>::lanes; ++i) r.v[i] = x;
  return r;
}
template <class T>
inline simd_t<T> simd_max(simd_t<T> a, simd_t<T> b) {
  for (int i = 0; i < Simd<T>::lanes; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
  return a;
}
template <class T>
inline simd_t<T> simd_zero_where(simd_t<T> s, T marker, simd_t<T> x) {
  for (int i = 0; i < Simd<T>::lanes; ++i) x.v[i] = s.v[i] == marker ? T(0) : x.v[i];
  return x;
}
#endif

template <class T>
inline simd_t<T> simd_load(const T* p) {
  simd_t<T> r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}
template <class T>
inline void simd_store(T* p, const simd_t<T>& v) {
  std::memcpy(p, &v, sizeof(v));
}

/// Sum of the lanes, in a fixed pairwise order (halves added until one lane is left).
template <class T>
inline T simd_sum(const simd_t<T>& v) {
  T x[Simd<T>::lanes];
  simd_store(x, v);
  for (int w = Simd<T>::lanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) x[i] += x[i + w];
  return x[0];
}
/// Largest lane (exact, so the order does not matter).
template <class T>
inline T simd_max_lane(const simd_t<T>& v) {
  T x[Simd<T>::lanes];
  simd_store(x, v);
  T m = x[0];
  for (int i = 1; i < Simd<T>::lanes; ++i) m = m > x[i] ? m : x[i];
  return m;
}

/// The float `softmax_exp` of tiles.hpp (same range reduction and polynomial) on every lane.
inline simd_t<float> simd_exp(simd_t<float> x) {
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  // Branch-free on whole vectors: a per-lane loop with the clamps as branches stays scalar.
  typedef std::int32_t ints __attribute__((vector_size(CTXPAR_SWA_SIMD_BYTES)));
  using floats = simd_t<float>;
  const floats lo = simd_broadcast(-87.0f), hi = simd_broadcast(88.0f);
  floats xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const floats scaled = xc * 1.44269504088896341f;
  const floats half = scaled >= simd_zero<float>() ? simd_broadcast(0.5f) : simd_broadcast(-0.5f);
  const ints n = __builtin_convertvector(scaled + half, ints);
  const floats nf = __builtin_convertvector(n, floats);
  const floats r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  floats p = simd_broadcast(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const ints bits = (n + 127) << 23;
  floats two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return x < lo ? simd_zero<float>() : p * two_n;
#else
  float xs[Simd<float>::lanes];
  simd_store(xs, x);
  for (int i = 0; i < Simd<float>::lanes; ++i) xs[i] = softmax_exp(xs[i]);
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

/// Vectors per key tile row.
template <class T>
inline constexpr int tile_vectors = host_key_tile / Simd<T>::lanes;
/// Query rows whose scores against one key tile stay in registers together (16 accumulators
/// where the vectors are wide enough; at least 4 rows, the blocking of the value products).
template <class T>
inline constexpr int score_rows = 16 / tile_vectors<T> > 4 ? 16 / tile_vectors<T> : 4;

/// `s[r] = sum_d a[r][d] * bt[d][:]` for `Rows` rows of `a` (row stride `lda`, `dim` columns) and
/// the packed transposed tile `bt[dim][host_key_tile]`; each score sums `d` in increasing order.
template <int Rows, class T>
inline void host_scores(const T* a, int lda, const T* bt, int dim,
                        simd_t<T> (&s)[Rows][tile_vectors<T>]) {
  constexpr int nv = tile_vectors<T>;
  constexpr int lanes = Simd<T>::lanes;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < nv; ++c) s[r][c] = simd_zero<T>();
  for (int d = 0; d < dim; ++d) {
    simd_t<T> b[nv];
    for (int c = 0; c < nv; ++c) b[c] = simd_load(bt + d * host_key_tile + c * lanes);
    for (int r = 0; r < Rows; ++r) {
      const T x = a[r * lda + d];
      for (int c = 0; c < nv; ++c) s[r][c] += x * b[c];
    }
  }
}

/// `acc[i][c0 .. c0 + Cols*lanes) += sum_k w[i*wi + k*wk] * b[k][same columns]` for `Rows` output
/// rows and `keys` terms, each element summed in increasing `k`.
template <int Rows, int Cols, class T>
inline void host_accumulate(const T* w, int wi, int wk, int keys, const T* b, int ldb, T* acc,
                            int lda) {
  constexpr int lanes = Simd<T>::lanes;
  simd_t<T> o[Rows][Cols];
  for (int i = 0; i < Rows; ++i)
    for (int c = 0; c < Cols; ++c) o[i][c] = simd_load(acc + i * lda + c * lanes);
  for (int k = 0; k < keys; ++k) {
    simd_t<T> bk[Cols];
    for (int c = 0; c < Cols; ++c) bk[c] = simd_load(b + k * ldb + c * lanes);
    for (int i = 0; i < Rows; ++i) {
      const T x = w[i * wi + k * wk];
      for (int c = 0; c < Cols; ++c) o[i][c] += x * bk[c];
    }
  }
  for (int i = 0; i < Rows; ++i)
    for (int c = 0; c < Cols; ++c) simd_store(acc + i * lda + c * lanes, o[i][c]);
}

/// `host_accumulate` over `Rows` output rows and all `dim` (a multiple of the lanes) columns.
template <int Rows, class T>
inline void host_accumulate_rows(const T* w, int wi, int wk, int keys, const T* b, int ldb, T* acc,
                                 int lda, int dim) {
  constexpr int lanes = Simd<T>::lanes;
  constexpr int wide = 4;
  int c0 = 0;
  for (; c0 + wide * lanes <= dim; c0 += wide * lanes)
    host_accumulate<Rows, wide>(w, wi, wk, keys, b + c0, ldb, acc + c0, lda);
  for (; c0 < dim; c0 += lanes)
    host_accumulate<Rows, 1>(w, wi, wk, keys, b + c0, ldb, acc + c0, lda);
}

/// Head dimension rounded up to whole vectors (the packed tiles and scratch rows are zero-padded).
template <class T>
inline int padded_dim(int dim) {
  return (dim + Simd<T>::lanes - 1) / Simd<T>::lanes * Simd<T>::lanes;
}

}  // namespace ctxpar::swa::impl

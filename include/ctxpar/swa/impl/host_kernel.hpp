/// \file
/// Host micro-kernels of the sliding-window attention kernels, for the host execution spaces only
/// (selected by `uses_host_kernels`): the packed key tile grid, the softmax exponential on whole
/// vectors and the score products, built on the kernel toolbox (`core/impl/simd.hpp`,
/// `core/impl/tile_product.hpp`). The portable kernels leave their register tiles to the compiler,
/// which keeps them in memory; these spell the vectors out so the accumulators stay in registers.
/// Every element is still accumulated in a fixed order that depends only on its own row and the
/// (globally anchored) key tile, which keeps the forward outputs independent of the rank count.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ctxpar/core/impl/simd.hpp"
#include "ctxpar/core/impl/tile_product.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"

namespace ctxpar::swa::impl {

/// True for execution spaces that take the SIMD kernels of this header: host spaces, unless the
/// build runs the portable kernels everywhere (`CTXPAR_PORTABLE_KERNELS`).
template <class ExecutionSpace>
inline constexpr bool uses_host_kernels = ctxpar::impl::uses_host_fast_path_v<ExecutionSpace>;

/// Keys per packed tile (the same grid as the portable kernels' `key_tile`).
inline constexpr int host_key_tile = 32;

using ctxpar::impl::Simd;
using ctxpar::impl::simd_broadcast;
using ctxpar::impl::simd_load;
using ctxpar::impl::simd_max;
using ctxpar::impl::simd_max_lane;
using ctxpar::impl::simd_rows_accumulate;
using ctxpar::impl::simd_store;
using ctxpar::impl::simd_sum;
using ctxpar::impl::simd_t;
using ctxpar::impl::simd_zero;
using ctxpar::impl::simd_zero_where;

/// The float `softmax_exp` of kernel_math.hpp (same range reduction and polynomial) on every lane.
inline simd_t<float> simd_exp(simd_t<float> x) {
#if CTXPAR_HOST_SIMD
  // Branch-free on whole vectors: a per-lane loop with the clamps as branches stays scalar.
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
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < tile_vectors<T>; ++c) s[r][c] = simd_zero<T>();
  ctxpar::impl::simd_tile_accumulate<Rows, tile_vectors<T>>(a, lda, 1, 0, dim, bt, host_key_tile,
                                                            s);
}

/// Head dimension rounded up to whole vectors (the packed tiles and scratch rows are zero-padded).
template <class T>
inline int padded_dim(int dim) {
  return (dim + Simd<T>::lanes - 1) / Simd<T>::lanes * Simd<T>::lanes;
}

}  // namespace ctxpar::swa::impl

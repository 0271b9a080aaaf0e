/// \file
/// Register-blocked micro-kernels of the sliding-window attention kernels: small dense products on
/// scratch tiles with compile-time extents, written so that the compiler vectorises the innermost
/// loop and keeps the accumulators in registers. Every element is accumulated in a fixed order
/// that depends only on its own row and the key tile, never on which slot of a block it occupies,
/// which is what makes the outputs independent of how queries are split across ranks.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/core/compat.hpp"

namespace ctxpar::swa::impl {

/// Rows processed together in registers.
inline constexpr int block_rows = 4;
/// Columns of the head dimension processed together in registers.
inline constexpr int block_cols = 32;

/// `c[r][j] = sum_d a[r][d] * bt[d][j]` for `block_rows` rows of `a` (row stride `dim`) and the
/// `Cols` columns of the transposed tile `bt` (row stride `Cols`).
template <int Cols, class T>
KOKKOS_INLINE_FUNCTION void rows_times_tile(const T* a, const T* bt, int dim, T (&c)[block_rows][Cols]) {
  for (int r = 0; r < block_rows; ++r)
    for (int j = 0; j < Cols; ++j) c[r][j] = T(0);
  for (int d = 0; d < dim; ++d) {
    const T* b = bt + d * Cols;
    for (int r = 0; r < block_rows; ++r) {
      const T x = a[r * dim + d];
      for (int j = 0; j < Cols; ++j) c[r][j] += x * b[j];
    }
  }
}

/// `acc[r][:] += sum_j p[r][j] * b[j][:]` for `block_rows` rows: `p` has row stride `Keys`, `b` is
/// `[Keys, dim]` and `acc` has row stride `dim`. Each accumulator sums its terms in key order.
template <int Keys, class T>
KOKKOS_INLINE_FUNCTION void accumulate_rows(const T* p, const T* b, int dim, T* acc) {
  int d0 = 0;
  for (; d0 + block_cols <= dim; d0 += block_cols) {
    T o[block_rows][block_cols];
    for (int r = 0; r < block_rows; ++r)
      for (int c = 0; c < block_cols; ++c) o[r][c] = acc[r * dim + d0 + c];
    for (int j = 0; j < Keys; ++j) {
      const T* bj = b + j * dim + d0;
      for (int r = 0; r < block_rows; ++r) {
        const T w = p[r * Keys + j];
        for (int c = 0; c < block_cols; ++c) o[r][c] += w * bj[c];
      }
    }
    for (int r = 0; r < block_rows; ++r)
      for (int c = 0; c < block_cols; ++c) acc[r * dim + d0 + c] = o[r][c];
  }
  for (int r = 0; r < block_rows; ++r)
    for (int d = d0; d < dim; ++d) {
      T o = acc[r * dim + d];
      for (int j = 0; j < Keys; ++j) o += p[r * Keys + j] * b[j * dim + d];
      acc[r * dim + d] = o;
    }
}

/// `acc[j][:] += sum_r p[r][j] * a[r][:]` for `block_rows` consecutive key rows `j0..` of `acc`
/// (the transposed product used by dK and dV): `p` has row stride `Keys`, `a` is `[Rows, dim]`.
template <int Rows, int Keys, class T>
KOKKOS_INLINE_FUNCTION void accumulate_columns(const T* p, const T* a, int dim, int j0, T* acc) {
  int d0 = 0;
  for (; d0 + block_cols <= dim; d0 += block_cols) {
    T o[block_rows][block_cols];
    for (int j = 0; j < block_rows; ++j)
      for (int c = 0; c < block_cols; ++c) o[j][c] = acc[(j0 + j) * dim + d0 + c];
    for (int r = 0; r < Rows; ++r) {
      const T* ar = a + r * dim + d0;
      for (int j = 0; j < block_rows; ++j) {
        const T w = p[r * Keys + j0 + j];
        for (int c = 0; c < block_cols; ++c) o[j][c] += w * ar[c];
      }
    }
    for (int j = 0; j < block_rows; ++j)
      for (int c = 0; c < block_cols; ++c) acc[(j0 + j) * dim + d0 + c] = o[j][c];
  }
  for (int j = 0; j < block_rows; ++j)
    for (int d = d0; d < dim; ++d) {
      T o = acc[(j0 + j) * dim + d];
      for (int r = 0; r < Rows; ++r) o += p[r * Keys + j0 + j] * a[r * dim + d];
      acc[(j0 + j) * dim + d] = o;
    }
}

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
KOKKOS_INLINE_FUNCTION double softmax_exp(double x) { return compat::exp(x); }

/// First index in the strictly increasing `pos[0, n)` whose value is at least `value`.
template <class PosView>
KOKKOS_INLINE_FUNCTION std::int64_t lower_bound(const PosView& pos, std::int64_t n, std::int64_t value) {
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
KOKKOS_INLINE_FUNCTION std::int64_t upper_bound(const PosView& pos, std::int64_t n, std::int64_t value) {
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

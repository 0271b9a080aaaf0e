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
KOKKOS_INLINE_FUNCTION void rows_times_tile(const T* a, const T* bt, int dim,
                                            T (&c)[block_rows][Cols]) {
  for (int r = 0; r < block_rows; ++r)
    for (int j = 0; j < Cols; ++j) c[r][j] = T(0);
  // Four terms per load and store of an accumulator, added one after the other: the same
  // rounding sequence as one term at a time, at a quarter of the memory traffic.
  int d = 0;
  for (; d + 8 <= dim; d += 8) {
    const T* b = bt + d * Cols;
    for (int r = 0; r < block_rows; ++r) {
      const T* x = a + r * dim + d;
      for (int j = 0; j < Cols; ++j) {
        T s = c[r][j];
        s += x[0] * b[j];
        s += x[1] * b[Cols + j];
        s += x[2] * b[2 * Cols + j];
        s += x[3] * b[3 * Cols + j];
        s += x[4] * b[4 * Cols + j];
        s += x[5] * b[5 * Cols + j];
        s += x[6] * b[6 * Cols + j];
        s += x[7] * b[7 * Cols + j];
        c[r][j] = s;
      }
    }
  }
  for (; d < dim; ++d) {
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
    static_assert(Keys % 8 == 0, "ctxpar::swa: key tiles are a multiple of 8");
    for (int j = 0; j < Keys; j += 8) {
      const T* bj = b + j * dim + d0;
      for (int r = 0; r < block_rows; ++r) {
        const T* w = p + r * Keys + j;
        for (int c = 0; c < block_cols; ++c) {
          T s = o[r][c];
          s += w[0] * bj[c];
          s += w[1] * bj[dim + c];
          s += w[2] * bj[2 * dim + c];
          s += w[3] * bj[3 * dim + c];
          s += w[4] * bj[4 * dim + c];
          s += w[5] * bj[5 * dim + c];
          s += w[6] * bj[6 * dim + c];
          s += w[7] * bj[7 * dim + c];
          o[r][c] = s;
        }
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
    static_assert(Rows % 4 == 0, "ctxpar::swa: query tiles are a multiple of 4");
    for (int r = 0; r < Rows; r += 4) {
      const T* a0 = a + r * dim + d0;
      const T* a1 = a0 + dim;
      const T* a2 = a1 + dim;
      const T* a3 = a2 + dim;
      for (int j = 0; j < block_rows; ++j) {
        const T w0 = p[r * Keys + j0 + j], w1 = p[(r + 1) * Keys + j0 + j],
                w2 = p[(r + 2) * Keys + j0 + j], w3 = p[(r + 3) * Keys + j0 + j];
        for (int c = 0; c < block_cols; ++c) {
          T s = o[j][c];
          s += w0 * a0[c];
          s += w1 * a1[c];
          s += w2 * a2[c];
          s += w3 * a3[c];
          o[j][c] = s;
        }
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

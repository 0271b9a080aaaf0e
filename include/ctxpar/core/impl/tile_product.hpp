/// \file
/// The one small dense matrix product of the team kernels: `C (+)= alpha·op(A)·B` on raw pointers
/// with strides (a transpose of `A` is a swap of its strides, an optional triangular band skips
/// its known zeros), spread over a team by `MR×NR` register tiles. On hosts with vector extensions
/// (`CTXPAR_HOST_SIMD`) a tile is an explicitly vectorised micro-kernel, which the sliding-window
/// host kernels also call directly on their packed tiles; elsewhere (device passes, nvcc,
/// `CTXPAR_PORTABLE_KERNELS` builds) a scalar tile the compiler unrolls. Every element of `C` sums
/// its inner index in increasing order whichever path runs.
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/core/impl/simd.hpp"

// Unrolling hint for the fixed-size tile loops (nvcc's host pass gets none: its front end
// rejects the GCC spelling).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || \
    (defined(__clang__) && !defined(__NVCC__))
#define CTXPAR_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && !defined(__NVCC__)
#define CTXPAR_UNROLL _Pragma("GCC unroll 16")
#else
#define CTXPAR_UNROLL
#endif

// Pins a vector to a register at this point. GCC otherwise folds a row of `B` into each FMA as a
// memory operand, reloading it once per row of `A`: on cores that load one 512-bit vector per
// cycle (AMD Zen 4) that makes the micro-kernels load-bound instead of FMA-bound.
#if CTXPAR_HOST_SIMD && (defined(__x86_64__) || defined(__i386__))
#define CTXPAR_KEEP_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define CTXPAR_KEEP_IN_REGISTER(v) ((void)0)
#endif

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::impl {

/// Where the left operand `A(i, p)` can be nonzero: everywhere, only for `p <= i` (lower
/// triangular) or only for `p >= i` (upper). Used to skip the known-zero part of the inner range;
/// the operand must still hold zeros in the skipped triangle inside a tile.
enum class Band { full, lower, upper };

/// A left operand: `A(i, p) = ptr[i * row_stride + p * col_stride]` (a transpose is a swap of
/// strides).
template <class T>
struct Left {
  const T* ptr;
  int row_stride;
  int col_stride;
  Band band;
};

/// Row-major left operand.
template <class T>
KOKKOS_INLINE_FUNCTION Left<T> rows(const T* p, int ld, Band band = Band::full) {
  return {p, ld, 1, band};
}

/// Transposed view of a row-major matrix with leading dimension `ld` as the left operand.
template <class T>
KOKKOS_INLINE_FUNCTION Left<T> transposed(const T* p, int ld, Band band = Band::full) {
  return {p, 1, ld, band};
}

/// Register micro-kernel: `acc[r][c] += sum_{p0 <= p < p1} a[r·rs + p·cs] · b[p·ldb + c·lanes ..]`
/// for `Rows` rows and `Cols` vectors of columns, each element summed in increasing `p` onto what
/// `acc` holds. Callers zero `acc` for a plain product or load `C` into it to accumulate in place.
/// `PinB` keeps each row of `B` in registers (`CTXPAR_KEEP_IN_REGISTER`): the wide blocks of
/// `simd_block_accumulate` take it (GCC reloaded their four vectors once per row of `A`); the
/// two-vector tiles of the chunkwise kernels are left as the compiler schedules them.
template <int Rows, int Cols, bool PinB = false, class T, class V>
KOKKOS_INLINE_FUNCTION void simd_tile_accumulate(const T* a, long rs, long cs, int p0, int p1,
                                                 const T* b, long ldb, V (&acc)[Rows][Cols]) {
  constexpr int lanes = simd_lanes<V>, bytes = static_cast<int>(sizeof(V));
  for (int p = p0; p < p1; ++p) {
    V bp[Cols];
    for (int c = 0; c < Cols; ++c) {
      bp[c] = simd_load<T, bytes>(b + p * ldb + c * lanes);
      if constexpr (PinB) CTXPAR_KEEP_IN_REGISTER(bp[c]);
    }
    CTXPAR_UNROLL
    for (int r = 0; r < Rows; ++r) {
      const T x = a[r * rs + p * cs];
      for (int c = 0; c < Cols; ++c) acc[r][c] += x * bp[c];
    }
  }
}

/// `C[Rows][Cols·lanes] += A·B` in place: `A(r, p) = a[r·rs + p·cs]` for `p < k`, `B` row-major
/// with `ldb`, `C` row-major with `ldc`; each element adds its `k` terms to its old value one by
/// one in increasing `p`.
template <int Rows, int Cols, int Bytes = CTXPAR_SIMD_BYTES, class T>
KOKKOS_INLINE_FUNCTION void simd_block_accumulate(const T* a, long rs, long cs, int k, const T* b,
                                                  long ldb, T* c, long ldc) {
  constexpr int lanes = Simd<T, Bytes>::lanes;
  simd_t<T, Bytes> o[Rows][Cols];
  for (int i = 0; i < Rows; ++i)
    for (int v = 0; v < Cols; ++v) o[i][v] = simd_load<T, Bytes>(c + i * ldc + v * lanes);
  simd_tile_accumulate<Rows, Cols, (Cols > 2)>(a, rs, cs, 0, k, b, ldb, o);
  for (int i = 0; i < Rows; ++i)
    for (int v = 0; v < Cols; ++v) simd_store(c + i * ldc + v * lanes, o[i][v]);
}

/// `simd_block_accumulate` over all `n` (a multiple of the lanes) columns: blocks of 4 vectors,
/// then single vectors.
template <int Rows, int Bytes = CTXPAR_SIMD_BYTES, class T>
KOKKOS_INLINE_FUNCTION void simd_rows_accumulate(const T* a, long rs, long cs, int k, const T* b,
                                                 long ldb, T* c, long ldc, int n) {
  constexpr int lanes = Simd<T, Bytes>::lanes;
  constexpr int wide = 4;
  int c0 = 0;
  for (; c0 + wide * lanes <= n; c0 += wide * lanes)
    simd_block_accumulate<Rows, wide, Bytes>(a, rs, cs, k, b + c0, ldb, c + c0, ldc);
  for (; c0 < n; c0 += lanes)
    simd_block_accumulate<Rows, 1, Bytes>(a, rs, cs, k, b + c0, ldb, c + c0, ldc);
}

/// The register tile of a scalar type at a vector width: `MR` rows × `NR` columns of `C`. On hosts
/// with vector extensions `NR` is two vector registers, so 4 rows need 8 accumulators (SSE/AVX
/// have 16 registers) and 8 rows 16 (AVX-512 has 32).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
struct TileShape {
#if CTXPAR_HOST_SIMD
  static constexpr int mr = Bytes == 64 ? 8 : 4;
  static constexpr int nr = 2 * Simd<T, Bytes>::lanes;
#else
  static constexpr int mr = 4;
  static constexpr int nr = sizeof(T) == 4 ? 8 : 4;
#endif
};

/// One full `MR×NR` tile at `(i0, j0)` of `C (+)= alpha·A·B` over the inner range `[p0, p1)`.
template <int MR, int NR, int Bytes = CTXPAR_SIMD_BYTES, class T>
KOKKOS_INLINE_FUNCTION void register_tile(int i0, int j0, int p0, int p1, T alpha, Left<T> a,
                                          const T* b, int ldb, T* c, int ldc, bool accumulate) {
#if CTXPAR_HOST_SIMD
  if constexpr (NR == 2 * Simd<T, Bytes>::lanes) {
    using simd = simd_t<T, Bytes>;
    constexpr int lanes = Simd<T, Bytes>::lanes;
    simd acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = simd{};
    simd_tile_accumulate<MR, 2>(a.ptr + static_cast<long>(i0) * a.row_stride, a.row_stride,
                                a.col_stride, p0, p1, b + j0, ldb, acc);
    // Written out for the two vectors, one branch per row: this shape decides whether GCC
    // contracts `alpha·acc + C` into FMAs under -march=native, so it is kept as it was.
    CTXPAR_UNROLL
    for (int r = 0; r < MR; ++r) {
      T* crow = c + static_cast<long>(i0 + r) * ldc + j0;
      simd c0 = alpha * acc[r][0], c1 = alpha * acc[r][1];
      if (accumulate) {
        const simd o0 = simd_load<T, Bytes>(crow), o1 = simd_load<T, Bytes>(crow + lanes);
        c0 += o0;
        c1 += o1;
      }
      simd_store(crow, c0);
      simd_store(crow + lanes, c1);
    }
    return;
  }
#endif
  T acc[MR][NR];
  CTXPAR_UNROLL
  for (int r = 0; r < MR; ++r) {
    CTXPAR_UNROLL
    for (int s = 0; s < NR; ++s) acc[r][s] = T(0);
  }
  for (int p = p0; p < p1; ++p) {
    const T* brow = b + static_cast<long>(p) * ldb + j0;
    T bv[NR];
    CTXPAR_UNROLL
    for (int s = 0; s < NR; ++s) bv[s] = brow[s];
    CTXPAR_UNROLL
    for (int r = 0; r < MR; ++r) {
      const T av =
          a.ptr[static_cast<long>(i0 + r) * a.row_stride + static_cast<long>(p) * a.col_stride];
      CTXPAR_UNROLL
      for (int s = 0; s < NR; ++s) acc[r][s] += av * bv[s];
    }
  }
  CTXPAR_UNROLL
  for (int r = 0; r < MR; ++r) {
    T* crow = c + static_cast<long>(i0 + r) * ldc + j0;
    CTXPAR_UNROLL
    for (int s = 0; s < NR; ++s)
      crow[s] = accumulate ? crow[s] + alpha * acc[r][s] : alpha * acc[r][s];
  }
}

/// `C = alpha·A·B` (or `C += alpha·A·B` when `accumulate`), `A` m×k, `B` k×n row-major with
/// leading dimension `ldb`, `C` m×n row-major with `ldc`, in `MR×NR` tiles. With `lower_output`,
/// tiles strictly above the diagonal of `C` are skipped (left untouched). Work is spread over the
/// team's threads by tile; the caller fences with a team barrier.
template <int MR, int NR, int Bytes = CTXPAR_SIMD_BYTES, class T, class Member>
KOKKOS_INLINE_FUNCTION void team_tile_product(const Member& team, int m, int n, int k, T alpha,
                                              Left<T> a, const T* b, int ldb, T* c, int ldc,
                                              bool accumulate, bool lower_output = false) {
  const int tiles_m = (m + MR - 1) / MR;
  const int tiles_n = (n + NR - 1) / NR;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tiles_m * tiles_n), [&](int tile) {
    const int i0 = (tile / tiles_n) * MR;
    const int j0 = (tile % tiles_n) * NR;
    const int mr = m - i0 < MR ? m - i0 : MR;
    const int nr = n - j0 < NR ? n - j0 : NR;
    if (lower_output && j0 > i0 + mr - 1) return;
    int p0 = 0, p1 = k;
    if (a.band == Band::lower) p1 = i0 + mr < k ? i0 + mr : k;
    if (a.band == Band::upper) p0 = i0;
    if (mr == MR && nr == NR) {
      register_tile<MR, NR, Bytes>(i0, j0, p0, p1, alpha, a, b, ldb, c, ldc, accumulate);
    } else {
      for (int r = 0; r < mr; ++r) {
        for (int s = 0; s < nr; ++s) {
          T acc = T(0);
          for (int p = p0; p < p1; ++p)
            acc += a.ptr[static_cast<long>(i0 + r) * a.row_stride +
                         static_cast<long>(p) * a.col_stride] *
                   b[static_cast<long>(p) * ldb + j0 + s];
          T& out = c[static_cast<long>(i0 + r) * ldc + j0 + s];
          out = accumulate ? out + alpha * acc : alpha * acc;
        }
      }
    }
  });
}

/// `team_tile_product` with the tile shape of `T` at the vector width `Bytes`.
template <int Bytes = CTXPAR_SIMD_BYTES, class T, class Member>
KOKKOS_INLINE_FUNCTION void team_gemm(const Member& team, int m, int n, int k, T alpha, Left<T> a,
                                      const T* b, int ldb, T* c, int ldc, bool accumulate,
                                      bool lower_output = false) {
  team_tile_product<TileShape<T, Bytes>::mr, TileShape<T, Bytes>::nr, Bytes>(
      team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate, lower_output);
}

}  // namespace ctxpar::impl
CTXPAR_WIDE_VECTORS_END

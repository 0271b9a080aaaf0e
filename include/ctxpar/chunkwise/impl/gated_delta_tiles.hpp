/// \file
/// Team-level small dense matrix products for the gated delta chunk kernels: register-tiled
/// micro-kernels over raw row-major pointers, so the compiler keeps an `MR×NR` accumulator in
/// registers and vectorises along the contiguous columns of `B` and `C`.
#pragma once

#include <Kokkos_Core.hpp>

namespace ctxpar::impl::gated_delta {

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__clang__)
#define CTXPAR_GD_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define CTXPAR_GD_UNROLL _Pragma("GCC unroll 16")
#else
#define CTXPAR_GD_UNROLL
#endif

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

/// `C = alpha·A·B` (or `C += alpha·A·B` when `accumulate`), `A` m×k, `B` k×n row-major with
/// leading dimension `ldb`, `C` m×n row-major with `ldc`. With `lower_output`, tiles strictly
/// above the diagonal of `C` are skipped (left untouched). Work is spread over the team's threads
/// by tile; the caller fences with a team barrier.
template <int MR, int NR, class T, class Member>
KOKKOS_INLINE_FUNCTION void gemm(const Member& team, int m, int n, int k, T alpha, Left<T> a,
                                 const T* b, int ldb, T* c, int ldc, bool accumulate,
                                 bool lower_output = false) {
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
      T acc[MR][NR];
      CTXPAR_GD_UNROLL
      for (int r = 0; r < MR; ++r) {
        CTXPAR_GD_UNROLL
        for (int s = 0; s < NR; ++s) acc[r][s] = T(0);
      }
      for (int p = p0; p < p1; ++p) {
        const T* brow = b + static_cast<long>(p) * ldb + j0;
        T bv[NR];
        CTXPAR_GD_UNROLL
        for (int s = 0; s < NR; ++s) bv[s] = brow[s];
        CTXPAR_GD_UNROLL
        for (int r = 0; r < MR; ++r) {
          const T av =
              a.ptr[static_cast<long>(i0 + r) * a.row_stride + static_cast<long>(p) * a.col_stride];
          CTXPAR_GD_UNROLL
          for (int s = 0; s < NR; ++s) acc[r][s] += av * bv[s];
        }
      }
      CTXPAR_GD_UNROLL
      for (int r = 0; r < MR; ++r) {
        T* crow = c + static_cast<long>(i0 + r) * ldc + j0;
        CTXPAR_GD_UNROLL
        for (int s = 0; s < NR; ++s)
          crow[s] = accumulate ? crow[s] + alpha * acc[r][s] : alpha * acc[r][s];
      }
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

/// The tile shape used for a scalar type: 4×8 accumulators fit the 16 SSE/NEON registers for
/// `float`; `double` halves the columns.
template <class T>
struct TileShape {
  static constexpr int mr = 4;
  static constexpr int nr = sizeof(T) == 4 ? 8 : 4;
};

/// `gemm` with the default tile shape of `T`.
template <class T, class Member>
KOKKOS_INLINE_FUNCTION void team_gemm(const Member& team, int m, int n, int k, T alpha, Left<T> a,
                                      const T* b, int ldb, T* c, int ldc, bool accumulate,
                                      bool lower_output = false) {
  gemm<TileShape<T>::mr, TileShape<T>::nr>(team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate,
                                           lower_output);
}

}  // namespace ctxpar::impl::gated_delta

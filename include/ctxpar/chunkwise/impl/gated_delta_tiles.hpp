/// \file
/// Team-level small dense matrix products for the gated delta chunk kernels: register-tiled
/// micro-kernels over raw row-major pointers, so the compiler keeps an `MR×NR` accumulator in
/// registers and vectorises along the contiguous columns of `B` and `C`.
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/core/team_size.hpp"

namespace ctxpar::impl::gated_delta {

// Unrolling hint for the fixed-size tile loops (nvcc's host pass gets none: its front end
// rejects the GCC spelling).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || \
    (defined(__clang__) && !defined(__NVCC__))
#define CTXPAR_GD_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && !defined(__NVCC__)
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

#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    (defined(__GNUC__) || defined(__clang__)) && !CTXPAR_PORTABLE_KERNELS
// Host compilers with vector extensions get an explicitly vectorised micro-kernel: GCC at -O2
// does not vectorise the scalar accumulator tile below on its own. Device passes (and portable
// builds, which test the device source on the host) keep the portable scalar tile.
#define CTXPAR_GD_HOST_SIMD 1
#if defined(__AVX512F__)
inline constexpr int simd_bytes = 64;
#elif defined(__AVX__)
inline constexpr int simd_bytes = 32;
#else
inline constexpr int simd_bytes = 16;
#endif
template <class T>
struct Simd;
template <>
struct Simd<float> {
  typedef float type __attribute__((vector_size(simd_bytes)));
};
template <>
struct Simd<double> {
  typedef double type __attribute__((vector_size(simd_bytes)));
};
#else
#define CTXPAR_GD_HOST_SIMD 0
#endif

/// The register tile of a scalar type: `MR` rows × `NR` columns of `C`. On hosts with vector
/// extensions `NR` is two vector registers, so 4 rows need 8 accumulators (SSE/AVX have 16
/// registers) and 8 rows 16 (AVX-512 has 32).
template <class T>
struct TileShape {
#if CTXPAR_GD_HOST_SIMD
  static constexpr int mr = simd_bytes == 64 ? 8 : 4;
#else
  static constexpr int mr = 4;
#endif
#if CTXPAR_GD_HOST_SIMD
  static constexpr int nr = 2 * simd_bytes / static_cast<int>(sizeof(T));
#else
  static constexpr int nr = sizeof(T) == 4 ? 8 : 4;
#endif
};

/// One full `MR×NR` tile of `C (+)= alpha·A·B` over the inner range `[p0, p1)`.
template <int MR, int NR, class T>
KOKKOS_INLINE_FUNCTION void full_tile(int i0, int j0, int p0, int p1, T alpha, Left<T> a,
                                      const T* b, int ldb, T* c, int ldc, bool accumulate) {
#if CTXPAR_GD_HOST_SIMD
  if constexpr (NR * sizeof(T) == 2 * simd_bytes) {
    using vec = typename Simd<T>::type;
    constexpr int W = simd_bytes / static_cast<int>(sizeof(T));
    vec acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vec{};
    for (int p = p0; p < p1; ++p) {
      const T* brow = b + static_cast<long>(p) * ldb + j0;
      vec b0, b1;
      __builtin_memcpy(&b0, brow, sizeof(vec));
      __builtin_memcpy(&b1, brow + W, sizeof(vec));
      CTXPAR_GD_UNROLL
      for (int r = 0; r < MR; ++r) {
        const T av =
            a.ptr[static_cast<long>(i0 + r) * a.row_stride + static_cast<long>(p) * a.col_stride];
        acc[r][0] += av * b0;
        acc[r][1] += av * b1;
      }
    }
    CTXPAR_GD_UNROLL
    for (int r = 0; r < MR; ++r) {
      T* crow = c + static_cast<long>(i0 + r) * ldc + j0;
      vec c0 = alpha * acc[r][0], c1 = alpha * acc[r][1];
      if (accumulate) {
        vec o0, o1;
        __builtin_memcpy(&o0, crow, sizeof(vec));
        __builtin_memcpy(&o1, crow + W, sizeof(vec));
        c0 += o0;
        c1 += o1;
      }
      __builtin_memcpy(crow, &c0, sizeof(vec));
      __builtin_memcpy(crow + W, &c1, sizeof(vec));
    }
    return;
  }
#endif
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
      full_tile<MR, NR>(i0, j0, p0, p1, alpha, a, b, ldb, c, ldc, accumulate);
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

/// `gemm` with the default tile shape of `T`.
template <class T, class Member>
KOKKOS_INLINE_FUNCTION void team_gemm(const Member& team, int m, int n, int k, T alpha, Left<T> a,
                                      const T* b, int ldb, T* c, int ldc, bool accumulate,
                                      bool lower_output = false) {
  gemm<TileShape<T>::mr, TileShape<T>::nr>(team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate,
                                           lower_output);
}

}  // namespace ctxpar::impl::gated_delta

/// \file
/// `team_gemm`'s product, `C (+)= alpha·op(A)·B` on fp32 matrices with strides, computed by the
/// warps of a team on tensor-core products: each warp takes strips of `C` in turn — one tile's
/// rows by `mma_strip_tiles` tiles —, reads its operands rounded to `Operand` (bfloat16 or
/// float16, or TF32 for `float`) straight into fragments, one A fragment per inner block serving
/// every tile of the strip, and accumulates in fp32. The tiles are the NVIDIA m16n8 products
/// (warps of 32 lanes) or, in HIP device code, AMD's 16×16 MFMA products (wavefronts of 64): one
/// source over the layout's index functions. The chunkwise kernels run it where the plan's
/// precision asks for tensor cores; on the host spaces the warp is emulated, so the same source
/// runs in CPU CI with only the instruction replaced, for either vendor's layout.
///
/// Each element of `C` sums its inner index in blocks of the layout's depth, the blocks in
/// increasing order; which warp computes a tile never changes its bits, so a result does not
/// depend on the team size.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "ctxpar/core/impl/mfma_fragment.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/core/impl/tile_product.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"

namespace ctxpar::impl {

/// The 16×8 tiles of `C` side by side that one warp computes with each A fragment it reads: the
/// A operand is loaded and rounded once per inner block for all of them rather than once per tile.
inline constexpr int mma_strip_tiles = 2;

/// 1 in a test built to emulate AMD's MFMA layouts on the host spaces (`team_mma_layout_t`): the
/// chunk kernels then move data as a HIP device does, in CPU CI.
#if !defined(CTXPAR_EMULATE_MFMA)
#define CTXPAR_EMULATE_MFMA 0
#endif

/// The tile layout `team_mma_gemm` multiplies `Operand`s in by default: AMD's MFMA in HIP device
/// code, NVIDIA's m16n8 everywhere else (the host spaces emulate it, or AMD's under
/// `CTXPAR_EMULATE_MFMA`).
template <class Operand>
#if defined(__HIP_DEVICE_COMPILE__) || CTXPAR_EMULATE_MFMA
using team_mma_layout_t = mfma_layout_t<Operand>;
#else
using team_mma_layout_t = mma_layout_t<Operand>;
#endif

/// Lanes of the warps the tensor-core products run on `ExecutionSpace`: a HIP wavefront is 64
/// (MFMA runs on CDNA, whose wavefronts are), every other warp 32. A device team that multiplies
/// on them is whole warps of this many threads.
template <class ExecutionSpace>
inline constexpr int team_mma_lanes_v =
#if defined(KOKKOS_ENABLE_HIP) && KOKKOS_VERSION >= 40000
    std::is_same_v<ExecutionSpace, Kokkos::HIP> ? 64 :
#elif defined(KOKKOS_ENABLE_HIP)
    std::is_same_v<ExecutionSpace, Kokkos::Experimental::HIP> ? 64 :
#endif
                                                32;

/// True when the team products run on tensor cores on `ExecutionSpace`: where the warp products
/// do (`has_warp_mma_v`: the host spaces emulated, CUDA sm_80 or later) and on HIP built for an
/// MFMA target (`CTXPAR_HIP_MFMA`).
template <class ExecutionSpace>
inline constexpr bool has_team_mma_v = has_warp_mma_v<ExecutionSpace> ||
                                       (team_mma_lanes_v<ExecutionSpace> == 64 && CTXPAR_HIP_MFMA);

/// True where an `automatic` choice runs 16-bit data's team products on tensor cores: the
/// devices that have them. The host spaces emulate them only when asked by name.
template <class ExecutionSpace>
inline constexpr bool team_mma_by_default_v =
    has_team_mma_v<ExecutionSpace> && !is_host_space_v<ExecutionSpace>;

/// Per-lane values a thread holds in a product of layout `L`: one where the lanes are threads,
/// the whole warp's where one thread emulates it.
template <class L>
inline constexpr int lane_slots_v = is_mfma_layout_v<L> ? wave_lane_slots : WarpLanes::count;

/// The warps of a team as the tensor-core products of layout `L` use them, and the calling
/// thread's place: on a device a warp is `L::lanes` consecutive threads, each one lane (threads
/// past the last whole warp sit out); on the host spaces each thread runs a whole warp of
/// emulated lanes.
struct TeamWarps {
  int count;       ///< warps of the team
  int index;       ///< the calling thread's warp (`index >= count`: it has none)
  int first_lane;  ///< the lane of the calling thread's slot 0 (the others follow)
};

/// The warps of `team` for layout `L` (`TeamWarps`).
template <class L, class Member>
KOKKOS_INLINE_FUNCTION TeamWarps team_warps(const Member& team) {
  const int rank = team.team_rank();
  if (lane_slots_v<L> == 1) return {team.team_size() / L::lanes, rank / L::lanes, rank % L::lanes};
  return {team.team_size(), rank, 0};
}

/// The warp's `D = A·B + C` in layout `L`, either vendor's.
template <class L, class T>
KOKKOS_INLINE_FUNCTION void team_warp_mma(float (&c)[lane_slots_v<L>][L::c_per_lane],
                                          const Fragment<T, L::a_per_lane> (&a)[lane_slots_v<L>],
                                          const Fragment<T, L::b_per_lane> (&b)[lane_slots_v<L>]) {
  if constexpr (is_mfma_layout_v<L>)
    wave_mfma<L>(c, a, b);
  else
    warp_mma<L>(c, a, b);
}

/// `C (+)= alpha·op(A)·B` with `A` `m×k` (`Left`: strides and band, as `team_gemm` takes it), `B`
/// `k×n` row-major (`ldb`), `C` `m×n` row-major (`ldc`), on tensor cores with operands rounded to
/// `Operand` and fp32 accumulation, in tiles of layout `L`. `lower_output`: only `C(i, j)` with `j
/// ≤ i` is wanted; tiles wholly above the diagonal are skipped (others are written whole). Every
/// thread of the team calls it; it does not wait for the team, the caller does before reading `C`.
/// A device team needs at least one whole warp (`L::lanes` threads).
template <class Operand, class L = team_mma_layout_t<Operand>, class Member>
KOKKOS_INLINE_FUNCTION void team_mma_gemm(const Member& team, int m, int n, int k, float alpha,
                                          Left<float> a, const float* b, int ldb, float* c, int ldc,
                                          bool accumulate, bool lower_output = false) {
  constexpr int slots = lane_slots_v<L>;
  const TeamWarps warps = team_warps<L>(team);
  if (warps.count == 0)
    Kokkos::abort("ctxpar: a tensor-core team product needs a team of at least one warp");
  if (warps.index >= warps.count) return;
  constexpr int strip = mma_strip_tiles;
  const int tiles_n = (n + L::n - 1) / L::n, strips_n = (tiles_n + strip - 1) / strip;
  const int strips = ((m + L::m - 1) / L::m) * strips_n;
  for (int at = warps.index; at < strips; at += warps.count) {
    const int i0 = (at / strips_n) * L::m, t0 = (at % strips_n) * strip;
    // The strip's tiles within `n` and, with `lower_output`, not wholly above the diagonal (a tile
    // is when its first column is past the strip's last row).
    int width = tiles_n - t0 < strip ? tiles_n - t0 : strip;
    if (lower_output) {
      const int below = (i0 + L::m - 1) / L::n - t0 + 1;
      width = below < width ? below : width;
      if (width <= 0) continue;
    }
    int p0 = 0, p1 = k;
    if (a.band == Band::lower) p1 = i0 + L::m < k ? i0 + L::m : k;
    if (a.band == Band::upper) p0 = i0 < k ? i0 : k;
    float acc[strip][slots][L::c_per_lane] = {};
    for (int p = p0; p < p1; p += L::k) {
      Fragment<Operand, L::a_per_lane> af[slots];
      for (int s = 0; s < slots; ++s) {
        const int lane = warps.first_lane + s;
        // Rows past `m` and inner indices past the band read as zeros.
        fill_rounded(af[s], [&](int e) {
          const int r = i0 + L::a_row(lane, e), q = p + L::a_col(lane, e);
          return r < m && q < p1 ? a.ptr[static_cast<long>(r) * a.row_stride +
                                         static_cast<long>(q) * a.col_stride]
                                 : 0.0f;
        });
      }
      // Every tile of the strip with the same A fragment: each tile's C sums the same products in
      // the same order as a tile computed alone, so the bits do not depend on the strip.
      CTXPAR_FRAGMENT_UNROLL
      for (int t = 0; t < strip; ++t) {
        if (t >= width) continue;
        const int j0 = (t0 + t) * L::n;
        Fragment<Operand, L::b_per_lane> bf[slots];
        for (int s = 0; s < slots; ++s) {
          const int lane = warps.first_lane + s;
          // Columns past `n` and inner indices past the band read as zeros.
          fill_rounded(bf[s], [&](int e) {
            const int q = p + L::b_row(lane, e), j = j0 + L::b_col(lane, e);
            return q < p1 && j < n ? b[static_cast<long>(q) * ldb + j] : 0.0f;
          });
        }
        team_warp_mma<L>(acc[t], af, bf);
      }
    }
    CTXPAR_FRAGMENT_UNROLL
    for (int t = 0; t < strip; ++t) {
      if (t >= width) continue;
      const int j0 = (t0 + t) * L::n;
      for (int s = 0; s < slots; ++s) {
        const int lane = warps.first_lane + s;
        CTXPAR_FRAGMENT_UNROLL
        for (int e = 0; e < L::c_per_lane; ++e) {
          const int r = i0 + L::c_row(lane, e), j = j0 + L::c_col(lane, e);
          if (r >= m || j >= n) continue;
          float& out = c[static_cast<long>(r) * ldc + j];
          out = accumulate ? out + alpha * acc[t][s][e] : alpha * acc[t][s][e];
        }
      }
    }
  }
}

}  // namespace ctxpar::impl

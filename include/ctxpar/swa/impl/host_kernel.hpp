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

#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/impl/simd.hpp"
#include "ctxpar/core/impl/tile_product.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"
#include "ctxpar/swa/options.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa::impl {

/// True for execution spaces that take the SIMD kernels of this header: host spaces, unless the
/// build runs the portable kernels everywhere (`CTXPAR_PORTABLE_KERNELS`).
template <class ExecutionSpace>
inline constexpr bool uses_host_kernels = ctxpar::impl::uses_host_fast_path_v<ExecutionSpace>;

/// Keys per packed tile (the same grid as the portable kernels' `key_tile`).
inline constexpr int host_key_tile = 32;

using ctxpar::impl::Simd;
using ctxpar::impl::simd_broadcast;
using ctxpar::impl::simd_exp;
using ctxpar::impl::simd_lanes;
using ctxpar::impl::simd_load;
using ctxpar::impl::simd_max;
using ctxpar::impl::simd_max_lane;
using ctxpar::impl::simd_rows_accumulate;
using ctxpar::impl::simd_store;
using ctxpar::impl::simd_sum;
using ctxpar::impl::simd_t;
using ctxpar::impl::simd_zero;
using ctxpar::impl::simd_zero_where;

/// Vectors of `Bytes` per key tile row.
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
inline constexpr int tile_vectors = host_key_tile / Simd<T, Bytes>::lanes;
/// Query rows whose scores against one key tile stay in registers together (16 accumulators
/// where the vectors are wide enough; at least 4 rows, the blocking of the value products).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
inline constexpr int score_rows = 16 / tile_vectors<T, Bytes> > 4 ? 16 / tile_vectors<T, Bytes> : 4;

/// `s[r] = sum_d a[r][d] * bt[d][:]` for `Rows` rows of `a` (row stride `lda`, `dim` columns) and
/// the packed transposed tile `bt[dim][host_key_tile]`, at the width of `V`; each score sums `d`
/// in increasing order.
template <int Rows, class T, class V, int Vectors>
inline void host_scores(const T* a, int lda, const T* bt, int dim, V (&s)[Rows][Vectors]) {
  static_assert(Vectors * simd_lanes<V> == host_key_tile, "one key tile per row of scores");
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Vectors; ++c) s[r][c] = simd_zero<T, static_cast<int>(sizeof(V))>();
  ctxpar::impl::simd_tile_accumulate<Rows, Vectors>(a, lda, 1, 0, dim, bt, host_key_tile, s);
}

/// Head dimension rounded up to whole vectors of `lanes` (the packed tiles and scratch rows are
/// zero-padded).
inline int padded_dim(int dim, int lanes) {
  return (dim + lanes - 1) / lanes * lanes;
}

/// True when `kernels` runs the host SIMD kernels on `ExecutionSpace` (a host space in a build
/// that has them, and any choice but `portable` and `tensor_core`).
template <class ExecutionSpace>
constexpr bool runs_host_kernels(KernelChoice kernels) {
  return uses_host_kernels<ExecutionSpace> && kernels != KernelChoice::portable &&
         kernels != KernelChoice::tensor_core;
}

/// Policy of the host SIMD kernels, which are written for one thread per team (the portable
/// kernels choose their team size in `team_kernel_policy`).
template <class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> host_kernel_policy(const ExecutionSpace& space,
                                                      std::int64_t league, std::size_t bytes,
                                                      int& level) {
  level = bytes <= 32768 ? 0 : 1;
  return Kokkos::TeamPolicy<ExecutionSpace>(space, static_cast<int>(league), 1)
      .set_scratch_size(level, Kokkos::PerTeam(bytes));
}

}  // namespace ctxpar::swa::impl
CTXPAR_WIDE_VECTORS_END
